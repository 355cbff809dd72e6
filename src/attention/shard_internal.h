/* What the parts of attention on a shard share (docs/design.md §8.12):
 * attention_shard.c (the exchange buffer, momentum's carries and the entry
 * points) calls shard_fmm.c (FMM's halos and far-field states) and
 * shard_ring.c (exact softmax by ring attention); all three read
 * shard_geometry.c (the halo, ranges, sizes and scratch), which calls none
 * of them. Private to src/attention/. */
#ifndef MOMFMM_SHARD_INTERNAL_H
#define MOMFMM_SHARD_INTERNAL_H
#include <stddef.h>

#include "attention/attention_types.h"

/* The exchange buffer, carved (attention_exchange_floats sizes it). Per
 * (row b, vector q|k, head, range): the momentum shares and carries. */
typedef struct {
    float *shares, *gathered, *carries; /* [B][2][H][2][2][dh], [C][...], [B][2][H][2][2][dh] */
    float *halo_send[2], *halo_recv[2]; /* [B][H][2][halo][dh]: forward (to next), reverse (to previous) */
    float *totals, *grad_in;            /* [B][H][state] */
    float *blocks[2];                   /* ring: [B][H][4][most][dh], two in turn */
    float *acc;                         /* ring: [B][H][T][dh], the merged output or dq */
} shard_exchange;

/* The layer's sizes for a shard of T rows. */
attention_layer_sizes shard_sizes(const attention_layer *a, int T);
/* The band's halo: the k - 1 keys before a shard (and after it,
 * non-causal); of those, the ones that exist before (left) and after
 * (right) this shard. */
int shard_halo_rows(const attention_layer_sizes *z);
int shard_halo_left(const attention_layer_sizes *z);
int shard_halo_right(const attention_layer_sizes *z);
/* The most rows any context rank holds (ring blocks are sent at this size). */
int shard_most_rows(const context_cut *cut);
/* What a shard keeps beyond the kernel's own: far_in, then the halo rows. */
size_t shard_state_floats(const attention_layer_sizes *z);
/* Rows of range r within a head's [T, dh] (ranges are stored in order). */
int shard_range_row(const context_cut *cut, int r);
/* This thread's head scratch (attention_shard_scratch_per_head floats),
 * and the last 5 [T, dh] of a head's scratch. */
float *shard_thread_scratch(const attention_layer *a, const attention_saved *s, int T);
float *shard_tail_scratch(const attention_layer *a, float *scratch, int T);

/* FMM on the shard (shard_fmm.c): the band with its halos, the far field
 * with the state of the other shards; q-hat, k-hat and v prepared. */
void shard_fmm_forward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *out, int B,
                       int T);
void shard_fmm_backward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, const float *d_out,
                        float *d_qkv, int B, int T);
/* Exact softmax on the shard (shard_ring.c): C ring steps of the key
 * blocks, merged by log-sum-exp; backward sends the key gradients along. */
void shard_ring_forward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *out, int B,
                        int T);
void shard_ring_backward(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                         const float *d_out, float *d_qkv, int B, int T);
#endif
