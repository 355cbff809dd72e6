/* Attention sublayer (docs/model.md §1.1-1.3; docs/design.md §8.1): split q, k, v into
 * heads, rotate and shear q and k, run softmax or FMM attention per head,
 * merge the heads. Per-head vectors are stored head-major [B, H, T, dh] so
 * every kernel sees contiguous [T, dh] matrices. A shard of sequences cut
 * across a context group runs in attention_shard.c (docs/design.md §8.12). */
#include "attention/attention.h"

#include <omp.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/tiled_softmax.h"

#include "attention_shard.h"
#include "attention_vectors.h"

/* Tiled softmax keeps each row's log-sum-exp and recomputes the
 * probabilities in backward, at every length (docs/model.md §1.3): up to
 * T = 256 it used to keep them as dense does, but since the tile kernel's
 * own products and exponentials (docs/design.md §8.10) the recompute costs
 * less than writing and reading T x T floats (bench_d256 and bench_d768,
 * fp32, docs/performance.md §9.9). */
static bool tiled(const config *cfg) {
    return cfg->attention == ATTENTION_SOFTMAX && cfg->attention_impl == ATTENTION_TILED;
}

/* A shard of a context group's sequences (docs/design.md §8.12). */
static bool sharded(const attention_layer_sizes *z) { return z->cut && z->cut->chunks > 1; }

/* FMM's band and far-field state; tiled softmax's log-sum-exp per row;
 * dense softmax's T x T probabilities. A shard's are attention_shard.c's:
 * it also keeps what its exchanges brought, and runs softmax as ring
 * attention on the tiled kernel whatever the length. */
size_t attention_saved_per_head(const attention_layer_sizes *z) {
    int T = z->T;
    if (sharded(z)) return attention_shard_saved_per_head(z);
    if (z->cfg->attention == ATTENTION_FMM) return fmm_head_saved_floats(z->fmm, T, config_head_dim(z->cfg));
    return tiled(z->cfg) ? (size_t)T : (size_t)T * T;
}

/* Kernel scratch (a shard's: attention_shard.c's) plus five [T, dh] temporaries for
 * gathering and the gradients of q, k, v (the last one also holds the
 * head's output for tiled softmax's backward). */
size_t attention_scratch_per_head(const attention_layer_sizes *z) {
    int T = z->T, dh = config_head_dim(z->cfg);
    if (sharded(z)) return attention_shard_scratch_per_head(z);
    size_t kernel = z->cfg->attention == ATTENTION_FMM ? fmm_head_scratch_floats(z->fmm, T, dh)
                    : tiled(z->cfg)                    ? tiled_softmax_scratch_floats(T, dh)
                                                       : (size_t)T * T;
    return kernel + 5 * (size_t)T * dh;
}

size_t attention_exchange_floats(const attention_layer_sizes *z, int B) {
    return sharded(z) ? attention_shard_exchange_floats(z, B) : 0;
}

int attention_threads(void) { return omp_get_max_threads(); }

/* Four [n, dh] temporaries (raw, q, p, head output) and the FMM kernel's. */
size_t attention_stream_scratch_floats(const config *cfg, const fmm_settings *fmm, int n_max, int dh) {
    size_t kernel = cfg->attention == ATTENTION_FMM ? fmm_stream_scratch_floats(fmm, dh)
                    : tiled(cfg)                    ? tiled_softmax_scratch_floats(n_max, dh) + (size_t)n_max
                                                    : 0;
    return 4 * (size_t)n_max * dh + kernel;
}

size_t attention_stream_probs_floats(const config *cfg, int n_max, int capacity) {
    return cfg->attention == ATTENTION_SOFTMAX && !tiled(cfg) ? (size_t)n_max * capacity : 0;
}

/* A whole sequence as one span. */
static const attention_span WHOLE = {0, true, NULL, NULL, NULL, NULL, true};

static attention_layer_sizes sizes_of(const attention_layer *a, int T) {
    return (attention_layer_sizes){a->cfg, a->fmm, a->cut, T};
}

/* Batch row b's share of what a head sums over the batch: gamma's
 * gradient [2][H] (q's part, then k's: the backward adds them in turn),
 * blend's [2][H], the momentum buffers' last positions [2][H][dh]
 * (attention_layer's d_gamma, d_blend and buffer_sums). */
static size_t row_share_floats(int H, int dh) { return 4 * (size_t)H + 2 * (size_t)H * dh; }

size_t attention_row_sums_floats(const attention_layer_sizes *z, int B) {
    if (sharded(z)) return 0; /* attention_shard.c runs its own loop */
    return (size_t)B * row_share_floats(z->cfg->n_heads, config_head_dim(z->cfg));
}

/* Whether the forward adds to the momentum buffers' sums: only a sheared
 * vector does (attention_prepare), so only with momentum. */
static bool sums_buffers(const attention_layer *a) { return a->buffer_sums && a->momentum; }

/* Whether the layer makes any sum over the batch: without one (softmax
 * without learned gamma or momentum) the shares are neither cleared nor
 * added. */
static bool sums_over_batch(const attention_layer *a) { return a->d_gamma || a->d_blend || sums_buffers(a); }

/* Where batch row b's share of each sum lies in s->row_sums; NULL for a
 * sum the layer does not make. */
typedef struct {
    float *gamma_q, *gamma_k, *blend, *buffers;
} row_share;

static row_share row_share_of(const attention_layer *a, const attention_saved *s, int b) {
    float *at = s->row_sums + (size_t)b * row_share_floats(a->H, a->dh);
    return (row_share){a->d_gamma ? at : NULL, a->d_gamma ? at + a->H : NULL, a->d_blend ? at + 2 * a->H : NULL,
                       sums_buffers(a) ? at + 4 * (size_t)a->H : NULL};
}

/* The layer as the heads of batch row b see it: what they add to the sums
 * over the batch goes to the row's share (gamma's q part; backward_pair
 * points it at the k part for k). */
static attention_layer row_view(const attention_layer *a, const attention_saved *s, int b) {
    attention_layer view = *a;
    row_share share = row_share_of(a, s, b);
    view.d_gamma = share.gamma_q, view.d_blend = share.blend; /* NULL where a's are */
    if (share.buffers) view.buffer_sums = share.buffers;
    return view;
}

/* Each share starts as -0, which leaves the first value added to it as it
 * is (x + -0 = x, for x = +0 too). */
static void clear_row_shares(const attention_layer *a, const attention_saved *s, int B) {
    if (!sums_over_batch(a)) return;
    size_t n = (size_t)B * row_share_floats(a->H, a->dh);
    for (size_t i = 0; i < n; i++) s->row_sums[i] = -0.0f;
}

/* The rows' shares added into the layer's sums, row by row in order (and
 * gamma's q part before its k part): the floats of adding each share as
 * the backward made it. */
static void add_row_shares(const attention_layer *a, const attention_saved *s, int B) {
    if (!sums_over_batch(a)) return;
    size_t buffers = 2 * (size_t)a->H * a->dh;
    for (int b = 0; b < B; b++) {
        row_share share = row_share_of(a, s, b);
        for (int h = 0; share.gamma_q && h < a->H; h++)
            a->d_gamma[h] = a->d_gamma[h] + share.gamma_q[h] + share.gamma_k[h];
        for (int i = 0; share.blend && i < 2 * a->H; i++) a->d_blend[i] += share.blend[i];
        for (size_t i = 0; share.buffers && i < buffers; i++) a->buffer_sums[i] += share.buffers[i];
    }
}

/* One (batch row, head) pair of the forward, on the calling thread's
 * scratch. */
static void forward_pair(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int b, int h,
                         int T, float *scratch) {
    int d = a->d, dh = a->dh;
    attention_layer_sizes z = sizes_of(a, T);
    float *raw = scratch + attention_scratch_per_head(&z) - 5 * (size_t)T * dh;
    float *head_out = raw + (size_t)T * dh;
    bool keep_p = s->p_q != NULL;
    attention_layer view = row_view(a, s, b);
    const float *rows = qkv + (size_t)b * T * 3 * d;
    size_t off = attention_head_offset(a, b, h, T);
    float *q = s->q_hat + off, *k = s->k_hat + off, *v = s->v_heads + off;
    attention_prepare_rows(&view, h, VECTOR_Q, rows, 3 * d, raw, q, keep_p ? s->p_q + off : NULL, T, &WHOLE);
    attention_prepare_rows(&view, h, VECTOR_K, rows, 3 * d, raw, k, keep_p ? s->p_k + off : NULL, T, &WHOLE);
    attention_gather_head(v, rows, 3 * d, 2 * d + h * dh, T, dh);
    float *saved = s->saved + ((size_t)b * a->H + h) * attention_saved_per_head(&z);
    if (a->cfg->attention == ATTENTION_FMM) {
        fmm_head_forward(a->fmm, NULL, q, k, v, a->blend[h], a->blend[a->H + h], head_out, saved, scratch, T, dh);
    } else if (tiled(a->cfg)) {
        tiled_softmax_forward(head_out, saved, q, k, v, T, T, dh, 0, a->cfg->causal, a->fmm->bf16, scratch);
    } else {
        softmax_attention_forward(head_out, saved, q, k, v, T, T, dh, 0, a->cfg->causal);
    }
    attention_scatter_head(out + (size_t)b * T * d, head_out, d, h * dh, T, dh);
}

static void backward_pair(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv, int b,
                          int h, int T, float *scratch) {
    int d = a->d, dh = a->dh;
    attention_layer_sizes z = sizes_of(a, T);
    size_t tdh = (size_t)T * dh;
    float *d_head_out = scratch + attention_scratch_per_head(&z) - 5 * tdh;
    float *dq = d_head_out + tdh, *dk = dq + tdh, *dv = dk + tdh, *d_raw = dv + tdh;
    bool keep_p = s->p_q != NULL;
    attention_layer view = row_view(a, s, b);
    float *d_rows = d_qkv + (size_t)b * T * 3 * d;
    size_t off = attention_head_offset(a, b, h, T);
    const float *q = s->q_hat + off, *k = s->k_hat + off, *v = s->v_heads + off;
    const float *saved = s->saved + ((size_t)b * a->H + h) * attention_saved_per_head(&z);
    attention_gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
    if (a->cfg->attention == ATTENTION_FMM) {
        fmm_head_backward(a->fmm, NULL, q, k, v, a->blend[h], a->blend[a->H + h], saved, d_head_out, dq, dk, dv,
                          view.d_blend + h, view.d_blend + a->H + h, scratch, T, dh);
    } else if (tiled(a->cfg)) {
        float *head_out = d_raw; /* free until attention_unprepare overwrites it */
        attention_gather_head(head_out, s->out + (size_t)b * T * d, d, h * dh, T, dh);
        tiled_softmax_backward(dq, dk, dv, d_head_out, head_out, saved, q, k, v, T, dh, a->cfg->causal, a->fmm->bf16,
                               scratch);
    } else {
        softmax_attention_backward(dq, dk, dv, d_head_out, saved, q, k, v, scratch, T, T, dh, a->cfg->causal);
    }
    attention_unprepare_rows(&view, h, VECTOR_Q, dq, d_rows, 3 * d, d_raw, keep_p ? s->p_q + off : NULL, T, &WHOLE);
    if (view.d_gamma) view.d_gamma = row_share_of(a, s, b).gamma_k;
    attention_unprepare_rows(&view, h, VECTOR_K, dk, d_rows, 3 * d, d_raw, keep_p ? s->p_k + off : NULL, T, &WHOLE);
    attention_scatter_head(d_rows, dv, 3 * d, 2 * d + h * dh, T, dh);
}

/* The B x H (batch row, head) pairs run in parallel (docs/design.md
 * §8.10), in row-major order cut into one run of pairs per thread: two
 * threads take half the rows each, all their heads, as two ranks would.
 * Cut by heads (each thread every row's columns of its heads) the
 * attention phases ran 1.7x on two threads against 2.1x on two ranks; cut
 * by rows they ran 9% faster at bench_d256 and 15% at bench_d768
 * (docs/performance.md §9.9), as LayerNorm and GELU did before
 * (docs/design.md §8.10). Each thread has its own scratch; what a head
 * sums over the batch is summed row by row in order after the pairs ran
 * (row_view), so results do not depend on the thread count. The products
 * inside run on one thread each. */
typedef void (*pair_fn)(const attention_layer *a, const attention_saved *s, const float *in, float *out, int b, int h,
                        int T, float *scratch);

static void run_pairs(const attention_layer *a, const attention_saved *s, pair_fn pair, const float *in, float *out,
                      int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    size_t per_thread = attention_scratch_per_head(&z);
    long long pairs = (long long)B * a->H;
    clear_row_shares(a, s, B);
#pragma omp parallel num_threads(s->threads)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        float *scratch = s->scratch + (size_t)t * per_thread;
        for (long long i = pairs * t / n; i < pairs * (t + 1) / n; i++)
            pair(a, s, in, out, (int)(i / a->H), (int)(i % a->H), T, scratch);
    }
    add_row_shares(a, s, B);
}

void attention_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    if (sharded(&z)) {
        attention_shard_forward(a, s, qkv, out, B, T);
        return;
    }
    run_pairs(a, s, forward_pair, qkv, out, B, T);
}

void attention_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv, int B,
                        int T) {
    attention_layer_sizes z = sizes_of(a, T);
    if (sharded(&z)) {
        attention_shard_backward(a, s, d_out, d_qkv, B, T);
        return;
    }
    run_pairs(a, s, backward_pair, d_out, d_qkv, B, T);
}

/* Read from what the forward kept (docs/metrics.md §3, the attention read-out):
 * dense softmax keeps the probabilities; tiled keeps each row's
 * log-sum-exp, so p_ij = exp(s_ij - lse_i) from q-hat and k-hat; FMM's
 * near and far fields are fmm_head_weight's. */
float attention_weight(const attention_layer *a, const attention_saved *s, int b, int h, int T, int i, int j) {
    if (a->cfg->causal && j > i) return 0.0f;
    attention_layer_sizes z = sizes_of(a, T);
    size_t off = attention_head_offset(a, b, h, T), per_head = attention_saved_per_head(&z);
    const float *q = s->q_hat + off, *k = s->k_hat + off, *saved = s->saved + ((size_t)b * a->H + h) * per_head;
    if (a->cfg->attention == ATTENTION_FMM)
        return fmm_head_weight(a->fmm, q, k, a->blend[h], a->blend[a->H + h], saved, T, a->dh, i, j);
    if (!tiled(a->cfg)) return saved[(size_t)i * T + j];
    return tiled_softmax_weight(q, k, saved, a->dh, i, j);
}

/* ---- streaming (docs/model.md §1.2: carry each sequence's previous vectors) ------- */

/* prepare_vector for positions pos..pos+n-1 of stream s: at pos 0 the shear
 * starts as in training (anchor or buffer); later it continues from the
 * carried x_{t-1} and p_{t-1}, which it then updates. */
static void prepare_stream_vector(const attention_layer *a, const attention_stream_layer *st, int s, int h, int which,
                                  float *raw, float *dst, float *p, int n) {
    int dh = a->dh, pos = st->rope_pos;
    size_t carry = (((size_t)which * st->S + s) * a->H + h) * dh;
    float *carry_x = st->carry_x + carry, *carry_p = st->carry_p + carry;
    attention_span span = {pos, !st->continued, carry_x, carry_p, NULL, NULL, false};
    if (!attention_is_sheared(a, which)) {
        attention_prepare(a, h, which, raw, dst, p, n, &span);
        return;
    }
    attention_shear_frame(a, raw, n, pos);
    attention_shear(a, h, which, raw, dst, p, n, &span);
    memcpy(carry_x, raw + (size_t)(n - 1) * dh, sizeof(float) * dh);
    memcpy(carry_p, p + (size_t)(n - 1) * dh, sizeof(float) * dh);
}

void attention_stream_forward(const attention_layer *a, const attention_stream_layer *st, const float *qkv, float *out,
                              int n) {
    int d = a->d, dh = a->dh, pos = st->pos;
    size_t ndh = (size_t)n * dh, cache = (size_t)st->capacity * dh;
    float *raw = st->scratch, *q = raw + ndh, *p = q + ndh, *head_out = p + ndh, *kernel = head_out + ndh;
    size_t far_floats = fmm_stream_state_floats(a->fmm, dh);
    for (int s = 0; s < st->S; s++) {
        const float *rows = qkv + (size_t)s * n * 3 * d;
        for (int h = 0; h < a->H; h++) {
            size_t index = (size_t)s * a->H + h;
            float *k_cache = st->k_cache + index * cache, *v_cache = st->v_cache + index * cache;
            attention_gather_head(raw, rows, 3 * d, h * dh, n, dh);
            prepare_stream_vector(a, st, s, h, VECTOR_Q, raw, q, p, n);
            attention_gather_head(raw, rows, 3 * d, d + h * dh, n, dh);
            prepare_stream_vector(a, st, s, h, VECTOR_K, raw, k_cache + (size_t)pos * dh, p, n);
            attention_gather_head(v_cache + (size_t)pos * dh, rows, 3 * d, 2 * d + h * dh, n, dh);
            if (a->cfg->attention == ATTENTION_FMM) {
                fmm_head_stream(a->fmm, q, k_cache, v_cache, pos, n, a->blend[h], a->blend[a->H + h],
                                st->far_state + index * far_floats, head_out, kernel, dh);
            } else {
                if (tiled(a->cfg))
                    tiled_softmax_forward(head_out, kernel, q, k_cache, v_cache, n, pos + n, dh, pos, true,
                                          a->fmm->bf16, kernel + n);
                else softmax_attention_forward(head_out, st->probs, q, k_cache, v_cache, n, pos + n, dh, pos, true);
            }
            attention_scatter_head(out + (size_t)s * n * d, head_out, d, h * dh, n, dh);
        }
    }
}
