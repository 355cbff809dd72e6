/* Softmax attention of one head in tiles, with an online softmax (see
 * tiled_softmax.h and docs/model.md §1.3): the T x T scores are never
 * stored. Forward, for each tile of query rows, runs over the key tiles it
 * may see, keeping per row the running maximum m and sum l of exp(s - m)
 * and an unnormalised output acc; a new tile's maximum rescales both. It
 * saves the log-sum-exp m + log l of each row. Backward recomputes each
 * tile's probabilities from it, exp(s - lse), so that with
 * D = rowsum(dO * O):
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - D),
 *   dQ += scale dS K,  dK += scale dS^T Q.
 * Tiles wholly above a causal diagonal are skipped. Every product goes
 * through gemm_product. */
#include "momfmm/tiled_softmax.h"

#include <math.h>
#include <string.h>

#include "momfmm/fast_math.h"
#include "momfmm/gemm.h"

/* A query tile of 64 rows against key tiles of 256: the score tile (64 KB),
 * a query tile and the output accumulator stay in a 1 MB L2 cache, and each
 * product is large enough (2^20 multiply-adds at dh 64) to keep a GEMM
 * kernel near its speed. */
#define TILE_Q 64
#define TILE_K 256

static int min_int(int a, int b) { return a < b ? a : b; }

/* Keys [0, visible) are visible to query row i at position q_pos0 + i. */
static int visible_keys(int i, int Tk, int q_pos0, bool causal) { return causal ? min_int(q_pos0 + i + 1, Tk) : Tk; }

size_t tiled_softmax_scratch_floats(int T, int dh) {
    return 2 * (size_t)TILE_Q * TILE_K + (size_t)TILE_Q * dh + 2 * (size_t)TILE_Q + (size_t)T;
}

/* One tile of scores (rows x keys, stride TILE_K) into probabilities of the
 * running softmax: updates each row's maximum m and sum l, rescales its
 * output row acc; returns nothing, leaves exp(s - m_new) (0 where masked). */
VECTOR_CLONES static void online_rows(float *scores, float *m, float *l, float *acc, int rows, int keys, int i0, int j0,
                                      int Tk, int q_pos0, bool causal, int dh) {
    for (int r = 0; r < rows; r++) {
        float *s = scores + (size_t)r * TILE_K;
        int visible = visible_keys(i0 + r, Tk, q_pos0, causal) - j0;
        visible = visible < keys ? visible : keys;
        if (visible <= 0) { /* the whole tile is masked for this row */
            for (int j = 0; j < keys; j++) s[j] = 0.0f;
            continue;
        }
        float tile_max = fast_max_lanes(s, visible), m_new = m[r] > tile_max ? m[r] : tile_max;
        float rescale = m[r] == -INFINITY ? 0.0f : fast_exp_nonpositive(m[r] - m_new);
        for (int j = 0; j < visible; j++) s[j] = fast_exp_nonpositive(s[j] - m_new);
        for (int j = visible; j < keys; j++) s[j] = 0.0f;
        l[r] = l[r] * rescale + fast_sum_lanes(s, visible);
        m[r] = m_new;
        float *o = acc + (size_t)r * dh;
        for (int c = 0; c < dh; c++) o[c] *= rescale;
    }
}

void tiled_softmax_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                           int dh, int q_pos0, bool causal, float *scratch) {
    float scale = 1.0f / sqrtf((float)dh);
    float *scores = scratch, *acc = scores + 2 * (size_t)TILE_Q * TILE_K, *m = acc + (size_t)TILE_Q * dh;
    float *l = m + TILE_Q;
    for (int i0 = 0; i0 < Tq; i0 += TILE_Q) {
        int rows = min_int(TILE_Q, Tq - i0);
        int last_key = visible_keys(i0 + rows - 1, Tk, q_pos0, causal); /* keys any row of the tile sees */
        for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
        memset(acc, 0, sizeof(float) * (size_t)rows * dh);
        for (int j0 = 0; j0 < last_key; j0 += TILE_K) {
            int keys = min_int(TILE_K, last_key - j0);
            gemm_product(false, true, rows, keys, dh, scale, q + (size_t)i0 * dh, dh, k + (size_t)j0 * dh, dh, 0.0f,
                         scores, TILE_K);
            online_rows(scores, m, l, acc, rows, keys, i0, j0, Tk, q_pos0, causal, dh);
            gemm_product(false, false, rows, dh, keys, 1.0f, scores, TILE_K, v + (size_t)j0 * dh, dh, 1.0f, acc, dh);
        }
        for (int r = 0; r < rows; r++) {
            float inv = 1.0f / l[r];
            const float *o = acc + (size_t)r * dh;
            float *dst = out + (size_t)(i0 + r) * dh;
            for (int c = 0; c < dh; c++) dst[c] = o[c] * inv;
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

/* Scores of one tile back into probabilities exp(s - lse), 0 where masked. */
VECTOR_CLONES static void recompute_probabilities(float *p, const float *lse, int rows, int keys, int i0, int j0, int T,
                                                  bool causal) {
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_K;
        int visible = min_int(visible_keys(i0 + r, T, 0, causal) - j0, keys);
        for (int j = 0; j < visible; j++) row[j] = fast_exp_nonpositive(row[j] - lse[i0 + r]);
        for (int j = visible < 0 ? 0 : visible; j < keys; j++) row[j] = 0.0f;
    }
}

/* dS = P * (dP - D), in place in dp. */
VECTOR_CLONES static void score_gradient(float *dp, const float *p, const float *D, int rows, int keys, int i0) {
    for (int r = 0; r < rows; r++) {
        float *ds = dp + (size_t)r * TILE_K;
        const float *pr = p + (size_t)r * TILE_K;
        for (int j = 0; j < keys; j++) ds[j] = pr[j] * (ds[j] - D[i0 + r]);
    }
}

VECTOR_CLONES static void row_dots(float *D, const float *dout, const float *out, int T, int dh) {
    for (int t = 0; t < T; t++) {
        const float *a = dout + (size_t)t * dh, *b = out + (size_t)t * dh;
        float sum = 0.0f;
        for (int c = 0; c < dh; c++) sum += a[c] * b[c];
        D[t] = sum;
    }
}

void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal,
                            float *scratch) {
    float scale = 1.0f / sqrtf((float)dh);
    float *p = scratch, *dp = p + (size_t)TILE_Q * TILE_K,
          *D = dp + (size_t)TILE_Q * TILE_K + (size_t)TILE_Q * dh + 2 * (size_t)TILE_Q;
    row_dots(D, dout, out, T, dh);
    memset(dq, 0, sizeof(float) * (size_t)T * dh);
    memset(dk, 0, sizeof(float) * (size_t)T * dh);
    memset(dv, 0, sizeof(float) * (size_t)T * dh);
    for (int j0 = 0; j0 < T; j0 += TILE_K) {
        int keys = min_int(TILE_K, T - j0);
        const float *kj = k + (size_t)j0 * dh, *vj = v + (size_t)j0 * dh;
        float *dkj = dk + (size_t)j0 * dh, *dvj = dv + (size_t)j0 * dh;
        for (int i0 = causal ? j0 / TILE_Q * TILE_Q : 0; i0 < T; i0 += TILE_Q) {
            int rows = min_int(TILE_Q, T - i0);
            const float *qi = q + (size_t)i0 * dh, *doi = dout + (size_t)i0 * dh;
            gemm_product(false, true, rows, keys, dh, scale, qi, dh, kj, dh, 0.0f, p, TILE_K);
            recompute_probabilities(p, lse, rows, keys, i0, j0, T, causal);
            gemm_product(true, false, keys, dh, rows, 1.0f, p, TILE_K, doi, dh, 1.0f, dvj, dh);
            gemm_product(false, true, rows, keys, dh, 1.0f, doi, dh, vj, dh, 0.0f, dp, TILE_K);
            score_gradient(dp, p, D, rows, keys, i0);
            gemm_product(false, false, rows, dh, keys, scale, dp, TILE_K, kj, dh, 1.0f, dq + (size_t)i0 * dh, dh);
            gemm_product(true, false, keys, dh, rows, scale, dp, TILE_K, qi, dh, 1.0f, dkj, dh);
        }
    }
}
