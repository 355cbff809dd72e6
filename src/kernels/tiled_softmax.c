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
#include "kernels/tiled_softmax.h"

#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/tile_gemm.h"

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

/* Which keys a query row sees (tiled_softmax.h): key j is visible to the
 * row at position pos when lo(pos) <= j <= hi(pos), that is when
 * j - ahead <= pos <= j + behind. A causal row sees no key ahead of it; a
 * band of half-width `half` (FMM's near field) none at distance half or
 * more. */
/* Past any distance: positions stay below 2^24 (config.c), so j + UNBOUNDED
 * still fits an int. */
#define UNBOUNDED (1 << 30)
typedef struct {
    int q_pos0, Tk, ahead, behind;
} tile_mask;

static tile_mask mask_of(int q_pos0, int Tk, bool causal, int half) {
    tile_mask m = {.q_pos0 = q_pos0, .Tk = Tk, .behind = half > 0 ? half - 1 : UNBOUNDED};
    m.ahead = causal ? 0 : m.behind;
    return m;
}

/* The first key visible to query row i, and one past the last. */
static int key_begin(const tile_mask *m, int i) { return max_int(m->q_pos0 + i - m->behind, 0); }
static int key_end(const tile_mask *m, int i) { return min_int(m->q_pos0 + i + m->ahead, m->Tk - 1) + 1; }

/* The rows [row_begin, row_end) of a query tile (rows i0.., `rows` of
 * them) that see key j. */
static int row_begin(const tile_mask *m, int j, int i0, int rows) {
    return min_int(max_int(j - m->ahead - m->q_pos0 - i0, 0), rows);
}
static int row_end(const tile_mask *m, int j, int i0, int rows) {
    return min_int(max_int(j + m->behind - m->q_pos0 - i0 + 1, 0), rows);
}

/* The running maxima: mx = max(m, the visible scores of the tile). The
 * restrict pointers tell GCC the rows do not overlap, so the loops over a
 * tile's rows vectorise. */
VECTOR_CLONES static void tile_maxima(float *restrict mx, const float *restrict m, const float *restrict st, int rows,
                                      int keys, int i0, int j0, const tile_mask *mask) {
    for (int r = 0; r < rows; r++) mx[r] = m[r];
    for (int j = 0; j < keys; j++) {
        const float *restrict col = st + (size_t)j * TILE_Q;
        int end = row_end(mask, j0 + j, i0, rows);
        for (int r = row_begin(mask, j0 + j, i0, rows); r < end; r++) mx[r] = col[r] > mx[r] ? col[r] : mx[r];
    }
}

/* exp(s - m) over the visible scores of the tile's rows [from, rows), 0
 * where masked; sum receives each row's total. */
VECTOR_CLONES static void tile_exponentials(float *restrict st, float *restrict sum, const float *restrict m, int from,
                                            int rows, int keys, int i0, int j0, const tile_mask *mask) {
    for (int r = from; r < rows; r++) sum[r] = 0.0f;
    for (int j = 0; j < keys; j++) {
        float *restrict col = st + (size_t)j * TILE_Q;
        int first = max_int(row_begin(mask, j0 + j, i0, rows), from),
            end = max_int(row_end(mask, j0 + j, i0, rows), first);
        for (int r = from; r < first; r++) col[r] = 0.0f;
        for (int r = first; r < end; r++) {
            col[r] = fast_exp_nonpositive(col[r] - m[r]);
            sum[r] += col[r];
        }
        for (int r = end; r < rows; r++) col[r] = 0.0f;
    }
}

#if FAST_EXP8_AVAILABLE
/* Lanes lo <= lane of eight, as a mask. */
__attribute__((target("avx2"), always_inline)) static inline __m256 lanes_from(int lo) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)));
}

/* Lanes lo <= lane < hi of eight, as a mask. */
__attribute__((target("avx2"), always_inline)) static inline __m256 lanes_between(int lo, int hi) {
    return _mm256_andnot_ps(lanes_from(hi), lanes_from(lo));
}

/* tile_exponentials eight rows at a time with fast_exp8_nonpositive, each
 * group's sums in a register across the keys; the rows past the last full
 * group of eight go to the scalar loop (masked loads and stores are slow on
 * AMD's cores). */
__attribute__((target("avx2,fma"))) static void tile_exponentials_avx2(float *st, float *sum, const float *m, int rows,
                                                                       int keys, int i0, int j0,
                                                                       const tile_mask *mask) {
    int full = rows / 8 * 8;
    /* every row sees every key: the last key's first row and the first key's last */
    bool whole = row_begin(mask, j0 + keys - 1, i0, rows) == 0 && row_end(mask, j0, i0, rows) == rows;
    for (int r0 = 0; r0 < full; r0 += 8) {
        __m256 mr = _mm256_loadu_ps(m + r0), total = _mm256_setzero_ps();
        for (int j = 0; j < keys; j++) {
            float *col = st + (size_t)j * TILE_Q + r0;
            __m256 e = fast_exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(col), mr));
            if (!whole)
                e = _mm256_and_ps(
                    e, lanes_between(row_begin(mask, j0 + j, i0, rows) - r0, row_end(mask, j0 + j, i0, rows) - r0));
            _mm256_storeu_ps(col, e);
            total = _mm256_add_ps(total, e);
        }
        _mm256_storeu_ps(sum + r0, total);
    }
    if (full < rows) tile_exponentials(st, sum, m, full, rows, keys, i0, j0, mask);
}
#endif

/* One tile of scores S^T (keys x rows, stride TILE_Q) into the running
 * softmax: leaves exp(s - m_new) (0 where masked), updates each row's m
 * and l and rescales its output row by exp(m_old - m_new). A row that has
 * seen no key yet keeps m = -inf, l = 0. */
static void online_tile(const tile_scratch *s, int rows, int keys, int i0, int j0, const tile_mask *mask, int dh) {
    tile_maxima(s->mx, s->m, s->st, rows, keys, i0, j0, mask);
    for (int r = 0; r < rows; r++) {
        s->rescale[r] = s->m[r] == -INFINITY ? 0.0f : fast_exp_nonpositive(s->m[r] - s->mx[r]);
        s->m[r] = s->mx[r];
    }
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_available()) tile_exponentials_avx2(s->st, s->sum, s->m, rows, keys, i0, j0, mask);
    else
#endif
        tile_exponentials(s->st, s->sum, s->m, 0, rows, keys, i0, j0, mask);
    for (int r = 0; r < rows; r++) {
        s->l[r] = s->l[r] * s->rescale[r] + s->sum[r];
        float *o = s->acc + (size_t)r * dh;
        for (int c = 0; c < dh; c++) o[c] *= s->rescale[r];
    }
}

static void forward_tile(float *out, float *lse, const float *q, const float *k, const float *v, int dh, int i0,
                         int rows, const tile_mask *mask, const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh);
    /* the keys any row of the tile sees: from the first row's first to the last row's last */
    int first_key = key_begin(mask, i0), last_key = key_end(mask, i0 + rows - 1);
    tile_gemm_transpose(s->qt, TILE_Q, q + (size_t)i0 * dh, dh, rows, dh);
    for (int r = 0; r < rows; r++) s->m[r] = -INFINITY, s->l[r] = 0.0f;
    memset(s->acc, 0, sizeof(float) * (size_t)rows * dh);
    for (int j0 = first_key; j0 < last_key; j0 += TILE_K) {
        int keys = min_int(TILE_K, last_key - j0);
        tile_gemm(keys, rows, dh, scale, k + (size_t)j0 * dh, dh, 1, s->qt, TILE_Q, false, s->st, TILE_Q);
        online_tile(s, rows, keys, i0, j0, mask, dh);
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

void tiled_softmax_band_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                                int dh, int q_pos0, bool causal, int half, float *scratch) {
    tile_scratch s = carve(scratch, dh);
    tile_mask mask = mask_of(q_pos0, Tk, causal, half);
    for (int i0 = 0; i0 < Tq; i0 += TILE_Q)
        forward_tile(out, lse, q, k, v, dh, i0, min_int(TILE_Q, Tq - i0), &mask, &s);
}

float tiled_softmax_weight(const float *q, const float *k, const float *lse, int dh, int i, int j) {
    float score = 0.0f;
    for (int c = 0; c < dh; c++) score += q[(size_t)i * dh + c] * k[(size_t)j * dh + c];
    return expf(score / sqrtf((float)dh) - lse[i]);
}

void tiled_softmax_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                           int dh, int q_pos0, bool causal, float *scratch) {
    tiled_softmax_band_forward(out, lse, q, k, v, Tq, Tk, dh, q_pos0, causal, 0, scratch);
}

/* Scores of one tile (rows x keys, stride TILE_KB), the keys [from, keys)
 * of each row, back into probabilities exp(s - lse), 0 where masked. */
VECTOR_CLONES static void recompute_probabilities(float *restrict p, const float *restrict lse, int rows, int from,
                                                  int keys, int i0, int j0, const tile_mask *mask) {
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = max_int(key_begin(mask, i0 + r) - j0, from);
        int end = max_int(min_int(key_end(mask, i0 + r) - j0, keys), begin);
        for (int j = from; j < begin; j++) row[j] = 0.0f;
        for (int j = begin; j < end; j++) row[j] = fast_exp_nonpositive(row[j] - lse[i0 + r]);
        for (int j = end; j < keys; j++) row[j] = 0.0f;
    }
}

#if FAST_EXP8_AVAILABLE
/* recompute_probabilities eight keys at a time (fast_exp8_nonpositive);
 * the keys past the last full group go to the scalar loop. */
__attribute__((target("avx2,fma"))) static void
recompute_probabilities_avx2(float *p, const float *lse, int rows, int keys, int i0, int j0, const tile_mask *mask) {
    int full = keys / 8 * 8;
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = key_begin(mask, i0 + r) - j0, end = min_int(key_end(mask, i0 + r) - j0, keys);
        __m256 lse_r = _mm256_set1_ps(lse[i0 + r]);
        for (int j = 0; j < full; j += 8) {
            __m256 e = fast_exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), lse_r));
            if (begin > j || end < j + 8) e = _mm256_and_ps(e, lanes_between(begin - j, end - j));
            _mm256_storeu_ps(row + j, e);
        }
    }
    if (full < keys) recompute_probabilities(p, lse, rows, full, keys, i0, j0, mask);
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
 * s->kt and s->vt) from the query rows i0 .. i0 + rows - 1, cut to the keys
 * those rows see: from the first row's first to the last row's last. */
static void backward_tile(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int dh, int i0, int rows, int j0, int keys, const tile_mask *mask,
                          const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int from = max_int(key_begin(mask, i0) - j0, 0);
    keys = min_int(keys, key_end(mask, i0 + rows - 1) - j0) - from;
    j0 += from, kj += (size_t)from * dh, dkj += (size_t)from * dh, dvj += (size_t)from * dh;
    const float *qi = q + (size_t)i0 * dh, *doi = dout + (size_t)i0 * dh;
    tile_gemm(rows, keys, dh, scale, qi, dh, 1, s->kt + from, TILE_KB, false, p, TILE_KB);
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_available()) recompute_probabilities_avx2(p, lse, rows, keys, i0, j0, mask);
    else
#endif
        recompute_probabilities(p, lse, rows, 0, keys, i0, j0, mask);
    tile_gemm(keys, dh, rows, 1.0f, p, 1, TILE_KB, doi, dh, true, dvj, dh);
    tile_gemm(rows, keys, dh, 1.0f, doi, dh, 1, s->vt + from, TILE_KB, false, s->dp, TILE_KB);
    score_gradient(s->dp, p, s->D, rows, keys, i0);
    tile_gemm(rows, dh, keys, scale, s->dp, TILE_KB, 1, kj, dh, true, dq + (size_t)i0 * dh, dh);
    tile_gemm(keys, dh, rows, scale, s->dp, 1, TILE_KB, qi, dh, true, dkj, dh);
}

void tiled_softmax_band_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                                 const float *q, const float *k, const float *v, int Tq, int Tk, int dh, int q_pos0,
                                 bool causal, int half, bool accumulate, float *scratch) {
    tile_scratch s = carve(scratch, dh);
    tile_mask mask = mask_of(q_pos0, Tk, causal, half);
    row_dots(s.D, dout, out, Tq, dh);
    if (!accumulate) {
        memset(dq, 0, sizeof(float) * (size_t)Tq * dh);
        memset(dk, 0, sizeof(float) * (size_t)Tk * dh);
        memset(dv, 0, sizeof(float) * (size_t)Tk * dh);
    }
    for (int j0 = 0; j0 < Tk; j0 += TILE_KB) {
        int keys = min_int(TILE_KB, Tk - j0);
        const float *kj = k + (size_t)j0 * dh;
        /* the rows that see a key of this tile, at positions j0 - ahead .. j0 + keys - 1 + behind, in query tiles */
        int first = max_int(j0 - mask.ahead - q_pos0, 0), end = min_int(j0 + keys + mask.behind - q_pos0, Tq);
        if (first >= end) continue;
        tile_gemm_transpose(s.kt, TILE_KB, kj, dh, keys, dh);
        tile_gemm_transpose(s.vt, TILE_KB, v + (size_t)j0 * dh, dh, keys, dh);
        for (int i0 = first; i0 < end; i0 += TILE_Q)
            backward_tile(dq, dk + (size_t)j0 * dh, dv + (size_t)j0 * dh, dout, lse, q, kj, dh, i0,
                          min_int(TILE_Q, end - i0), j0, keys, &mask, &s);
    }
}

void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal,
                            float *scratch) {
    tiled_softmax_band_backward(dq, dk, dv, dout, out, lse, q, k, v, T, T, dh, 0, causal, 0, false, scratch);
}

void tiled_softmax_merge(float *out, float *lse, const float *block_out, const float *block_lse, int Tq, int dh) {
    for (int i = 0; i < Tq; i++) {
        float m = fmaxf(lse[i], block_lse[i]);
        if (m == -INFINITY) continue; /* neither has seen a key */
        float a = expf(lse[i] - m), b = expf(block_lse[i] - m), inv = 1.0f / (a + b);
        float *o = out + (size_t)i * dh;
        const float *ob = block_out + (size_t)i * dh;
        for (int c = 0; c < dh; c++) o[c] = (a * o[c] + b * ob[c]) * inv;
        lse[i] = m + logf(a + b);
    }
}
