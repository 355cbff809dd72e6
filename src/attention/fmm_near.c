/* FMM's near field (docs/model.md §1.3): softmax over the band only, on rows
 * (O(T * W * dh), the probabilities saved) or, for a wide band, on
 * tiled_softmax's tiles (the log-sum-exp and the output saved). */
#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/tiled_softmax.h"

#include "fmm_internal.h"

fmm_band fmm_band_of(const fmm_settings *s, int T) {
    fmm_band g;
    g.half = s->bandwidth < T ? s->bandwidth : T;
    if (g.half < 0) g.half = 0;
    g.causal = s->causal;
    g.width = g.half == 0 ? 0 : (s->causal ? g.half : 2 * g.half - 1);
    g.left = 0;
    g.Tk = T;
    g.bf16 = s->bf16;
    return g;
}

/* The whole sequence's band (the same keys per row as on one rank), over
 * the shard's keys with their halos. */
fmm_band fmm_band_of_shard(const fmm_settings *s, const fmm_shard *shard, int T) {
    if (!shard) return fmm_band_of(s, T);
    fmm_band g = fmm_band_of(s, shard->T_seq);
    g.left = shard->left;
    g.Tk = shard->left + T + shard->right;
    return g;
}

/* A band of at least this many keys per row runs on tiled_softmax's tiles
 * when attention.impl = tiled (docs/model.md §1.3): narrower, the 96-row
 * tiles are mostly masked and the rows below are faster. `build/test_fmm
 * --bench` (near field alone, T 4096, dh 32, causal and not; AMD EPYC):
 * tiles 0.97-0.98x the rows at 39-40 keys, 1.11-1.12x at 47-48, 1.86x at
 * 127-128 and 3.1x at 1023-1024. */
#define FMM_TILED_BAND_MIN_WIDTH 48

bool fmm_band_on_tiles(const fmm_settings *s, const fmm_band *g) {
    return s->band_tiles && g->width >= FMM_TILED_BAND_MIN_WIDTH;
}

/* The near field's share of `saved`. */
size_t fmm_band_saved_floats(const fmm_settings *s, const fmm_band *g, int T, int dh) {
    if (g->width == 0) return 0;
    return fmm_band_on_tiles(s, g) ? (size_t)T * ((size_t)dh + 1) : (size_t)T * (size_t)g->width;
}

/* Row i's keys are j in [*lo, *hi]; P[i, j - base] holds p_ij. */
int fmm_band_limits(const fmm_band *g, int i, int *lo, int *hi) {
    int at = i + g->left; /* row i's own key */
    *lo = at - g->half + 1 > 0 ? at - g->half + 1 : 0;
    *hi = g->causal ? at : (at + g->half - 1 < g->Tk - 1 ? at + g->half - 1 : g->Tk - 1);
    return at - g->half + 1;
}

/* Softmax of row i's band scores, written into p (width W, zeros outside the
 * band).  The row maximum is subtracted before exp (no overflow). */
void fmm_band_row(const fmm_band *g, const float *qi, const float *k, float *p, int i, int dh) {
    int lo, hi, base = fmm_band_limits(g, i, &lo, &hi);
    float scale = 1.0f / sqrtf((float)dh), max = -INFINITY, sum = 0.0f;
    memset(p, 0, (size_t)g->width * sizeof *p);
    for (int j = lo; j <= hi; j++) {
        p[j - base] = fmm_dot(qi, k + (size_t)j * dh, dh) * scale;
        if (p[j - base] > max) max = p[j - base];
    }
    for (int j = lo; j <= hi; j++) {
        p[j - base] = expf(p[j - base] - max);
        sum += p[j - base];
    }
    for (int j = lo; j <= hi; j++) p[j - base] /= sum;
}

/* out_i = weight * Σ_j p_ij v_j (overwrites out); saves P. */
void fmm_band_rows_forward(const fmm_band *g, const float *q, const float *k, const float *v, float weight, float *P,
                           float *out, int T, int dh) {
    for (int i = 0; i < T; i++) {
        float *p = P + (size_t)i * g->width, *oi = out + (size_t)i * dh;
        int lo, hi, base;
        fmm_band_row(g, q + (size_t)i * dh, k, p, i, dh);
        base = fmm_band_limits(g, i, &lo, &hi);
        memset(oi, 0, (size_t)dh * sizeof *oi);
        for (int j = lo; j <= hi; j++) fmm_add_scaled(oi, weight * p[j - base], v + (size_t)j * dh, dh);
    }
}

/* Adds the near field's dq, dk, dv; returns Σ_i dout_i · near_i (for the
 * blend-logit gradient), computed from e_ij = dout_i · v_j so near need not
 * be saved.  Softmax backward: ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij'). */
double fmm_band_rows_backward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                              const float *P, const float *dout, float *dq, float *dk, float *dv, float *e, int T,
                              int dh) {
    float scale = 1.0f / sqrtf((float)dh);
    double dout_dot_near = 0.0;
    for (int i = 0; i < T; i++) {
        const float *p = P + (size_t)i * g->width, *gi = dout + (size_t)i * dh;
        const float *qi = q + (size_t)i * dh;
        int lo, hi, base = fmm_band_limits(g, i, &lo, &hi);
        float pe = 0.0f;
        for (int j = lo; j <= hi; j++) {
            e[j - base] = fmm_dot(gi, v + (size_t)j * dh, dh);
            pe += p[j - base] * e[j - base];
        }
        dout_dot_near += pe;
        for (int j = lo; j <= hi; j++) {
            float pj = p[j - base], ds = weight * pj * (e[j - base] - pe) * scale;
            fmm_add_scaled(dv + (size_t)j * dh, weight * pj, gi, dh);
            fmm_add_scaled(dq + (size_t)i * dh, ds, k + (size_t)j * dh, dh);
            fmm_add_scaled(dk + (size_t)j * dh, ds, qi, dh);
        }
    }
    return dout_dot_near;
}

/* The near field on tiles: tiled_softmax's band kernel writes the near
 * output and each row's log-sum-exp into `saved`, in O(T * dh). */
void fmm_band_tiles_forward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                            float *saved, float *out, float *scratch, int T, int dh) {
    float *near = saved + T;
    tiled_softmax_band_forward(near, saved, q, k, v, T, g->Tk, dh, g->left, g->causal, g->half, g->bf16, scratch);
    for (size_t i = 0; i < (size_t)T * dh; i++) out[i] = weight * near[i];
}

/* Its backward, which is linear in dout: the kernel's gradients for dout,
 * scaled by the weight; returns Σ_i dout_i · near_i. Writes dq [T, dh],
 * dk, dv [Tk, dh]. */
double fmm_band_tiles_backward(const fmm_band *g, const float *q, const float *k, const float *v, float weight,
                               const float *saved, const float *dout, float *dq, float *dk, float *dv, float *scratch,
                               int T, int dh) {
    const float *near = saved + T;
    size_t n = (size_t)T * dh, nk = (size_t)g->Tk * dh;
    tiled_softmax_band_backward(dq, dk, dv, dout, near, saved, q, k, v, T, g->Tk, dh, g->left, g->causal, g->half,
                                false, g->bf16, scratch);
    double dout_dot_near = fast_dot_lanes_double(dout, near, n);
    for (size_t i = 0; i < n; i++) dq[i] *= weight;
    for (size_t i = 0; i < nk; i++) dk[i] *= weight, dv[i] *= weight;
    return dout_dot_near;
}
