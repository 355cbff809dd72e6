/* The tile products on bf16 operands and the packing into pairs
 * (tile_gemm.h; docs/design.md §8.10): vdpbf16ps where the CPU has
 * AVX512_BF16, else the same sums in fp32, with the same bits. */
#include "kernels/tile_gemm.h"

#include <string.h>

#include "base/cpu.h"

#include "tile_gemm_internal.h"
#if TILE_GEMM_AVX2
#include "transpose16.h"
#endif

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* ---- bf16 operands (tile_gemm.h) ---------------------------------------- */

static int bf16_native_choice = -1; /* -1: where the CPU has AVX512_BF16; 0 or 1: set by the tests */

void tile_gemm_set_bf16_native(int choice) { bf16_native_choice = choice; }

bool tile_gemm_bf16_native(void) {
#if TILE_GEMM_AVX2
    static int cpu = -1; /* the CPU does not change */
    if (cpu < 0) cpu = cpu_has_avx512_bf16();
    return bf16_native_choice != 0 && cpu;
#else
    return false;
#endif
}

/* One block of the pair operands, as the micro-kernels see it (strides in
 * pairs, tile_gemm.h). */
typedef struct {
    int rows, cols, pairs;
    float alpha;
    const uint16_t *a;
    ptrdiff_t a_row, a_col;
    const uint16_t *b;
    ptrdiff_t ldb;
    bool accumulate;
    float *c;
    ptrdiff_t ldc;
} pair_block;

static inline uint32_t pair_bits(const uint16_t *p) {
    uint32_t bits;
    memcpy(&bits, p, sizeof bits);
    return bits;
}

static inline float bits_float(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The pair's elements as floats: the odd one is the high half. */
static inline float pair_even(uint32_t bits) { return bits_float(bits << 16); }
static inline float pair_odd(uint32_t bits) { return bits_float(bits & 0xffff0000u); }

/* alpha * sum (+ the old C), rounded twice as tile_gemm's store does it. */
static inline float stored(const pair_block *t, float sum, const float *old) {
    float scaled = t->alpha * sum;
    return t->accumulate ? scaled + *old : scaled;
}

/* Portable C, and the columns that do not fill a vector: per lane, the
 * odd product, then the even one, each exact, each added with one rounding
 * (strict C11 fuses nothing), as vdpbf16ps adds them. */
static void pairs_scalar(const pair_block *t) {
    for (int i = 0; i < t->rows; i++)
        for (int j = 0; j < t->cols; j++) {
            float sum = 0.0f;
            for (int pp = 0; pp < t->pairs; pp++) {
                uint32_t x = pair_bits(t->a + 2 * (i * t->a_row + pp * t->a_col)),
                         y = pair_bits(t->b + 2 * (pp * t->ldb + j));
                sum += pair_odd(x) * pair_odd(y);
                sum += pair_even(x) * pair_even(y);
            }
            float *c = t->c + i * t->ldc + j;
            *c = stored(t, sum, c);
        }
}

/* The fp32 path in generic vectors (compiled for AVX-512F, AVX2 + FMA and
 * the default target, chosen at run time): 4 rows x 16 columns, which on
 * AVX2 keeps the eight accumulators, B's two halves and a broadcast within
 * the sixteen ymm registers. fp-contract=fast fuses c += x * b, which
 * gives the bits of the separate multiply and add: the product of two bf16
 * numbers is exact. */
#define EMULATED_ROWS 4
#define EMULATED_COLS 16
typedef float pairs_vec __attribute__((vector_size(64)));
typedef uint32_t pairs_bits __attribute__((vector_size(64)));

#define PAIRS_STORE_ROW(t, r, acc)                                                                 \
    do {                                                                                           \
        if ((r) < (t)->rows) {                                                                     \
            float *row = (t)->c + (r) * (t)->ldc;                                                  \
            pairs_vec v = (t)->alpha * (acc), old;                                                 \
            if ((t)->accumulate) {                                                                 \
                __asm__("" : "+m"(v)); /* round alpha * acc, then add (no FMA), as pairs_scalar */ \
                memcpy(&old, row, sizeof old), v = v + old;                                        \
            }                                                                                      \
            memcpy(row, &v, sizeof v);                                                             \
        }                                                                                          \
    } while (0)

__attribute__((always_inline, WIDE_CONTRACT)) static inline void pairs_emulated(const pair_block *t) {
    int last = t->rows - 1;
    ptrdiff_t o1 = 2 * min_int(1, last) * t->a_row, o2 = 2 * min_int(2, last) * t->a_row;
    ptrdiff_t o3 = 2 * min_int(3, last) * t->a_row;
    const uint16_t *a = t->a, *b = t->b;
    const pairs_bits high = (pairs_bits){0} + 0xffff0000u;
    pairs_vec c0 = {0}, c1 = c0, c2 = c0, c3 = c0;
    for (int pp = t->pairs; pp > 0; pp--, a += 2 * t->a_col, b += 2 * t->ldb) {
        pairs_bits bits;
        memcpy(&bits, b, sizeof bits);
        pairs_vec b_odd = (pairs_vec)(bits & high), b_even = (pairs_vec)(bits << 16);
        uint32_t x0 = pair_bits(a), x1 = pair_bits(a + o1), x2 = pair_bits(a + o2), x3 = pair_bits(a + o3);
        c0 += pair_odd(x0) * b_odd, c0 += pair_even(x0) * b_even;
        c1 += pair_odd(x1) * b_odd, c1 += pair_even(x1) * b_even;
        c2 += pair_odd(x2) * b_odd, c2 += pair_even(x2) * b_even;
        c3 += pair_odd(x3) * b_odd, c3 += pair_even(x3) * b_even;
    }
    PAIRS_STORE_ROW(t, 0, c0);
    PAIRS_STORE_ROW(t, 1, c1);
    PAIRS_STORE_ROW(t, 2, c2);
    PAIRS_STORE_ROW(t, 3, c3);
}

#if TILE_GEMM_AVX2
__attribute__((target("avx512f"), WIDE_CONTRACT)) static void pairs_emulated_avx512(const pair_block *t) {
    pairs_emulated(t);
}
__attribute__((target("avx2,fma"), WIDE_CONTRACT)) static void pairs_emulated_avx2(const pair_block *t) {
    pairs_emulated(t);
}
#endif
__attribute__((WIDE_CONTRACT)) static void pairs_emulated_default(const pair_block *t) { pairs_emulated(t); }

static void pairs_emulated_any(const pair_block *t) {
#if TILE_GEMM_AVX2
    static int isa = -1; /* 2: AVX-512F, 1: AVX2 + FMA, 0: neither */
    if (isa < 0) isa = cpu_has_avx512f() ? 2 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
    if (isa == 2) pairs_emulated_avx512(t);
    else if (isa == 1) pairs_emulated_avx2(t);
    else
#endif
        pairs_emulated_default(t);
}

#if TILE_GEMM_AVX2
/* vdpbf16ps: 8 rows x 32 columns in sixteen zmm accumulators; a pair of A
 * is one broadcast dword, B's 32 pairs two loads. Eight rows, not the fp32
 * kernels' six: twelve sums in flight left vdpbf16ps's latency showing, and
 * with sixteen the tile products ran 3-10% faster (bench_attention, T = 256,
 * dh 32 and 64, Zen 5); eight divides the tiles' 32, 64, 96 and 192 rows.
 * Columns past t->cols are masked (AVX-512's masked loads and stores
 * fault on no masked-off lane), so B is never read past column n. */
#define NATIVE_ROWS 8
#define NATIVE_COLS 32
#define BF16_TARGET target("avx512f,avx512bf16,avx512bw,avx512vl")

__attribute__((BF16_TARGET, always_inline)) static inline void native_store(const pair_block *t, int r, __m512 lo,
                                                                            __m512 hi, __mmask16 m0, __mmask16 m1) {
    if (r >= t->rows) return;
    float *c = t->c + r * t->ldc;
    const __m512 alpha = _mm512_set1_ps(t->alpha);
    lo = _mm512_mul_ps(alpha, lo), hi = _mm512_mul_ps(alpha, hi);
    if (t->accumulate) {
        lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, c));
        hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, c + 16));
    }
    _mm512_mask_storeu_ps(c, m0, lo);
    _mm512_mask_storeu_ps(c + 16, m1, hi);
}

/* One row's step: broadcast its pair, two dot products into its two accumulators. */
#define NATIVE_ROW(c0, c1, off)                                               \
    do {                                                                      \
        __m512bh x_ = (__m512bh)_mm512_set1_epi32((int)pair_bits(a + (off))); \
        c0 = _mm512_dpbf16_ps(c0, x_, b0), c1 = _mm512_dpbf16_ps(c1, x_, b1); \
    } while (0)

__attribute__((BF16_TARGET)) static void pairs_native(const pair_block *t) {
    __mmask16 m0 = (__mmask16)(t->cols >= 16 ? 0xffffu : (1u << t->cols) - 1u);
    __mmask16 m1 = (__mmask16)(t->cols >= 32 ? 0xffffu : t->cols <= 16 ? 0u : (1u << (t->cols - 16)) - 1u);
    int last = t->rows - 1;
    /* rows past the last read the last again (their sums are not stored) */
    ptrdiff_t o1 = 2 * min_int(1, last) * t->a_row, o2 = 2 * min_int(2, last) * t->a_row;
    ptrdiff_t o3 = 2 * min_int(3, last) * t->a_row, o4 = 2 * min_int(4, last) * t->a_row;
    ptrdiff_t o5 = 2 * min_int(5, last) * t->a_row, o6 = 2 * min_int(6, last) * t->a_row;
    ptrdiff_t o7 = 2 * min_int(7, last) * t->a_row;
    const uint16_t *a = t->a, *b = t->b;
    const ptrdiff_t a_step = 2 * t->a_col, b_step = 2 * t->ldb;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    for (int pp = t->pairs; pp > 0; pp--, a += a_step, b += b_step) {
        __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b);
        __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + 32);
        NATIVE_ROW(c00, c01, 0);
        NATIVE_ROW(c10, c11, o1);
        NATIVE_ROW(c20, c21, o2);
        NATIVE_ROW(c30, c31, o3);
        NATIVE_ROW(c40, c41, o4);
        NATIVE_ROW(c50, c51, o5);
        NATIVE_ROW(c60, c61, o6);
        NATIVE_ROW(c70, c71, o7);
    }
    native_store(t, 0, c00, c01, m0, m1);
    native_store(t, 1, c10, c11, m0, m1);
    native_store(t, 2, c20, c21, m0, m1);
    native_store(t, 3, c30, c31, m0, m1);
    native_store(t, 4, c40, c41, m0, m1);
    native_store(t, 5, c50, c51, m0, m1);
    native_store(t, 6, c60, c61, m0, m1);
    native_store(t, 7, c70, c71, m0, m1);
}
#endif

void tile_gemm_bf16(int m, int n, int k, float alpha, const uint16_t *a, ptrdiff_t a_row, ptrdiff_t a_col,
                    const uint16_t *b, ptrdiff_t ldb, bool accumulate, float *c, ptrdiff_t ldc) {
    bool native = tile_gemm_bf16_native();
    int width = EMULATED_COLS, height = EMULATED_ROWS;
#if TILE_GEMM_AVX2
    if (native) width = NATIVE_COLS, height = NATIVE_ROWS;
#endif
    pair_block t = {.pairs = (k + 1) / 2,
                    .alpha = alpha,
                    .a_row = a_row,
                    .a_col = a_col,
                    .ldb = ldb,
                    .accumulate = accumulate,
                    .ldc = ldc};
    for (int j = 0; j < n; j += width) {
        t.cols = min_int(width, n - j);
        t.b = b + 2 * j;
        for (int i = 0; i < m; i += height) {
            t.rows = min_int(height, m - i);
            t.a = a + 2 * i * a_row;
            t.c = c + i * ldc + j;
#if TILE_GEMM_AVX2
            if (native) {
                pairs_native(&t);
                continue;
            }
#endif
            if (t.cols == EMULATED_COLS) pairs_emulated_any(&t);
            else pairs_scalar(&t);
        }
    }
}

/* ---- Packing into pairs (tile_gemm.h) ---- */

/* Values converted per step of the packing loops (on the stack). */
#define PACK_CHUNK 64

/* One row of pairs: (bf16(even[j * s]), bf16(odd[j * s]) or 0) for j < n,
 * pair j at dst + 2 * j * d_n. */
static void pack_pair_row(uint16_t *dst, ptrdiff_t d_n, const float *even, const float *odd, ptrdiff_t s, int n) {
    float gathered[2][PACK_CHUNK];
    uint16_t lo[PACK_CHUNK], hi[PACK_CHUNK];
    for (int j0 = 0; j0 < n; j0 += PACK_CHUNK) {
        int len = min_int(PACK_CHUNK, n - j0);
        const float *e = even + j0 * s, *o = odd ? odd + j0 * s : NULL;
        if (s != 1) {
            for (int j = 0; j < len; j++) gathered[0][j] = e[j * s], gathered[1][j] = o ? o[j * s] : 0.0f;
            e = gathered[0], o = o ? gathered[1] : NULL;
        }
        cpu_f32_to_bf16(lo, e, (size_t)len);
        if (o) cpu_f32_to_bf16(hi, o, (size_t)len);
        else memset(hi, 0, sizeof hi);
        uint16_t *d = dst + 2 * j0 * d_n;
        for (int j = 0; j < len; j++) d[2 * j * d_n] = lo[j], d[2 * j * d_n + 1] = hi[j];
    }
}

#if TILE_GEMM_AVX2
/* Rows of contiguous values, two by two, into rows of contiguous pairs, 16
 * pairs per step: vcvtne2ps2bf16 (the rounding of cpu_f32_to_bf16) puts
 * the even row's 16 in the low half and the odd row's in the high half,
 * one permute interleaves them. The tail is masked. */
__attribute__((BF16_TARGET)) static void pack_rows_native(uint16_t *dst, ptrdiff_t d_k, const float *src, ptrdiff_t s_k,
                                                          int k, int n) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int p = 0; p < k; p += 2) {
        const float *even = src + p * s_k, *odd = even + s_k;
        uint16_t *row = dst + p * d_k; /* pair row p / 2 */
        for (int j = 0; j < n; j += 16) {
            __mmask16 m = (__mmask16)(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1u);
            __m512 e = _mm512_maskz_loadu_ps(m, even + j),
                   o = p + 1 < k ? _mm512_maskz_loadu_ps(m, odd + j) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(row + 2 * j, m,
                                     _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(o, e)));
        }
    }
}
#endif

/* tile_bf16_pack of n rows of k contiguous values one after the other
 * (s_k = 1, s_n = k, k <= PLACED_BLOCK) into pairs placed anywhere: blocks
 * of whole rows converted by one call, each pair then copied to its place
 * (the high half of an odd k's last pair 0). */
#define PLACED_BLOCK 4096
static void pack_placed(uint16_t *dst, ptrdiff_t d_k, ptrdiff_t d_n, const float *src, int k, int n) {
    uint16_t converted[PLACED_BLOCK];
    int pairs = (k + 1) / 2, rows = PLACED_BLOCK / k;
    for (int j0 = 0; j0 < n; j0 += rows) {
        int count = min_int(rows, n - j0);
        cpu_f32_to_bf16(converted, src + (size_t)j0 * k, (size_t)count * k);
        for (int j = 0; j < count; j++)
            for (int pp = 0; pp < pairs; pp++) {
                uint16_t pair[2] = {converted[j * k + 2 * pp], 2 * pp + 1 < k ? converted[j * k + 2 * pp + 1] : 0};
                memcpy(dst + 2 * (pp * d_k + (j0 + j) * d_n), pair, sizeof pair);
            }
    }
}

#if TILE_GEMM_AVX2
/* pack_placed's case with the pairs of each j contiguous in dst's rows
 * (d_n = 1): a transpose of bf16 pairs. Sixteen rows of src at a time, 32
 * values (16 pairs) of each converted into one register (vcvtne2ps2bf16:
 * cpu_f32_to_bf16's rounding, pairs in order), the 16 x 16 pairs
 * transposed in registers, each pair row stored whole (masked past n). A
 * query tile of the forward and a key tile of the backward are packed
 * this way (docs/design.md §8.10); pack_placed's scalar copies of single
 * pairs took as long as a fifth of the tile products they fed. */
__attribute__((BF16_TARGET)) static void pack_pairs_transposed(uint16_t *dst, ptrdiff_t d_k, const float *src, int k,
                                                               int n) {
    int pairs = (k + 1) / 2;
    for (int j0 = 0; j0 < n; j0 += 16) {
        int rows = min_int(16, n - j0);
        __mmask16 in_rows = (__mmask16)((1u << rows) - 1u);
        for (int p0 = 0; p0 < pairs; p0 += 16) {
            int c0 = 2 * p0, len = min_int(32, k - c0); /* values of each row in this block */
            __mmask16 lo = (__mmask16)((1u << min_int(len, 16)) - 1u),
                      hi = (__mmask16)((1u << max_int(len - 16, 0)) - 1u);
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                const float *x = src + (size_t)(j0 + min_int(i, rows - 1)) * k + c0; /* past n: a row read again */
                r[i] = (__m512)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
            }
            transpose16(r);
            for (int p = 0; p < min_int(16, pairs - p0); p++)
                _mm512_mask_storeu_epi32(dst + 2 * ((size_t)(p0 + p) * d_k + j0), in_rows, (__m512i)r[p]);
        }
    }
}
#endif

/* ---- Transposed conversion (tile_gemm.h) ---- */

/* Rows per band: a transposed row's 32 values of a band fill one 64-byte
 * line, so no line of dst_t is written in two parts. */
#define TRANSPOSE_BAND 32
/* Columns per step: a band's step of src (128 KiB) stays in L2 between its
 * straight conversion and its transposition. */
#define TRANSPOSE_CHUNK 1024

/* The band's rows [r0, r0 + height) of columns [c0, c0 + width) converted
 * as they lie, row by row: sequential reads, which also bring the step
 * into cache for its transposition. */
static void convert_band_rows(uint16_t *dst, ptrdiff_t ld, const float *src, int r0, int height, int c0, int width,
                              int cols) {
    for (int i = 0; i < height; i++)
        cpu_f32_to_bf16(dst + (size_t)(r0 + i) * ld + c0, src + (size_t)(r0 + i) * cols + c0, (size_t)width);
}

/* dst_t's columns [r0, r0 + height) of its rows [c0, c0 + width), from the
 * straight copy. */
static void transpose_band_portable(uint16_t *dst_t, ptrdiff_t ld_t, const uint16_t *dst, ptrdiff_t ld, int r0,
                                    int height, int c0, int width) {
    for (int j = 0; j < width; j++)
        for (int i = 0; i < height; i++) dst_t[(size_t)(c0 + j) * ld_t + r0 + i] = dst[(size_t)(r0 + i) * ld + c0 + j];
}

#if TILE_GEMM_AVX2
/* The same from src, 16 columns at a time: the band's two 16 x 16 halves
 * transposed in registers (transpose16), each column's 32 values converted
 * by one vcvtne2ps2bf16 (cpu_f32_to_bf16's rounding) and stored as one
 * line. Rows past the band and columns past the step are masked (read as
 * 0, never stored); full blocks take unmasked loads and stores, in loops
 * of 16 that unroll, so the halves stay in registers. */
__attribute__((BF16_TARGET)) static void transpose_band_native(uint16_t *dst_t, ptrdiff_t ld_t, const float *src,
                                                               int r0, int height, int c0, int width, int cols) {
    __mmask32 in_band = height == TRANSPOSE_BAND ? ~(__mmask32)0 : (__mmask32)((1u << height) - 1u);
    __mmask16 low_rows = (__mmask16)(in_band & 0xffffu), high_rows = (__mmask16)(in_band >> 16);
    const float *top = src + (size_t)r0 * cols, *bottom = top + (size_t)16 * cols;
    for (int j0 = c0; j0 < c0 + width; j0 += 16) {
        int n = min_int(16, c0 + width - j0);
        __m512 lo[16], hi[16];
        if (n == 16 && height == TRANSPOSE_BAND) {
            for (int i = 0; i < 16; i++) {
                lo[i] = _mm512_loadu_ps(top + (size_t)i * cols + j0);
                hi[i] = _mm512_loadu_ps(bottom + (size_t)i * cols + j0);
            }
        } else {
            __mmask16 in_cols = (__mmask16)((1u << n) - 1u);
            for (int i = 0; i < 16; i++) {
                lo[i] = low_rows >> i & 1 ? _mm512_maskz_loadu_ps(in_cols, top + (size_t)i * cols + j0)
                                          : _mm512_setzero_ps();
                hi[i] = high_rows >> i & 1 ? _mm512_maskz_loadu_ps(in_cols, bottom + (size_t)i * cols + j0)
                                           : _mm512_setzero_ps();
            }
        }
        transpose16(lo);
        transpose16(hi);
        uint16_t *out = dst_t + (size_t)j0 * ld_t + r0;
        if (n == 16 && height == TRANSPOSE_BAND)
            for (int j = 0; j < 16; j++)
                _mm512_storeu_si512((void *)(out + (size_t)j * ld_t), (__m512i)_mm512_cvtne2ps_pbh(hi[j], lo[j]));
        else
            for (int j = 0; j < n; j++)
                _mm512_mask_storeu_epi16(out + (size_t)j * ld_t, in_band, (__m512i)_mm512_cvtne2ps_pbh(hi[j], lo[j]));
    }
}
#endif

/* Band by band and step by step: the step's rows converted as they lie,
 * then transposed while in L2. A first version that read the band's 32
 * rows from memory 64 bytes at a time, with masked loads on every block,
 * took 4.5x the straight conversion's time; this one about twice
 * (bench_d768's dY shapes, docs/performance.md §9.9). */
void tile_bf16_transpose(uint16_t *dst_t, ptrdiff_t ld_t, uint16_t *dst, ptrdiff_t ld, const float *src, int rows,
                         int cols) {
#if TILE_GEMM_AVX2
    bool native = tile_gemm_bf16_native();
#endif
    for (int r0 = 0; r0 < rows; r0 += TRANSPOSE_BAND) {
        int height = min_int(TRANSPOSE_BAND, rows - r0);
        for (int c0 = 0; c0 < cols; c0 += TRANSPOSE_CHUNK) {
            int width = min_int(TRANSPOSE_CHUNK, cols - c0);
            convert_band_rows(dst, ld, src, r0, height, c0, width, cols);
#if TILE_GEMM_AVX2
            if (native) {
                transpose_band_native(dst_t, ld_t, src, r0, height, c0, width, cols);
                continue;
            }
#endif
            transpose_band_portable(dst_t, ld_t, dst, ld, r0, height, c0, width);
        }
    }
}

void tile_bf16_pack(uint16_t *dst, ptrdiff_t d_k, ptrdiff_t d_n, const float *src, ptrdiff_t s_k, ptrdiff_t s_n, int k,
                    int n) {
    int pairs = (k + 1) / 2;
    if (s_k == 1 && d_k == 1) {         /* each j: k contiguous values into contiguous pairs */
        if (s_n == k && 2 * d_n == k) { /* and the rows one after the other: one conversion */
            cpu_f32_to_bf16(dst, src, (size_t)k * n);
            return;
        }
        for (int j = 0; j < n; j++) {
            uint16_t *row = dst + 2 * j * d_n;
            cpu_f32_to_bf16(row, src + j * s_n, (size_t)k);
            if (k & 1) row[k] = 0;
        }
        return;
    }
#if TILE_GEMM_AVX2
    if (s_k == 1 && s_n == k && d_n == 1 && k > 0 && tile_gemm_bf16_native()) {
        pack_pairs_transposed(dst, d_k, src, k, n);
        return;
    }
#endif
    if (s_k == 1 && s_n == k && k > 0 && k <= PLACED_BLOCK) { /* pairs contiguous in src, not in dst */
        pack_placed(dst, d_k, d_n, src, k, n);
        return;
    }
#if TILE_GEMM_AVX2
    if (s_n == 1 && d_n == 1 && tile_gemm_bf16_native()) {
        pack_rows_native(dst, d_k, src, s_k, k, n);
        return;
    }
#endif
    for (int pp = 0; pp < pairs; pp++) {
        const float *even = src + 2 * pp * s_k, *odd = 2 * pp + 1 < k ? even + s_k : NULL;
        pack_pair_row(dst + 2 * pp * d_k, d_n, even, odd, s_n, n);
    }
}
