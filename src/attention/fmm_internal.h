/* What the files of FMM attention share (docs/model.md §1.3): fmm_head.c (sizes
 * and the entry points of fmm.h), fmm_near.c (the banded softmax near
 * field, on rows or on tiles), fmm_far.c (the feature maps and the chunked
 * linear-attention far field) and fmm_stream.c (the same field one token at
 * a time). Private to src/attention/ (docs/design.md §8.1). */
#ifndef MOMFMM_FMM_INTERNAL_H
#define MOMFMM_FMM_INTERNAL_H
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attention/fmm.h"

static inline float fmm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The dh-long loops run in blocks of 8 so that gcc -O2, which vectorises
 * only loops of known length, vectorises them (8 partial sums in dot). */
static inline float fmm_dot(const float *restrict a, const float *restrict b, int n) {
    float part[8] = {0}, acc = 0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc += a[i] * b[i];
    for (int j = 0; j < 8; j++) acc += part[j];
    return acc;
}

static inline void fmm_add_scaled(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) y[i + j] += a * x[i + j];
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---- near field (fmm_near.c) ---- */

/* Keys j of row i lie in [i - half + 1, i] (causal) or |i - j| < half
 * (non-causal).  half = min(bandwidth, T): a band wider than the sequence
 * holds the same keys, and clamping keeps `saved` at most [T, 2T - 1].
 * The keys are an array of Tk rows in which row i's own key is i + left:
 * a shard's rows read `left` halo keys before them (context parallelism,
 * docs/design.md §8.12); a whole sequence has left = 0, Tk = T. */
typedef struct {
    int half, width;
    bool causal;
    int left, Tk;
    bool bf16; /* the tiles' products on bf16 operands (fmm_settings) */
} fmm_band;

/* The band of a whole sequence of T, or of a shard's T rows (shard: NULL
 * for a whole sequence). */
fmm_band fmm_band_of(const fmm_settings *s, int T);
fmm_band fmm_band_of_shard(const fmm_settings *s, const fmm_shard *shard, int T);
/* Whether the band runs on tiled_softmax's tiles (attention.impl = tiled and
 * wide enough, FMM_TILED_BAND_MIN_WIDTH). */
bool fmm_band_on_tiles(const fmm_settings *s, const fmm_band *g);
/* The near field's share of `saved`. */
size_t fmm_band_saved_floats(const fmm_settings *s, const fmm_band *g, int T, int dh);
/* Row i's keys are j in [*lo, *hi]; returns the key of p's column 0. */
int fmm_band_limits(const fmm_band *g, int i, int *lo, int *hi);
/* Softmax of row i's band scores into p (width W, zeros outside the band). */
void fmm_band_row(const fmm_band *g, const float *qi, const float *k, float *p, int i, int dh);
/* out = weight * near (overwrites out); saves the probabilities P [T, W]. */
void fmm_band_rows_forward(const fmm_band *g, const float *q, const float *k, const float *v, float weight, float *P,
                           float *out, int T, int dh);
/* Adds the near field's dq [T, dh], dk, dv [Tk, dh]; returns Σ_i dout_i · near_i. */
double fmm_band_rows_backward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                              const float *P, const float *dout, float *dq, float *dk, float *dv, float *e, int T,
                              int dh);
/* The same on tiles: saved = [lse | near]; the backward writes dq, dk, dv. */
void fmm_band_tiles_forward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                            float *saved, float *out, float *scratch, int T, int dh);
double fmm_band_tiles_backward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                               const float *saved, const float *dout, float *dq, float *dk, float *dv, float *scratch,
                               int T, int dh);

/* ---- far field (fmm_far.c) ---- */

typedef struct {
    float *phi_q, *phi_k, *v_aug, *u_aug, *result, *block, *state, *init, *band_row;
    uint16_t *pairs; /* bf16 (fmm_settings.bf16): a chunk's operands in pairs; NULL: fp32 */
} fmm_scratch;

/* Which j enter Y_i: j <= i (causal forward), j >= i (causal backward, the
 * reverse-time sums that dk and dv need) or every j (non-causal). */
typedef enum { SUM_PAST, SUM_FUTURE, SUM_ALL } fmm_sum_range;

typedef struct {
    const fmm_settings *s;
    int T, dh, C;
    fmm_sum_range range;
    fmm_scratch sc;
} fmm_far_context;

/* Floats (pairs) of fmm_scratch.pairs for chunks of C and a head of dh. */
size_t fmm_far_pairs_floats(int C, int dh);
/* phi = φ(x) over n values. */
void fmm_apply_feature_map(fmm_feature_map m, const float *x, float *phi, size_t n);
/* [v | 1] into aug [T, dh + 1]. */
void fmm_fill_augmented(float *aug, const float *v, int T, int dh);
/* Kernel m's [num | den] into nd [T, dh + 1]; adds weight * num / (den + eps)
 * to out. Expects fc->sc.v_aug = [v | 1]. `in` ([dh, dh + 1] or NULL): the
 * kernel's state from the other shards (fmm_shard.far_in). */
void fmm_far_kernel_forward(const fmm_far_context *fc, fmm_feature_map m, const float *q, const float *k, float weight,
                            const float *in, float *nd, float *out);
/* Adds kernel m's dq, dk, dv; returns Σ_i dout_i · far_i. `in` as the
 * forward's; `grad_in` ([dh + 1, dh] or NULL): fmm_shard.far_grad_in's. */
double fmm_far_kernel_backward(const fmm_far_context *fc, fmm_feature_map m, const float *q, const float *k,
                               float weight, const float *in, const float *grad_in, const float *nd, const float *dout,
                               float *dq, float *dk, float *dv);
/* The kernel's local totals, what the other shards' far_in and far_grad_in
 * sum: φ(K)ᵀ [V | 1] ([dh, dh + 1]; expects fc->sc.v_aug), and Σ_i u'_i ⊗
 * φ(q_i) ([dh + 1, dh]) from the forward's nd and dout. */
void fmm_far_kernel_totals(const fmm_far_context *fc, fmm_feature_map m, const float *k, float *totals);
void fmm_far_kernel_grad_totals(const fmm_far_context *fc, fmm_feature_map m, const float *q, float weight,
                                const float *nd, const float *dout, float *totals);
#endif
