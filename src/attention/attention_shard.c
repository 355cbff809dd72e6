/* One block's attention on a shard of each sequence (context parallelism,
 * docs/design.md §8.12): the same q-hat, k-hat and outputs as on one rank,
 * from the shard's rows and what the context group sends. In phases, so
 * that the group exchanges once per layer for all heads and rows: heads run
 * on OpenMP's threads between the exchanges, which the main thread makes
 * (MPI_THREAD_FUNNELED).
 *
 *   forward   rotate; momentum shares -> all-gather -> carries -> shear;
 *             FMM: halo send, far-field state scan -> heads;
 *             softmax: C ring steps of K, V, merged by log-sum-exp
 *   backward  FMM: far-field gradient scan -> heads -> halo gradients back;
 *             softmax: C ring steps of K, V, dK, dV;
 *             momentum shares -> all-gather -> carries -> unshear, unrotate */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention/fmm.h"
#include "kernels/kernels.h"
#include "kernels/tiled_softmax.h"
#include "parallel/context.h"

#include "attention_shard.h"
#include "attention_vectors.h"

/* ---- geometry */

static bool is_fmm(const attention_layer *a) { return a->cfg->attention == ATTENTION_FMM; }

/* The band's halo: the k - 1 keys before a shard (and after it, non-causal). */
static int halo_rows(const attention_layer_sizes *z) {
    if (z->cfg->attention != ATTENTION_FMM) return 0;
    int T = z->cut->T_seq, half = z->fmm->bandwidth < T ? z->fmm->bandwidth : T;
    return half > 1 ? half - 1 : 0;
}

static int halo_left(const attention_layer_sizes *z) {
    int h = halo_rows(z), start = z->cut->start[0];
    return h < start ? h : start;
}

static int halo_right(const attention_layer_sizes *z) {
    if (z->cfg->causal) return 0;
    int h = halo_rows(z), after = z->cut->T_seq - z->cut->start[0] - z->cut->len[0];
    return h < after ? h : after;
}

/* The most rows any context rank holds (ring blocks are sent at this size). */
static int most_rows(const context_cut *cut) {
    int most = 0, C = cut->n == 2 ? cut->chunks / 2 : cut->chunks;
    for (int c = 0; c < C; c++) {
        context_cut other = context_cut_of(cut->T_seq, C, c, cut->n == 2);
        most = other.total > most ? other.total : most;
    }
    return most;
}

static attention_layer_sizes sizes_of(const attention_layer *a, int T) {
    return (attention_layer_sizes){a->cfg, a->fmm, a->cut, T};
}

/* What a shard keeps beyond the kernel's own: far_in, then the halo rows. */
static size_t shard_state_floats(const attention_layer_sizes *z) {
    if (z->cfg->attention != ATTENTION_FMM) return 0;
    int dh = config_head_dim(z->cfg);
    return fmm_far_state_floats(z->fmm, dh) + 2 * (size_t)(halo_left(z) + halo_right(z)) * dh;
}

/* FMM's saved floats and the shard's state; ring attention's log-sum-exp. */
size_t attention_shard_saved_per_head(const attention_layer_sizes *z) {
    if (z->cfg->attention == ATTENTION_FMM)
        return fmm_head_saved_floats(z->fmm, z->T, config_head_dim(z->cfg)) + shard_state_floats(z);
    return (size_t)z->T;
}

/* The kernel's scratch; FMM's keys, values and their gradients with the
 * halos, or a ring block's output and log-sum-exp; five [T, dh] temporaries. */
size_t attention_shard_scratch_per_head(const attention_layer_sizes *z) {
    int dh = config_head_dim(z->cfg), T = z->T, Tk = halo_left(z) + T + halo_right(z);
    if (z->cfg->attention == ATTENTION_FMM)
        return fmm_head_scratch_floats(z->fmm, T, dh) + 4 * (size_t)Tk * dh + 5 * (size_t)T * dh;
    return tiled_softmax_scratch_floats(T, dh) + (size_t)T * (dh + 1) + 5 * (size_t)T * dh;
}

/* The exchange buffer, carved (attention_exchange_floats sizes it). Per
 * (row b, vector q|k, head, range): the momentum shares and carries. */
typedef struct {
    float *shares, *gathered, *carries; /* [B][2][H][2][2][dh], [C][...], [B][2][H][2][2][dh] */
    float *halo_send[2], *halo_recv[2]; /* [B][H][2][halo][dh]: forward (to next), reverse (to previous) */
    float *totals, *grad_in;            /* [B][H][state] */
    float *blocks[2];                   /* ring: [B][H][4][most][dh], two in turn */
    float *acc;                         /* ring: [B][H][T][dh], the merged output or dq */
} exchange_areas;

static size_t momentum_floats(const attention_layer_sizes *z, int B) {
    return (size_t)B * 2 * z->cfg->n_heads * 2 * 2 * config_head_dim(z->cfg);
}

static exchange_areas carve_exchange(const attention_layer_sizes *z, int B, float *base, size_t *total) {
    exchange_areas x;
    int H = z->cfg->n_heads, dh = config_head_dim(z->cfg), C = context_size();
    size_t mom = momentum_floats(z, B), halo = (size_t)B * H * 2 * halo_rows(z) * dh;
    size_t state = z->cfg->attention == ATTENTION_FMM ? (size_t)B * H * fmm_far_state_floats(z->fmm, dh) : 0;
    bool ring = z->cfg->attention != ATTENTION_FMM;
    size_t block = ring ? (size_t)B * H * 4 * most_rows(z->cut) * dh : 0, acc = ring ? (size_t)B * H * z->T * dh : 0;
    size_t sizes[] = {mom, mom * C, mom, halo, halo, halo, halo, state, state, block, block, acc};
    float **slots[] = {&x.shares,       &x.gathered, &x.carries, &x.halo_send[0], &x.halo_send[1], &x.halo_recv[0],
                       &x.halo_recv[1], &x.totals,   &x.grad_in, &x.blocks[0],    &x.blocks[1],    &x.acc};
    size_t at = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = base ? base + at : NULL;
        at += sizes[i];
    }
    *total = at;
    return x;
}

size_t attention_shard_exchange_floats(const attention_layer_sizes *z, int B) {
    size_t total;
    carve_exchange(z, B, NULL, &total);
    return total;
}

/* ---- momentum across the shards (docs/model.md §1.2; momentum.h) */

/* Rows of range r within a head's [T, dh] (ranges are stored in order). */
static int range_row(const context_cut *cut, int r) { return r == 0 ? 0 : cut->len[0]; }

/* Index of (b, which, h, range) in the [B][2][H][2] share and carry tables. */
static size_t share_at(const attention_layer *a, int b, int which, int h, int r) {
    return ((((size_t)b * 2 + which) * a->H + h) * 2 + r) * 2 * a->dh;
}

/* Forward shares of one head's range x (in the shear's frame): its last x,
 * and its p at the last row with nothing carried in (the sequence's first
 * range: its true p). */
static void forward_share(const attention_layer *a, int h, int which, const float *x, int T, bool first, float *share,
                          float *zero) {
    int dh = a->dh;
    memcpy(share, x + (size_t)(T - 1) * dh, sizeof(float) * dh);
    const float *prev = first ? (a->cfg->anchor ? NULL : a->buffers + attention_head_buffer(a, which, h)) : zero;
    momentum_p_end(x, prev, NULL, attention_head_coeffs(a, h).beta, share + dh, T, dh);
}

/* From every range's shares, the carries (x, p of the row before) of this
 * rank's ranges, chunk by chunk in sequence order. */
static void forward_carries(const attention_layer *a, const exchange_areas *x, int B) {
    const context_cut *cut = a->cut;
    int dh = a->dh, K = cut->chunks;
    size_t per_rank = momentum_floats(&(attention_layer_sizes){a->cfg, a->fmm, cut, 0}, B);
    float p_end[dh], next[dh];
    for (int b = 0; b < B; b++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < a->H; h++) {
                const float *prev_x = NULL;
                for (int k = 0; k < K; k++) {
                    int owner = context_chunk_owner(cut, k), r = k == owner ? 0 : 1;
                    const float *share = x->gathered + owner * per_rank + share_at(a, b, which, h, r);
                    if (k == 0) memcpy(p_end, share + dh, sizeof p_end);
                    else {
                        for (int r2 = 0; r2 < cut->n; r2++)
                            if (cut->chunk[r2] == k) {
                                float *carry = x->carries + share_at(a, b, which, h, r2);
                                memcpy(carry, prev_x, sizeof(float) * dh);
                                memcpy(carry + dh, p_end, sizeof(float) * dh);
                            }
                        momentum_carry_p(share + dh, prev_x, p_end, attention_head_coeffs(a, h).beta, next,
                                         context_chunk_len(cut, k), dh);
                        memcpy(p_end, next, sizeof p_end);
                    }
                    prev_x = share;
                }
            }
}

/* Backward shares of one range's g: its first g, and u at its first row
 * with nothing carried in. */
static void backward_share(const attention_layer *a, int h, const float *g, int T, float *share) {
    memcpy(share, g, sizeof(float) * a->dh);
    momentum_u_first(g, NULL, NULL, attention_head_coeffs(a, h), share + a->dh, T, a->dh);
}

/* The carries (g, u of the row after) of this rank's ranges, chunk by chunk
 * from the sequence's end. */
static void backward_carries(const attention_layer *a, const exchange_areas *x, int B) {
    const context_cut *cut = a->cut;
    int dh = a->dh, K = cut->chunks;
    size_t per_rank = momentum_floats(&(attention_layer_sizes){a->cfg, a->fmm, cut, 0}, B);
    float u_first[dh], next[dh];
    for (int b = 0; b < B; b++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < a->H; h++) {
                const float *next_g = NULL;
                for (int k = K - 1; k >= 0; k--) {
                    int owner = context_chunk_owner(cut, k), r = k == owner ? 0 : 1;
                    const float *share = x->gathered + owner * per_rank + share_at(a, b, which, h, r);
                    if (k == K - 1) memcpy(u_first, share + dh, sizeof u_first);
                    else {
                        for (int r2 = 0; r2 < cut->n; r2++)
                            if (cut->chunk[r2] == k) {
                                float *carry = x->carries + share_at(a, b, which, h, r2);
                                memcpy(carry, next_g, sizeof(float) * dh);
                                memcpy(carry + dh, u_first, sizeof(float) * dh);
                            }
                        momentum_carry_u(share + dh, next_g, u_first, attention_head_coeffs(a, h), next,
                                         context_chunk_len(cut, k), dh);
                        memcpy(u_first, next, sizeof u_first);
                    }
                    next_g = share;
                }
            }
}

static attention_span forward_span(const attention_layer *a, const exchange_areas *x, int b, int which, int h, int r) {
    const context_cut *cut = a->cut;
    const float *carry = x->carries + share_at(a, b, which, h, r);
    bool first = cut->chunk[r] == 0;
    attention_span span = {cut->start[r],
                           first,
                           first ? NULL : carry,
                           first ? NULL : carry + a->dh,
                           NULL,
                           NULL,
                           cut->start[r] + cut->len[r] == cut->T_seq};
    return span;
}

static attention_span backward_span(const attention_layer *a, const exchange_areas *x, int b, int which, int h, int r) {
    attention_span span = forward_span(a, x, b, which, h, r);
    bool last = span.holds_last;
    const float *carry = x->carries + share_at(a, b, which, h, r);
    span.g_next = last ? NULL : carry;
    span.u_next = last ? NULL : carry + a->dh;
    return span;
}

/* Per head: q, k into q-hat, k-hat in the shear's frame, and their shares. */
static void rotate_and_share(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                             const float *qkv, int B, int T, int h, float *zero) {
    int d = a->d, dh = a->dh;
    for (int b = 0; b < B; b++) {
        const float *rows = qkv + (size_t)b * T * 3 * d;
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            float *dst = (which == VECTOR_Q ? s->q_hat : s->k_hat) + off;
            attention_gather_head(dst, rows, 3 * d, which * d + h * dh, T, dh);
            for (int r = 0; r < a->cut->n; r++) {
                float *range = dst + (size_t)range_row(a->cut, r) * dh;
                int len = a->cut->len[r];
                if (!attention_is_sheared(a, which)) continue;
                attention_shear_frame(a, range, len, a->cut->start[r]);
                /* the momentum buffers sum the sequence's last position (on one rank of the group) */
                if (a->buffer_sums && a->cut->start[r] + len == a->cut->T_seq)
                    attention_add_last_position(a->buffer_sums + attention_head_buffer(a, which, h), range, len, dh);
                forward_share(a, h, which, range, len, a->cut->chunk[r] == 0, x->shares + share_at(a, b, which, h, r),
                              zero);
            }
        }
        attention_gather_head(s->v_heads + off, rows, 3 * d, 2 * d + h * dh, T, dh);
    }
}

/* Per head: the shear with its carries (q-hat, k-hat hold the frame's x). */
static void shear_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x, int B, int T, int h,
                       float *raw) {
    int dh = a->dh;
    bool keep_p = s->p_q != NULL;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            float *dst = (which == VECTOR_Q ? s->q_hat : s->k_hat) + off;
            float *p = keep_p ? (which == VECTOR_Q ? s->p_q : s->p_k) + off : NULL;
            for (int r = 0; r < a->cut->n; r++) {
                size_t at = (size_t)range_row(a->cut, r) * dh;
                int len = a->cut->len[r];
                attention_span span = forward_span(a, x, b, which, h, r);
                if (attention_is_sheared(a, which)) {
                    memcpy(raw, dst + at, sizeof(float) * len * dh);
                    attention_shear(a, h, which, raw, dst + at, p ? p + at : NULL, len, &span);
                } else {
                    rope_forward(dst + at, a->rope_cos, a->rope_sin, len, dh, span.pos0);
                }
            }
        }
    }
}

static float *thread_scratch(const attention_layer *a, const attention_saved *s, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    return s->scratch + (size_t)omp_get_thread_num() * attention_shard_scratch_per_head(&z);
}

/* The last 5 [T, dh] of a head's scratch (attention_scratch_per_head). */
static float *tail_scratch(const attention_layer *a, float *scratch, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    return scratch + attention_shard_scratch_per_head(&z) - 5 * (size_t)T * a->dh;
}

/* q-hat, k-hat, v of the shard: rotated at their global positions, sheared
 * with the carries from the ranges before them. */
static void shard_prepare(const attention_layer *a, const attention_saved *s, const exchange_areas *x, const float *qkv,
                          int B, int T) {
    float zero[a->dh];
    memset(zero, 0, sizeof zero);
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) rotate_and_share(a, s, x, qkv, B, T, h, zero);
    if (a->momentum) {
        attention_layer_sizes z = sizes_of(a, T);
        context_allgather(x->shares, x->gathered, momentum_floats(&z, B), "momentum carry all-gather");
        forward_carries(a, x, B);
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) shear_head(a, s, x, B, T, h, tail_scratch(a, thread_scratch(a, s, T), T));
}

/* Per head: the gradients of q-hat, k-hat (in d_qkv's columns) back through
 * the shear and the rotation; the shares come first (share = true). */
static void unshear_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x, float *d_qkv,
                         int B, int T, int h, bool share, float *scratch) {
    int d = a->d, dh = a->dh;
    float *d_hat = tail_scratch(a, scratch, T), *d_raw = d_hat + (size_t)T * dh;
    bool keep_p = s->p_q != NULL;
    for (int b = 0; b < B; b++) {
        float *rows = d_qkv + (size_t)b * T * 3 * d;
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            attention_gather_head(d_hat, rows, 3 * d, which * d + h * dh, T, dh);
            const float *p = keep_p ? (which == VECTOR_Q ? s->p_q : s->p_k) + off : NULL;
            for (int r = 0; r < a->cut->n; r++) {
                size_t at = (size_t)range_row(a->cut, r) * dh;
                int len = a->cut->len[r];
                if (share) {
                    if (!attention_is_sheared(a, which)) continue;
                    attention_shear_gradient_frame(a, d_hat + at, len, a->cut->start[r]);
                    backward_share(a, h, d_hat + at, len, x->shares + share_at(a, b, which, h, r));
                    continue;
                }
                attention_span span = backward_span(a, x, b, which, h, r);
                attention_unprepare(a, h, which, d_hat + at, d_raw + at, p ? p + at : NULL, len, &span);
            }
            if (!share) attention_scatter_head(rows, d_raw, 3 * d, which * d + h * dh, T, dh);
        }
    }
}

/* d_qkv holds dL/d(q-hat, k-hat, v) of the shard: q and k columns become
 * dL/d(q, k) through the shear (with its carries from the ranges after)
 * and the rotation. */
static void shard_unprepare(const attention_layer *a, const attention_saved *s, const exchange_areas *x, float *d_qkv,
                            int B, int T) {
    if (a->momentum) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++) unshear_head(a, s, x, d_qkv, B, T, h, true, thread_scratch(a, s, T));
        attention_layer_sizes z = sizes_of(a, T);
        context_allgather(x->shares, x->gathered, momentum_floats(&z, B), "momentum gradient carry all-gather");
        backward_carries(a, x, B);
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) unshear_head(a, s, x, d_qkv, B, T, h, false, thread_scratch(a, s, T));
}

/* ---- FMM across the shards: halos and far-field states */

/* The halo rows of (b, h): [2][halo][dh], k then v. */
static size_t halo_at(const attention_layer *a, int b, int h, int halo) {
    return ((size_t)b * a->H + h) * 2 * (size_t)halo * a->dh;
}

/* Packs this shard's first and last `halo` rows of k-hat and v for its neighbours. */
static void pack_halos(const attention_layer *a, const attention_saved *s, const exchange_areas *x, int B, int T,
                       int halo) {
    size_t bytes = sizeof(float) * (size_t)halo * a->dh;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++) {
            size_t off = attention_head_offset(a, b, h, T), at = halo_at(a, b, h, halo);
            const float *k = s->k_hat + off, *v = s->v_heads + off;
            size_t last = (size_t)(T - halo) * a->dh;
            memcpy(x->halo_send[0] + at, k + last, bytes), memcpy(x->halo_send[0] + at + halo * a->dh, v + last, bytes);
            memcpy(x->halo_send[1] + at, k, bytes), memcpy(x->halo_send[1] + at + halo * a->dh, v, bytes);
        }
}

/* A head's saved shard state: far_in, then the halo rows k, v (left, right). */
static float *shard_saved(const attention_layer *a, const attention_saved *s, int b, int h, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    size_t per_head = attention_shard_saved_per_head(&z);
    return s->saved + ((size_t)b * a->H + h) * per_head + (per_head - shard_state_floats(&z));
}

/* Keeps (b, h)'s far_in and the halo rows it received for the backward. */
static void keep_shard_state(const attention_layer *a, const attention_saved *s, const exchange_areas *x, int b, int h,
                             int T) {
    attention_layer_sizes z = sizes_of(a, T);
    int dh = a->dh, halo = halo_rows(&z), left = halo_left(&z), right = halo_right(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), at = halo_at(a, b, h, halo);
    float *kept = shard_saved(a, s, b, h, T);
    memcpy(kept, x->totals + ((size_t)b * a->H + h) * state, sizeof(float) * state);
    float *rows = kept + state;
    for (int kv = 0; kv < 2;
         kv++) { /* k, v: left halo rows (the last of the previous shard), right (the next's first) */
        memcpy(rows, x->halo_recv[0] + at + (size_t)kv * halo * dh + (size_t)(halo - left) * dh,
               sizeof(float) * left * dh);
        memcpy(rows + (size_t)left * dh, x->halo_recv[1] + at + (size_t)kv * halo * dh, sizeof(float) * right * dh);
        rows += (size_t)(left + right) * dh;
    }
}

/* The head's keys and values with their halos, into k_ext, v_ext. */
static fmm_shard shard_of(const attention_layer *a, const attention_saved *s, int b, int h, int T, float *k_ext,
                          float *v_ext, const float *far_grad_in) {
    attention_layer_sizes z = sizes_of(a, T);
    int dh = a->dh, left = halo_left(&z), right = halo_right(&z);
    size_t off = attention_head_offset(a, b, h, T), state = fmm_far_state_floats(a->fmm, dh);
    const float *kept = shard_saved(a, s, b, h, T), *rows = kept + state;
    const float *own[2] = {s->k_hat + off, s->v_heads + off};
    float *ext[2] = {k_ext, v_ext};
    for (int kv = 0; kv < 2; kv++) {
        const float *halo = rows + (size_t)kv * (left + right) * dh;
        memcpy(ext[kv], halo, sizeof(float) * left * dh);
        memcpy(ext[kv] + (size_t)left * dh, own[kv], sizeof(float) * T * dh);
        memcpy(ext[kv] + (size_t)(left + T) * dh, halo + (size_t)left * dh, sizeof(float) * right * dh);
    }
    fmm_shard shard = {a->cut->T_seq, left, right, k_ext, v_ext, kept, far_grad_in};
    return shard;
}

static void fmm_forward_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x, float *out,
                             int B, int T, int h, float *scratch) {
    attention_layer_sizes z = sizes_of(a, T);
    int d = a->d, dh = a->dh, Tk = halo_left(&z) + T + halo_right(&z);
    float *k_ext = scratch + fmm_head_scratch_floats(a->fmm, T, dh), *v_ext = k_ext + (size_t)Tk * dh;
    float *head_out = tail_scratch(a, scratch, T);
    for (int b = 0; b < B; b++) {
        keep_shard_state(a, s, x, b, h, T);
        size_t off = attention_head_offset(a, b, h, T);
        fmm_shard shard = shard_of(a, s, b, h, T, k_ext, v_ext, NULL);
        float *saved = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        fmm_head_forward(a->fmm, &shard, s->q_hat + off, s->k_hat + off, s->v_heads + off, a->blend[h],
                         a->blend[a->H + h], head_out, saved, scratch, T, dh);
        attention_scatter_head(out + (size_t)b * T * d, head_out, d, h * dh, T, dh);
    }
}

/* The far-field totals of every (b, h), then out = the state from the
 * other shards: the shards before (causal, a scan) or all others (the
 * group's sum less this shard's). */
static void far_field_exchange(const attention_layer *a, float *totals, float *scratch_out, size_t n, bool reverse,
                               const char *what) {
    if (a->cfg->causal) {
        context_scan(totals, scratch_out, n, reverse, what);
        memcpy(totals, scratch_out, sizeof(float) * n);
        return;
    }
    memcpy(scratch_out, totals, sizeof(float) * n);
    context_sum(scratch_out, n, what);
    for (size_t i = 0; i < n; i++) totals[i] = scratch_out[i] - totals[i];
}

static void fmm_shard_forward(const attention_layer *a, const attention_saved *s, const exchange_areas *x, float *out,
                              int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    int dh = a->dh, halo = halo_rows(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), halo_n = (size_t)B * a->H * 2 * halo * dh;
    if (halo > 0) {
        pack_halos(a, s, x, B, T, halo);
        context_shift(x->halo_send[0], halo_n, x->halo_recv[0], halo_n, false, "context halo send");
        if (!a->cfg->causal)
            context_shift(x->halo_send[1], halo_n, x->halo_recv[1], halo_n, true, "context halo send back");
    }
    if (state > 0) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++)
            for (int b = 0; b < B; b++) {
                size_t off = attention_head_offset(a, b, h, T);
                fmm_head_far_totals(a->fmm, s->k_hat + off, s->v_heads + off,
                                    x->totals + ((size_t)b * a->H + h) * state, thread_scratch(a, s, T), T, dh);
            }
        far_field_exchange(a, x->totals, x->grad_in, (size_t)B * a->H * state, false, "far-field state scan");
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) fmm_forward_head(a, s, x, out, B, T, h, thread_scratch(a, s, T));
}

/* Per head: the far-field gradient totals (grad = false) or the backward
 * itself, dq, dk, dv into d_qkv's columns and the halo keys' into the send
 * buffers. */
static void fmm_backward_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                              const float *d_out, float *d_qkv, int B, int T, int h, bool totals, float *scratch) {
    attention_layer_sizes z = sizes_of(a, T);
    int d = a->d, dh = a->dh, halo = halo_rows(&z), left = halo_left(&z), right = halo_right(&z);
    int Tk = left + T + right;
    size_t state = fmm_far_state_floats(a->fmm, dh);
    float *k_ext = scratch + fmm_head_scratch_floats(a->fmm, T, dh), *v_ext = k_ext + (size_t)Tk * dh;
    float *dk_ext = v_ext + (size_t)Tk * dh, *dv_ext = dk_ext + (size_t)Tk * dh;
    float *d_head_out = tail_scratch(a, scratch, T), *dq = d_head_out + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T), at = halo_at(a, b, h, halo);
        const float *saved = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        float *grad_in = x->grad_in + ((size_t)b * a->H + h) * state;
        fmm_shard shard = shard_of(a, s, b, h, T, k_ext, v_ext, state ? grad_in : NULL);
        attention_gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
        if (totals) {
            fmm_head_far_grad_totals(a->fmm, &shard, s->q_hat + off, a->blend[a->H + h], saved, d_head_out, grad_in,
                                     scratch, T, dh);
            continue;
        }
        fmm_head_backward(a->fmm, &shard, s->q_hat + off, s->k_hat + off, s->v_heads + off, a->blend[h],
                          a->blend[a->H + h], saved, d_head_out, dq, dk_ext, dv_ext, &a->d_blend[h],
                          &a->d_blend[a->H + h], scratch, T, dh);
        float *rows = d_qkv + (size_t)b * T * 3 * d;
        attention_scatter_head(rows, dq, 3 * d, h * dh, T, dh);
        attention_scatter_head(rows, dk_ext + (size_t)left * dh, 3 * d, d + h * dh, T, dh);
        attention_scatter_head(rows, dv_ext + (size_t)left * dh, 3 * d, 2 * d + h * dh, T, dh);
        for (int kv = 0; kv < 2; kv++) { /* the halo keys' gradients, for the shards that own them */
            const float *g = kv == 0 ? dk_ext : dv_ext;
            memset(x->halo_send[1] + at + (size_t)kv * halo * dh, 0, sizeof(float) * halo * dh);
            memcpy(x->halo_send[1] + at + (size_t)kv * halo * dh + (size_t)(halo - left) * dh, g,
                   sizeof(float) * left * dh);
            memcpy(x->halo_send[0] + at + (size_t)kv * halo * dh, g + (size_t)(left + T) * dh,
                   sizeof(float) * right * dh);
        }
    }
}

/* Adds the halo gradients received into the shard's first and last rows. */
static void add_halo_gradients(const attention_layer *a, const exchange_areas *x, float *d_qkv, int B, int T,
                               int halo) {
    int d = a->d, dh = a->dh, n = halo < T ? halo : T;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++)
            for (int kv = 0; kv < 2; kv++) {
                size_t at = halo_at(a, b, h, halo) + (size_t)kv * halo * dh;
                float *rows = d_qkv + (size_t)b * T * 3 * d + (size_t)(kv + 1) * d + h * dh;
                for (int t = 0; t < n; t++) { /* from the next shard: its left halo is my last rows */
                    const float *g = x->halo_recv[1] + at + (size_t)(halo - n + t) * dh;
                    float *row = rows + (size_t)(T - n + t) * 3 * d;
                    for (int c = 0; c < dh; c++) row[c] += g[c];
                }
                for (int t = 0; t < n && !a->cfg->causal; t++) { /* from the previous: its right halo, my first rows */
                    const float *g = x->halo_recv[0] + at + (size_t)t * dh;
                    float *row = rows + (size_t)t * 3 * d;
                    for (int c = 0; c < dh; c++) row[c] += g[c];
                }
            }
}

static void fmm_shard_backward(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                               const float *d_out, float *d_qkv, int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    int dh = a->dh, halo = halo_rows(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), halo_n = (size_t)B * a->H * 2 * halo * dh;
    if (state > 0) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++) fmm_backward_head(a, s, x, d_out, d_qkv, B, T, h, true, thread_scratch(a, s, T));
        far_field_exchange(a, x->grad_in, x->totals, (size_t)B * a->H * state, true, "far-field gradient scan");
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) fmm_backward_head(a, s, x, d_out, d_qkv, B, T, h, false, thread_scratch(a, s, T));
    if (halo > 0) {
        context_shift(x->halo_send[1], halo_n, x->halo_recv[1], halo_n, true, "context halo gradient send");
        if (!a->cfg->causal)
            context_shift(x->halo_send[0], halo_n, x->halo_recv[0], halo_n, false, "context halo gradient send on");
        add_halo_gradients(a, x, d_qkv, B, T, halo);
    }
}

/* ---- exact softmax across the shards: ring attention */

/* A ring block: [B][H][4][most][dh], k, v, dk, dv of one rank's rows. */
static float *block_part(const attention_layer *a, float *block, int b, int h, int part, int most) {
    return block + (((size_t)b * a->H + h) * 4 + part) * (size_t)most * a->dh;
}

/* The pairs of a query range (chunk qc) and a key range (chunk kc): every
 * key visible, the causal diagonal, or none (zigzag keeps them whole). */
static int pair_kind(bool causal, int qc, int kc) { return !causal || kc < qc ? 1 : kc == qc ? 0 : -1; }

static void ring_forward_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                              const float *block, const context_cut *owner, int B, int T, int h, float *scratch) {
    attention_layer_sizes z = sizes_of(a, T);
    int dh = a->dh, most = most_rows(a->cut);
    float *bout = scratch + tiled_softmax_scratch_floats(T, dh), *blse = bout + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        float *lse = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z), *acc = x->acc + off;
        const float *k = block_part(a, (float *)block, b, h, 0, most),
                    *v = block_part(a, (float *)block, b, h, 1, most);
        for (int qr = 0; qr < a->cut->n; qr++) {
            int q0 = range_row(a->cut, qr), tq = a->cut->len[qr];
            for (int kr = 0, k0 = 0; kr < owner->n; k0 += owner->len[kr], kr++) {
                int kind = pair_kind(a->cfg->causal, a->cut->chunk[qr], owner->chunk[kr]);
                if (kind < 0) continue;
                tiled_softmax_forward(bout, blse, s->q_hat + off + (size_t)q0 * dh, k + (size_t)k0 * dh,
                                      v + (size_t)k0 * dh, tq, owner->len[kr], dh,
                                      kind == 0 ? 0 : a->cut->start[qr] - owner->start[kr], kind == 0, a->fmm->bf16,
                                      scratch);
                tiled_softmax_merge(acc + (size_t)q0 * dh, lse + q0, bout, blse, tq, dh);
            }
        }
    }
}

/* This rank's k-hat and v into a ring block. */
static void fill_block(const attention_layer *a, const attention_saved *s, float *block, int B, int T) {
    int most = most_rows(a->cut);
    size_t bytes = sizeof(float) * (size_t)T * a->dh;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++) {
            size_t off = attention_head_offset(a, b, h, T);
            memcpy(block_part(a, block, b, h, 0, most), s->k_hat + off, bytes);
            memcpy(block_part(a, block, b, h, 1, most), s->v_heads + off, bytes);
            memset(block_part(a, block, b, h, 2, most), 0, 2 * sizeof(float) * (size_t)most * a->dh);
        }
}

/* The cut of the rank whose block arrives at ring step `step`. */
static context_cut block_owner(const attention_layer *a, int step) {
    int C = context_size(), owner = (context_rank() - step + C) % C;
    return context_cut_of(a->cut->T_seq, C, owner, a->cut->n == 2);
}

static void ring_shard_forward(const attention_layer *a, const attention_saved *s, const exchange_areas *x, float *out,
                               int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    int C = context_size(), most = most_rows(a->cut), d = a->d, dh = a->dh;
    size_t block_n = (size_t)B * a->H * 4 * most * dh;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++) {
            float *lse = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
            for (int i = 0; i < T; i++) lse[i] = -INFINITY;
        }
    memset(x->acc, 0, sizeof(float) * (size_t)B * a->H * T * dh);
    fill_block(a, s, x->blocks[0], B, T);
    for (int step = 0; step < C; step++) {
        float *here = x->blocks[step & 1], *next = x->blocks[(step + 1) & 1];
        if (step + 1 < C) context_ring_start(here, next, block_n, "ring attention block");
        context_cut owner = block_owner(a, step);
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++) {
            ring_forward_head(a, s, x, here, &owner, B, T, h, thread_scratch(a, s, T));
            if (omp_get_thread_num() == 0) context_progress();
        }
        if (step + 1 < C) context_ring_wait();
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++)
            attention_scatter_head(out + (size_t)b * T * d, x->acc + attention_head_offset(a, b, h, T), d, h * dh, T,
                                   dh);
}

static void ring_backward_head(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                               float *block, const context_cut *owner, const float *d_out, int B, int T, int h,
                               float *scratch) {
    attention_layer_sizes z = sizes_of(a, T);
    int d = a->d, dh = a->dh, most = most_rows(a->cut);
    float *d_head_out = tail_scratch(a, scratch, T), *head_out = d_head_out + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        const float *lse = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        attention_gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
        attention_gather_head(head_out, s->out + (size_t)b * T * d, d, h * dh, T, dh);
        float *k = block_part(a, block, b, h, 0, most), *v = block_part(a, block, b, h, 1, most);
        float *dk = block_part(a, block, b, h, 2, most), *dv = block_part(a, block, b, h, 3, most);
        for (int qr = 0; qr < a->cut->n; qr++) {
            int q0 = range_row(a->cut, qr), tq = a->cut->len[qr];
            for (int kr = 0, k0 = 0; kr < owner->n; k0 += owner->len[kr], kr++) {
                int kind = pair_kind(a->cfg->causal, a->cut->chunk[qr], owner->chunk[kr]);
                if (kind < 0) continue;
                size_t qa = (size_t)q0 * dh, ka = (size_t)k0 * dh;
                tiled_softmax_band_backward(x->acc + off + qa, dk + ka, dv + ka, d_head_out + qa, head_out + qa,
                                            lse + q0, s->q_hat + off + qa, k + ka, v + ka, tq, owner->len[kr], dh,
                                            kind == 0 ? 0 : a->cut->start[qr] - owner->start[kr], kind == 0, 0, true,
                                            a->fmm->bf16, scratch);
            }
        }
    }
}

/* K, V and their gradient accumulators travel the ring; after C steps the
 * accumulators are back with the rank whose keys they are. */
static void ring_shard_backward(const attention_layer *a, const attention_saved *s, const exchange_areas *x,
                                const float *d_out, float *d_qkv, int B, int T) {
    int C = context_size(), most = most_rows(a->cut), d = a->d, dh = a->dh;
    size_t block_n = (size_t)B * a->H * 4 * most * dh;
    memset(x->acc, 0, sizeof(float) * (size_t)B * a->H * T * dh);
    fill_block(a, s, x->blocks[0], B, T);
    for (int step = 0; step < C; step++) {
        float *here = x->blocks[step & 1], *next = x->blocks[(step + 1) & 1];
        context_cut owner = block_owner(a, step);
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++)
            ring_backward_head(a, s, x, here, &owner, d_out, B, T, h, thread_scratch(a, s, T));
        context_ring_start(here, next, block_n, "ring attention gradient block");
        context_ring_wait();
    }
    float *home = x->blocks[C & 1]; /* this rank's keys' block, back after C steps */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++) {
            float *rows = d_qkv + (size_t)b * T * 3 * d;
            attention_scatter_head(rows, x->acc + attention_head_offset(a, b, h, T), 3 * d, h * dh, T, dh);
            attention_scatter_head(rows, block_part(a, home, b, h, 2, most), 3 * d, d + h * dh, T, dh);
            attention_scatter_head(rows, block_part(a, home, b, h, 3, most), 3 * d, 2 * d + h * dh, T, dh);
        }
}

/* ---- entry points */

void attention_shard_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B,
                             int T) {
    attention_layer_sizes z = sizes_of(a, T);
    size_t total;
    exchange_areas x = carve_exchange(&z, B, s->exchange, &total);
    shard_prepare(a, s, &x, qkv, B, T);
    if (is_fmm(a)) fmm_shard_forward(a, s, &x, out, B, T);
    else ring_shard_forward(a, s, &x, out, B, T);
}

void attention_shard_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv,
                              int B, int T) {
    attention_layer_sizes z = sizes_of(a, T);
    size_t total;
    exchange_areas x = carve_exchange(&z, B, s->exchange, &total);
    if (is_fmm(a)) fmm_shard_backward(a, s, &x, d_out, d_qkv, B, T);
    else ring_shard_backward(a, s, &x, d_out, d_qkv, B, T);
    shard_unprepare(a, s, &x, d_qkv, B, T);
}
