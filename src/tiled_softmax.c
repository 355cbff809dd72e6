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
 * Tiles wholly above a causal diagonal are skipped. The products run on
 * tile_gemm (docs/design.md §8.10). Forward holds a tile's scores as
 * S^T (keys x rows), so that only the query tile is transposed, once for
 * all its key tiles, and the softmax's per-row maxima and sums run along
 * contiguous rows of lanes; backward, key tiles outside, transposes K and V
 * once per key tile. */
#include "momfmm/tiled_softmax.h"

#include <math.h>
#include <string.h>

#include "momfmm/fast_math.h"
#include "momfmm/tile_gemm.h"

/* A query tile of 96 rows against key tiles of 192: the score tiles (72 KB
 * each) and the transposed operands stay in a 512 KB L2 cache, and both
 * sizes are multiples of tile_gemm's 6 x 16 micro-tile. Smaller tiles would
 * waste less of the causal diagonal (about (96 + 192) / T of the work) but
 * pay more per-tile overhead. */
#define TILE_Q 96
#define TILE_K 192
/* Backward's key tiles are narrower: a causal diagonal tile is computed
 * whole and masked, and backward, key tiles outside, crosses the diagonal
 * with every query tile that overlaps it, so at T = 1k the 192-wide tiles
 * wasted a third of the work. */
#define TILE_KB 96

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* The scratch, carved: forward uses st, qt, acc and the row arrays;
 * backward p, dp, kt, vt and D. */
typedef struct {
    float *st, *dp, *qt, *kt, *vt, *acc, *m, *l, *mx, *rescale, *sum, *D;
} tile_scratch;

size_t tiled_softmax_scratch_floats(int T, int dh) {
    return 2 * (size_t)TILE_Q * TILE_K + 2 * (size_t)dh * TILE_K + 2 * (size_t)dh * TILE_Q + 5 * (size_t)TILE_Q +
           (size_t)T;
}

static tile_scratch carve(float *scratch, int dh) {
    tile_scratch s;
    s.st = scratch, s.dp = s.st + (size_t)TILE_Q * TILE_K, s.kt = s.dp + (size_t)TILE_Q * TILE_K;
    s.vt = s.kt + (size_t)dh * TILE_K, s.qt = s.vt + (size_t)dh * TILE_K, s.acc = s.qt + (size_t)dh * TILE_Q;
    s.m = s.acc + (size_t)dh * TILE_Q, s.l = s.m + TILE_Q, s.mx = s.l + TILE_Q, s.rescale = s.mx + TILE_Q;
    s.sum = s.rescale + TILE_Q, s.D = s.sum + TILE_Q;
    return s;
}

/* Keys [0, visible) are visible to query row i at position q_pos0 + i. */
static int visible_keys(int i, int Tk, int q_pos0, bool causal) { return causal ? min_int(q_pos0 + i + 1, Tk) : Tk; }

/* The first row of a query tile (rows i0.., at positions q_pos0 + i0..)
 * that sees key j: key j is visible to row r when j <= q_pos0 + i0 + r. */
static int first_row(int j, int i0, int q_pos0, bool causal, int rows) {
    return causal ? min_int(max_int(j - q_pos0 - i0, 0), rows) : 0;
}

/* The running maxima: mx = max(m, the visible scores of the tile). The
 * restrict pointers tell GCC the rows do not overlap, so the loops over a
 * tile's rows vectorise. */
VECTOR_CLONES static void tile_maxima(float *restrict mx, const float *restrict m, const float *restrict st, int rows,
                                      int keys, int i0, int j0, int q_pos0, bool causal) {
    for (int r = 0; r < rows; r++) mx[r] = m[r];
    for (int j = 0; j < keys; j++) {
        const float *restrict col = st + (size_t)j * TILE_Q;
        for (int r = first_row(j0 + j, i0, q_pos0, causal, rows); r < rows; r++)
            mx[r] = col[r] > mx[r] ? col[r] : mx[r];
    }
}

/* exp(s - m) over the visible scores of the tile's rows [from, rows), 0
 * where masked; sum receives each row's total. */
VECTOR_CLONES static void tile_exponentials(float *restrict st, float *restrict sum, const float *restrict m, int from,
                                            int rows, int keys, int i0, int j0, int q_pos0, bool causal) {
    for (int r = from; r < rows; r++) sum[r] = 0.0f;
    for (int j = 0; j < keys; j++) {
        float *restrict col = st + (size_t)j * TILE_Q;
        int first = max_int(first_row(j0 + j, i0, q_pos0, causal, rows), from);
        for (int r = from; r < first; r++) col[r] = 0.0f;
        for (int r = first; r < rows; r++) {
            col[r] = fast_exp_nonpositive(col[r] - m[r]);
            sum[r] += col[r];
        }
    }
}

#if FAST_EXP8_AVAILABLE
/* Lanes lo <= lane of eight, as a mask. */
__attribute__((target("avx2"), always_inline)) static inline __m256 lanes_from(int lo) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)));
}

/* tile_exponentials eight rows at a time with fast_exp8_nonpositive, each
 * group's sums in a register across the keys; the rows past the last full
 * group of eight go to the scalar loop (masked loads and stores are slow on
 * AMD's cores). */
__attribute__((target("avx2,fma"))) static void tile_exponentials_avx2(float *st, float *sum, const float *m, int rows,
                                                                       int keys, int i0, int j0, int q_pos0,
                                                                       bool causal) {
    int full = rows / 8 * 8;
    bool whole = first_row(j0 + keys - 1, i0, q_pos0, causal, rows) == 0; /* every row sees every key */
    for (int r0 = 0; r0 < full; r0 += 8) {
        __m256 mr = _mm256_loadu_ps(m + r0), total = _mm256_setzero_ps();
        for (int j = 0; j < keys; j++) {
            float *col = st + (size_t)j * TILE_Q + r0;
            __m256 e = fast_exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(col), mr));
            if (!whole) e = _mm256_and_ps(e, lanes_from(first_row(j0 + j, i0, q_pos0, causal, rows) - r0));
            _mm256_storeu_ps(col, e);
            total = _mm256_add_ps(total, e);
        }
        _mm256_storeu_ps(sum + r0, total);
    }
    if (full < rows) tile_exponentials(st, sum, m, full, rows, keys, i0, j0, q_pos0, causal);
}
#endif

/* One tile of scores S^T (keys x rows, stride TILE_Q) into the running
 * softmax: leaves exp(s - m_new) (0 where masked), updates each row's m
 * and l and rescales its output row by exp(m_old - m_new). */
static void online_tile(const tile_scratch *s, int rows, int keys, int i0, int j0, int q_pos0, bool causal, int dh) {
    tile_maxima(s->mx, s->m, s->st, rows, keys, i0, j0, q_pos0, causal);
    for (int r = 0; r < rows; r++) {
        s->rescale[r] = s->m[r] == -INFINITY ? 0.0f : fast_exp_nonpositive(s->m[r] - s->mx[r]);
        s->m[r] = s->mx[r];
    }
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_available()) tile_exponentials_avx2(s->st, s->sum, s->m, rows, keys, i0, j0, q_pos0, causal);
    else
#endif
        tile_exponentials(s->st, s->sum, s->m, 0, rows, keys, i0, j0, q_pos0, causal);
    for (int r = 0; r < rows; r++) {
        s->l[r] = s->l[r] * s->rescale[r] + s->sum[r];
        float *o = s->acc + (size_t)r * dh;
        for (int c = 0; c < dh; c++) o[c] *= s->rescale[r];
    }
}

static void forward_tile(float *out, float *lse, const float *q, const float *k, const float *v, int Tk, int dh, int i0,
                         int rows, int q_pos0, bool causal, const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh);
    int last_key = visible_keys(i0 + rows - 1, Tk, q_pos0, causal); /* keys any row of the tile sees */
    tile_gemm_transpose(s->qt, TILE_Q, q + (size_t)i0 * dh, dh, rows, dh);
    for (int r = 0; r < rows; r++) s->m[r] = -INFINITY, s->l[r] = 0.0f;
    memset(s->acc, 0, sizeof(float) * (size_t)rows * dh);
    for (int j0 = 0; j0 < last_key; j0 += TILE_K) {
        int keys = min_int(TILE_K, last_key - j0);
        tile_gemm(keys, rows, dh, scale, k + (size_t)j0 * dh, dh, 1, s->qt, TILE_Q, false, s->st, TILE_Q);
        online_tile(s, rows, keys, i0, j0, q_pos0, causal, dh);
        tile_gemm(rows, dh, keys, 1.0f, s->st, 1, TILE_Q, v + (size_t)j0 * dh, dh, true, s->acc, dh);
    }
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / s->l[r];
        const float *o = s->acc + (size_t)r * dh;
        float *dst = out + (size_t)(i0 + r) * dh;
        for (int c = 0; c < dh; c++) dst[c] = o[c] * inv;
        lse[i0 + r] = s->m[r] + logf(s->l[r]);
    }
}

void tiled_softmax_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                           int dh, int q_pos0, bool causal, float *scratch) {
    tile_scratch s = carve(scratch, dh);
    for (int i0 = 0; i0 < Tq; i0 += TILE_Q)
        forward_tile(out, lse, q, k, v, Tk, dh, i0, min_int(TILE_Q, Tq - i0), q_pos0, causal, &s);
}

/* Scores of one tile (rows x keys, stride TILE_KB), the keys [from, keys)
 * of each row, back into probabilities exp(s - lse), 0 where masked. */
VECTOR_CLONES static void recompute_probabilities(float *restrict p, const float *restrict lse, int rows, int from,
                                                  int keys, int i0, int j0, int T, bool causal) {
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int visible = min_int(visible_keys(i0 + r, T, 0, causal) - j0, keys);
        for (int j = from; j < visible; j++) row[j] = fast_exp_nonpositive(row[j] - lse[i0 + r]);
        for (int j = max_int(visible, from); j < keys; j++) row[j] = 0.0f;
    }
}

#if FAST_EXP8_AVAILABLE
/* recompute_probabilities eight keys at a time (fast_exp8_nonpositive);
 * the keys past the last full group go to the scalar loop. */
__attribute__((target("avx2,fma"))) static void
recompute_probabilities_avx2(float *p, const float *lse, int rows, int keys, int i0, int j0, int T, bool causal) {
    int full = keys / 8 * 8;
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int visible = min_int(visible_keys(i0 + r, T, 0, causal) - j0, keys);
        __m256 lse_r = _mm256_set1_ps(lse[i0 + r]);
        for (int j = 0; j < full; j += 8) {
            __m256 e = fast_exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), lse_r));
            if (visible < j + 8) e = _mm256_andnot_ps(lanes_from(visible - j), e); /* lanes j + l >= visible */
            _mm256_storeu_ps(row + j, e);
        }
    }
    if (full < keys) recompute_probabilities(p, lse, rows, full, keys, i0, j0, T, causal);
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

VECTOR_CLONES static void row_dots(float *D, const float *dout, const float *out, int T, int dh) {
    for (int t = 0; t < T; t++) {
        const float *a = dout + (size_t)t * dh, *b = out + (size_t)t * dh;
        float sum = 0.0f;
        for (int c = 0; c < dh; c++) sum += a[c] * b[c];
        D[t] = sum;
    }
}

/* The gradients' share of key tile j0 (keys x dh of K and V, transposed in
 * s->kt and s->vt) from the query tile i0. */
static void backward_tile(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int T, int dh, int i0, int j0, int keys, bool causal,
                          const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int rows = min_int(TILE_Q, T - i0);
    if (causal) keys = min_int(keys, i0 + rows - j0); /* the tile's rows see no key past i0 + rows - 1 */
    const float *qi = q + (size_t)i0 * dh, *doi = dout + (size_t)i0 * dh;
    tile_gemm(rows, keys, dh, scale, qi, dh, 1, s->kt, TILE_KB, false, p, TILE_KB);
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_available()) recompute_probabilities_avx2(p, lse, rows, keys, i0, j0, T, causal);
    else
#endif
        recompute_probabilities(p, lse, rows, 0, keys, i0, j0, T, causal);
    tile_gemm(keys, dh, rows, 1.0f, p, 1, TILE_KB, doi, dh, true, dvj, dh);
    tile_gemm(rows, keys, dh, 1.0f, doi, dh, 1, s->vt, TILE_KB, false, s->dp, TILE_KB);
    score_gradient(s->dp, p, s->D, rows, keys, i0);
    tile_gemm(rows, dh, keys, scale, s->dp, TILE_KB, 1, kj, dh, true, dq + (size_t)i0 * dh, dh);
    tile_gemm(keys, dh, rows, scale, s->dp, 1, TILE_KB, qi, dh, true, dkj, dh);
}

void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal,
                            float *scratch) {
    tile_scratch s = carve(scratch, dh);
    row_dots(s.D, dout, out, T, dh);
    memset(dq, 0, sizeof(float) * (size_t)T * dh);
    memset(dk, 0, sizeof(float) * (size_t)T * dh);
    memset(dv, 0, sizeof(float) * (size_t)T * dh);
    for (int j0 = 0; j0 < T; j0 += TILE_KB) {
        int keys = min_int(TILE_KB, T - j0);
        const float *kj = k + (size_t)j0 * dh;
        tile_gemm_transpose(s.kt, TILE_KB, kj, dh, keys, dh);
        tile_gemm_transpose(s.vt, TILE_KB, v + (size_t)j0 * dh, dh, keys, dh);
        for (int i0 = causal ? j0 / TILE_Q * TILE_Q : 0; i0 < T; i0 += TILE_Q)
            backward_tile(dq, dk + (size_t)j0 * dh, dv + (size_t)j0 * dh, dout, lse, q, kj, T, dh, i0, j0, keys, causal,
                          &s);
    }
}
