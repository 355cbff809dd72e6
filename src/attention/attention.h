/* The attention sublayer (docs/model.md §1.1-1.3): split q, k, v into heads, rotate
 * (RoPE) and shear (momentum) q and k, run softmax or FMM attention per head,
 * merge the heads. In the layers of docs/design.md §8.1 it sits below the
 * model and above the kernels: it sees one block through attention_layer,
 * which model.c and stream.c fill, and never includes model.h. */
#ifndef MOMFMM_ATTENTION_H
#define MOMFMM_ATTENTION_H
#include <stdbool.h>
#include <stddef.h>

#include "attention/fmm.h"
#include "config/config.h"
#include "parallel/context.h"

/* One block's attention: settings, tables and parameters (a view). */
typedef struct {
    const config *cfg; /* kind, causality, momentum settings */
    const fmm_settings *fmm;
    int d, H, dh;
    bool momentum; /* the shear applies (config_momentum_enabled) */
    const float *rope_cos, *rope_sin;
    const float *gamma;       /* learned gamma [H], or NULL (cfg->gamma) */
    const float *blend;       /* FMM blend logits [2][H], or NULL */
    float *d_gamma, *d_blend; /* their gradients (backward only), or NULL */
    const float *buffers;     /* momentum buffers prev_q, prev_k: [2][H][dh] */
    float *buffer_sums;       /* [2][H][dh]: last-position sums to collect, or NULL */
    /* this rank's positions of every sequence when a context group shares
     * them (docs/design.md §8.12), or NULL: whole sequences */
    const context_cut *cut;
} attention_layer;

/* What one block's forward on B rows of T keeps for its backward. */
typedef struct {
    float *q_hat, *k_hat, *v_heads; /* [B][H][T][dh]: rotated and sheared */
    float *p_q, *p_k;               /* momentum p [B][H][T][dh] (learned gamma), or NULL */
    float *saved;                   /* [B][H][attention_saved_per_head] */
    const float *out;               /* [B][T][d]: the merged heads' output (backward of tiled softmax) */
    float *scratch;                 /* threads x attention_scratch_per_head floats */
    int threads;                    /* heads that may run at once, one scratch area each */
    float *exchange;                /* attention_exchange_floats: the context group's messages */
} attention_saved;

/* One block's streaming state for S sequences (docs/model.md §1.2: the carry). */
typedef struct {
    int S, capacity, pos;     /* sequences, cache positions, positions consumed */
    float *k_cache, *v_cache; /* [S][H][capacity][dh] (k-hat after shear, RoPE) */
    float *carry_x, *carry_p; /* [2][S][H][dh]: previous x and p of q and k */
    float *far_state;         /* [S][H][fmm_stream_state_floats] */
    float *scratch;           /* attention_stream_scratch_floats */
    float *probs;             /* [n_max][capacity] attention weights (dense softmax), or NULL */
    int rope_pos;             /* the segment's first row in the layer's rope tables */
    bool continued;           /* an earlier position exists (perhaps slid out of the cache) */
} attention_stream_layer;

/* What one block's sizes depend on: T rows per sequence on this rank, and
 * the cut (NULL: whole sequences). */
typedef struct {
    const config *cfg;
    const fmm_settings *fmm;
    const context_cut *cut;
    int T;
} attention_layer_sizes;

/* Floats per (row, head) kept between forward and backward, and the
 * per-head scratch (dh = d_model / n_heads). */
size_t attention_saved_per_head(const attention_layer_sizes *z);
size_t attention_scratch_per_head(const attention_layer_sizes *z);
/* Floats of the exchange buffer for B rows (0 for whole sequences). */
size_t attention_exchange_floats(const attention_layer_sizes *z, int B);
/* Heads run on this many threads at once (OpenMP's), each with its own
 * scratch of attention_scratch_per_head floats. */
int attention_threads(void);
/* Scratch of attention_stream_forward for segments of up to n_max. */
size_t attention_stream_scratch_floats(const config *cfg, const fmm_settings *fmm, int n_max, int dh);
/* The attention weights of a segment, [n_max][capacity]: only dense softmax
 * stores them. */
size_t attention_stream_probs_floats(const config *cfg, int n_max, int capacity);

/* qkv [B*T*3d] -> merged heads out [B*T*d]. */
void attention_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B, int T);
/* d_out [B*T*d] -> d_qkv [B*T*3d] (overwritten); adds into d_gamma, d_blend. */
void attention_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv, int B,
                        int T);
/* The weight of value j in output i of head h, batch row b, after a
 * forward on rows of T (the attention read-out of docs/metrics.md §3):
 * softmax's p_ij, FMM's near and far coefficients together (fmm_head_weight);
 * 0 for a masked key. O(dh) from the saved state: never a T x T pass. */
float attention_weight(const attention_layer *a, const attention_saved *s, int b, int h, int T, int i, int j);
/* The same sublayer on a streamed segment: qkv [S*n*3d] -> out [S*n*d];
 * appends to the caches and updates the carries (st->pos is not advanced). */
void attention_stream_forward(const attention_layer *a, const attention_stream_layer *st, const float *qkv, float *out,
                              int n);
#endif
