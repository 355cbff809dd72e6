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
 * once per key tile. In bf16 (train.precision = bf16) the same products
 * run on tile_gemm_bf16, their operands packed in pairs (tiled_pairs below),
 * and the softmax around them stays fp32. */
#include "kernels/tiled_softmax.h"

#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/tile_gemm.h"

#include "tiled_softmax_internal.h"

/* The pairs `keys` keys' K takes (pairs along dh) and their V (pairs
 * along keys): a key tile's in forward_pairs, or the head's where forward
 * packs them once (whole_keys), K's first. */
static size_t key_pairs(int keys, int dh) { return (size_t)keys * ((dh + 1) / 2); }
static size_t value_pairs(int keys, int dh) { return (size_t)(keys + 1) / 2 * dh; }

/* Pairs of the bf16 operands (docs/design.md §8.10): forward and backward
 * share them, for at most this many pairs. */
static size_t pairs_needed(int dh) {
    size_t hp = (size_t)(dh + 1) / 2,
           forward = hp * TILE_Q + key_pairs(TILE_K, dh) + value_pairs(TILE_K, dh) + (TILE_K + 1) / 2 * (size_t)TILE_Q;
    size_t rows = (TILE_Q + 1) / 2, backward = 2 * hp * TILE_KB + 2 * (TILE_KB + 1) / 2 * (size_t)dh + 2 * rows * dh +
                                               2 * rows * TILE_KB + TILE_Q * (size_t)(TILE_KB + 1) / 2;
    return forward > backward ? forward : backward;
}

/* The scratch's rows part, for up to T rows: D [T], and in bf16
 * backward's Q and dO packed once per call, as the scores' operands (2
 * [T][(dh + 1) / 2] pairs) and as dK's and dV's (2 [(T + 1) / 2][dh]). A
 * pair takes a float's 4 bytes. Forward may hold a head's K and V pairs
 * there instead (whole_keys). */
static size_t rows_floats(int T, int dh) {
    return (size_t)T * (1 + 2 * (size_t)((dh + 1) / 2)) + 2 * (size_t)((T + 1) / 2) * dh;
}

size_t tiled_softmax_scratch_floats(int T, int dh) {
    return 2 * (size_t)TILE_Q * TILE_K + 2 * (size_t)dh * TILE_K + 2 * (size_t)dh * TILE_Q + 5 * (size_t)TILE_Q +
           pairs_needed(dh) + rows_floats(T, dh);
}

tiled_scratch tiled_carve(float *scratch, int dh, bool bf16) {
    tiled_scratch s;
    s.bf16 = bf16, s.keys_packed = false;
    s.st = scratch, s.dp = s.st + (size_t)TILE_Q * TILE_K, s.kt = s.dp + (size_t)TILE_Q * TILE_K;
    s.vt = s.kt + (size_t)dh * TILE_K, s.qt = s.vt + (size_t)dh * TILE_K, s.acc = s.qt + (size_t)dh * TILE_Q;
    s.m = s.acc + (size_t)dh * TILE_Q, s.l = s.m + TILE_Q, s.mx = s.l + TILE_Q, s.rescale = s.mx + TILE_Q;
    s.sum = s.rescale + TILE_Q, s.pairs = (uint16_t *)(s.sum + TILE_Q);
    s.D = s.sum + TILE_Q + pairs_needed(dh); /* [T], then the rows' pairs: the rest of the scratch */
    return s;
}

/* The forward's pairs, carved from s->pairs. */
static tiled_pairs forward_pairs(const tiled_scratch *s, int dh) {
    size_t hp = (size_t)(dh + 1) / 2;
    tiled_pairs p = {0};
    p.q = s->pairs, p.k = p.q + 2 * hp * TILE_Q, p.v = p.k + 2 * key_pairs(TILE_K, dh);
    p.p = p.v + 2 * value_pairs(TILE_K, dh);
    return p;
}

/* The running maxima: mx = max(m, the visible scores of the tile), for
 * the rows [from, rows). The restrict pointers tell GCC the rows do not
 * overlap, so the loops over a tile's rows vectorise. */
VECTOR_CLONES static void tile_maxima(float *restrict mx, const float *restrict m, const float *restrict st, int from,
                                      int rows, int keys, int i0, int j0, const tiled_mask *mask) {
    for (int r = from; r < rows; r++) mx[r] = m[r];
    for (int j = 0; j < keys; j++) {
        const float *restrict col = st + (size_t)j * TILE_Q;
        int end = tiled_row_end(mask, j0 + j, i0, rows);
        for (int r = tiled_max(tiled_row_begin(mask, j0 + j, i0, rows), from); r < end; r++)
            mx[r] = col[r] > mx[r] ? col[r] : mx[r];
    }
}

/* The rows' outputs so far times their factors exp(m_old - m_new). A factor
 * of 1 leaves a row as it is, and one of 0 comes only with m_old = -inf, a
 * row that has seen no key, whose output is still the zeros it started as
 * (and NaN * 0 stays NaN; a finite m_old gives at least e^-87, the
 * clamp of fast_exp_nonpositive): both rows are skipped with the same
 * bits. At T = 256 that is every row but those of a second key tile, and
 * the multiplies took about 5% of a bf16 forward (docs/design.md §8.10). */
VECTOR_CLONES static void rescale_outputs(float *restrict acc, const float *restrict rescale, int rows, int dh) {
    for (int r = 0; r < rows; r++) {
        float f = rescale[r];
        if (f == 1.0f || f == 0.0f) continue;
        float *restrict o = acc + (size_t)r * dh;
        for (int c = 0; c < dh; c++) o[c] *= f;
    }
}

/* exp(s - m) over the visible scores of the tile's rows [from, rows), 0
 * where masked; sum receives each row's total. `coarse` (bf16, whose P
 * is rounded to bf16 next) takes fast_exp_coarse, here and in every form
 * below: the same exponentials forward and backward. */
VECTOR_CLONES static void tile_exponentials(float *restrict st, float *restrict sum, const float *restrict m, int from,
                                            int rows, int keys, int i0, int j0, const tiled_mask *mask, bool coarse) {
    for (int r = from; r < rows; r++) sum[r] = 0.0f;
    for (int j = 0; j < keys; j++) {
        float *restrict col = st + (size_t)j * TILE_Q;
        int first = tiled_max(tiled_row_begin(mask, j0 + j, i0, rows), from),
            end = tiled_max(tiled_row_end(mask, j0 + j, i0, rows), first);
        for (int r = from; r < first; r++) col[r] = 0.0f;
        if (coarse) /* two loops: a choice inside one stops GCC vectorising it */
            for (int r = first; r < end; r++) col[r] = fast_exp_coarse(col[r] - m[r]), sum[r] += col[r];
        else
            for (int r = first; r < end; r++) col[r] = fast_exp_nonpositive(col[r] - m[r]), sum[r] += col[r];
        for (int r = end; r < rows; r++) col[r] = 0.0f;
    }
}

#if FAST_EXP8_AVAILABLE
/* The rows r0 .. r0 + 7 over the tile's keys with fast_exp8_nonpositive
 * (fast_exp8_coarse in bf16), their sums in a register; inlined with
 * `whole` a constant, as the AVX-512 groups below (`coarse` is a branch
 * the predictor takes alike every key). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
exponentials_group8(float *st, float *sum, const float *m, int r0, int keys, int i0, int j0, const tiled_mask *mask,
                    bool whole, bool coarse) {
    __m256 mr = _mm256_loadu_ps(m + r0), total = _mm256_setzero_ps();
    tiled_rows8 seen = tiled_rows8_of(mask, i0, r0);
    __m256i key = _mm256_set1_epi32(j0);
    float *col = st + r0;
    for (int j = 0; j < keys; j++, col += TILE_Q, key = _mm256_add_epi32(key, _mm256_set1_epi32(1))) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(col), mr);
        __m256 e = coarse ? fast_exp8_coarse(x) : fast_exp8_nonpositive(x);
        if (!whole) e = _mm256_and_ps(e, tiled_rows8_see(&seen, key));
        _mm256_storeu_ps(col, e);
        total = _mm256_add_ps(total, e);
    }
    _mm256_storeu_ps(sum + r0, total);
}

/* tile_exponentials eight rows at a time, from row `from` (a multiple of
 * eight); the rows past the last full group of eight go to the scalar
 * loop (masked loads and stores are slow on AMD's cores). */
__attribute__((target("avx2,fma"))) static void tile_exponentials_avx2(float *st, float *sum, const float *m, int from,
                                                                       int rows, int keys, int i0, int j0,
                                                                       const tiled_mask *mask, bool coarse) {
    int full = rows / 8 * 8;
    bool whole = tiled_whole(mask, rows, keys, i0, j0);
    for (int r0 = from; r0 < full; r0 += 8) {
        if (whole) exponentials_group8(st, sum, m, r0, keys, i0, j0, mask, true, coarse);
        else exponentials_group8(st, sum, m, r0, keys, i0, j0, mask, false, coarse);
    }
    if (full < rows) tile_exponentials(st, sum, m, full, rows, keys, i0, j0, mask, coarse);
}

/* The same sixteen rows at a time on AVX-512 (fast_exp16_nonpositive or
 * _coarse: the same bits as the eight-lane groups), then the rest as
 * above, so that each row's result does not depend on the vector width. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline __m512
exponentials16(const float *col, __m512 mr, bool whole, const tiled_rows16 *seen, __m512i key, bool coarse) {
    __m512 x = _mm512_sub_ps(_mm512_loadu_ps(col), mr);
    __m512 e = coarse ? fast_exp16_coarse(x) : fast_exp16_nonpositive(x);
    return whole ? e : _mm512_maskz_mov_ps(tiled_rows16_see(seen, key), e);
}

/* The rows r0 .. r0 + 15 over the tile's keys, their sums in a register.
 * The group loops here are inlined with `whole` a constant, so that a whole
 * tile's loop carries no test of the mask and a cut one no branch around
 * it; the keys advance as a vector and the columns as a pointer. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
exponentials_group16(float *st, float *sum, const float *m, int r0, int keys, int i0, int j0, const tiled_mask *mask,
                     bool whole, bool coarse) {
    __m512 mr = _mm512_loadu_ps(m + r0), total = _mm512_setzero_ps();
    tiled_rows16 seen = tiled_rows16_of(mask, i0, r0);
    __m512i key = _mm512_set1_epi32(j0);
    float *col = st + r0;
    for (int j = 0; j < keys; j++, col += TILE_Q, key = _mm512_add_epi32(key, _mm512_set1_epi32(1))) {
        __m512 e = exponentials16(col, mr, whole, &seen, key, coarse);
        _mm512_storeu_ps(col, e);
        total = _mm512_add_ps(total, e);
    }
    _mm512_storeu_ps(sum + r0, total);
}

__attribute__((target("avx512f,avx2,fma"))) static void tile_exponentials_avx512(float *st, float *sum, const float *m,
                                                                                 int rows, int keys, int i0, int j0,
                                                                                 const tiled_mask *mask, bool coarse) {
    int full = rows / 16 * 16;
    bool whole = tiled_whole(mask, rows, keys, i0, j0);
    for (int r0 = 0; r0 < full; r0 += 16) {
        if (whole) exponentials_group16(st, sum, m, r0, keys, i0, j0, mask, true, coarse);
        else exponentials_group16(st, sum, m, r0, keys, i0, j0, mask, false, coarse);
    }
    tile_exponentials_avx2(st, sum, m, full, rows, keys, i0, j0, mask, coarse);
}

/* The bf16 form of exponentials_group16 (so with fast_exp_coarse): two
 * keys a step, written as a row of pairs of the P operand
 * (tile_exponentials_pairs). */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma"), always_inline)) static inline void
exponentials_pairs_group16(const float *st, float *sum, const float *m, int r0, int keys, int i0, int j0,
                           const tiled_mask *mask, uint16_t *pairs, bool whole) {
    __m512 mr = _mm512_loadu_ps(m + r0), total = _mm512_setzero_ps();
    tiled_rows16 seen = tiled_rows16_of(mask, i0, r0);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i key = _mm512_set1_epi32(j0);
    const float *col = st + r0;
    uint16_t *dst = pairs + 2 * (size_t)r0;
    int j = 0;
    for (; j + 1 < keys;
         j += 2, col += 2 * TILE_Q, dst += 2 * TILE_Q, key = _mm512_add_epi32(key, _mm512_set1_epi32(2))) {
        __m512 e0 = exponentials16(col, mr, whole, &seen, key, true);
        total = _mm512_add_ps(total, e0);
        __m512 e1 = exponentials16(col + TILE_Q, mr, whole, &seen, _mm512_add_epi32(key, one), true);
        total = _mm512_add_ps(total, e1);
        _mm512_storeu_si512((void *)dst, tiled_interleave16(e0, e1));
    }
    if (j < keys) { /* an odd count: the last key's pair with zeros */
        __m512 e0 = exponentials16(col, mr, whole, &seen, key, true);
        total = _mm512_add_ps(total, e0);
        _mm512_storeu_si512((void *)dst, tiled_interleave16(e0, _mm512_setzero_ps()));
    }
    _mm512_storeu_ps(sum + r0, total);
}

/* The same exponentials for bf16 on vdpbf16ps, written as forward's P
 * operand (pairs of keys, tile_values) instead of back into st: two keys
 * at a time, summed in key order as above, so the same values and sums;
 * the rows past the sixteens go through st and tile_bf16_pack. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma"))) static void
tile_exponentials_pairs(float *st, float *sum, const float *m, int rows, int keys, int i0, int j0,
                        const tiled_mask *mask, uint16_t *pairs) {
    int full = rows / 16 * 16;
    bool whole = tiled_whole(mask, rows, keys, i0, j0);
    for (int r0 = 0; r0 < full; r0 += 16) {
        if (whole) exponentials_pairs_group16(st, sum, m, r0, keys, i0, j0, mask, pairs, true);
        else exponentials_pairs_group16(st, sum, m, r0, keys, i0, j0, mask, pairs, false);
    }
    if (full == rows) return;
    tile_exponentials_avx2(st, sum, m, full, rows, keys, i0, j0, mask, true);
    tile_bf16_pack(pairs + 2 * full, TILE_Q, 1, st + full, TILE_Q, 1, keys, rows - full);
}

/* The running maxima of the rows r0 .. r0 + 15 over the tile's keys, in a
 * register (inlined with `whole` a constant, as exponentials_group16).
 * max(col, m) keeps m where col is not greater, NaN included, as
 * tile_maxima does: the same maxima. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
maxima_group16(float *mx, const float *m, const float *st, int r0, int keys, int i0, int j0, const tiled_mask *mask,
               bool whole) {
    __m512 top = _mm512_loadu_ps(m + r0);
    tiled_rows16 seen = tiled_rows16_of(mask, i0, r0);
    __m512i key = _mm512_set1_epi32(j0);
    const float *col = st + r0;
    for (int j = 0; j < keys; j++, col += TILE_Q, key = _mm512_add_epi32(key, _mm512_set1_epi32(1))) {
        __m512 c = _mm512_loadu_ps(col);
        top = whole ? _mm512_max_ps(c, top) : _mm512_mask_max_ps(top, tiled_rows16_see(&seen, key), c, top);
    }
    _mm512_storeu_ps(mx + r0, top);
}

/* tile_maxima sixteen rows at a time, each group's maxima in a register
 * across the keys (the loop above carries them through memory: a store
 * and a reload per key, 9% of a bf16 forward at T = 256), then the rows
 * past the sixteens as above. */
__attribute__((target("avx512f,avx2,fma"))) static void tile_maxima_avx512(float *mx, const float *m, const float *st,
                                                                           int rows, int keys, int i0, int j0,
                                                                           const tiled_mask *mask) {
    int full = rows / 16 * 16;
    bool whole = tiled_whole(mask, rows, keys, i0, j0);
    for (int r0 = 0; r0 < full; r0 += 16) {
        if (whole) maxima_group16(mx, m, st, r0, keys, i0, j0, mask, true);
        else maxima_group16(mx, m, st, r0, keys, i0, j0, mask, false);
    }
    if (full < rows) tile_maxima(mx, m, st, full, rows, keys, i0, j0, mask);
}
#endif

/* Where bf16's exponentials write the P operand themselves: vdpbf16ps
 * and AVX-512 exponentials both run. */
static bool fused_pairs(const tiled_scratch *s) {
#if FAST_EXP8_AVAILABLE
    return s->bf16 && tile_gemm_avx512() && tile_gemm_bf16_native();
#else
    (void)s;
    return false;
#endif
}

/* One tile of scores S^T (keys x rows, stride TILE_Q) into the running
 * softmax: leaves exp(s - m_new) (0 where masked), in st or, where
 * fused_pairs, as the P operand in s->pr.p; updates each row's m and l and
 * rescales its output row by exp(m_old - m_new). A row that has seen no
 * key yet keeps m = -inf, l = 0. */
static void online_tile(const tiled_scratch *s, int rows, int keys, int i0, int j0, const tiled_mask *mask, int dh) {
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_avx512()) tile_maxima_avx512(s->mx, s->m, s->st, rows, keys, i0, j0, mask);
    else
#endif
        tile_maxima(s->mx, s->m, s->st, 0, rows, keys, i0, j0, mask);
    for (int r = 0; r < rows; r++) {
        s->rescale[r] = s->m[r] == -INFINITY ? 0.0f : fast_exp_nonpositive(s->m[r] - s->mx[r]);
        s->m[r] = s->mx[r];
    }
#if FAST_EXP8_AVAILABLE
    if (fused_pairs(s)) tile_exponentials_pairs(s->st, s->sum, s->m, rows, keys, i0, j0, mask, s->pr.p);
    else if (tile_gemm_avx512()) tile_exponentials_avx512(s->st, s->sum, s->m, rows, keys, i0, j0, mask, s->bf16);
    else if (tile_gemm_available()) tile_exponentials_avx2(s->st, s->sum, s->m, 0, rows, keys, i0, j0, mask, s->bf16);
    else
#endif
        tile_exponentials(s->st, s->sum, s->m, 0, rows, keys, i0, j0, mask, s->bf16);
    for (int r = 0; r < rows; r++) s->l[r] = s->l[r] * s->rescale[r] + s->sum[r];
    rescale_outputs(s->acc, s->rescale, rows, dh);
}

/* The tile's scores S^T = scale K_j Q_i^T (keys x rows) into s->st, from
 * the query tile as forward_tile packed it; in bf16 K_j is the key tile's
 * packing (pack_key_values) from its key `off` on. */
static void tile_scores(const float *kj, int off, int keys, int rows, int dh, const tiled_scratch *s,
                        const tiled_pairs *pr) {
    float scale = 1.0f / sqrtf((float)dh);
    if (!s->bf16) {
        tile_gemm(keys, rows, dh, scale, kj, dh, 1, s->qt, TILE_Q, false, s->st, TILE_Q);
        return;
    }
    int hp = (dh + 1) / 2;
    tile_gemm_bf16(keys, rows, dh, scale, pr->k + 2 * (size_t)off * hp, hp, 1, pr->q, TILE_Q, false, s->st, TILE_Q);
}

/* acc += P V_j, P the tile's probabilities (s->st, keys x rows); in bf16
 * V_j from the key tile's packing, from its key `off` on (even: its pairs
 * start there). */
static void tile_values(const float *vj, int off, int keys, int rows, int dh, const tiled_scratch *s,
                        const tiled_pairs *pr) {
    if (!s->bf16) {
        tile_gemm(rows, dh, keys, 1.0f, s->st, 1, TILE_Q, vj, dh, true, s->acc, dh);
        return;
    }
    if (!fused_pairs(s)) tile_bf16_pack(pr->p, TILE_Q, 1, s->st, TILE_Q, 1, keys, rows);
    tile_gemm_bf16(rows, dh, keys, 1.0f, pr->p, 1, TILE_Q, pr->v + 2 * (size_t)(off / 2) * dh, dh, true, s->acc, dh);
}

/* bf16: a key tile's K (pairs along dh) and V (pairs along keys), packed
 * once for every part of the query tile that reads it. */
static void pack_key_values(const float *kj, const float *vj, int keys, int dh, const tiled_pairs *pr) {
    int hp = (dh + 1) / 2;
    tile_bf16_pack(pr->k, 1, hp, kj, 1, dh, dh, keys);
    tile_bf16_pack(pr->v, dh, 1, vj, dh, 1, keys, dh);
}

/* The scratch of a query tile seen from its row r0: each row's state and
 * the packed queries from that row on, so that rows r0.. run as a tile of
 * their own; the tile's scores and P (st, pr.p) are made afresh by each. */
static tiled_scratch rows_from(const tiled_scratch *s, int r0, int dh) {
    tiled_scratch part = *s;
    part.m += r0, part.l += r0, part.mx += r0, part.rescale += r0, part.sum += r0;
    part.acc += (size_t)r0 * dh, part.qt += r0, part.pr.q += 2 * (size_t)r0;
    return part;
}

/* bf16: whether forward packs the head's K and V once for all its query
 * tiles, into the scratch's rows part (which backward alone uses), rather
 * than each key tile once per query tile: with T / TILE_Q query tiles each
 * packing the keys up to its last, that packing took 8-12% of a bf16
 * forward at T = 4k (perf), and packed once the forward runs 5-9% faster
 * at T = 256 to 4k (docs/performance.md §9.9, "K and V packed once").
 * Only where every query tile's keys begin at key 0 (no band): its key
 * tiles then start at even keys, so V's pairs are a key tile's pairs and
 * the products give the same bits (test_tiles runs the query tiles alone
 * against the whole call). A band's query tiles see few keys each, and
 * theirs start anywhere. The scratch holds rows_floats(T) for some
 * T >= Tq, so the head's pairs must fit in rows_floats(Tq); where they do
 * not (many more keys than queries: generation) the tiles pack as before. */
static bool whole_keys(const tiled_scratch *s, const tiled_mask *mask, int Tq, int dh) {
    size_t pairs = key_pairs(mask->Tk, dh) + value_pairs(mask->Tk, dh);
    return s->bf16 && Tq > TILE_Q && mask->behind == UNBOUNDED && pairs <= rows_floats(Tq, dh);
}

/* Key tile [j0, j0 + keys) into the running softmax of rows r0 .. r0 +
 * rows - 1 of the query tile at row i0; the keys packed (bf16) start at
 * key kj0: the key tile's first, or 0 where forward packed them all. */
static void forward_keys(const float *k, const float *v, int dh, int i0, int r0, int rows, int j0, int keys, int kj0,
                         const tiled_mask *mask, const tiled_scratch *s) {
    int row = i0 + r0, first = tiled_max(j0, tiled_key_begin(mask, row)),
        last = tiled_min(j0 + keys, tiled_key_end(mask, row + rows - 1));
    if (first >= last) return; /* these rows see none of the tile's keys: their state stays */
    if (tiled_split_rows(mask, rows, last - first, row, first, FORWARD_PART)) {
        int part = tiled_first_part(rows, FORWARD_PART);
        forward_keys(k, v, dh, i0, r0, part, first, last - first, kj0, mask, s);
        forward_keys(k, v, dh, i0, r0 + part, rows - part, first, last - first, kj0, mask, s);
        return;
    }
    /* bf16: from an even key of the packed tile, where V's pairs start; the
     * key before `first` that this may add is masked for all these rows */
    if (s->bf16 && (first - kj0) % 2) first--;
    tiled_scratch rs = rows_from(s, r0, dh);
    tile_scores(k + (size_t)first * dh, first - kj0, last - first, rows, dh, &rs, &rs.pr);
    online_tile(&rs, rows, last - first, row, first, mask, dh);
    tile_values(v + (size_t)first * dh, first - kj0, last - first, rows, dh, &rs, &rs.pr);
}

/* A query tile's last step: each row's output acc / l and log-sum-exp
 * m + log l. Inside forward_tile the normalising loop ran on four-lane
 * SSE (the file's baseline) with logf's call in it; cloned
 * (VECTOR_CLONES) it runs on the CPU's widest lanes, the same multiplies,
 * so the same bits: a bf16 forward 2% faster at T = 256 (docs/performance.md
 * §9.9, "K and V packed once"). The reciprocals made first, sixteen to a
 * division, were not faster. */
VECTOR_CLONES static void finish_rows(float *restrict out, float *restrict lse, const float *restrict acc,
                                      const float *restrict m, const float *restrict l, int rows, int dh) {
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / l[r];
        const float *restrict o = acc + (size_t)r * dh;
        float *restrict dst = out + (size_t)r * dh;
        for (int c = 0; c < dh; c++) dst[c] = o[c] * inv;
    }
    for (int r = 0; r < rows; r++) lse[r] = m[r] + logf(l[r]);
}

static void forward_tile(float *out, float *lse, const float *q, const float *k, const float *v, int dh, int i0,
                         int rows, const tiled_mask *mask, const tiled_scratch *s) {
    /* the keys any row of the tile sees: from the first row's first to the last row's last */
    int first_key = tiled_key_begin(mask, i0), last_key = tiled_key_end(mask, i0 + rows - 1);
    const tiled_pairs *pr = &s->pr;
    if (s->bf16) tile_bf16_pack(pr->q, TILE_Q, 1, q + (size_t)i0 * dh, 1, dh, dh, rows);
    else tile_gemm_transpose(s->qt, TILE_Q, q + (size_t)i0 * dh, dh, rows, dh);
    for (int r = 0; r < rows; r++) s->m[r] = -INFINITY, s->l[r] = 0.0f;
    memset(s->acc, 0, sizeof(float) * (size_t)rows * dh);
    for (int j0 = first_key; j0 < last_key; j0 += TILE_K) {
        int keys = tiled_min(TILE_K, last_key - j0);
        if (s->bf16 && !s->keys_packed) pack_key_values(k + (size_t)j0 * dh, v + (size_t)j0 * dh, keys, dh, pr);
        forward_keys(k, v, dh, i0, 0, rows, j0, keys, s->keys_packed ? 0 : j0, mask, s);
    }
    finish_rows(out + (size_t)i0 * dh, lse + i0, s->acc, s->m, s->l, rows, dh);
}

void tiled_softmax_band_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                                int dh, int q_pos0, bool causal, int half, bool bf16, float *scratch) {
    tiled_scratch s = tiled_carve(scratch, dh, bf16);
    s.pr = forward_pairs(&s, dh);
    tiled_mask mask = tiled_mask_of(q_pos0, Tk, causal, half);
    if (whole_keys(&s, &mask, Tq, dh)) {
        s.keys_packed = true;
        s.pr.k = (uint16_t *)s.D, s.pr.v = s.pr.k + 2 * key_pairs(Tk, dh);
        pack_key_values(k, v, Tk, dh, &s.pr);
    }
    for (int i0 = 0; i0 < Tq; i0 += TILE_Q)
        forward_tile(out, lse, q, k, v, dh, i0, tiled_min(TILE_Q, Tq - i0), &mask, &s);
}

float tiled_softmax_weight(const float *q, const float *k, const float *lse, int dh, int i, int j) {
    float score = 0.0f;
    for (int c = 0; c < dh; c++) score += q[(size_t)i * dh + c] * k[(size_t)j * dh + c];
    return expf(score / sqrtf((float)dh) - lse[i]);
}

void tiled_softmax_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                           int dh, int q_pos0, bool causal, bool bf16, float *scratch) {
    tiled_softmax_band_forward(out, lse, q, k, v, Tq, Tk, dh, q_pos0, causal, 0, bf16, scratch);
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
