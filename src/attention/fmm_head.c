/* FMM attention for one head (docs/model.md §1.3): a banded softmax near field plus a
 * multi-kernel linear-attention far field, blended by sigmoid logits.
 *
 * Layout of `saved` (fmm_head_saved_floats):
 *   [T, W]           near-field probabilities, if bandwidth > 0 (W = band width),
 *   or, when the band runs on tiles (fmm_band_on_tiles):
 *   [T] + [T, dh]    each row's log-sum-exp and the near field's output
 *   r x [T, dh + 1]  per far kernel: numerator (dh columns) and denominator
 *                    (last column, before eps) of docs/model.md §1.3's far_l,i
 * The far output is not saved, nor the near one on rows: the blend
 * gradients are recomputed from these in O(T * (W + dh)).
 *
 * The far field (fmm_far.c) is one primitive, linear_attention_product, applied with a
 * value matrix augmented by a column of ones, so the numerator and the
 * normaliser Σ φ(q_i)·φ(k_j) come out of the same matmuls.  Its backward is
 * the same primitive three more times (forward-time state for dq, reverse-time
 * states for dk and dv).  All matmuls go through gemm_product (gemm.h). The
 * near field is fmm_near.c's; this file holds the sizes and the entry points. */
#include "attention/fmm.h"

#include <string.h>

#include "kernels/tiled_softmax.h"

#include "fmm_internal.h"

/* Chunk length used when settings.chunk <= 0.  Per token the intra-chunk
 * block costs ~2 C dh multiply-adds and the state ~2 dh^2 whatever C is, so
 * small chunks win until sgemm call overhead dominates: in the benchmark
 * (tests/test_fmm.c --bench, dh 32 and 64, T 1K-64K) C = 8..16 is fastest,
 * 64 is 1.15-1.5x slower, 128 1.5-2x. */
#define FMM_DEFAULT_CHUNK 16

/* ------------------------------------------------------------------------ */
/* Sizes                                                                    */
/* ------------------------------------------------------------------------ */

static int effective_chunk(const fmm_settings *s, int T) {
    int c = s->chunk > 0 ? s->chunk : FMM_DEFAULT_CHUNK;
    return c < T ? c : T;
}

static int far_kernels(const fmm_settings *s) { return s->n_kernels > 0 ? s->n_kernels : 0; }

size_t fmm_head_saved_floats(const fmm_settings *s, int T, int dh) {
    if (T <= 0) return 0;
    fmm_band g = fmm_band_of(s, T);
    return fmm_band_saved_floats(s, &g, T, dh) + (size_t)far_kernels(s) * (size_t)T * (size_t)(dh + 1);
}

/* Scratch, carved by carve_scratch: phi_q, phi_k [T, dh]; v_aug, u_aug,
 * result [T, dh + 1]; block [C, C]; state and init [dh + 1, dh + 1]; the
 * bf16 pairs (fmm_far_pairs_floats); band_row [W].
 * A band on tiles uses the scratch before the far field does. */
size_t fmm_head_scratch_floats(const fmm_settings *s, int T, int dh) {
    if (T <= 0) return 0;
    size_t t = (size_t)T, c = (size_t)effective_chunk(s, T), e = (size_t)dh + 1;
    fmm_band g = fmm_band_of(s, T);
    size_t band = (size_t)g.width, far = 0;
    if (far_kernels(s) > 0) far = 2 * t * (size_t)dh + 3 * t * e + c * c + 2 * e * e + fmm_far_pairs_floats((int)c, dh);
    size_t tiles = fmm_band_on_tiles(s, &g) ? tiled_softmax_scratch_floats(T, dh) : 0;
    return far + band > tiles ? far + band : tiles;
}

static fmm_scratch carve_scratch(const fmm_settings *s, float *scratch, int T, int dh) {
    fmm_scratch sc;
    size_t t = (size_t)T, e = (size_t)dh + 1, c = (size_t)effective_chunk(s, T);
    if (far_kernels(s) == 0) {
        memset(&sc, 0, sizeof sc);
        sc.band_row = scratch;
        return sc;
    }
    sc.phi_q = scratch;
    sc.phi_k = sc.phi_q + t * (size_t)dh;
    sc.v_aug = sc.phi_k + t * (size_t)dh;
    sc.u_aug = sc.v_aug + t * e;
    sc.result = sc.u_aug + t * e;
    sc.block = sc.result + t * e;
    sc.state = sc.block + c * c;
    sc.init = sc.state + e * e;
    sc.pairs = s->bf16 ? (uint16_t *)(sc.init + e * e) : NULL;
    sc.band_row = sc.init + e * e + fmm_far_pairs_floats((int)c, dh);
    return sc;
}

static fmm_far_context far_context_of(const fmm_settings *s, float *scratch, int T, int dh) {
    fmm_far_context fc;
    fc.s = s;
    fc.T = T;
    fc.dh = dh;
    fc.C = effective_chunk(s, T);
    fc.range = s->causal ? SUM_PAST : SUM_ALL;
    fc.sc = carve_scratch(s, scratch, T, dh);
    return fc;
}

/* ------------------------------------------------------------------------ */
/* Head forward / backward                                                  */
/* ------------------------------------------------------------------------ */

/* The band's keys and values: a shard's, halos included, or the rows' own. */
static const float *band_keys(const fmm_shard *shard, const float *k) { return shard && shard->k ? shard->k : k; }
static const float *band_values(const fmm_shard *shard, const float *v) { return shard && shard->v ? shard->v : v; }

/* Kernel l's state from the other shards, or NULL. */
static const float *far_in_of(const fmm_settings *s, const fmm_shard *shard, int l, int dh) {
    return shard && shard->far_in ? shard->far_in + (size_t)l * fmm_far_state_floats(s, dh) / far_kernels(s) : NULL;
}

static const float *far_grad_in_of(const fmm_settings *s, const fmm_shard *shard, int l, int dh) {
    return shard && shard->far_grad_in ? shard->far_grad_in + (size_t)l * fmm_far_state_floats(s, dh) / far_kernels(s)
                                       : NULL;
}

size_t fmm_far_state_floats(const fmm_settings *s, int dh) {
    return (size_t)far_kernels(s) * (size_t)dh * ((size_t)dh + 1);
}

void fmm_head_far_totals(const fmm_settings *s, const float *k, const float *v, float *totals, float *scratch, int T,
                         int dh) {
    int r = far_kernels(s);
    if (T <= 0 || r == 0) return;
    fmm_far_context fc = far_context_of(s, scratch, T, dh);
    fmm_fill_augmented(fc.sc.v_aug, v, T, dh);
    for (int l = 0; l < r; l++) fmm_far_kernel_totals(&fc, s->kernels[l], k, totals + (size_t)l * dh * (dh + 1));
}

void fmm_head_far_grad_totals(const fmm_settings *s, const fmm_shard *shard, const float *q, float blend_far,
                              const float *saved, const float *dout, float *totals, float *scratch, int T, int dh) {
    int r = far_kernels(s);
    if (T <= 0 || r == 0) return;
    fmm_band g = fmm_band_of_shard(s, shard, T);
    fmm_far_context fc = far_context_of(s, scratch, T, dh);
    const float *nd = saved + fmm_band_saved_floats(s, &g, T, dh);
    float weight = fmm_sigmoid(blend_far) / (float)r;
    for (int l = 0; l < r; l++)
        fmm_far_kernel_grad_totals(&fc, s->kernels[l], q, weight, nd + (size_t)l * T * (dh + 1), dout,
                                   totals + (size_t)l * dh * (dh + 1));
}

void fmm_head_forward(const fmm_settings *s, const fmm_shard *shard, const float *q, const float *k, const float *v,
                      float blend_near, float blend_far, float *out, float *saved, float *scratch, int T, int dh) {
    if (T <= 0) return;
    fmm_band g = fmm_band_of_shard(s, shard, T);
    const float *bk = band_keys(shard, k), *bv = band_values(shard, v);
    int r = far_kernels(s);
    if (g.width == 0) memset(out, 0, (size_t)T * dh * sizeof *out);
    else if (fmm_band_on_tiles(s, &g))
        fmm_band_tiles_forward(&g, q, bk, bv, fmm_sigmoid(blend_near), saved, out, scratch, T, dh);
    else fmm_band_rows_forward(&g, q, bk, bv, fmm_sigmoid(blend_near), saved, out, T, dh);
    if (r == 0) return;

    fmm_far_context fc = far_context_of(s, scratch, T, dh);
    float *nd = saved + fmm_band_saved_floats(s, &g, T, dh);
    float weight = fmm_sigmoid(blend_far) / (float)r; /* σ(w_far) · (1/r) Σ_l */
    fmm_fill_augmented(fc.sc.v_aug, v, T, dh);
    for (int l = 0; l < r; l++)
        fmm_far_kernel_forward(&fc, s->kernels[l], q, k, weight, far_in_of(s, shard, l, dh),
                               nd + (size_t)l * T * (dh + 1), out);
}

/* The coefficient of v_j in out_i (docs/metrics.md §3, attention read-out),
 * from what the forward saved and q, k alone: the band's probability p_ij
 *  times sigmoid(w_near), plus per far kernel sigmoid(w_far) / r times
 * φ(q_i)·φ(k_j) / (den_i + eps), den_i read from the saved last column.
 * O(dh) per (i, j); nothing T x T. */
float fmm_head_weight(const fmm_settings *s, const float *q, const float *k, float blend_near, float blend_far,
                      const float *saved, int T, int dh, int i, int j) {
    fmm_band g = fmm_band_of(s, T);
    double w = 0.0;
    int lo, hi, base = fmm_band_limits(&g, i, &lo, &hi);
    const float *qi = q + (size_t)i * dh, *kj = k + (size_t)j * dh;
    if (g.width > 0 && j >= lo && j <= hi) {
        float p = fmm_band_on_tiles(s, &g) ? tiled_softmax_weight(q, k, saved, dh, i, j) /* saved: lse first */
                                           : saved[(size_t)i * g.width + (j - base)];
        w += fmm_sigmoid(blend_near) * p;
    }
    int r = far_kernels(s);
    if (r == 0 || (s->causal && j > i)) return (float)w;
    const float *nd = saved + fmm_band_saved_floats(s, &g, T, dh);
    for (int l = 0; l < r; l++) {
        double a = 0.0;
        for (int c = 0; c < dh; c++) a += (double)fmm_feature(s->kernels[l], qi[c]) * fmm_feature(s->kernels[l], kj[c]);
        float den = nd[(size_t)l * T * (dh + 1) + (size_t)i * (dh + 1) + dh];
        w += fmm_sigmoid(blend_far) / r * a / (den + s->eps);
    }
    return (float)w;
}

void fmm_head_backward(const fmm_settings *s, const fmm_shard *shard, const float *q, const float *k, const float *v,
                       float blend_near, float blend_far, const float *saved, const float *dout, float *dq, float *dk,
                       float *dv, float *d_blend_near, float *d_blend_far, float *scratch, int T, int dh) {
    if (T <= 0) return;
    fmm_band g = fmm_band_of_shard(s, shard, T);
    const float *bk = band_keys(shard, k), *bv = band_values(shard, v);
    int r = far_kernels(s);
    if (!fmm_band_on_tiles(s, &g)) { /* the band on tiles writes them; the rows and the far field add */
        memset(dq, 0, (size_t)T * dh * sizeof *dq);
        memset(dk, 0, (size_t)g.Tk * dh * sizeof *dk);
        memset(dv, 0, (size_t)g.Tk * dh * sizeof *dv);
    }
    fmm_scratch sc = carve_scratch(s, scratch, T, dh);

    if (g.width > 0) {
        float sn = fmm_sigmoid(blend_near);
        double dot_near = fmm_band_on_tiles(s, &g)
                              ? fmm_band_tiles_backward(&g, q, bk, bv, sn, saved, dout, dq, dk, dv, scratch, T, dh)
                              : fmm_band_rows_backward(&g, q, bk, bv, sn, saved, dout, dq, dk, dv, sc.band_row, T, dh);
        *d_blend_near += (float)(sn * (1.0f - sn) * dot_near); /* σ' = σ(1-σ) */
    }
    if (r == 0) return;

    fmm_far_context fc = far_context_of(s, scratch, T, dh);
    const float *nd = saved + fmm_band_saved_floats(s, &g, T, dh);
    float sf = fmm_sigmoid(blend_far), weight = sf / (float)r;
    double dot_far = 0.0;             /* Σ_l Σ_i dout_i · far_l,i */
    size_t own = (size_t)g.left * dh; /* the rows' own keys in dk, dv */
    fmm_fill_augmented(fc.sc.v_aug, v, T, dh);
    for (int l = 0; l < r; l++)
        dot_far += fmm_far_kernel_backward(&fc, s->kernels[l], q, k, weight, far_in_of(s, shard, l, dh),
                                           far_grad_in_of(s, shard, l, dh), nd + (size_t)l * T * (dh + 1), dout, dq,
                                           dk + own, dv + own);
    *d_blend_far += (float)(sf * (1.0f - sf) * dot_far / r);
}
