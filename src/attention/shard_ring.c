/* Exact softmax attention on a shard of each sequence: ring attention
 * (docs/design.md §8.12). Every rank's keys and values travel the context
 * group's ring in C steps, each block's output merged into the running one
 * by log-sum-exp (tiled_softmax_merge); with a causal mask the zigzag cut
 * gives every rank the same share of visible pairs. The next block's send
 * overlaps this block's products. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/tiled_softmax.h"
#include "parallel/context.h"

#include "attention_shard.h"
#include "attention_vectors.h"
#include "shard_internal.h"

/* A ring block: [B][H][4][most][dh], k, v, dk, dv of one rank's rows. */
static float *block_part(const attention_layer *a, float *block, int b, int h, int part, int most) {
    return block + (((size_t)b * a->H + h) * 4 + part) * (size_t)most * a->dh;
}

/* The pairs of a query range (chunk qc) and a key range (chunk kc): every
 * key visible, the causal diagonal, or none (zigzag keeps them whole). */
static int pair_kind(bool causal, int qc, int kc) { return !causal || kc < qc ? 1 : kc == qc ? 0 : -1; }

static void ring_forward_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                              const float *block, const context_cut *owner, int B, int T, int h, float *scratch) {
    attention_layer_sizes z = shard_sizes(a, T);
    int dh = a->dh, most = shard_most_rows(a->cut);
    float *bout = scratch + tiled_softmax_scratch_floats(T, dh), *blse = bout + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        float *lse = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z), *acc = x->acc + off;
        const float *k = block_part(a, (float *)block, b, h, 0, most),
                    *v = block_part(a, (float *)block, b, h, 1, most);
        for (int qr = 0; qr < a->cut->n; qr++) {
            int q0 = shard_range_row(a->cut, qr), tq = a->cut->len[qr];
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
    int most = shard_most_rows(a->cut);
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

void shard_ring_forward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *out, int B,
                        int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    int C = context_size(), most = shard_most_rows(a->cut), d = a->d, dh = a->dh;
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
            ring_forward_head(a, s, x, here, &owner, B, T, h, shard_thread_scratch(a, s, T));
            if (omp_get_thread_num() == 0) context_progress();
        }
        if (step + 1 < C) context_ring_wait();
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++)
            attention_scatter_head(out + (size_t)b * T * d, x->acc + attention_head_offset(a, b, h, T), d, h * dh, T,
                                   dh);
}

static void ring_backward_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                               float *block, const context_cut *owner, const float *d_out, int B, int T, int h,
                               float *scratch) {
    attention_layer_sizes z = shard_sizes(a, T);
    int d = a->d, dh = a->dh, most = shard_most_rows(a->cut);
    float *d_head_out = shard_tail_scratch(a, scratch, T), *head_out = d_head_out + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T);
        const float *lse = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        attention_gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
        attention_gather_head(head_out, s->out + (size_t)b * T * d, d, h * dh, T, dh);
        float *k = block_part(a, block, b, h, 0, most), *v = block_part(a, block, b, h, 1, most);
        float *dk = block_part(a, block, b, h, 2, most), *dv = block_part(a, block, b, h, 3, most);
        for (int qr = 0; qr < a->cut->n; qr++) {
            int q0 = shard_range_row(a->cut, qr), tq = a->cut->len[qr];
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
void shard_ring_backward(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                         const float *d_out, float *d_qkv, int B, int T) {
    int C = context_size(), most = shard_most_rows(a->cut), d = a->d, dh = a->dh;
    size_t block_n = (size_t)B * a->H * 4 * most * dh;
    memset(x->acc, 0, sizeof(float) * (size_t)B * a->H * T * dh);
    fill_block(a, s, x->blocks[0], B, T);
    for (int step = 0; step < C; step++) {
        float *here = x->blocks[step & 1], *next = x->blocks[(step + 1) & 1];
        context_cut owner = block_owner(a, step);
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++)
            ring_backward_head(a, s, x, here, &owner, d_out, B, T, h, shard_thread_scratch(a, s, T));
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
