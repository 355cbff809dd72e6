/* Register-blocked products for attention tiles (tile_gemm.h). */
#include "kernels/tile_gemm.h"

#include <string.h>

#include "base/cpu.h"

#include "tile_gemm_internal.h"
#include "transpose16.h"

/* The micro-tile: 6 rows x 16 columns are twelve ymm accumulators, which
 * cover the FMA latency (4 cycles) on both pipes, and with two B loads and
 * one broadcast they leave one of the sixteen registers spare. */
#define MICRO_ROWS 6
#define MICRO_COLS 16

#define WIDE_COLS 32

static bool enabled = true;
static int wide_choice = -1; /* -1: where the CPU has AVX-512F; 0 or 1: set by the tests */

void tile_gemm_set_enabled(bool on) { enabled = on; }

void tile_gemm_set_wide(int choice) { wide_choice = choice; }

bool tile_gemm_wide(void) {
#if TILE_GEMM_WIDE
    if (!tile_gemm_available()) return false;
    return wide_choice >= 0 ? wide_choice == 1 : cpu_has_avx512f();
#else
    return false;
#endif
}

bool tile_gemm_avx512(void) {
#if TILE_GEMM_WIDE
    return cpu_has_avx512f() && tile_gemm_wide(); /* decided once in cpu.c: the tiles ask per call */
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
    bool avx512 = tile_gemm_avx512();
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

/* tile_gemm_transpose of rows [j0, rows) and columns [p0, cols). */
static void transpose_scalar(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int j0, int rows, int p0,
                             int cols) {
    for (int j = j0; j < rows; j++)
        for (int p = p0; p < cols; p++) dst[p * ld_dst + j] = src[j * ld_src + p];
}

#if TILE_GEMM_WIDE
/* In blocks of 16 x 16 (transpose16_columns), the rows and columns past
 * the last full sixteen element by element: the loop above took a tenth of
 * an fp32 tiled softmax at T = 256 (it transposes the query tile forward,
 * the key and value tiles backward; docs/design.md §8.10). A copy, so the
 * same floats either way. */
__attribute__((target("avx512f"))) static void transpose_avx512(float *dst, ptrdiff_t ld_dst, const float *src,
                                                                ptrdiff_t ld_src, int rows, int cols) {
    int full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
    for (int j0 = 0; j0 < full_rows; j0 += 16)
        for (int p0 = 0; p0 < full_cols; p0 += 16)
            transpose16_columns(dst + p0 * ld_dst + j0, ld_dst, src + j0 * ld_src + p0, ld_src, 16);
    transpose_scalar(dst, ld_dst, src, ld_src, 0, full_rows, full_cols, cols);
    transpose_scalar(dst, ld_dst, src, ld_src, full_rows, rows, 0, cols);
}
#endif

void tile_gemm_transpose(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int rows, int cols) {
#if TILE_GEMM_WIDE
    if (tile_gemm_avx512()) {
        transpose_avx512(dst, ld_dst, src, ld_src, rows, cols);
        return;
    }
#endif
    transpose_scalar(dst, ld_dst, src, ld_src, 0, rows, 0, cols);
}
