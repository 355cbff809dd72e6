/* Register-blocked products for attention tiles (tile_gemm.h). */
#include "kernels/tile_gemm.h"

#include <string.h>

#include "base/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "transpose16.h"
#define TILE_GEMM_AVX2 1
#else
#define TILE_GEMM_AVX2 0
#endif
/* The AVX-512 kernel is GCC's generic vectors, compiled for two targets. */
#if TILE_GEMM_AVX2 && !defined(__clang__)
#define TILE_GEMM_WIDE 1
#else
#define TILE_GEMM_WIDE 0
#endif

/* The micro-tile: 6 rows x 16 columns are twelve ymm accumulators, which
 * cover the FMA latency (4 cycles) on both pipes, and with two B loads and
 * one broadcast they leave one of the sixteen registers spare. */
#define MICRO_ROWS 6
#define MICRO_COLS 16

#define WIDE_COLS 32

/* The generic-vector kernels' c += x * b fused (strict C11 would not). */
#if defined(__clang__)
#define WIDE_CONTRACT
#else
#define WIDE_CONTRACT optimize("O2", "fp-contract=fast")
#endif

static bool enabled = true;
static int wide_choice = -1; /* -1: where the CPU has AVX-512F; 0 or 1: set by the tests */

void tile_gemm_set_enabled(bool on) { enabled = on; }

void tile_gemm_set_wide(int choice) { wide_choice = choice; }

bool tile_gemm_wide(void) {
#if TILE_GEMM_WIDE
    if (!tile_gemm_available()) return false;
    return wide_choice >= 0 ? wide_choice == 1 : __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

bool tile_gemm_available(void) {
#if TILE_GEMM_AVX2
    return enabled && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* One block of the operands, as the micro-kernels see it. */
typedef struct {
    int rows, cols, k; /* rows <= MICRO_ROWS, cols <= MICRO_COLS */
    float alpha;
    const float *a;
    ptrdiff_t a_row, a_col;
    const float *b;
    ptrdiff_t ldb;
    bool accumulate;
    float *c;
    ptrdiff_t ldc;
} tile_block;

/* Portable C for machines without AVX2 and FMA, and the reference the
 * tests hold the AVX2 kernel to. */
static void block_portable(const tile_block *t) {
    for (int i = 0; i < t->rows; i++) {
        float sum[MICRO_COLS] = {0};
        const float *a = t->a + i * t->a_row;
        for (int p = 0; p < t->k; p++)
            for (int j = 0; j < t->cols; j++) sum[j] += a[p * t->a_col] * t->b[p * t->ldb + j];
        float *c = t->c + i * t->ldc;
        for (int j = 0; j < t->cols; j++) c[j] = t->alpha * sum[j] + (t->accumulate ? c[j] : 0.0f);
    }
}

#if TILE_GEMM_AVX2
/* One row of the micro-tile's result: c (=|+=) alpha (lo, hi). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
store_row(const tile_block *t, int r, __m256 lo, __m256 hi, bool masked, __m256i mask0, __m256i mask1) {
    if (r >= t->rows) return;
    float *c = t->c + r * t->ldc;
    const __m256 alpha = _mm256_set1_ps(t->alpha);
    lo = _mm256_mul_ps(alpha, lo), hi = _mm256_mul_ps(alpha, hi);
    if (t->accumulate) {
        lo = _mm256_add_ps(lo, masked ? _mm256_maskload_ps(c, mask0) : _mm256_loadu_ps(c));
        hi = _mm256_add_ps(hi, masked ? _mm256_maskload_ps(c + 8, mask1) : _mm256_loadu_ps(c + 8));
    }
    if (masked) {
        _mm256_maskstore_ps(c, mask0, lo);
        _mm256_maskstore_ps(c + 8, mask1, hi);
    } else {
        _mm256_storeu_ps(c, lo);
        _mm256_storeu_ps(c + 8, hi);
    }
}

/* Rows past t->rows read the last real row again (their sums are dropped),
 * so that the inner loop has no branch; columns past t->cols are masked
 * when `masked`, which the two callers below fix at compile time. The
 * accumulators are named, not an array, so that GCC keeps all twelve in
 * registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void block_avx2(const tile_block *t, bool masked) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(t->cols), lane);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(t->cols - 8), lane);
    int last = t->rows - 1;
    /* Row offsets in registers and one moving pointer: each broadcast is
     * then a single base + index load, with no address arithmetic. */
    ptrdiff_t o1 = min_int(1, last) * t->a_row, o2 = min_int(2, last) * t->a_row, o3 = min_int(3, last) * t->a_row;
    ptrdiff_t o4 = min_int(4, last) * t->a_row, o5 = min_int(5, last) * t->a_row;
    const float *a = t->a, *b = t->b;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const ptrdiff_t a_col = t->a_col, ldb = t->ldb;
    for (int p = t->k; p > 0; p--, a += a_col, b += ldb) {
        __m256 b0 = masked ? _mm256_maskload_ps(b, mask0) : _mm256_loadu_ps(b);
        __m256 b1 = masked ? _mm256_maskload_ps(b + 8, mask1) : _mm256_loadu_ps(b + 8);
        __m256 x = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a + o1);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a + o2);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a + o3);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a + o4);
        c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a + o5);
        c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    store_row(t, 0, c00, c01, masked, mask0, mask1);
    store_row(t, 1, c10, c11, masked, mask0, mask1);
    store_row(t, 2, c20, c21, masked, mask0, mask1);
    store_row(t, 3, c30, c31, masked, mask0, mask1);
    store_row(t, 4, c40, c41, masked, mask0, mask1);
    store_row(t, 5, c50, c51, masked, mask0, mask1);
}

__attribute__((target("avx2,fma"))) static void block_avx2_full(const tile_block *t) { block_avx2(t, false); }
__attribute__((target("avx2,fma"))) static void block_avx2_masked(const tile_block *t) { block_avx2(t, true); }

#if TILE_GEMM_WIDE
/* The micro-tile twice as wide for AVX-512 (docs/design.md §8.10): 6 rows
 * x 32 columns in twelve 16-lane accumulators, one zmm each, full column
 * blocks only (tile_gemm gives the rest of a product to the 16-column
 * kernels). The same steps as block_avx2, so the two give the same bits:
 * each sum runs over p in order with one fused multiply-add per step. It is
 * written in GCC's generic vectors and compiled twice, so that the tests
 * run this very source on a CPU without AVX-512 (block_wide_avx2: two ymm
 * per accumulator, FMA too). fp-contract=fast fuses c += x * b, which
 * strict C11 would not. */
typedef float wide_vec __attribute__((vector_size(64)));

/* Helpers as macros: a function taking or returning a 64-byte vector
 * would change the ABI between the two targets. x - 0 is x for every x, -0
 * included, so WIDE_SPLAT is a broadcast. */
#define WIDE_LOAD(v, p) memcpy(&(v), (p), sizeof(v))
#define WIDE_SPLAT(x) ((x) - (wide_vec){0})
#define WIDE_STORE_ROW(t, r, lo, hi)                                                                     \
    do {                                                                                                 \
        if ((r) < (t)->rows) {                                                                           \
            float *row = (t)->c + (r) * (t)->ldc;                                                        \
            wide_vec l = (t)->alpha * (lo), h = (t)->alpha * (hi), old;                                  \
            if ((t)->accumulate) {                                                                       \
                __asm__("" : "+m"(l), "+m"(h)); /* as block_avx2: round alpha * lo, then add (no FMA) */ \
                WIDE_LOAD(old, row), l = l + old, WIDE_LOAD(old, row + 16), h = h + old;                 \
            }                                                                                            \
            memcpy(row, &l, sizeof l);                                                                   \
            memcpy(row + 16, &h, sizeof h);                                                              \
        }                                                                                                \
    } while (0)

__attribute__((always_inline, WIDE_CONTRACT)) static inline void block_wide(const tile_block *t) {
    int last = t->rows - 1;
    ptrdiff_t o1 = min_int(1, last) * t->a_row, o2 = min_int(2, last) * t->a_row, o3 = min_int(3, last) * t->a_row;
    ptrdiff_t o4 = min_int(4, last) * t->a_row, o5 = min_int(5, last) * t->a_row;
    const float *a = t->a, *b = t->b;
    wide_vec c00 = {0}, c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    wide_vec c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const ptrdiff_t a_col = t->a_col, ldb = t->ldb;
    for (int p = t->k; p > 0; p--, a += a_col, b += ldb) {
        wide_vec b0, b1, x = WIDE_SPLAT(a[0]);
        WIDE_LOAD(b0, b), WIDE_LOAD(b1, b + 16);
        c00 += x * b0, c01 += x * b1;
        x = WIDE_SPLAT(a[o1]);
        c10 += x * b0, c11 += x * b1;
        x = WIDE_SPLAT(a[o2]);
        c20 += x * b0, c21 += x * b1;
        x = WIDE_SPLAT(a[o3]);
        c30 += x * b0, c31 += x * b1;
        x = WIDE_SPLAT(a[o4]);
        c40 += x * b0, c41 += x * b1;
        x = WIDE_SPLAT(a[o5]);
        c50 += x * b0, c51 += x * b1;
    }
    WIDE_STORE_ROW(t, 0, c00, c01);
    WIDE_STORE_ROW(t, 1, c10, c11);
    WIDE_STORE_ROW(t, 2, c20, c21);
    WIDE_STORE_ROW(t, 3, c30, c31);
    WIDE_STORE_ROW(t, 4, c40, c41);
    WIDE_STORE_ROW(t, 5, c50, c51);
}

__attribute__((target("avx512f"), WIDE_CONTRACT)) static void block_wide_avx512(const tile_block *t) { block_wide(t); }
__attribute__((target("avx2,fma"), WIDE_CONTRACT)) static void block_wide_avx2(const tile_block *t) { block_wide(t); }
#endif
#endif

/* Column blocks outside, row blocks inside: a block of B (k x 16, or 32
 * on the wide kernel) stays in L1 while the rows of A stream past it. */
void tile_gemm(int m, int n, int k, float alpha, const float *a, ptrdiff_t a_row, ptrdiff_t a_col, const float *b,
               ptrdiff_t ldb, bool accumulate, float *c, ptrdiff_t ldc) {
    bool avx2 = tile_gemm_available(), wide = tile_gemm_wide();
#if TILE_GEMM_WIDE
    bool avx512 = wide && __builtin_cpu_supports("avx512f");
#endif
    tile_block t = {
        .k = k, .alpha = alpha, .a_row = a_row, .a_col = a_col, .ldb = ldb, .accumulate = accumulate, .ldc = ldc};
    for (int j = 0; j < n;) {
        int width = wide && n - j >= WIDE_COLS ? WIDE_COLS : MICRO_COLS;
        t.cols = min_int(width, n - j);
        t.b = b + j;
        for (int i = 0; i < m; i += MICRO_ROWS) {
            t.rows = min_int(MICRO_ROWS, m - i);
            t.a = a + i * a_row;
            t.c = c + i * ldc + j;
#if TILE_GEMM_WIDE
            if (width == WIDE_COLS) {
                if (avx512) block_wide_avx512(&t);
                else block_wide_avx2(&t);
                continue;
            }
#endif
#if TILE_GEMM_AVX2
            if (avx2) {
                if (t.cols == MICRO_COLS) block_avx2_full(&t);
                else block_avx2_masked(&t);
                continue;
            }
#endif
            (void)avx2;
            block_portable(&t);
        }
        j += width;
    }
}

void tile_gemm_transpose(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int rows, int cols) {
    for (int j = 0; j < rows; j++)
        for (int p = 0; p < cols; p++) dst[p * ld_dst + j] = src[j * ld_src + p];
}

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
    if (isa < 0)
        isa = __builtin_cpu_supports("avx512f")                                 ? 2
              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
                                                                                : 0;
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
