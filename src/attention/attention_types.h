/* The views through which the model hands one block to the attention
 * sublayer (attention.h): its settings and parameters, what its forward
 * keeps for backward, its streaming state, and what its sizes depend on.
 * Apart from attention.h so that the files behind it (attention_vectors.c,
 * attention_shard.c) see the types without the entry points that call
 * them. */
#ifndef MOMFMM_ATTENTION_TYPES_H
#define MOMFMM_ATTENTION_TYPES_H
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
    int threads;                    /* (row, head) pairs that may run at once, one scratch area each */
    float *row_sums;                /* attention_row_sums_floats: each batch row's share of the sums over the batch */
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
#endif
