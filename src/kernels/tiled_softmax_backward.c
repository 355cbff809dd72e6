/* Tiled softmax attention's backward (tiled_softmax.h; docs/model.md
 * §1.3): key tiles outside, query tiles inside, each tile's probabilities
 * recomputed from the forward's log-sum-exp, then dV, dP, dS, dQ and dK
 * (the steps in tiled_softmax.c's opening comment). Its scratch, masks and
 * tile sizes are the forward's (tiled_softmax_internal.h). */
#include "kernels/tiled_softmax.h"

#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/tile_gemm.h"

#include "tiled_softmax_internal.h"

/* Backward's: qr and dr hold all Tq rows (after D). */
static tiled_pairs backward_pairs(const tiled_scratch *s, int dh, int Tq) {
    size_t hp = (size_t)(dh + 1) / 2, rows = (TILE_Q + 1) / 2;
    tiled_pairs p = {0};
    p.kt = s->pairs, p.vt = p.kt + 2 * hp * TILE_KB, p.k = p.vt + 2 * hp * TILE_KB;
    p.q = p.k + 2 * (size_t)(TILE_KB + 1) / 2 * dh;
    p.d = p.q + 2 * rows * dh, p.p = p.d + 2 * rows * dh, p.s = p.p + 2 * rows * TILE_KB;
    p.sr = p.s + 2 * rows * TILE_KB, p.kc = p.sr + 2 * (size_t)TILE_Q * ((TILE_KB + 1) / 2);
    p.qr = (uint16_t *)(s->D + Tq), p.dr = p.qr + 2 * (size_t)Tq * hp;
    p.qc = p.dr + 2 * (size_t)Tq * hp, p.dc = p.qc + 2 * (size_t)((Tq + 1) / 2) * dh;
    return p;
}

/* Scores of one tile (rows x keys, stride TILE_KB), the keys [from, keys)
 * of each row, back into probabilities exp(s - lse), 0 where masked; with
 * `coarse` (bf16) by fast_exp_coarse, as forward made them. */
VECTOR_CLONES static void recompute_probabilities(float *restrict p, const float *restrict lse, int rows, int from,
                                                  int keys, int i0, int j0, const tiled_mask *mask, bool coarse) {
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = tiled_max(tiled_key_begin(mask, i0 + r) - j0, from);
        int end = tiled_max(tiled_min(tiled_key_end(mask, i0 + r) - j0, keys), begin);
        for (int j = from; j < begin; j++) row[j] = 0.0f;
        if (coarse)
            for (int j = begin; j < end; j++) row[j] = fast_exp_coarse(row[j] - lse[i0 + r]);
        else
            for (int j = begin; j < end; j++) row[j] = fast_exp_nonpositive(row[j] - lse[i0 + r]);
        for (int j = end; j < keys; j++) row[j] = 0.0f;
    }
}

#if FAST_EXP8_AVAILABLE
/* recompute_probabilities eight keys at a time (fast_exp8_nonpositive,
 * or fast_exp8_coarse); the keys past the last full group go to the
 * scalar loop. */
__attribute__((target("avx2,fma"))) static void recompute_probabilities_avx2(float *p, const float *lse, int rows,
                                                                             int keys, int i0, int j0,
                                                                             const tiled_mask *mask, bool coarse) {
    int full = keys / 8 * 8;
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = tiled_key_begin(mask, i0 + r) - j0, end = tiled_min(tiled_key_end(mask, i0 + r) - j0, keys);
        __m256 lse_r = _mm256_set1_ps(lse[i0 + r]);
        for (int j = 0; j < full; j += 8) {
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + j), lse_r);
            __m256 e = coarse ? fast_exp8_coarse(x) : fast_exp8_nonpositive(x);
            if (begin > j || end < j + 8) e = _mm256_and_ps(e, tiled_lanes_between(begin - j, end - j));
            _mm256_storeu_ps(row + j, e);
        }
    }
    if (full < keys) recompute_probabilities(p, lse, rows, full, keys, i0, j0, mask, coarse);
}

/* The same sixteen keys at a time on AVX-512, then one group of eight
 * where it fits, then the scalar loop: the same bits as above. */
__attribute__((target("avx512f,avx2,fma"))) static void recompute_probabilities_avx512(float *p, const float *lse,
                                                                                       int rows, int keys, int i0,
                                                                                       int j0, const tiled_mask *mask,
                                                                                       bool coarse) {
    int full16 = keys / 16 * 16, full = keys / 8 * 8;
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = tiled_key_begin(mask, i0 + r) - j0, end = tiled_min(tiled_key_end(mask, i0 + r) - j0, keys);
        __m512 lse_r = _mm512_set1_ps(lse[i0 + r]);
        for (int j = 0; j < full16; j += 16) {
            __m512 x = _mm512_sub_ps(_mm512_loadu_ps(row + j), lse_r);
            __m512 e = coarse ? fast_exp16_coarse(x) : fast_exp16_nonpositive(x);
            if (begin > j || end < j + 16) e = _mm512_maskz_mov_ps(tiled_lanes16(begin - j, end - j), e);
            _mm512_storeu_ps(row + j, e);
        }
        if (full16 < full) {
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + full16), _mm256_set1_ps(lse[i0 + r]));
            __m256 e = coarse ? fast_exp8_coarse(x) : fast_exp8_nonpositive(x);
            if (begin > full16 || end < full) e = _mm256_and_ps(e, tiled_lanes_between(begin - full16, end - full16));
            _mm256_storeu_ps(row + full16, e);
        }
    }
    if (full < keys) recompute_probabilities(p, lse, rows, full, keys, i0, j0, mask, coarse);
}
#endif

/* dS = P * (dP - D), in place in dp. */
VECTOR_CLONES static void score_gradient(float *restrict dp, const float *restrict p, const float *restrict D, int rows,
                                         int keys, int i0) {
    for (int r = 0; r < rows; r++) {
        float *ds = dp + (size_t)r * TILE_KB;
        const float *pr = p + (size_t)r * TILE_KB;
        for (int j = 0; j < keys; j++) ds[j] = pr[j] * (ds[j] - D[i0 + r]);
    }
}

/* D[t] = dO_t . O_t in fixed lanes (fast_dot_lanes): a sequential sum ran
 * at one add per add latency (4% of a bf16 backward at dh 64), and the
 * lanes vectorise with the same floats on every clone and machine. */
VECTOR_CLONES static void row_dots(float *D, const float *dout, const float *out, int T, int dh) {
    for (int t = 0; t < T; t++) D[t] = fast_dot_lanes(dout + (size_t)t * dh, out + (size_t)t * dh, dh);
}

#if FAST_EXP8_AVAILABLE
/* bf16 backward's dS = P * (dP - D) (score_gradient's steps) and the three
 * operands made of P and dS (tile_bf16_pack's rounding) in one pass, two
 * rows at a time: P and dS in pairs across rows (p, s) and dS in pairs
 * along keys (sr). */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
score_gradient_pairs(const float *p, const float *dp, const float *D, int rows, int keys, int i0,
                     const tiled_pairs *pr) {
    const int kp = (TILE_KB + 1) / 2;
    for (int r = 0; r < rows; r += 2) {
        bool two = r + 1 < rows;
        const float *p0 = p + (size_t)r * TILE_KB, *g0 = dp + (size_t)r * TILE_KB;
        __m512 d0 = _mm512_set1_ps(D[i0 + r]), d1 = _mm512_set1_ps(two ? D[i0 + r + 1] : 0.0f);
        uint16_t *row0 = pr->sr + 2 * (size_t)r * kp, *row1 = row0 + 2 * kp;
        uint16_t *pp = pr->p + 2 * (size_t)(r / 2) * TILE_KB, *ps = pr->s + 2 * (size_t)(r / 2) * TILE_KB;
        for (int j = 0; j < keys; j += 16) {
            __mmask16 m = tiled_lanes16(0, keys - j);
            __m512 a0 = _mm512_maskz_loadu_ps(m, p0 + j), a1 = _mm512_setzero_ps(), s1 = a1;
            __m512 s0 = _mm512_mul_ps(a0, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, g0 + j), d0));
            if (two) {
                a1 = _mm512_maskz_loadu_ps(m, p0 + TILE_KB + j);
                s1 = _mm512_mul_ps(a1, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, g0 + TILE_KB + j), d1));
                _mm256_mask_storeu_epi16(row1 + j, m, (__m256i)_mm512_cvtneps_pbh(s1));
            }
            _mm256_mask_storeu_epi16(row0 + j, m, (__m256i)_mm512_cvtneps_pbh(s0));
            _mm512_mask_storeu_epi32(pp + 2 * j, m, tiled_interleave16(a0, a1));
            _mm512_mask_storeu_epi32(ps + 2 * j, m, tiled_interleave16(s0, s1));
        }
        if (keys & 1) { /* the last pair's high half, as tile_bf16_pack leaves it */
            row0[keys] = 0;
            if (two) row1[keys] = 0;
        }
    }
}
#endif

/* bf16 backward's operands made of P and dS: P and dS in pairs across rows
 * (pr->p, pr->s) and dS along keys (pr->sr); dS = P * (dP - D). */
static void score_gradient_bf16(float *p, float *dp, const float *D, int rows, int keys, int i0,
                                const tiled_scratch *s) {
    const tiled_pairs *pr = &s->pr;
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_bf16_native()) {
        score_gradient_pairs(p, dp, D, rows, keys, i0, pr);
        return;
    }
#endif
    tile_bf16_pack(pr->p, TILE_KB, 1, p, TILE_KB, 1, rows, keys);
    score_gradient(dp, p, D, rows, keys, i0);
    tile_bf16_pack(pr->sr, 1, (TILE_KB + 1) / 2, dp, 1, TILE_KB, keys, rows);
    tile_bf16_pack(pr->s, TILE_KB, 1, dp, TILE_KB, 1, rows, keys);
}

/* The tile's probabilities exp(s - lse), in place of its scores (coarse
 * in bf16: recompute_probabilities). */
static void tile_probabilities(float *p, const float *lse, int rows, int keys, int i0, int j0, const tiled_mask *mask,
                               bool coarse) {
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_avx512()) recompute_probabilities_avx512(p, lse, rows, keys, i0, j0, mask, coarse);
    else if (tile_gemm_available()) recompute_probabilities_avx2(p, lse, rows, keys, i0, j0, mask, coarse);
    else
#endif
        recompute_probabilities(p, lse, rows, 0, keys, i0, j0, mask, coarse);
}

/* One (key tile, query tile) pair of backward: rows query rows from i0
 * against keys keys from j0 (K_j transposed in s->kt and V_j in s->vt from
 * column `from`); q, dout, dq at row i0, k, dk, dv at key j0. */
typedef struct {
    float *dq, *dk, *dv;
    const float *q, *dout, *k, *lse;
    int i0, rows, j0, keys, from;
} tile_pair_args;

static void backward_products(const tile_pair_args *t, int dh, const tiled_mask *mask, const tiled_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int rows = t->rows, keys = t->keys;
    tile_gemm(rows, keys, dh, scale, t->q, dh, 1, s->kt + t->from, TILE_KB, false, p, TILE_KB);
    tile_probabilities(p, t->lse, rows, keys, t->i0, t->j0, mask, s->bf16);
    tile_gemm(keys, dh, rows, 1.0f, p, 1, TILE_KB, t->dout, dh, true, t->dv, dh);
    tile_gemm(rows, keys, dh, 1.0f, t->dout, dh, 1, s->vt + t->from, TILE_KB, false, s->dp, TILE_KB);
    score_gradient(s->dp, p, s->D, rows, keys, t->i0);
    tile_gemm(rows, dh, keys, scale, s->dp, TILE_KB, 1, t->k, dh, true, t->dq, dh);
    tile_gemm(keys, dh, rows, scale, s->dp, 1, TILE_KB, t->q, dh, true, t->dk, dh);
}

/* The same steps on bf16 operands: the query and output-gradient rows and
 * the keys packed once for the pair, P and dS once each as they come. */
static void backward_products_bf16(const tile_pair_args *t, int dh, const tiled_mask *mask, const tiled_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int rows = t->rows, keys = t->keys, hp = (dh + 1) / 2, kp = (TILE_KB + 1) / 2;
    const tiled_pairs pr = s->pr;
    const uint16_t *qr = pr.qr + 2 * (size_t)t->i0 * hp, *dr = pr.dr + 2 * (size_t)t->i0 * hp;
    const uint16_t *qc = pr.qc + 2 * (size_t)(t->i0 / 2) * dh, *dc = pr.dc + 2 * (size_t)(t->i0 / 2) * dh;
    const uint16_t *kc = pr.kc + 2 * (size_t)(t->from / 2) * dh;
    if (t->i0 % 2 || rows % 2) { /* rows not on the call's pairs */
        tile_bf16_pack(pr.q, dh, 1, t->q, dh, 1, rows, dh);
        tile_bf16_pack(pr.d, dh, 1, t->dout, dh, 1, rows, dh);
        qc = pr.q, dc = pr.d;
    }
    if (t->from % 2 || keys % 2) { /* keys not on the key tile's pairs */
        tile_bf16_pack(pr.k, dh, 1, t->k, dh, 1, keys, dh);
        kc = pr.k;
    }
    tile_gemm_bf16(rows, keys, dh, scale, qr, hp, 1, pr.kt + 2 * t->from, TILE_KB, false, p, TILE_KB);
    tile_probabilities(p, t->lse, rows, keys, t->i0, t->j0, mask, s->bf16);
    tile_gemm_bf16(rows, keys, dh, 1.0f, dr, hp, 1, pr.vt + 2 * t->from, TILE_KB, false, s->dp, TILE_KB);
    score_gradient_bf16(p, s->dp, s->D, rows, keys, t->i0, s);
    tile_gemm_bf16(keys, dh, rows, 1.0f, pr.p, 1, TILE_KB, dc, dh, true, t->dv, dh);
    tile_gemm_bf16(rows, dh, keys, scale, pr.sr, kp, 1, kc, dh, true, t->dq, dh);
    tile_gemm_bf16(keys, dh, rows, scale, pr.s, 1, TILE_KB, qc, dh, true, t->dk, dh);
}

/* The gradients' share of key tile j0 (keys x dh of K and V, packed in
 * s->kt and s->vt) from the query rows i0 .. i0 + rows - 1, cut to the keys
 * those rows see: from the first row's first to the last row's last. */
static void backward_tile(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int dh, int i0, int rows, int j0, int keys, const tiled_mask *mask,
                          const tiled_scratch *s) {
    int from = tiled_max(tiled_key_begin(mask, i0) - j0, 0);
    size_t at = (size_t)from * dh, row = (size_t)i0 * dh;
    tile_pair_args t = {dq + row,
                        dkj + at,
                        dvj + at,
                        q + row,
                        dout + row,
                        kj + at,
                        lse,
                        i0,
                        rows,
                        j0 + from,
                        tiled_min(keys, tiled_key_end(mask, i0 + rows - 1) - j0) - from,
                        from};
    if (s->bf16) backward_products_bf16(&t, dh, mask, s);
    else backward_products(&t, dh, mask, s);
}

/* backward_tile, its rows in parts where the pair crosses the mask's edge
 * (tiled_split_rows), each part cut to the keys it sees. */
static void backward_rows(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int dh, int i0, int rows, int j0, int keys, const tiled_mask *mask,
                          const tiled_scratch *s) {
    int from = tiled_max(tiled_key_begin(mask, i0) - j0, 0),
        end = tiled_min(keys, tiled_key_end(mask, i0 + rows - 1) - j0);
    if (from >= end) return; /* these rows see none of the tile's keys */
    if (tiled_split_rows(mask, rows, end - from, i0, j0 + from, BACKWARD_PART)) {
        int part = tiled_first_part(rows, BACKWARD_PART);
        backward_rows(dq, dkj, dvj, dout, lse, q, kj, dh, i0, part, j0, keys, mask, s);
        backward_rows(dq, dkj, dvj, dout, lse, q, kj, dh, i0 + part, rows - part, j0, keys, mask, s);
        return;
    }
    backward_tile(dq, dkj, dvj, dout, lse, q, kj, dh, i0, rows, j0, keys, mask, s);
}

/* Key tile j0's K and V as the products of backward_tile read them. */
static void pack_key_tile(const float *kj, const float *vj, int keys, int dh, const tiled_scratch *s) {
    if (s->bf16) {
        tile_bf16_pack(s->pr.kt, TILE_KB, 1, kj, 1, dh, dh, keys);
        tile_bf16_pack(s->pr.vt, TILE_KB, 1, vj, 1, dh, dh, keys);
        tile_bf16_pack(s->pr.kc, dh, 1, kj, dh, 1, keys, dh);
        return;
    }
    tile_gemm_transpose(s->kt, TILE_KB, kj, dh, keys, dh);
    tile_gemm_transpose(s->vt, TILE_KB, vj, dh, keys, dh);
}

void tiled_softmax_band_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                                 const float *q, const float *k, const float *v, int Tq, int Tk, int dh, int q_pos0,
                                 bool causal, int half, bool accumulate, bool bf16, float *scratch) {
    tiled_scratch s = tiled_carve(scratch, dh, bf16);
    tiled_mask mask = tiled_mask_of(q_pos0, Tk, causal, half);
    row_dots(s.D, dout, out, Tq, dh);
    if (bf16) {
        /* Q and dO once for every key tile: in pairs along dh for the
         * scores (qr, dr), across rows for dK and dV (qc, dc) */
        s.pr = backward_pairs(&s, dh, Tq);
        tile_bf16_pack(s.pr.qr, 1, (dh + 1) / 2, q, 1, dh, dh, Tq);
        tile_bf16_pack(s.pr.dr, 1, (dh + 1) / 2, dout, 1, dh, dh, Tq);
        tile_bf16_pack(s.pr.qc, dh, 1, q, dh, 1, Tq, dh);
        tile_bf16_pack(s.pr.dc, dh, 1, dout, dh, 1, Tq, dh);
    }
    if (!accumulate) {
        memset(dq, 0, sizeof(float) * (size_t)Tq * dh);
        memset(dk, 0, sizeof(float) * (size_t)Tk * dh);
        memset(dv, 0, sizeof(float) * (size_t)Tk * dh);
    }
    for (int j0 = 0; j0 < Tk; j0 += TILE_KB) {
        int keys = tiled_min(TILE_KB, Tk - j0);
        const float *kj = k + (size_t)j0 * dh;
        /* the rows that see a key of this tile, at positions j0 - ahead .. j0 + keys - 1 + behind, in query tiles */
        int first = tiled_max(j0 - mask.ahead - q_pos0, 0), end = tiled_min(j0 + keys + mask.behind - q_pos0, Tq);
        if (first >= end) continue;
        pack_key_tile(kj, v + (size_t)j0 * dh, keys, dh, &s);
        for (int i0 = first; i0 < end; i0 += TILE_Q)
            backward_rows(dq, dk + (size_t)j0 * dh, dv + (size_t)j0 * dh, dout, lse, q, kj, dh, i0,
                          tiled_min(TILE_Q, end - i0), j0, keys, &mask, &s);
    }
}

void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal, bool bf16,
                            float *scratch) {
    tiled_softmax_band_backward(dq, dk, dv, dout, out, lse, q, k, v, T, T, dh, 0, causal, 0, false, bf16, scratch);
}
