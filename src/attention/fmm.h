/* FMM attention for one head (docs/model.md §1.3): banded softmax near field plus
 * multi-kernel linear far field, blended by sigmoid(w_near), sigmoid(w_far).
 * Every array is row-major [T, dh] for one (batch row, head); nothing here is
 * ever T x T.  Memory is O(T * (bandwidth + dh)) per head. */
#ifndef MOMFMM_FMM_H
#define MOMFMM_FMM_H
#include <stdbool.h>
#include <stddef.h>

#define FMM_MAX_KERNELS 8

/* In the order of the names of fmm.kernels (config.h, CONFIG_FMM_KERNELS),
 * whose indices the model copies into fmm_settings. */
typedef enum { FEATURE_ELU = 0, FEATURE_ELU_FLIP = 1, FEATURE_TANH = 2 } fmm_feature_map;

typedef struct {
    int bandwidth; /* k of docs/model.md §1.3; 0 drops the near field */
    bool causal;
    int n_kernels; /* r; 0 drops the far field */
    fmm_feature_map kernels[FMM_MAX_KERNELS];
    float eps;       /* normaliser epsilon of the far field */
    int chunk;       /* chunk length C of the chunked linear attention */
    bool band_tiles; /* a wide band may run on tiled_softmax's kernel (attention.impl = tiled) */
    /* products on bf16 operands (train.precision = bf16, docs/design.md
     * §8.10): the band's tiles and the far field here, and softmax
     * attention's tiles, which read it from the same settings; an fp32
     * forward of a bf16 model (gain_R's, docs/metrics.md §3) clears it */
    bool bf16;
} fmm_settings;

/* A head's T rows as one shard of a sequence cut across the ranks of a
 * context group (docs/design.md §8.12). The rows see the same keys as on
 * one rank: the band's halo keys of the neighbouring shards, and, in the
 * far field, the sums of the other shards' keys in range. A NULL shard is
 * a whole sequence. */
typedef struct {
    int T_seq;          /* the whole sequence's length (the band's clamp) */
    int left, right;    /* halo keys before and after the rows */
    const float *k, *v; /* [left + T + right, dh]: the band's keys and values, the rows' own in the middle */
    /* [n_kernels][dh, dh + 1]: Σ φ_l(k_j) ⊗ [v_j | 1] over the keys of the
     * other shards that the rows see (causal: those before), or NULL */
    const float *far_in;
    /* backward: [n_kernels][dh + 1, dh]: Σ u'_i ⊗ φ_l(q_i) over the rows of
     * the other shards that see these keys (causal: those after), or NULL */
    const float *far_grad_in;
} fmm_shard;

/* Floats of one kernel set's far-field state, [n_kernels][dh, dh + 1]
 * (far_in, far_grad_in and the totals below). */
size_t fmm_far_state_floats(const fmm_settings *s, int dh);
/* This shard's share of the other shards' far_in: per kernel φ(K)ᵀ [V | 1]
 * of its T keys; and of their far_grad_in, from the forward's `saved` and
 * dout (both O(T dh²), nothing T x T). */
void fmm_head_far_totals(const fmm_settings *s, const float *k, const float *v, float *totals, float *scratch, int T,
                         int dh);
void fmm_head_far_grad_totals(const fmm_settings *s, const fmm_shard *shard, const float *q, float blend_far,
                              const float *saved, const float *dout, float *totals, float *scratch, int T, int dh);

/* Floats saved between forward and backward, per head. */
size_t fmm_head_saved_floats(const fmm_settings *s, int T, int dh);
/* Floats of scratch one call needs (reused across heads, not kept). */
size_t fmm_head_scratch_floats(const fmm_settings *s, int T, int dh);

/* out = sigmoid(blend_near) * near + sigmoid(blend_far) * (1/r) sum_l far_l.
 * q, k are the (possibly sheared, rotated) q-hat, k-hat of docs/model.md §1.3;
 * shard (or NULL) places the T rows in a longer sequence. */
void fmm_head_forward(const fmm_settings *s, const fmm_shard *shard, const float *q, const float *k, const float *v,
                      float blend_near, float blend_far, float *out, float *saved, float *scratch, int T, int dh);

/* Writes (overwrites) dq [T, dh] and dk, dv: [left + T + right, dh] for a
 * shard (the halo keys' gradients go back to their shards), [T, dh] else;
 * adds into *d_blend_near, *d_blend_far. */
void fmm_head_backward(const fmm_settings *s, const fmm_shard *shard, const float *q, const float *k, const float *v,
                       float blend_near, float blend_far, const float *saved, const float *dout, float *dq, float *dk,
                       float *dv, float *d_blend_near, float *d_blend_far, float *scratch, int T, int dh);
/* The weight of value j in output i of a forward (docs/metrics.md §3, the
 * attention read-out): out_i = sum_j weight(i, j) v_j exactly, from q, k
 * and the forward's `saved`, in O(dh): nothing T x T. */
float fmm_head_weight(const fmm_settings *s, const float *q, const float *k, float blend_near, float blend_far,
                      const float *saved, int T, int dh, int i, int j);
/* phi(x) of a feature map (docs/model.md §1.3), the same function the kernels use. */
float fmm_feature(fmm_feature_map m, float x);

/* Streaming (causal) FMM for one head (fmm_stream.c): queries q [n, dh] at
 * positions pos..pos+n-1; k_all, v_all hold every key and value 0..pos+n-1.
 * far_state carries, per kernel, sum phi(k_j) v_j^T [dh, dh] and
 * sum phi(k_j) [dh] over j < pos, and is advanced to pos + n: the far field
 * costs O(dh^2) per token, never a pass over the whole prefix.
 * scratch: fmm_stream_scratch_floats. */
size_t fmm_stream_state_floats(const fmm_settings *s, int dh);
size_t fmm_stream_scratch_floats(const fmm_settings *s, int dh);
void fmm_head_stream(const fmm_settings *s, const float *q, const float *k_all, const float *v_all, int pos, int n,
                     float blend_near, float blend_far, float *far_state, float *out, float *scratch, int dh);
#endif
