/* FMM's far field (docs/model.md §1.3): the feature maps φ and the
 * multi-kernel linear attention far_l,i = num_l,i / (den_l,i + eps), by
 * chunks in O(T·C·dh + T·dh²), never T x T. */
#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/gemm.h"
#include "kernels/tile_gemm.h"

#include "fmm_internal.h"

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
 * in blocks of VEC_BLOCK (restrict: no alias checks), then a scalar tail;
 * the two entry points below are cloned for AVX2 and AVX-512
 * (VECTOR_CLONES, fast_math.h: the same bits on every clone), where the
 * default target's four lanes made the feature maps the largest piece of
 * a bf16 FMM head after its products (perf, bench_fmm at T 4096). */
#define VEC_BLOCK 16

static inline void feature_block(fmm_feature_map m, const float *restrict x, float *restrict phi) {
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

VECTOR_CLONES void fmm_apply_feature_map(fmm_feature_map m, const float *x, float *phi, size_t n) {
    size_t i = 0;
    for (; i + VEC_BLOCK <= n; i += VEC_BLOCK) feature_block(m, x + i, phi + i);
    for (; i < n; i++) phi[i] = feature_value(m, x[i]);
}

static inline void chain_block(fmm_feature_map m, const float *restrict x, const float *restrict phi,
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
VECTOR_CLONES static void feature_chain(fmm_feature_map m, const float *x, const float *phi, const float *dphi,
                                        float *dx, size_t n) {
    size_t i = 0;
    for (; i + VEC_BLOCK <= n; i += VEC_BLOCK) chain_block(m, x + i, phi + i, dphi + i, dx + i);
    for (; i < n; i++) dx[i] += dphi[i] * feature_slope(m, x[i], phi[i]);
}

/* ------------------------------------------------------------------------ */
/* Chunked linear attention (the O(T·C·dh + T·dh²) core)                     */
/* ------------------------------------------------------------------------ */

static fmm_sum_range reversed(fmm_sum_range r) {
    return r == SUM_PAST ? SUM_FUTURE : r == SUM_FUTURE ? SUM_PAST : SUM_ALL;
}

/* Through the process-wide GEMM engine (gemm.h; docs/scale.md §7): cblas_sgemm
 * itself for fp32/OpenBLAS, oneDNN's matmul for the other engines. */
static void sgemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    gemm_product(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* Zeroes the block entries (i, j) outside the range: j > i for SUM_PAST,
 * j < i for SUM_FUTURE (the diagonal is kept: position i sees itself). */
static void mask_block(float *block, int len, fmm_sum_range range) {
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
 * Σ B_j X_jᵀ over the chunks already visited (and what came in from other
 * shards); then the chunk joins state. `first`: the state is still zero. */
static void linear_attention_chunk(const lin_operands *o, int start, int len, fmm_sum_range range, bool first,
                                   bool last, float *block, float *state) {
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

/* ---- bf16 (fmm_settings.bf16; docs/design.md §8.10) ----
 * The same products on bf16 operands with fp32 sums (tile_gemm_bf16), on
 * the tile kernel rather than the engine: they are small (a chunk of 16
 * rows) and run inside the parallel heads. Each chunk's operands are
 * packed once, in the form each product reads (tile_gemm.h): A_c in rows
 * (a) and B_c both ways (bt for the block, b for the state), X_c (x) for
 * both products that read it, the masked block, and the state. The state
 * itself stays fp32: its products add into it in fp32. */
typedef struct {
    uint16_t *a, *bt, *b, *x, *block, *state;
} far_pairs;

size_t fmm_far_pairs_floats(int C, int dh) {
    size_t c = (size_t)C, e = (size_t)dh + 1, hc = (c + 1) / 2, he = (e + 1) / 2;
    return 2 * c * he + 2 * hc * e + c * hc + he * e;
}

static far_pairs carve_pairs(uint16_t *p, int C, int dh) {
    size_t c = (size_t)C, e = (size_t)dh + 1, hc = (c + 1) / 2, he = (e + 1) / 2;
    far_pairs f;
    f.a = p, f.bt = f.a + 2 * c * he, f.b = f.bt + 2 * he * c, f.x = f.b + 2 * hc * e, f.block = f.x + 2 * hc * e;
    f.state = f.block + 2 * c * hc;
    return f;
}

/* state (=|+=) B_cᵀ X_c over rows [start, start + len), fp32 sums. */
static void state_add_bf16(const lin_operands *o, int start, int len, bool accumulate, float *state,
                           const far_pairs *f) {
    int m = o->m, n = o->n;
    tile_bf16_pack(f->b, m, 1, o->B + (size_t)start * m, m, 1, len, m);
    tile_bf16_pack(f->x, n, 1, o->X + (size_t)start * n, n, 1, len, n);
    tile_gemm_bf16(m, n, len, 1.0f, f->b, 1, m, f->x, n, accumulate, state, n);
}

/* Y_c (=|+=) A_c state, with the state packed in f->state. */
static void state_product_bf16(const lin_operands *o, int start, int len, bool accumulate, const far_pairs *f) {
    int m = o->m, n = o->n, hm = (m + 1) / 2;
    tile_bf16_pack(f->a, 1, hm, o->A + (size_t)start * m, 1, m, m, len);
    tile_gemm_bf16(len, n, m, 1.0f, f->a, hm, 1, f->state, n, accumulate, o->Y + (size_t)start * n, n);
}

/* linear_attention_chunk's steps on bf16 operands. */
static void chunk_bf16(const lin_operands *o, int start, int len, fmm_sum_range range, bool first, bool last,
                       float *block, float *state, const far_pairs *f) {
    int m = o->m, n = o->n, hm = (m + 1) / 2, hl = (len + 1) / 2;
    const float *Ac = o->A + (size_t)start * m, *Bc = o->B + (size_t)start * m;
    float *Yc = o->Y + (size_t)start * n;
    tile_bf16_pack(f->a, 1, hm, Ac, 1, m, m, len);
    tile_bf16_pack(f->bt, len, 1, Bc, 1, m, m, len);
    tile_bf16_pack(f->x, n, 1, o->X + (size_t)start * n, n, 1, len, n);
    tile_gemm_bf16(len, len, m, 1.0f, f->a, hm, 1, f->bt, len, false, block, len);
    mask_block(block, len, range);
    tile_bf16_pack(f->block, 1, hl, block, 1, len, len, len);
    tile_gemm_bf16(len, n, len, 1.0f, f->block, hl, 1, f->x, n, false, Yc, n);
    if (!first) {
        tile_bf16_pack(f->state, n, 1, state, n, 1, m, n);
        tile_gemm_bf16(len, n, m, 1.0f, f->a, hm, 1, f->state, n, true, Yc, n);
    }
    if (!last) {
        tile_bf16_pack(f->b, m, 1, Bc, m, 1, len, m);
        tile_gemm_bf16(m, n, len, 1.0f, f->b, 1, m, f->x, n, !first, state, n);
    }
}

/* SUM_ALL on bf16 operands: the global state chunk by chunk, then each
 * chunk's rows against it. */
static void all_bf16(const lin_operands *o, int T, int C, bool started, float *state, const far_pairs *f) {
    for (int start = 0; start < T; start += C)
        state_add_bf16(o, start, T - start < C ? T - start : C, started || start > 0, state, f);
    tile_bf16_pack(f->state, o->n, 1, state, o->n, 1, o->m, o->n);
    for (int start = 0; start < T; start += C) state_product_bf16(o, start, T - start < C ? T - start : C, false, f);
}

/* Y_i = Σ_{j in range(i)} (A_i · B_j) X_j without forming the T x T matrix.
 * SUM_ALL uses one global state Bᵀ X (m x n).  The chunk size only changes
 * the summation order, so results agree across chunk sizes up to rounding.
 * `init` ([m, n] or NULL) is Σ B_j X_jᵀ over the positions of the other
 * shards in range (context parallelism, docs/design.md §8.12): the state the
 * walk starts from, or for SUM_ALL the rest of the global state.
 * Scratch: block [C, C], state [m, n]; pairs (bf16, or NULL: fp32). */
static void linear_attention_product(const lin_operands *o, int T, fmm_sum_range range, int C, const float *init,
                                     float *block, float *state, uint16_t *pairs) {
    size_t state_floats = (size_t)o->m * o->n;
    far_pairs f = {0};
    if (pairs) f = carve_pairs(pairs, C, o->m > o->n ? o->m - 1 : o->n - 1);
    if (range == SUM_ALL) {
        if (init) memcpy(state, init, state_floats * sizeof *state);
        if (pairs) {
            all_bf16(o, T, C, init != NULL, state, &f);
            return;
        }
        sgemm(true, false, o->m, o->n, T, o->B, o->m, o->X, o->n, init ? 1.0f : 0.0f, state, o->n);
        sgemm(false, false, T, o->n, o->m, o->A, o->m, state, o->n, 0.0f, o->Y, o->n);
        return;
    }
    if (init) memcpy(state, init, state_floats * sizeof *state);
    int n_chunks = (T + C - 1) / C;
    for (int step = 0; step < n_chunks; step++) {
        int c = range == SUM_PAST ? step : n_chunks - 1 - step;
        int start = c * C, len = T - start < C ? T - start : C;
        bool first = step == 0 && !init, last = step == n_chunks - 1;
        if (pairs) chunk_bf16(o, start, len, range, first, last, block, state, &f);
        else linear_attention_chunk(o, start, len, range, first, last, block, state);
    }
}

/* state = Bᵀ X over all T rows (a shard's totals), in the head's precision. */
static void state_sum(const lin_operands *o, int T, int C, uint16_t *pairs, float *state) {
    if (!pairs) {
        sgemm(true, false, o->m, o->n, T, o->B, o->m, o->X, o->n, 0.0f, state, o->n);
        return;
    }
    far_pairs f = carve_pairs(pairs, C, o->m > o->n ? o->m - 1 : o->n - 1);
    for (int start = 0; start < T; start += C)
        state_add_bf16(o, start, T - start < C ? T - start : C, start > 0, state, &f);
}

/* dst [n, m] = srcᵀ, src [m, n]. */
static void transpose(float *dst, const float *src, int m, int n) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) dst[(size_t)j * m + i] = src[(size_t)i * n + j];
}

/* ------------------------------------------------------------------------ */
/* Far field (docs/model.md §1.3): far_l,i = num_l,i / (den_l,i + eps)                 */
/* ------------------------------------------------------------------------ */

/* [v | 1]: the ones column makes the last output column Σ φ(q_i)·φ(k_j). */
void fmm_fill_augmented(float *aug, const float *v, int T, int dh) {
    for (int i = 0; i < T; i++) {
        memcpy(aug + (size_t)i * (dh + 1), v + (size_t)i * dh, (size_t)dh * sizeof *v);
        aug[(size_t)i * (dh + 1) + dh] = 1.0f;
    }
}

void fmm_far_kernel_forward(const fmm_far_context *fc, fmm_feature_map m, const float *q, const float *k, float weight,
                            const float *in, float *nd, float *out) {
    int T = fc->T, dh = fc->dh;
    fmm_apply_feature_map(m, q, fc->sc.phi_q, (size_t)T * dh);
    fmm_apply_feature_map(m, k, fc->sc.phi_k, (size_t)T * dh);
    lin_operands o = {fc->sc.phi_q, fc->sc.phi_k, fc->sc.v_aug, nd, dh, dh + 1};
    linear_attention_product(&o, T, fc->range, fc->C, in, fc->sc.block, fc->sc.state, fc->sc.pairs);
    for (int i = 0; i < T; i++) {
        const float *row = nd + (size_t)i * (dh + 1);
        fmm_add_scaled(out + (size_t)i * dh, weight / (row[dh] + fc->s->eps), row, dh);
    }
}

/* Gradient w.r.t. the augmented value rows, u'_i = [g_i / D_i, -(g_i·o_i)/D_i]
 * with g_i = weight * dout_i, o_i = far_l,i, D_i = den_i + eps: then
 * d(num_i) = u_i and d(den_i) = the last entry.  Returns Σ_i dout_i · o_i. */
static double build_u_aug(const fmm_far_context *fc, const float *nd, const float *dout, float weight, float *u_aug) {
    int dh = fc->dh;
    double dout_dot_far = 0.0;
    for (int i = 0; i < fc->T; i++) {
        const float *row = nd + (size_t)i * (dh + 1), *gi = dout + (size_t)i * dh;
        float *u = u_aug + (size_t)i * (dh + 1);
        float inv_d = 1.0f / (row[dh] + fc->s->eps);
        float dout_dot_o = fmm_dot(gi, row, dh) * inv_d;
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
 * From other shards the forward-time state starts at `in`ᵀ and the
 * reverse-time ones at `grad_in` = Σ u'_i ⊗ φq_i of the rows after (and its
 * transpose). Adds into dq, dk, dv; returns Σ_i dout_i · far_l,i. */
double fmm_far_kernel_backward(const fmm_far_context *fc, fmm_feature_map m, const float *q, const float *k,
                               float weight, const float *in, const float *grad_in, const float *nd, const float *dout,
                               float *dq, float *dk, float *dv) {
    int T = fc->T, dh = fc->dh, e = dh + 1;
    const fmm_scratch *sc = &fc->sc;
    fmm_apply_feature_map(m, q, sc->phi_q, (size_t)T * dh);
    fmm_apply_feature_map(m, k, sc->phi_k, (size_t)T * dh);
    double dout_dot_far = build_u_aug(fc, nd, dout, weight, sc->u_aug);

    if (in) transpose(sc->init, in, dh, e);
    lin_operands dphi_q = {sc->u_aug, sc->v_aug, sc->phi_k, sc->result, e, dh};
    linear_attention_product(&dphi_q, T, fc->range, fc->C, in ? sc->init : NULL, sc->block, sc->state, sc->pairs);
    feature_chain(m, q, sc->phi_q, sc->result, dq, (size_t)T * dh);

    fmm_sum_range back = reversed(fc->range);
    lin_operands dphi_k = {sc->v_aug, sc->u_aug, sc->phi_q, sc->result, e, dh};
    linear_attention_product(&dphi_k, T, back, fc->C, grad_in, sc->block, sc->state, sc->pairs);
    feature_chain(m, k, sc->phi_k, sc->result, dk, (size_t)T * dh);

    if (grad_in) transpose(sc->init, grad_in, e, dh);
    lin_operands dv_aug = {sc->phi_k, sc->phi_q, sc->u_aug, sc->result, dh, e};
    linear_attention_product(&dv_aug, T, back, fc->C, grad_in ? sc->init : NULL, sc->block, sc->state, sc->pairs);
    for (int i = 0; i < T; i++) fmm_add_scaled(dv + (size_t)i * dh, 1.0f, sc->result + (size_t)i * e, dh);
    return dout_dot_far;
}

void fmm_far_kernel_totals(const fmm_far_context *fc, fmm_feature_map m, const float *k, float *totals) {
    int T = fc->T, dh = fc->dh;
    fmm_apply_feature_map(m, k, fc->sc.phi_k, (size_t)T * dh);
    lin_operands o = {NULL, fc->sc.phi_k, fc->sc.v_aug, NULL, dh, dh + 1};
    state_sum(&o, T, fc->C, fc->sc.pairs, totals);
}

void fmm_far_kernel_grad_totals(const fmm_far_context *fc, fmm_feature_map m, const float *q, float weight,
                                const float *nd, const float *dout, float *totals) {
    int T = fc->T, dh = fc->dh;
    fmm_apply_feature_map(m, q, fc->sc.phi_q, (size_t)T * dh);
    build_u_aug(fc, nd, dout, weight, fc->sc.u_aug);
    lin_operands o = {NULL, fc->sc.u_aug, fc->sc.phi_q, NULL, dh + 1, dh};
    state_sum(&o, T, fc->C, fc->sc.pairs, totals);
}
