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
 *             momentum shares -> all-gather -> carries -> unshear, unrotate
 *
 * The FMM phases are shard_fmm.c's, the ring's shard_ring.c's. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention/fmm.h"
#include "kernels/kernels.h"
#include "kernels/tiled_softmax.h"
#include "parallel/context.h"

#include "attention_shard.h"
#include "attention_vectors.h"
#include "shard_internal.h"

/* ---- the exchange buffer (the geometry and sizes: shard_geometry.c) */

static bool is_fmm(const attention_layer *a) { return a->cfg->attention == ATTENTION_FMM; }

static size_t momentum_floats(const attention_layer_sizes *z, int B) {
    return (size_t)B * 2 * z->cfg->n_heads * 2 * 2 * config_head_dim(z->cfg);
}

static shard_exchange carve_exchange(const attention_layer_sizes *z, int B, float *base, size_t *total) {
    shard_exchange x;
    int H = z->cfg->n_heads, dh = config_head_dim(z->cfg), C = context_size();
    size_t mom = momentum_floats(z, B), halo = (size_t)B * H * 2 * shard_halo_rows(z) * dh;
    size_t state = z->cfg->attention == ATTENTION_FMM ? (size_t)B * H * fmm_far_state_floats(z->fmm, dh) : 0;
    bool ring = z->cfg->attention != ATTENTION_FMM;
    size_t block = ring ? (size_t)B * H * 4 * shard_most_rows(z->cut) * dh : 0,
           acc = ring ? (size_t)B * H * z->T * dh : 0;
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
static void forward_carries(const attention_layer *a, const shard_exchange *x, int B) {
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
static void backward_carries(const attention_layer *a, const shard_exchange *x, int B) {
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

static attention_span forward_span(const attention_layer *a, const shard_exchange *x, int b, int which, int h, int r) {
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

static attention_span backward_span(const attention_layer *a, const shard_exchange *x, int b, int which, int h, int r) {
    attention_span span = forward_span(a, x, b, which, h, r);
    bool last = span.holds_last;
    const float *carry = x->carries + share_at(a, b, which, h, r);
    span.g_next = last ? NULL : carry;
    span.u_next = last ? NULL : carry + a->dh;
    return span;
}

/* Per head: q, k into q-hat, k-hat in the shear's frame, and their shares. */
static void rotate_and_share(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                             const float *qkv, int B, int T, int h, float *zero) {
    int d = a->d, dh = a->dh;
    for (int b = 0; b < B; b++) {
        const float *rows = qkv + (size_t)b * T * 3 * d;
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            float *dst = (which == VECTOR_Q ? s->q_hat : s->k_hat) + off;
            attention_gather_head(dst, rows, 3 * d, which * d + h * dh, T, dh);
            for (int r = 0; r < a->cut->n; r++) {
                float *range = dst + (size_t)shard_range_row(a->cut, r) * dh;
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
static void shear_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x, int B, int T, int h,
                       float *raw) {
    int dh = a->dh;
    bool keep_p = s->p_q != NULL;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            float *dst = (which == VECTOR_Q ? s->q_hat : s->k_hat) + off;
            float *p = keep_p ? (which == VECTOR_Q ? s->p_q : s->p_k) + off : NULL;
            for (int r = 0; r < a->cut->n; r++) {
                size_t at = (size_t)shard_range_row(a->cut, r) * dh;
                int len = a->cut->len[r];
                attention_span span = forward_span(a, x, b, which, h, r);
                if (attention_is_sheared(a, which)) {
                    memcpy(raw, dst + at, sizeof(float) * len * dh);
                    attention_shear(a, h, which, raw, dst + at, p ? p + at : NULL, len, &span);
                } else {
                    rope_forward(dst + at, dst + at, a->rope_cos, a->rope_sin, len, dh, span.pos0);
                }
            }
        }
    }
}

/* q-hat, k-hat, v of the shard: rotated at their global positions, sheared
 * with the carries from the ranges before them. */
static void shard_prepare(const attention_layer *a, const attention_saved *s, const shard_exchange *x, const float *qkv,
                          int B, int T) {
    float zero[a->dh];
    memset(zero, 0, sizeof zero);
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) rotate_and_share(a, s, x, qkv, B, T, h, zero);
    if (a->momentum) {
        attention_layer_sizes z = shard_sizes(a, T);
        context_allgather(x->shares, x->gathered, momentum_floats(&z, B), "momentum carry all-gather");
        forward_carries(a, x, B);
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++)
        shear_head(a, s, x, B, T, h, shard_tail_scratch(a, shard_thread_scratch(a, s, T), T));
}

/* Per head: the gradients of q-hat, k-hat (in d_qkv's columns) back through
 * the shear and the rotation; the shares come first (share = true). */
static void unshear_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *d_qkv,
                         int B, int T, int h, bool share, float *scratch) {
    int d = a->d, dh = a->dh;
    float *d_hat = shard_tail_scratch(a, scratch, T), *d_raw = d_hat + (size_t)T * dh;
    bool keep_p = s->p_q != NULL;
    for (int b = 0; b < B; b++) {
        float *rows = d_qkv + (size_t)b * T * 3 * d;
        size_t off = attention_head_offset(a, b, h, T);
        for (int which = 0; which < 2; which++) {
            attention_gather_head(d_hat, rows, 3 * d, which * d + h * dh, T, dh);
            const float *p = keep_p ? (which == VECTOR_Q ? s->p_q : s->p_k) + off : NULL;
            for (int r = 0; r < a->cut->n; r++) {
                size_t at = (size_t)shard_range_row(a->cut, r) * dh;
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
static void shard_unprepare(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *d_qkv,
                            int B, int T) {
    if (a->momentum) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++) unshear_head(a, s, x, d_qkv, B, T, h, true, shard_thread_scratch(a, s, T));
        attention_layer_sizes z = shard_sizes(a, T);
        context_allgather(x->shares, x->gathered, momentum_floats(&z, B), "momentum gradient carry all-gather");
        backward_carries(a, x, B);
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) unshear_head(a, s, x, d_qkv, B, T, h, false, shard_thread_scratch(a, s, T));
}

/* ---- entry points */

void attention_shard_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B,
                             int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    size_t total;
    shard_exchange x = carve_exchange(&z, B, s->exchange, &total);
    shard_prepare(a, s, &x, qkv, B, T);
    if (is_fmm(a)) shard_fmm_forward(a, s, &x, out, B, T);
    else shard_ring_forward(a, s, &x, out, B, T);
}

void attention_shard_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv,
                              int B, int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    size_t total;
    shard_exchange x = carve_exchange(&z, B, s->exchange, &total);
    if (is_fmm(a)) shard_fmm_backward(a, s, &x, d_out, d_qkv, B, T);
    else shard_ring_backward(a, s, &x, d_out, d_qkv, B, T);
    shard_unprepare(a, s, &x, d_qkv, B, T);
}
