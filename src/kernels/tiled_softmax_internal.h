/* Private to tiled softmax (tiled_softmax.h): what its forward
 * (tiled_softmax.c) and backward (tiled_softmax_backward.c) share — the
 * tile sizes, the carved scratch and the bf16 pairs in it, which keys a
 * row sees, how a pair of tiles crossing the mask's edge is cut, and the
 * vector masks and bf16 interleave of the exponential passes. */
#ifndef MOMFMM_TILED_SOFTMAX_INTERNAL_H
#define MOMFMM_TILED_SOFTMAX_INTERNAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/fast_math.h"

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

static inline int tiled_min(int a, int b) { return a < b ? a : b; }
static inline int tiled_max(int a, int b) { return a > b ? a : b; }

/* bf16 operands (docs/design.md §8.10), packed once per tile into pairs
 * (tile_gemm.h), each in the form its product reads: forward the query
 * tile (q, once for all its key tiles), the key and value tiles (k, v:
 * or the head's keys and values once per call, in the rows part) and
 * the probabilities (p); backward the key tile (kt, vt: once for all its
 * query tiles), and per (key tile, query tile) the keys as dQ's operand
 * (k), the query and output-gradient rows (q, qr, d, dr) and the tile's
 * probabilities and score gradients (p, sr, s). Backward also packs the
 * keys as dQ's operand once per key tile (kc) and the query and
 * output-gradient rows as dK's and dV's once per call (qc, dc); a pair of
 * tiles reads those where its first row and key and its counts are even
 * (its pairs then line up), and packs its own k, q and d otherwise. Sizes
 * in pairs. */
typedef struct {
    uint16_t *q, *qr, *qc, *k, *kc, *kt, *v, *vt, *d, *dr, *dc, *p, *s, *sr;
} tiled_pairs;

/* The scratch, carved: forward uses st, qt, acc and the row arrays;
 * backward p, dp, kt, vt and D, and after D the rows part (its bf16 Q and
 * dO pairs; bf16 forward may hold the head's K and V pairs there); the
 * bf16 paths the pairs. */
typedef struct {
    float *st, *dp, *qt, *kt, *vt, *acc, *m, *l, *mx, *rescale, *sum, *D;
    uint16_t *pairs;  /* pairs_needed(dh) */
    bool bf16;        /* the products on bf16 operands */
    bool keys_packed; /* forward: the head's K and V pairs packed once, in the rows part (whole_keys) */
    tiled_pairs pr;   /* the pairs, carved for the direction that runs */
} tiled_scratch;

/* The scratch of tiled_softmax_scratch_floats, carved (bf16: the products
 * on bf16 operands). */
tiled_scratch tiled_carve(float *scratch, int dh, bool bf16);

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
} tiled_mask;

static inline tiled_mask tiled_mask_of(int q_pos0, int Tk, bool causal, int half) {
    tiled_mask m = {.q_pos0 = q_pos0, .Tk = Tk, .behind = half > 0 ? half - 1 : UNBOUNDED};
    m.ahead = causal ? 0 : m.behind;
    return m;
}

/* The first key visible to query row i, and one past the last. */
static inline int tiled_key_begin(const tiled_mask *m, int i) { return tiled_max(m->q_pos0 + i - m->behind, 0); }
static inline int tiled_key_end(const tiled_mask *m, int i) {
    return tiled_min(m->q_pos0 + i + m->ahead, m->Tk - 1) + 1;
}

/* The rows [tiled_row_begin, tiled_row_end) of a query tile (rows i0.., `rows` of
 * them) that see key j. */
static inline int tiled_row_begin(const tiled_mask *m, int j, int i0, int rows) {
    return tiled_min(tiled_max(j - m->ahead - m->q_pos0 - i0, 0), rows);
}
static inline int tiled_row_end(const tiled_mask *m, int j, int i0, int rows) {
    return tiled_min(tiled_max(j + m->behind - m->q_pos0 - i0 + 1, 0), rows);
}

/* Every row of the tile sees every key: the last key's first row and the
 * first key's last. */
static inline bool tiled_whole(const tiled_mask *mask, int rows, int keys, int i0, int j0) {
    return tiled_row_begin(mask, j0 + keys - 1, i0, rows) == 0 && tiled_row_end(mask, j0, i0, rows) == rows;
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

static inline bool tiled_split_rows(const tiled_mask *mask, int rows, int keys, int i0, int j0, int unit) {
    return rows >= 2 * unit && !tiled_whole(mask, rows, keys, i0, j0);
}

/* The first part's rows: half, rounded up to the unit. */
static inline int tiled_first_part(int rows, int unit) { return (rows / 2 + unit - 1) / unit * unit; }

#if FAST_EXP8_AVAILABLE
/* Lanes lo <= lane of eight, as a mask. */
__attribute__((target("avx2"), always_inline)) static inline __m256 tiled_lanes_from(int lo) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)));
}

/* Lanes lo <= lane < hi of eight, as a mask. */
__attribute__((target("avx2"), always_inline)) static inline __m256 tiled_lanes_between(int lo, int hi) {
    return _mm256_andnot_ps(tiled_lanes_from(hi), tiled_lanes_from(lo));
}

/* Lanes lo <= lane < hi of sixteen, as a mask register. */
__attribute__((target("avx512f"), always_inline)) static inline __mmask16 tiled_lanes16(int lo, int hi) {
    lo = tiled_max(tiled_min(lo, 16), 0), hi = tiled_max(tiled_min(hi, 16), 0);
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* Which of the sixteen rows r0 .. r0 + 15 of a query tile (at row i0) see
 * a key, as bounds set once per group of sixteen: the row at position pos
 * sees key j when pos - behind - 1 < j <= pos + ahead (tiled_key_begin and
 * tiled_key_end, unclamped: the sixteen lie inside the tile). The loops over
 * a tile's keys then test a key by two compares against a vector of it;
 * the bounds worked out afresh per key took most of the forward's maxima
 * pass, and about 30 of the 75 instructions of its exponentials' loop of
 * two keys on a cut tile (docs/design.md §8.10). Positions stay below 2^24
 * and ahead, behind at most UNBOUNDED, so the bounds fit an int. */
typedef struct {
    __m512i last, before; /* the last key each row sees; the key just behind its first */
} tiled_rows16;

__attribute__((target("avx512f"), always_inline)) static inline tiled_rows16 tiled_rows16_of(const tiled_mask *m,
                                                                                             int i0, int r0) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i pos = _mm512_add_epi32(lane, _mm512_set1_epi32(m->q_pos0 + i0 + r0));
    tiled_rows16 r = {_mm512_add_epi32(pos, _mm512_set1_epi32(m->ahead)),
                      _mm512_sub_epi32(pos, _mm512_set1_epi32(m->behind + 1))};
    return r;
}

/* The rows of the group that see the key in every lane of `key`. */
__attribute__((target("avx512f"), always_inline)) static inline __mmask16 tiled_rows16_see(const tiled_rows16 *r,
                                                                                           __m512i key) {
    return _mm512_mask_cmpgt_epi32_mask(_mm512_cmple_epi32_mask(key, r->last), key, r->before);
}

/* tiled_rows16's bounds for the eight rows r0 .. r0 + 7 (AVX2): a key is
 * seen where it is above `before` and not above `last`, as all ones in the
 * lane. */
typedef struct {
    __m256i last, before;
} tiled_rows8;

__attribute__((target("avx2"), always_inline)) static inline tiled_rows8 tiled_rows8_of(const tiled_mask *m, int i0,
                                                                                        int r0) {
    __m256i pos = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(m->q_pos0 + i0 + r0));
    tiled_rows8 r = {_mm256_add_epi32(pos, _mm256_set1_epi32(m->ahead)),
                     _mm256_sub_epi32(pos, _mm256_set1_epi32(m->behind + 1))};
    return r;
}

__attribute__((target("avx2"), always_inline)) static inline __m256 tiled_rows8_see(const tiled_rows8 *r, __m256i key) {
    return _mm256_castsi256_ps(
        _mm256_andnot_si256(_mm256_cmpgt_epi32(key, r->last), _mm256_cmpgt_epi32(key, r->before)));
}

/* Sixteen bf16 pairs (a_i, b_i) from two rows of sixteen floats, with
 * cpu_f32_to_bf16's rounding (vcvtne2ps2bf16) and one permute. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"), always_inline)) static inline __m512i
tiled_interleave16(__m512 a, __m512 b) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
#endif
#endif
