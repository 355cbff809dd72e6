/* FMM attention for one head (docs/model.md §1.3): a banded softmax near field plus a
 * multi-kernel linear-attention far field, blended by sigmoid logits.
 *
 * Layout of `saved` (fmm_head_saved_floats):
 *   [T, W]           near-field probabilities, if bandwidth > 0 (W = band width),
 *   or, when the band runs on tiles (band_on_tiles):
 *   [T] + [T, dh]    each row's log-sum-exp and the near field's output
 *   r x [T, dh + 1]  per far kernel: numerator (dh columns) and denominator
 *                    (last column, before eps) of docs/model.md §1.3's far_l,i
 * The far output is not saved, nor the near one on rows: the blend
 * gradients are recomputed from these in O(T * (W + dh)).
 *
 * The far field is one primitive, linear_attention_product, applied with a
 * value matrix augmented by a column of ones, so the numerator and the
 * normaliser Σ φ(q_i)·φ(k_j) come out of the same matmuls.  Its backward is
 * the same primitive three more times (forward-time state for dq, reverse-time
 * states for dk and dv).  All matmuls go through gemm_product (gemm.h). */
#include "attention/fmm.h"

#include "base/fast_math.h"
#include "kernels/gemm.h"
#include "kernels/tiled_softmax.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Chunk length used when settings.chunk <= 0.  Per token the intra-chunk
 * block costs ~2 C dh multiply-adds and the state ~2 dh^2 whatever C is, so
 * small chunks win until sgemm call overhead dominates: in the benchmark
 * (tests/test_fmm.c --bench, dh 32 and 64, T 1K-64K) C = 8..16 is fastest,
 * 64 is 1.15-1.5x slower, 128 1.5-2x. */
#define FMM_DEFAULT_CHUNK 16

/* ------------------------------------------------------------------------ */
/* Sizes                                                                     */
/* ------------------------------------------------------------------------ */

/* Keys j of row i lie in [i - half + 1, i] (causal) or |i - j| < half
 * (non-causal).  half = min(bandwidth, T): a band wider than the sequence
 * holds the same keys, and clamping keeps `saved` at most [T, 2T - 1]. */
typedef struct {
    int half, width;
    bool causal;
} band_geometry;

static band_geometry band_of(const fmm_settings *s, int T) {
    band_geometry g;
    g.half = s->bandwidth < T ? s->bandwidth : T;
    if (g.half < 0) g.half = 0;
    g.causal = s->causal;
    g.width = g.half == 0 ? 0 : (s->causal ? g.half : 2 * g.half - 1);
    return g;
}

/* A band of at least this many keys per row runs on tiled_softmax's tiles
 * when attention.impl = tiled (docs/model.md §1.3): narrower, the 96-row
 * tiles are mostly masked and the rows below are faster. `build/test_fmm
 * --bench` (near field alone, T 4096, dh 32, causal and not; AMD EPYC):
 * tiles 0.97-0.98x the rows at 39-40 keys, 1.11-1.12x at 47-48, 1.86x at
 * 127-128 and 3.1x at 1023-1024. */
#define FMM_TILED_BAND_MIN_WIDTH 48

static bool band_on_tiles(const fmm_settings *s, const band_geometry *g) {
    return s->band_tiles && g->width >= FMM_TILED_BAND_MIN_WIDTH;
}

/* The near field's share of `saved`. */
static size_t band_saved_floats(const fmm_settings *s, const band_geometry *g, int T, int dh) {
    if (g->width == 0) return 0;
    return band_on_tiles(s, g) ? (size_t)T * ((size_t)dh + 1) : (size_t)T * (size_t)g->width;
}

static int effective_chunk(const fmm_settings *s, int T) {
    int c = s->chunk > 0 ? s->chunk : FMM_DEFAULT_CHUNK;
    return c < T ? c : T;
}

static int far_kernels(const fmm_settings *s) { return s->n_kernels > 0 ? s->n_kernels : 0; }

size_t fmm_head_saved_floats(const fmm_settings *s, int T, int dh) {
    if (T <= 0) return 0;
    band_geometry g = band_of(s, T);
    return band_saved_floats(s, &g, T, dh) + (size_t)far_kernels(s) * (size_t)T * (size_t)(dh + 1);
}

/* Scratch, carved by carve_scratch: phi_q, phi_k [T, dh]; v_aug, u_aug,
 * result [T, dh + 1]; block [C, C]; state [dh + 1, dh + 1]; band_row [W].
 * A band on tiles uses the scratch before the far field does. */
size_t fmm_head_scratch_floats(const fmm_settings *s, int T, int dh) {
    if (T <= 0) return 0;
    size_t t = (size_t)T, c = (size_t)effective_chunk(s, T), e = (size_t)dh + 1;
    band_geometry g = band_of(s, T);
    size_t band = (size_t)g.width, far = 0;
    if (far_kernels(s) > 0) far = 2 * t * (size_t)dh + 3 * t * e + c * c + e * e;
    size_t tiles = band_on_tiles(s, &g) ? tiled_softmax_scratch_floats(T, dh) : 0;
    return far + band > tiles ? far + band : tiles;
}

typedef struct {
    float *phi_q, *phi_k, *v_aug, *u_aug, *result, *block, *state, *band_row;
} fmm_scratch;

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
    sc.band_row = sc.state + e * e;
    return sc;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The dh-long loops run in blocks of 8 so that gcc -O2, which vectorises
 * only loops of known length, vectorises them (8 partial sums in dot). */
static float dot(const float *restrict a, const float *restrict b, int n) {
    float part[8] = {0}, acc = 0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc += a[i] * b[i];
    for (int j = 0; j < 8; j++) acc += part[j];
    return acc;
}

static void add_scaled(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) y[i + j] += a * x[i + j];
    for (; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------------------ */
/* Near field: softmax over the band only (docs/model.md §1.3), O(T * W * dh)          */
/* ------------------------------------------------------------------------ */

/* Row i's keys are j in [*lo, *hi]; P[i, j - base] holds p_ij. */
static int band_limits(const band_geometry *g, int i, int T, int *lo, int *hi) {
    *lo = i - g->half + 1 > 0 ? i - g->half + 1 : 0;
    *hi = g->causal ? i : (i + g->half - 1 < T - 1 ? i + g->half - 1 : T - 1);
    return i - g->half + 1;
}

/* Softmax of row i's band scores, written into p (width W, zeros outside the
 * band).  The row maximum is subtracted before exp (no overflow). */
static void band_softmax_row(const band_geometry *g, const float *qi, const float *k, float *p, int i, int T, int dh) {
    int lo, hi, base = band_limits(g, i, T, &lo, &hi);
    float scale = 1.0f / sqrtf((float)dh), max = -INFINITY, sum = 0.0f;
    memset(p, 0, (size_t)g->width * sizeof *p);
    for (int j = lo; j <= hi; j++) {
        p[j - base] = dot(qi, k + (size_t)j * dh, dh) * scale;
        if (p[j - base] > max) max = p[j - base];
    }
    for (int j = lo; j <= hi; j++) {
        p[j - base] = expf(p[j - base] - max);
        sum += p[j - base];
    }
    for (int j = lo; j <= hi; j++) p[j - base] /= sum;
}

/* out_i = weight * Σ_j p_ij v_j (overwrites out); saves P. */
static void band_softmax_forward(const band_geometry *g, const float *q, const float *k, const float *v, float weight,
                                 float *P, float *out, int T, int dh) {
    for (int i = 0; i < T; i++) {
        float *p = P + (size_t)i * g->width, *oi = out + (size_t)i * dh;
        int lo, hi, base;
        band_softmax_row(g, q + (size_t)i * dh, k, p, i, T, dh);
        base = band_limits(g, i, T, &lo, &hi);
        memset(oi, 0, (size_t)dh * sizeof *oi);
        for (int j = lo; j <= hi; j++) add_scaled(oi, weight * p[j - base], v + (size_t)j * dh, dh);
    }
}

/* Adds the near field's dq, dk, dv; returns Σ_i dout_i · near_i (for the
 * blend-logit gradient), computed from e_ij = dout_i · v_j so near need not
 * be saved.  Softmax backward: ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij'). */
static double band_softmax_backward(const band_geometry *g, const float *q, const float *k, const float *v,
                                    float weight, const float *P, const float *dout, float *dq, float *dk, float *dv,
                                    float *e, int T, int dh) {
    float scale = 1.0f / sqrtf((float)dh);
    double dout_dot_near = 0.0;
    for (int i = 0; i < T; i++) {
        const float *p = P + (size_t)i * g->width, *gi = dout + (size_t)i * dh;
        const float *qi = q + (size_t)i * dh;
        int lo, hi, base = band_limits(g, i, T, &lo, &hi);
        float pe = 0.0f;
        for (int j = lo; j <= hi; j++) {
            e[j - base] = dot(gi, v + (size_t)j * dh, dh);
            pe += p[j - base] * e[j - base];
        }
        dout_dot_near += pe;
        for (int j = lo; j <= hi; j++) {
            float pj = p[j - base], ds = weight * pj * (e[j - base] - pe) * scale;
            add_scaled(dv + (size_t)j * dh, weight * pj, gi, dh);
            add_scaled(dq + (size_t)i * dh, ds, k + (size_t)j * dh, dh);
            add_scaled(dk + (size_t)j * dh, ds, qi, dh);
        }
    }
    return dout_dot_near;
}

/* The near field on tiles: tiled_softmax's band kernel writes the near
 * output and each row's log-sum-exp into `saved`, in O(T * dh). */
static void band_tiles_forward(const band_geometry *g, const float *q, const float *k, const float *v, float weight,
                               float *saved, float *out, float *scratch, int T, int dh) {
    float *near = saved + T;
    tiled_softmax_band_forward(near, saved, q, k, v, T, T, dh, 0, g->causal, g->half, scratch);
    for (size_t i = 0; i < (size_t)T * dh; i++) out[i] = weight * near[i];
}

/* Its backward, which is linear in dout: the kernel's gradients for dout,
 * scaled by the weight; returns Σ_i dout_i · near_i. Writes dq, dk, dv. */
static double band_tiles_backward(const band_geometry *g, const float *q, const float *k, const float *v, float weight,
                                  const float *saved, const float *dout, float *dq, float *dk, float *dv,
                                  float *scratch, int T, int dh) {
    const float *near = saved + T;
    size_t n = (size_t)T * dh;
    tiled_softmax_band_backward(dq, dk, dv, dout, near, saved, q, k, v, T, dh, g->causal, g->half, scratch);
    double dout_dot_near = 0.0;
    for (size_t i = 0; i < n; i++) {
        dout_dot_near += (double)dout[i] * near[i];
        dq[i] *= weight, dk[i] *= weight, dv[i] *= weight;
    }
    return dout_dot_near;
}

/* ------------------------------------------------------------------------ */
/* Feature maps φ of docs/model.md §1.3 (all strictly positive, so normalisers are > 0) */
/* ------------------------------------------------------------------------ */

/* Branch-free forms (the sign of x is random, so branches mispredict half
 * the time, and gcc -O2 turns float ternaries and fminf into branches or
 * calls): a 0/1 mask blended arithmetically, and min(x, 0) = (x - |x|) / 2
 * (exact).
 *   elu(x) + 1  = x + 1 (x > 0), e^x (x <= 0);  elu_flip(x) = elu(-x) + 1
 *   tanh(x) + 1 = 2 / (1 + e^-2x); with t = e^-2|x| <= 1 nothing overflows:
 *                 2 / (1 + t) for x >= 0, 2t / (1 + t) for x < 0. */
static inline float phi_elu(float x) {
    float pos = (float)(x > 0.0f), e = fast_exp_nonpositive(0.5f * (x - fabsf(x)));
    return e + pos * (x + 1.0f - e);
}

static inline float phi_elu_flip(float x) { return phi_elu(-x); }

static inline float phi_tanh(float x) {
    float neg = (float)(x < 0.0f), t = fast_exp_nonpositive(-2.0f * fabsf(x));
    return 2.0f / (1.0f + t) * (1.0f + neg * (t - 1.0f));
}

/* φ'(x) from x and φ(x), avoiding another exp: elu: φ where x <= 0
 * (φ = e^x), else 1; elu_flip: -elu'(-x); tanh: 1 - tanh² = φ (2 - φ). */
static inline float slope_elu(float x, float phi) { return phi + (float)(x > 0.0f) * (1.0f - phi); }

static inline float slope_elu_flip(float x, float phi) { return -slope_elu(-x, phi); }

static inline float slope_tanh(float x, float phi) {
    (void)x;
    return phi * (2.0f - phi);
}

static float feature_value(fmm_feature_map m, float x) {
    return m == FEATURE_ELU ? phi_elu(x) : m == FEATURE_ELU_FLIP ? phi_elu_flip(x) : phi_tanh(x);
}

float fmm_feature(fmm_feature_map m, float x) { return feature_value(m, x); }

static float feature_slope(fmm_feature_map m, float x, float phi) {
    return m == FEATURE_ELU ? slope_elu(x, phi) : m == FEATURE_ELU_FLIP ? slope_elu_flip(x, phi) : slope_tanh(x, phi);
}

/* gcc -O2 vectorises only loops of known length, so elementwise work runs
 * in blocks of VEC_BLOCK (restrict: no alias checks), then a scalar tail. */
#define VEC_BLOCK 16

static void feature_block(fmm_feature_map m, const float *restrict x, float *restrict phi) {
    switch (m) {
    case FEATURE_ELU:
        for (int i = 0; i < VEC_BLOCK; i++) phi[i] = phi_elu(x[i]);
        break;
    case FEATURE_ELU_FLIP:
        for (int i = 0; i < VEC_BLOCK; i++) phi[i] = phi_elu_flip(x[i]);
        break;
    case FEATURE_TANH:
        for (int i = 0; i < VEC_BLOCK; i++) phi[i] = phi_tanh(x[i]);
        break;
    }
}

static void apply_feature_map(fmm_feature_map m, const float *x, float *phi, size_t n) {
    size_t i = 0;
    for (; i + VEC_BLOCK <= n; i += VEC_BLOCK) feature_block(m, x + i, phi + i);
    for (; i < n; i++) phi[i] = feature_value(m, x[i]);
}

static void chain_block(fmm_feature_map m, const float *restrict x, const float *restrict phi,
                        const float *restrict dphi, float *restrict dx) {
    switch (m) {
    case FEATURE_ELU:
        for (int i = 0; i < VEC_BLOCK; i++) dx[i] += dphi[i] * slope_elu(x[i], phi[i]);
        break;
    case FEATURE_ELU_FLIP:
        for (int i = 0; i < VEC_BLOCK; i++) dx[i] += dphi[i] * slope_elu_flip(x[i], phi[i]);
        break;
    case FEATURE_TANH:
        for (int i = 0; i < VEC_BLOCK; i++) dx[i] += dphi[i] * slope_tanh(x[i], phi[i]);
        break;
    }
}

/* dx += dphi ⊙ φ'(x): the chain rule through the feature map (n values). */
static void feature_chain(fmm_feature_map m, const float *x, const float *phi, const float *dphi, float *dx, size_t n) {
    size_t i = 0;
    for (; i + VEC_BLOCK <= n; i += VEC_BLOCK) chain_block(m, x + i, phi + i, dphi + i, dx + i);
    for (; i < n; i++) dx[i] += dphi[i] * feature_slope(m, x[i], phi[i]);
}

/* ------------------------------------------------------------------------ */
/* Chunked linear attention (the O(T·C·dh + T·dh²) core)                     */
/* ------------------------------------------------------------------------ */

/* Which j enter Y_i: j <= i (causal forward), j >= i (causal backward, the
 * reverse-time sums that dk and dv need) or every j (non-causal). */
typedef enum { SUM_PAST, SUM_FUTURE, SUM_ALL } sum_range;

static sum_range reversed(sum_range r) { return r == SUM_PAST ? SUM_FUTURE : r == SUM_FUTURE ? SUM_PAST : SUM_ALL; }

/* Through the process-wide GEMM engine (gemm.h; docs/scale.md §7): cblas_sgemm
 * itself for fp32/OpenBLAS, oneDNN's matmul for the other engines. */
static void sgemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    gemm_product(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* Zeroes the block entries (i, j) outside the range: j > i for SUM_PAST,
 * j < i for SUM_FUTURE (the diagonal is kept: position i sees itself). */
static void mask_block(float *block, int len, sum_range range) {
    for (int i = 0; i < len; i++) {
        float *row = block + (size_t)i * len;
        if (range == SUM_PAST) memset(row + i + 1, 0, (size_t)(len - i - 1) * sizeof *row);
        else memset(row, 0, (size_t)i * sizeof *row);
    }
}

typedef struct {
    const float *A, *B, *X; /* [T, m], [T, m], [T, n] */
    float *Y;               /* [T, n] */
    int m, n;
} lin_operands;

/* One chunk [start, start + len): intra-chunk part through the masked
 * len x len block A_c B_cᵀ, inter-chunk part A_c · state, where state =
 * Σ B_j X_jᵀ over the chunks already visited; then the chunk joins state. */
static void linear_attention_chunk(const lin_operands *o, int start, int len, sum_range range, bool first, bool last,
                                   float *block, float *state) {
    int m = o->m, n = o->n;
    const float *Ac = o->A + (size_t)start * m, *Bc = o->B + (size_t)start * m;
    const float *Xc = o->X + (size_t)start * n;
    float *Yc = o->Y + (size_t)start * n;
    sgemm(false, true, len, len, m, Ac, m, Bc, m, 0.0f, block, len);
    mask_block(block, len, range);
    sgemm(false, false, len, n, len, block, len, Xc, n, 0.0f, Yc, n);
    if (!first) sgemm(false, false, len, n, m, Ac, m, state, n, 1.0f, Yc, n);
    if (!last) sgemm(true, false, m, n, len, Bc, m, Xc, n, first ? 0.0f : 1.0f, state, n);
}

/* Y_i = Σ_{j in range(i)} (A_i · B_j) X_j without forming the T x T matrix.
 * SUM_ALL uses one global state Bᵀ X (m x n).  The chunk size only changes
 * the summation order, so results agree across chunk sizes up to rounding.
 * Scratch: block [C, C], state [m, n]. */
static void linear_attention_product(const lin_operands *o, int T, sum_range range, int C, float *block, float *state) {
    if (range == SUM_ALL) {
        sgemm(true, false, o->m, o->n, T, o->B, o->m, o->X, o->n, 0.0f, state, o->n);
        sgemm(false, false, T, o->n, o->m, o->A, o->m, state, o->n, 0.0f, o->Y, o->n);
        return;
    }
    int n_chunks = (T + C - 1) / C;
    for (int step = 0; step < n_chunks; step++) {
        int c = range == SUM_PAST ? step : n_chunks - 1 - step;
        int start = c * C, len = T - start < C ? T - start : C;
        linear_attention_chunk(o, start, len, range, step == 0, step == n_chunks - 1, block, state);
    }
}

/* ------------------------------------------------------------------------ */
/* Far field (docs/model.md §1.3): far_l,i = num_l,i / (den_l,i + eps)                 */
/* ------------------------------------------------------------------------ */

/* [v | 1]: the ones column makes the last output column Σ φ(q_i)·φ(k_j). */
static void fill_augmented(float *aug, const float *v, int T, int dh) {
    for (int i = 0; i < T; i++) {
        memcpy(aug + (size_t)i * (dh + 1), v + (size_t)i * dh, (size_t)dh * sizeof *v);
        aug[(size_t)i * (dh + 1) + dh] = 1.0f;
    }
}

typedef struct {
    const fmm_settings *s;
    int T, dh, C;
    sum_range range;
    fmm_scratch sc;
} far_context;

/* Writes kernel l's [num | den] into nd ([T, dh + 1]), adds
 * weight * num / (den + eps) to out.  Expects fc->sc.v_aug = [v | 1]. */
static void far_kernel_forward(const far_context *fc, fmm_feature_map m, const float *q, const float *k, float weight,
                               float *nd, float *out) {
    int T = fc->T, dh = fc->dh;
    apply_feature_map(m, q, fc->sc.phi_q, (size_t)T * dh);
    apply_feature_map(m, k, fc->sc.phi_k, (size_t)T * dh);
    lin_operands o = {fc->sc.phi_q, fc->sc.phi_k, fc->sc.v_aug, nd, dh, dh + 1};
    linear_attention_product(&o, T, fc->range, fc->C, fc->sc.block, fc->sc.state);
    for (int i = 0; i < T; i++) {
        const float *row = nd + (size_t)i * (dh + 1);
        add_scaled(out + (size_t)i * dh, weight / (row[dh] + fc->s->eps), row, dh);
    }
}

/* Gradient w.r.t. the augmented value rows, u'_i = [g_i / D_i, -(g_i·o_i)/D_i]
 * with g_i = weight * dout_i, o_i = far_l,i, D_i = den_i + eps: then
 * d(num_i) = u_i and d(den_i) = the last entry.  Returns Σ_i dout_i · o_i. */
static double build_u_aug(const far_context *fc, const float *nd, const float *dout, float weight, float *u_aug) {
    int dh = fc->dh;
    double dout_dot_far = 0.0;
    for (int i = 0; i < fc->T; i++) {
        const float *row = nd + (size_t)i * (dh + 1), *gi = dout + (size_t)i * dh;
        float *u = u_aug + (size_t)i * (dh + 1);
        float inv_d = 1.0f / (row[dh] + fc->s->eps);
        float dout_dot_o = dot(gi, row, dh) * inv_d;
        for (int c = 0; c < dh; c++) u[c] = weight * gi[c] * inv_d;
        u[dh] = -weight * dout_dot_o * inv_d;
        dout_dot_far += dout_dot_o;
    }
    return dout_dot_far;
}

/* With a_ij = φq_i·φk_j and u', v' the augmented rows (range j <= i causal):
 *   dφq_i = Σ_{j<=i} (u'_i·v'_j) φk_j       forward-time state  V'ᵀ φK
 *   dφk_j = Σ_{i>=j} (v'_j·u'_i) φq_i       reverse-time state  U'ᵀ φQ
 *   dv'_j = Σ_{i>=j} (φk_j·φq_i) u'_i       reverse-time state  φQᵀ U'
 * Adds into dq, dk, dv; returns Σ_i dout_i · far_l,i. */
static double far_kernel_backward(const far_context *fc, fmm_feature_map m, const float *q, const float *k,
                                  float weight, const float *nd, const float *dout, float *dq, float *dk, float *dv) {
    int T = fc->T, dh = fc->dh, e = dh + 1;
    const fmm_scratch *sc = &fc->sc;
    apply_feature_map(m, q, sc->phi_q, (size_t)T * dh);
    apply_feature_map(m, k, sc->phi_k, (size_t)T * dh);
    double dout_dot_far = build_u_aug(fc, nd, dout, weight, sc->u_aug);

    lin_operands dphi_q = {sc->u_aug, sc->v_aug, sc->phi_k, sc->result, e, dh};
    linear_attention_product(&dphi_q, T, fc->range, fc->C, sc->block, sc->state);
    feature_chain(m, q, sc->phi_q, sc->result, dq, (size_t)T * dh);

    sum_range back = reversed(fc->range);
    lin_operands dphi_k = {sc->v_aug, sc->u_aug, sc->phi_q, sc->result, e, dh};
    linear_attention_product(&dphi_k, T, back, fc->C, sc->block, sc->state);
    feature_chain(m, k, sc->phi_k, sc->result, dk, (size_t)T * dh);

    lin_operands dv_aug = {sc->phi_k, sc->phi_q, sc->u_aug, sc->result, dh, e};
    linear_attention_product(&dv_aug, T, back, fc->C, sc->block, sc->state);
    for (int i = 0; i < T; i++) add_scaled(dv + (size_t)i * dh, 1.0f, sc->result + (size_t)i * e, dh);
    return dout_dot_far;
}

static far_context far_context_of(const fmm_settings *s, float *scratch, int T, int dh) {
    far_context fc;
    fc.s = s;
    fc.T = T;
    fc.dh = dh;
    fc.C = effective_chunk(s, T);
    fc.range = s->causal ? SUM_PAST : SUM_ALL;
    fc.sc = carve_scratch(s, scratch, T, dh);
    return fc;
}

/* ------------------------------------------------------------------------ */
/* Head forward / backward                                                   */
/* ------------------------------------------------------------------------ */

void fmm_head_forward(const fmm_settings *s, const float *q, const float *k, const float *v, float blend_near,
                      float blend_far, float *out, float *saved, float *scratch, int T, int dh) {
    if (T <= 0) return;
    band_geometry g = band_of(s, T);
    int r = far_kernels(s);
    if (g.width == 0) memset(out, 0, (size_t)T * dh * sizeof *out);
    else if (band_on_tiles(s, &g)) band_tiles_forward(&g, q, k, v, sigmoid(blend_near), saved, out, scratch, T, dh);
    else band_softmax_forward(&g, q, k, v, sigmoid(blend_near), saved, out, T, dh);
    if (r == 0) return;

    far_context fc = far_context_of(s, scratch, T, dh);
    float *nd = saved + band_saved_floats(s, &g, T, dh);
    float weight = sigmoid(blend_far) / (float)r; /* σ(w_far) · (1/r) Σ_l */
    fill_augmented(fc.sc.v_aug, v, T, dh);
    for (int l = 0; l < r; l++)
        far_kernel_forward(&fc, s->kernels[l], q, k, weight, nd + (size_t)l * T * (dh + 1), out);
}

/* The coefficient of v_j in out_i (docs/metrics.md §3, attention read-out),
 * from what the forward saved and q, k alone: the band's probability p_ij
 * times sigmoid(w_near), plus per far kernel sigmoid(w_far) / r times
 * φ(q_i)·φ(k_j) / (den_i + eps), den_i read from the saved last column.
 * O(dh) per (i, j); nothing T x T. */
float fmm_head_weight(const fmm_settings *s, const float *q, const float *k, float blend_near, float blend_far,
                      const float *saved, int T, int dh, int i, int j) {
    band_geometry g = band_of(s, T);
    double w = 0.0;
    int lo, hi, base = band_limits(&g, i, T, &lo, &hi);
    const float *qi = q + (size_t)i * dh, *kj = k + (size_t)j * dh;
    if (g.width > 0 && j >= lo && j <= hi) {
        float p = band_on_tiles(s, &g) ? tiled_softmax_weight(q, k, saved, dh, i, j) /* saved: lse first */
                                       : saved[(size_t)i * g.width + (j - base)];
        w += sigmoid(blend_near) * p;
    }
    int r = far_kernels(s);
    if (r == 0 || (s->causal && j > i)) return (float)w;
    const float *nd = saved + band_saved_floats(s, &g, T, dh);
    for (int l = 0; l < r; l++) {
        double a = 0.0;
        for (int c = 0; c < dh; c++) a += (double)fmm_feature(s->kernels[l], qi[c]) * fmm_feature(s->kernels[l], kj[c]);
        float den = nd[(size_t)l * T * (dh + 1) + (size_t)i * (dh + 1) + dh];
        w += sigmoid(blend_far) / r * a / (den + s->eps);
    }
    return (float)w;
}

void fmm_head_backward(const fmm_settings *s, const float *q, const float *k, const float *v, float blend_near,
                       float blend_far, const float *saved, const float *dout, float *dq, float *dk, float *dv,
                       float *d_blend_near, float *d_blend_far, float *scratch, int T, int dh) {
    if (T <= 0) return;
    size_t n = (size_t)T * dh;
    band_geometry g = band_of(s, T);
    int r = far_kernels(s);
    if (!band_on_tiles(s, &g)) { /* the band on tiles writes them; the rows and the far field add */
        memset(dq, 0, n * sizeof *dq);
        memset(dk, 0, n * sizeof *dk);
        memset(dv, 0, n * sizeof *dv);
    }
    fmm_scratch sc = carve_scratch(s, scratch, T, dh);

    if (g.width > 0) {
        float sn = sigmoid(blend_near);
        double dot_near = band_on_tiles(s, &g)
                              ? band_tiles_backward(&g, q, k, v, sn, saved, dout, dq, dk, dv, scratch, T, dh)
                              : band_softmax_backward(&g, q, k, v, sn, saved, dout, dq, dk, dv, sc.band_row, T, dh);
        *d_blend_near += (float)(sn * (1.0f - sn) * dot_near); /* σ' = σ(1-σ) */
    }
    if (r == 0) return;

    far_context fc = far_context_of(s, scratch, T, dh);
    const float *nd = saved + band_saved_floats(s, &g, T, dh);
    float sf = sigmoid(blend_far), weight = sf / (float)r;
    double dot_far = 0.0; /* Σ_l Σ_i dout_i · far_l,i */
    fill_augmented(fc.sc.v_aug, v, T, dh);
    for (int l = 0; l < r; l++)
        dot_far +=
            far_kernel_backward(&fc, s->kernels[l], q, k, weight, nd + (size_t)l * T * (dh + 1), dout, dq, dk, dv);
    *d_blend_far += (float)(sf * (1.0f - sf) * dot_far / r);
}
