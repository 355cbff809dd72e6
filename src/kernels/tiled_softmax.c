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
 * run on tile_gemm_bf16, their operands packed in pairs (tile_pairs below),
 * and the softmax around them stays fp32. */
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

/* bf16 operands (docs/design.md §8.10), packed once per tile into pairs
 * (tile_gemm.h), each in the form its product reads: forward the query
 * tile (q, once for all its key tiles), the key and value tiles (k, v) and
 * the probabilities (p); backward the key tile (kt, vt: once for all its
 * query tiles), and per (key tile, query tile) the keys as dQ's operand
 * (k), the query and output-gradient rows (q, qr, d, dr) and the tile's
 * probabilities and score gradients (p, sr, s). Sizes in pairs. */
typedef struct {
    uint16_t *q, *qr, *k, *kt, *v, *vt, *d, *dr, *p, *s, *sr;
} tile_pairs;

/* Pairs of the bf16 operands (docs/design.md §8.10): forward and backward
 * share them, for at most this many pairs. */
static size_t pairs_needed(int dh) {
    size_t hp = (size_t)(dh + 1) / 2, forward = hp * TILE_Q + TILE_K * hp + (TILE_K + 1) / 2 * ((size_t)dh + TILE_Q);
    size_t rows = (TILE_Q + 1) / 2, backward = 2 * hp * TILE_KB + (TILE_KB + 1) / 2 * (size_t)dh + 2 * rows * dh +
                                               2 * rows * TILE_KB + TILE_Q * (size_t)(TILE_KB + 1) / 2;
    return forward > backward ? forward : backward;
}

/* The scratch, carved: forward uses st, qt, acc and the row arrays;
 * backward p, dp, kt, vt and D; the bf16 paths the pairs. */
typedef struct {
    float *st, *dp, *qt, *kt, *vt, *acc, *m, *l, *mx, *rescale, *sum, *D;
    uint16_t *pairs; /* pairs_needed(dh) */
    bool bf16;       /* the products on bf16 operands */
    tile_pairs pr;   /* the pairs, carved for the direction that runs */
} tile_scratch;

/* D [T], and in bf16 backward's Q and dO as the scores' operands, packed
 * once per call: 2 [T][(dh + 1) / 2] pairs. */
size_t tiled_softmax_scratch_floats(int T, int dh) {
    return 2 * (size_t)TILE_Q * TILE_K + 2 * (size_t)dh * TILE_K + 2 * (size_t)dh * TILE_Q + 5 * (size_t)TILE_Q +
           pairs_needed(dh) + (size_t)T * (1 + 2 * (size_t)((dh + 1) / 2)); /* a pair takes a float's 4 bytes */
}

static tile_scratch carve(float *scratch, int dh, bool bf16) {
    tile_scratch s;
    s.bf16 = bf16;
    s.st = scratch, s.dp = s.st + (size_t)TILE_Q * TILE_K, s.kt = s.dp + (size_t)TILE_Q * TILE_K;
    s.vt = s.kt + (size_t)dh * TILE_K, s.qt = s.vt + (size_t)dh * TILE_K, s.acc = s.qt + (size_t)dh * TILE_Q;
    s.m = s.acc + (size_t)dh * TILE_Q, s.l = s.m + TILE_Q, s.mx = s.l + TILE_Q, s.rescale = s.mx + TILE_Q;
    s.sum = s.rescale + TILE_Q, s.pairs = (uint16_t *)(s.sum + TILE_Q);
    s.D = s.sum + TILE_Q + pairs_needed(dh); /* [T], then the rows' pairs: the rest of the scratch */
    return s;
}

/* The forward's pairs, carved from s->pairs. */
static tile_pairs forward_pairs(const tile_scratch *s, int dh) {
    size_t hp = (size_t)(dh + 1) / 2;
    tile_pairs p = {0};
    p.q = s->pairs, p.k = p.q + 2 * hp * TILE_Q, p.v = p.k + 2 * TILE_K * hp;
    p.p = p.v + 2 * (size_t)(TILE_K + 1) / 2 * dh;
    return p;
}

/* Backward's: qr and dr hold all Tq rows (after D). */
static tile_pairs backward_pairs(const tile_scratch *s, int dh, int Tq) {
    size_t hp = (size_t)(dh + 1) / 2, rows = (TILE_Q + 1) / 2;
    tile_pairs p = {0};
    p.kt = s->pairs, p.vt = p.kt + 2 * hp * TILE_KB, p.k = p.vt + 2 * hp * TILE_KB;
    p.q = p.k + 2 * (size_t)(TILE_KB + 1) / 2 * dh;
    p.d = p.q + 2 * rows * dh, p.p = p.d + 2 * rows * dh, p.s = p.p + 2 * rows * TILE_KB;
    p.sr = p.s + 2 * rows * TILE_KB;
    p.qr = (uint16_t *)(s->D + Tq), p.dr = p.qr + 2 * (size_t)Tq * hp;
    return p;
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

/* Every row of the tile sees every key: the last key's first row and the
 * first key's last. */
static bool tile_whole(const tile_mask *mask, int rows, int keys, int i0, int j0) {
    return row_begin(mask, j0 + keys - 1, i0, rows) == 0 && row_end(mask, j0, i0, rows) == rows;
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
 * group's sums in a register across the keys, from row `from` (a multiple
 * of eight); the rows past the last full group of eight go to the scalar
 * loop (masked loads and stores are slow on AMD's cores). */
__attribute__((target("avx2,fma"))) static void tile_exponentials_avx2(float *st, float *sum, const float *m, int from,
                                                                       int rows, int keys, int i0, int j0,
                                                                       const tile_mask *mask) {
    int full = rows / 8 * 8;
    bool whole = tile_whole(mask, rows, keys, i0, j0);
    for (int r0 = from; r0 < full; r0 += 8) {
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

/* Lanes lo <= lane < hi of sixteen, as a mask register. */
static __mmask16 lanes16(int lo, int hi) {
    lo = max_int(min_int(lo, 16), 0), hi = max_int(min_int(hi, 16), 0);
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* The same sixteen rows at a time on AVX-512 (fast_exp16_nonpositive: the
 * same bits as the eight-lane groups), then the rest as above, so that
 * each row's result does not depend on the vector width. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline __m512
exponentials16(const float *col, __m512 mr, bool whole, int j, int r0, int rows, int i0, int j0,
               const tile_mask *mask) {
    __m512 e = fast_exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(col), mr));
    if (whole) return e;
    return _mm512_maskz_mov_ps(lanes16(row_begin(mask, j0 + j, i0, rows) - r0, row_end(mask, j0 + j, i0, rows) - r0),
                               e);
}

__attribute__((target("avx512f,avx2,fma"))) static void tile_exponentials_avx512(float *st, float *sum, const float *m,
                                                                                 int rows, int keys, int i0, int j0,
                                                                                 const tile_mask *mask) {
    int full = rows / 16 * 16;
    bool whole = tile_whole(mask, rows, keys, i0, j0);
    for (int r0 = 0; r0 < full; r0 += 16) {
        __m512 mr = _mm512_loadu_ps(m + r0), total = _mm512_setzero_ps();
        for (int j = 0; j < keys; j++) {
            float *col = st + (size_t)j * TILE_Q + r0;
            __m512 e = exponentials16(col, mr, whole, j, r0, rows, i0, j0, mask);
            _mm512_storeu_ps(col, e);
            total = _mm512_add_ps(total, e);
        }
        _mm512_storeu_ps(sum + r0, total);
    }
    tile_exponentials_avx2(st, sum, m, full, rows, keys, i0, j0, mask);
}

/* Sixteen bf16 pairs (a_i, b_i) from two rows of sixteen floats, with
 * cpu_f32_to_bf16's rounding (vcvtne2ps2bf16) and one permute. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"), always_inline)) static inline __m512i
interleave16(__m512 a, __m512 b) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* The same exponentials for bf16 on vdpbf16ps, written as forward's P
 * operand (pairs of keys, tile_values) instead of back into st: two keys
 * at a time, summed in key order as above, so the same values and sums;
 * the rows past the sixteens go through st and tile_bf16_pack. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma"))) static void
tile_exponentials_pairs(float *st, float *sum, const float *m, int rows, int keys, int i0, int j0,
                        const tile_mask *mask, uint16_t *pairs) {
    int full = rows / 16 * 16;
    bool whole = tile_whole(mask, rows, keys, i0, j0);
    for (int r0 = 0; r0 < full; r0 += 16) {
        __m512 mr = _mm512_loadu_ps(m + r0), total = _mm512_setzero_ps();
        for (int j = 0; j < keys; j += 2) {
            const float *col = st + (size_t)j * TILE_Q + r0;
            __m512 e0 = exponentials16(col, mr, whole, j, r0, rows, i0, j0, mask), e1 = _mm512_setzero_ps();
            total = _mm512_add_ps(total, e0);
            if (j + 1 < keys) {
                e1 = exponentials16(col + TILE_Q, mr, whole, j + 1, r0, rows, i0, j0, mask);
                total = _mm512_add_ps(total, e1);
            }
            _mm512_storeu_si512((void *)(pairs + 2 * ((size_t)(j / 2) * TILE_Q + r0)), interleave16(e0, e1));
        }
        _mm512_storeu_ps(sum + r0, total);
    }
    if (full == rows) return;
    tile_exponentials_avx2(st, sum, m, full, rows, keys, i0, j0, mask);
    tile_bf16_pack(pairs + 2 * full, TILE_Q, 1, st + full, TILE_Q, 1, keys, rows - full);
}

/* Where the exponentials run on AVX-512: with the wide products
 * (tile_gemm_wide, which the tests switch) on a CPU that has AVX-512F. */
static bool exp16_here(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = __builtin_cpu_supports("avx512f");
    return cpu && tile_gemm_wide();
}
#endif

/* Where bf16's exponentials write the P operand themselves: vdpbf16ps
 * and AVX-512 exponentials both run. */
static bool fused_pairs(const tile_scratch *s) {
#if FAST_EXP8_AVAILABLE
    return s->bf16 && exp16_here() && tile_gemm_bf16_native();
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
static void online_tile(const tile_scratch *s, int rows, int keys, int i0, int j0, const tile_mask *mask, int dh) {
    tile_maxima(s->mx, s->m, s->st, rows, keys, i0, j0, mask);
    for (int r = 0; r < rows; r++) {
        s->rescale[r] = s->m[r] == -INFINITY ? 0.0f : fast_exp_nonpositive(s->m[r] - s->mx[r]);
        s->m[r] = s->mx[r];
    }
#if FAST_EXP8_AVAILABLE
    if (fused_pairs(s)) tile_exponentials_pairs(s->st, s->sum, s->m, rows, keys, i0, j0, mask, s->pr.p);
    else if (exp16_here()) tile_exponentials_avx512(s->st, s->sum, s->m, rows, keys, i0, j0, mask);
    else if (tile_gemm_available()) tile_exponentials_avx2(s->st, s->sum, s->m, 0, rows, keys, i0, j0, mask);
    else
#endif
        tile_exponentials(s->st, s->sum, s->m, 0, rows, keys, i0, j0, mask);
    for (int r = 0; r < rows; r++) {
        s->l[r] = s->l[r] * s->rescale[r] + s->sum[r];
        float *o = s->acc + (size_t)r * dh;
        for (int c = 0; c < dh; c++) o[c] *= s->rescale[r];
    }
}

/* The tile's scores S^T = scale K_j Q_i^T (keys x rows) into s->st, from
 * the query tile as forward_tile packed it. */
static void tile_scores(const float *kj, int keys, int rows, int dh, const tile_scratch *s, const tile_pairs *pr) {
    float scale = 1.0f / sqrtf((float)dh);
    if (!s->bf16) {
        tile_gemm(keys, rows, dh, scale, kj, dh, 1, s->qt, TILE_Q, false, s->st, TILE_Q);
        return;
    }
    int hp = (dh + 1) / 2;
    tile_bf16_pack(pr->k, 1, hp, kj, 1, dh, dh, keys);
    tile_gemm_bf16(keys, rows, dh, scale, pr->k, hp, 1, pr->q, TILE_Q, false, s->st, TILE_Q);
}

/* acc += P V_j, P the tile's probabilities (s->st, keys x rows). */
static void tile_values(const float *vj, int keys, int rows, int dh, const tile_scratch *s, const tile_pairs *pr) {
    if (!s->bf16) {
        tile_gemm(rows, dh, keys, 1.0f, s->st, 1, TILE_Q, vj, dh, true, s->acc, dh);
        return;
    }
    if (!fused_pairs(s)) tile_bf16_pack(pr->p, TILE_Q, 1, s->st, TILE_Q, 1, keys, rows);
    tile_bf16_pack(pr->v, dh, 1, vj, dh, 1, keys, dh);
    tile_gemm_bf16(rows, dh, keys, 1.0f, pr->p, 1, TILE_Q, pr->v, dh, true, s->acc, dh);
}

/* The scratch of a query tile seen from its row r0: each row's state and
 * the packed queries from that row on, so that rows r0.. run as a tile of
 * their own; the tile's scores and P (st, pr.p) are made afresh by each. */
static tile_scratch rows_from(const tile_scratch *s, int r0, int dh) {
    tile_scratch part = *s;
    part.m += r0, part.l += r0, part.mx += r0, part.rescale += r0, part.sum += r0;
    part.acc += (size_t)r0 * dh, part.qt += r0, part.pr.q += 2 * (size_t)r0;
    return part;
}

/* Where a pair of tiles crosses the mask's edge (a causal diagonal), its
 * rows run as two parts, each cut to the keys its rows see, and each part
 * again while it crosses: a causal diagonal square then costs little more
 * than its lower half (bench_attention at T = 256, bf16: backward 20% faster,
 * forward 3-6%; docs/design.md §8.10). A part is a multiple of `unit` rows:
 * 32 in forward, where the rows are the columns of the scores' 32-wide
 * micro-tiles; 16 in backward, the exponentials' vector. The keys cut
 * away are masked ones, which add exact zeros. */
#define FORWARD_PART 32
#define BACKWARD_PART 16

static bool split_rows(const tile_mask *mask, int rows, int keys, int i0, int j0, int unit) {
    return rows >= 2 * unit && !tile_whole(mask, rows, keys, i0, j0);
}

/* The first part's rows: half, rounded up to the unit. */
static int first_part(int rows, int unit) { return (rows / 2 + unit - 1) / unit * unit; }

/* Key tile [j0, j0 + keys) into the running softmax of rows r0 .. r0 +
 * rows - 1 of the query tile at row i0. */
static void forward_keys(const float *k, const float *v, int dh, int i0, int r0, int rows, int j0, int keys,
                         const tile_mask *mask, const tile_scratch *s) {
    int row = i0 + r0, first = max_int(j0, key_begin(mask, row)),
        last = min_int(j0 + keys, key_end(mask, row + rows - 1));
    if (first >= last) return; /* these rows see none of the tile's keys: their state stays */
    if (split_rows(mask, rows, last - first, row, first, FORWARD_PART)) {
        int part = first_part(rows, FORWARD_PART);
        forward_keys(k, v, dh, i0, r0, part, first, last - first, mask, s);
        forward_keys(k, v, dh, i0, r0 + part, rows - part, first, last - first, mask, s);
        return;
    }
    tile_scratch rs = rows_from(s, r0, dh);
    tile_scores(k + (size_t)first * dh, last - first, rows, dh, &rs, &rs.pr);
    online_tile(&rs, rows, last - first, row, first, mask, dh);
    tile_values(v + (size_t)first * dh, last - first, rows, dh, &rs, &rs.pr);
}

static void forward_tile(float *out, float *lse, const float *q, const float *k, const float *v, int dh, int i0,
                         int rows, const tile_mask *mask, const tile_scratch *s) {
    /* the keys any row of the tile sees: from the first row's first to the last row's last */
    int first_key = key_begin(mask, i0), last_key = key_end(mask, i0 + rows - 1);
    const tile_pairs *pr = &s->pr;
    if (s->bf16) tile_bf16_pack(pr->q, TILE_Q, 1, q + (size_t)i0 * dh, 1, dh, dh, rows);
    else tile_gemm_transpose(s->qt, TILE_Q, q + (size_t)i0 * dh, dh, rows, dh);
    for (int r = 0; r < rows; r++) s->m[r] = -INFINITY, s->l[r] = 0.0f;
    memset(s->acc, 0, sizeof(float) * (size_t)rows * dh);
    for (int j0 = first_key; j0 < last_key; j0 += TILE_K)
        forward_keys(k, v, dh, i0, 0, rows, j0, min_int(TILE_K, last_key - j0), mask, s);
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / s->l[r];
        const float *o = s->acc + (size_t)r * dh;
        float *dst = out + (size_t)(i0 + r) * dh;
        for (int c = 0; c < dh; c++) dst[c] = o[c] * inv;
        lse[i0 + r] = s->m[r] + logf(s->l[r]);
    }
}

void tiled_softmax_band_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                                int dh, int q_pos0, bool causal, int half, bool bf16, float *scratch) {
    tile_scratch s = carve(scratch, dh, bf16);
    s.pr = forward_pairs(&s, dh);
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
                           int dh, int q_pos0, bool causal, bool bf16, float *scratch) {
    tiled_softmax_band_forward(out, lse, q, k, v, Tq, Tk, dh, q_pos0, causal, 0, bf16, scratch);
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

/* The same sixteen keys at a time on AVX-512, then one group of eight
 * where it fits, then the scalar loop: the same bits as above. */
__attribute__((target("avx512f,avx2,fma"))) static void
recompute_probabilities_avx512(float *p, const float *lse, int rows, int keys, int i0, int j0, const tile_mask *mask) {
    int full16 = keys / 16 * 16, full = keys / 8 * 8;
    for (int r = 0; r < rows; r++) {
        float *row = p + (size_t)r * TILE_KB;
        int begin = key_begin(mask, i0 + r) - j0, end = min_int(key_end(mask, i0 + r) - j0, keys);
        __m512 lse_r = _mm512_set1_ps(lse[i0 + r]);
        for (int j = 0; j < full16; j += 16) {
            __m512 e = fast_exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), lse_r));
            if (begin > j || end < j + 16) e = _mm512_maskz_mov_ps(lanes16(begin - j, end - j), e);
            _mm512_storeu_ps(row + j, e);
        }
        if (full16 < full) {
            __m256 e = fast_exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + full16), _mm256_set1_ps(lse[i0 + r])));
            if (begin > full16 || end < full) e = _mm256_and_ps(e, lanes_between(begin - full16, end - full16));
            _mm256_storeu_ps(row + full16, e);
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

#if FAST_EXP8_AVAILABLE
/* bf16 backward's dS = P * (dP - D) (score_gradient's steps) and the three
 * operands made of P and dS (tile_bf16_pack's rounding) in one pass, two
 * rows at a time: P and dS in pairs across rows (p, s) and dS in pairs
 * along keys (sr). */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
score_gradient_pairs(const float *p, const float *dp, const float *D, int rows, int keys, int i0,
                     const tile_pairs *pr) {
    const int kp = (TILE_KB + 1) / 2;
    for (int r = 0; r < rows; r += 2) {
        bool two = r + 1 < rows;
        const float *p0 = p + (size_t)r * TILE_KB, *g0 = dp + (size_t)r * TILE_KB;
        __m512 d0 = _mm512_set1_ps(D[i0 + r]), d1 = _mm512_set1_ps(two ? D[i0 + r + 1] : 0.0f);
        uint16_t *row0 = pr->sr + 2 * (size_t)r * kp, *row1 = row0 + 2 * kp;
        uint16_t *pp = pr->p + 2 * (size_t)(r / 2) * TILE_KB, *ps = pr->s + 2 * (size_t)(r / 2) * TILE_KB;
        for (int j = 0; j < keys; j += 16) {
            __mmask16 m = lanes16(0, keys - j);
            __m512 a0 = _mm512_maskz_loadu_ps(m, p0 + j), a1 = _mm512_setzero_ps(), s1 = a1;
            __m512 s0 = _mm512_mul_ps(a0, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, g0 + j), d0));
            if (two) {
                a1 = _mm512_maskz_loadu_ps(m, p0 + TILE_KB + j);
                s1 = _mm512_mul_ps(a1, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, g0 + TILE_KB + j), d1));
                _mm256_mask_storeu_epi16(row1 + j, m, (__m256i)_mm512_cvtneps_pbh(s1));
            }
            _mm256_mask_storeu_epi16(row0 + j, m, (__m256i)_mm512_cvtneps_pbh(s0));
            _mm512_mask_storeu_epi32(pp + 2 * j, m, interleave16(a0, a1));
            _mm512_mask_storeu_epi32(ps + 2 * j, m, interleave16(s0, s1));
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
                                const tile_scratch *s) {
    const tile_pairs *pr = &s->pr;
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

/* The tile's probabilities exp(s - lse), in place of its scores. */
static void tile_probabilities(float *p, const float *lse, int rows, int keys, int i0, int j0, const tile_mask *mask) {
#if FAST_EXP8_AVAILABLE
    if (exp16_here()) recompute_probabilities_avx512(p, lse, rows, keys, i0, j0, mask);
    else if (tile_gemm_available()) recompute_probabilities_avx2(p, lse, rows, keys, i0, j0, mask);
    else
#endif
        recompute_probabilities(p, lse, rows, 0, keys, i0, j0, mask);
}

/* One (key tile, query tile) pair of backward: rows query rows from i0
 * against keys keys from j0 (K_j transposed in s->kt and V_j in s->vt from
 * column `from`); q, dout, dq at row i0, k, dk, dv at key j0. */
typedef struct {
    float *dq, *dk, *dv;
    const float *q, *dout, *k, *lse;
    int i0, rows, j0, keys, from;
} tile_pair_args;

static void backward_products(const tile_pair_args *t, int dh, const tile_mask *mask, const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int rows = t->rows, keys = t->keys;
    tile_gemm(rows, keys, dh, scale, t->q, dh, 1, s->kt + t->from, TILE_KB, false, p, TILE_KB);
    tile_probabilities(p, t->lse, rows, keys, t->i0, t->j0, mask);
    tile_gemm(keys, dh, rows, 1.0f, p, 1, TILE_KB, t->dout, dh, true, t->dv, dh);
    tile_gemm(rows, keys, dh, 1.0f, t->dout, dh, 1, s->vt + t->from, TILE_KB, false, s->dp, TILE_KB);
    score_gradient(s->dp, p, s->D, rows, keys, t->i0);
    tile_gemm(rows, dh, keys, scale, s->dp, TILE_KB, 1, t->k, dh, true, t->dq, dh);
    tile_gemm(keys, dh, rows, scale, s->dp, 1, TILE_KB, t->q, dh, true, t->dk, dh);
}

/* The same steps on bf16 operands: the query and output-gradient rows and
 * the keys packed once for the pair, P and dS once each as they come. */
static void backward_products_bf16(const tile_pair_args *t, int dh, const tile_mask *mask, const tile_scratch *s) {
    float scale = 1.0f / sqrtf((float)dh), *p = s->st;
    int rows = t->rows, keys = t->keys, hp = (dh + 1) / 2, kp = (TILE_KB + 1) / 2;
    const tile_pairs pr = s->pr;
    const uint16_t *qr = pr.qr + 2 * (size_t)t->i0 * hp, *dr = pr.dr + 2 * (size_t)t->i0 * hp;
    tile_bf16_pack(pr.q, dh, 1, t->q, dh, 1, rows, dh);
    tile_bf16_pack(pr.d, dh, 1, t->dout, dh, 1, rows, dh);
    tile_bf16_pack(pr.k, dh, 1, t->k, dh, 1, keys, dh);
    tile_gemm_bf16(rows, keys, dh, scale, qr, hp, 1, pr.kt + 2 * t->from, TILE_KB, false, p, TILE_KB);
    tile_probabilities(p, t->lse, rows, keys, t->i0, t->j0, mask);
    tile_gemm_bf16(rows, keys, dh, 1.0f, dr, hp, 1, pr.vt + 2 * t->from, TILE_KB, false, s->dp, TILE_KB);
    score_gradient_bf16(p, s->dp, s->D, rows, keys, t->i0, s);
    tile_gemm_bf16(keys, dh, rows, 1.0f, pr.p, 1, TILE_KB, pr.d, dh, true, t->dv, dh);
    tile_gemm_bf16(rows, dh, keys, scale, pr.sr, kp, 1, pr.k, dh, true, t->dq, dh);
    tile_gemm_bf16(keys, dh, rows, scale, pr.s, 1, TILE_KB, pr.q, dh, true, t->dk, dh);
}

/* The gradients' share of key tile j0 (keys x dh of K and V, packed in
 * s->kt and s->vt) from the query rows i0 .. i0 + rows - 1, cut to the keys
 * those rows see: from the first row's first to the last row's last. */
static void backward_tile(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int dh, int i0, int rows, int j0, int keys, const tile_mask *mask,
                          const tile_scratch *s) {
    int from = max_int(key_begin(mask, i0) - j0, 0);
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
                        min_int(keys, key_end(mask, i0 + rows - 1) - j0) - from,
                        from};
    if (s->bf16) backward_products_bf16(&t, dh, mask, s);
    else backward_products(&t, dh, mask, s);
}

/* backward_tile, its rows in parts where the pair crosses the mask's edge
 * (split_rows), each part cut to the keys it sees. */
static void backward_rows(float *dq, float *dkj, float *dvj, const float *dout, const float *lse, const float *q,
                          const float *kj, int dh, int i0, int rows, int j0, int keys, const tile_mask *mask,
                          const tile_scratch *s) {
    int from = max_int(key_begin(mask, i0) - j0, 0), end = min_int(keys, key_end(mask, i0 + rows - 1) - j0);
    if (from >= end) return; /* these rows see none of the tile's keys */
    if (split_rows(mask, rows, end - from, i0, j0 + from, BACKWARD_PART)) {
        int part = first_part(rows, BACKWARD_PART);
        backward_rows(dq, dkj, dvj, dout, lse, q, kj, dh, i0, part, j0, keys, mask, s);
        backward_rows(dq, dkj, dvj, dout, lse, q, kj, dh, i0 + part, rows - part, j0, keys, mask, s);
        return;
    }
    backward_tile(dq, dkj, dvj, dout, lse, q, kj, dh, i0, rows, j0, keys, mask, s);
}

/* Key tile j0's K and V as the products of backward_tile read them. */
static void pack_key_tile(const float *kj, const float *vj, int keys, int dh, const tile_scratch *s) {
    if (s->bf16) {
        tile_bf16_pack(s->pr.kt, TILE_KB, 1, kj, 1, dh, dh, keys);
        tile_bf16_pack(s->pr.vt, TILE_KB, 1, vj, 1, dh, dh, keys);
        return;
    }
    tile_gemm_transpose(s->kt, TILE_KB, kj, dh, keys, dh);
    tile_gemm_transpose(s->vt, TILE_KB, vj, dh, keys, dh);
}

void tiled_softmax_band_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                                 const float *q, const float *k, const float *v, int Tq, int Tk, int dh, int q_pos0,
                                 bool causal, int half, bool accumulate, bool bf16, float *scratch) {
    tile_scratch s = carve(scratch, dh, bf16);
    tile_mask mask = mask_of(q_pos0, Tk, causal, half);
    row_dots(s.D, dout, out, Tq, dh);
    if (bf16) { /* the scores' operands: Q and dO in pairs along dh, once for every key tile */
        s.pr = backward_pairs(&s, dh, Tq);
        tile_bf16_pack(s.pr.qr, 1, (dh + 1) / 2, q, 1, dh, dh, Tq);
        tile_bf16_pack(s.pr.dr, 1, (dh + 1) / 2, dout, 1, dh, dh, Tq);
    }
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
        pack_key_tile(kj, v + (size_t)j0 * dh, keys, dh, &s);
        for (int i0 = first; i0 < end; i0 += TILE_Q)
            backward_rows(dq, dk + (size_t)j0 * dh, dv + (size_t)j0 * dh, dout, lse, q, kj, dh, i0,
                          min_int(TILE_Q, end - i0), j0, keys, &mask, &s);
    }
}

void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal, bool bf16,
                            float *scratch) {
    tiled_softmax_band_backward(dq, dk, dv, dout, out, lse, q, k, v, T, T, dh, 0, causal, 0, false, bf16, scratch);
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
