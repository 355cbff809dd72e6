/* GELU (tanh form) with its product's bias, forward and backward, of
 * kernels.h (docs/model.md §1): the bias add, the activation and its slope
 * in one pass; the forward on fused vector steps where the CPU has them,
 * its output in fp32 or straight into bf16 for the products that read it;
 * the backward and the bias gradient in one pass over fixed blocks of rows
 * (docs/design.md §8.10). Split from kernels.c, whose other layers do not read these. */
#include "kernels/kernels.h"

#include <omp.h>
#include <string.h>

#include "base/cpu.h"
#include "base/fast_math.h"
#include "kernels/tile_gemm.h"

#include "kernels_internal.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static inline float gelu_tanh_term(float x) { return fast_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)); }

/* gelu'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
 * from x and its tanh term th. Strict C11 keeps its steps unfused, and the
 * vector forms below take the same steps: the same bits on any lanes. */
static inline float gelu_slope(float x, float th) {
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* Rows from element `at` on of an array the caller may leave NULL. */
static float *row_of(float *rows, size_t at) { return rows ? rows + at : NULL; }

/* GELU of pre + bias along one row, and its slope unless slope is NULL:
 * the bias add costs no pass of its own (docs/design.md §8.10). The
 * portable form, for CPUs without AVX2 and FMA. */
VECTOR_CLONES static void gelu_bias_forward_row_portable(float *out, float *slope, const float *pre, const float *bias,
                                                         int dim) {
    for (int i = 0; i < dim; i++) {
        float x = pre[i] + bias[i], th = gelu_tanh_term(x);
        if (slope) slope[i] = gelu_slope(x, th);
        out[i] = 0.5f * x * (1.0f + th);
    }
}

#if FAST_EXP8_AVAILABLE
/* The same on eight or sixteen lanes with fused multiply-adds in the cubic
 * and in tanh's exponential (fast_tanh8/16): the tanh term's work bounds
 * the pass, and the compiler, bound by strict C11 to separate multiplies
 * and adds, made it about 1.5 times as long (docs/performance.md §9.9). The
 * two widths take the same steps, so the same bits; the output is
 * 0.5 x (1 + th) and the slope gelu_slope's expression, in the portable
 * form's order, unfused. A row's tail runs as one more vector of lanes
 * copied into zeros. */
#define GELU_LANES(width, vec, load, store, add, sub, mul, fma, set1, tanh_lanes)                         \
    static inline void gelu_lanes##width(float *out, float *slope, const float *pre, const float *bias) { \
        vec x = add(load(pre), load(bias));                                                               \
        vec cubic = mul(mul(set1(0.044715f), x), x);                                                      \
        vec th = tanh_lanes(mul(set1(GELU_SCALE), fma(cubic, x, x)));                                     \
        if (slope) {                                                                                      \
            vec sech2 = sub(set1(1.0f), mul(th, th));                                                     \
            vec rise = add(set1(1.0f), mul(mul(set1(3.0f * 0.044715f), x), x));                           \
            vec tail = mul(mul(mul(mul(set1(0.5f), x), sech2), set1(GELU_SCALE)), rise);                  \
            store(slope, add(mul(set1(0.5f), add(set1(1.0f), th)), tail));                                \
        }                                                                                                 \
        store(out, mul(mul(set1(0.5f), x), add(set1(1.0f), th)));                                         \
    }                                                                                                     \
    static void gelu_row##width(float *out, float *slope, const float *pre, const float *bias, int dim) { \
        int i = 0;                                                                                        \
        for (; i + (width) <= dim; i += (width))                                                          \
            gelu_lanes##width(out + i, row_of(slope, (size_t)i), pre + i, bias + i);                      \
        if (i == dim) return;                                                                             \
        size_t tail = sizeof(float) * (size_t)(dim - i);                                                  \
        float o[width], s[width], p[width] = {0}, b[width] = {0};                                         \
        memcpy(p, pre + i, tail), memcpy(b, bias + i, tail);                                              \
        gelu_lanes##width(o, slope ? s : NULL, p, b);                                                     \
        if (slope) memcpy(slope + i, s, tail);                                                            \
        memcpy(out + i, o, tail); /* out may alias pre */                                                 \
    }
#pragma GCC push_options
#pragma GCC target("avx2,fma")
GELU_LANES(8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_fmadd_ps,
           _mm256_set1_ps, fast_tanh8)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
GELU_LANES(16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_fmadd_ps,
           _mm512_set1_ps, fast_tanh16)
#pragma GCC pop_options
#endif

/* Which form runs: 16 lanes where the CPU has AVX-512F and the tests did
 * not turn the wide kernels off (tile_gemm_wide), 8 where it has AVX2 and
 * FMA, else the portable one (other bits: no fused steps). */
static void gelu_bias_forward_row(float *out, float *slope, const float *pre, const float *bias, int dim) {
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_avx512()) {
        gelu_row16(out, slope, pre, bias, dim);
        return;
    }
    if (tile_gemm_available()) {
        gelu_row8(out, slope, pre, bias, dim);
        return;
    }
#endif
    gelu_bias_forward_row_portable(out, slope, pre, bias, dim);
}

void gelu_bias_forward(float *out, float *slope, const float *pre, const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        gelu_bias_forward_row(out + at, row_of(slope, at), pre + at, bias, dim);
    }
}

/* gelu_bias_forward_row's output in bf16, piece by piece. */
static void gelu_bias_forward_row_bf16(uint16_t *out, float *slope, const float *pre, const float *bias, int dim) {
    float piece[KERNEL_BF16_PIECE];
    for (int i = 0; i < dim; i += KERNEL_BF16_PIECE) {
        int n = dim - i < KERNEL_BF16_PIECE ? dim - i : KERNEL_BF16_PIECE;
        gelu_bias_forward_row(piece, row_of(slope, (size_t)i), pre + i, bias + i, n);
        cpu_f32_to_bf16(out + i, piece, (size_t)n);
    }
}

void gelu_bias_forward_bf16(uint16_t *out, float *slope, const float *pre, const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        gelu_bias_forward_row_bf16(out + at, row_of(slope, at), pre + at, bias, dim);
    }
}

/* Rows [r0, r1) of dpre = dout * slope, each row added into the block's
 * bias partials as it is made: GELU's backward and the bias gradient in
 * one pass (docs/design.md §8.10). */
VECTOR_CLONES static void gelu_bias_backward_block(float *dpre, float *partial, const float *slope, const float *dout,
                                                   int r0, int r1, int dim) {
    memset(partial, 0, sizeof(float) * dim);
    for (int r = r0; r < r1; r++) {
        size_t at = (size_t)r * dim;
        for (int c = 0; c < dim; c++) {
            dpre[at + c] = dout[at + c] * slope[at + c];
            partial[c] += dpre[at + c];
        }
    }
}

void gelu_bias_backward(float *dpre, float *dbias, const float *slope, const float *dout, int rows, int dim,
                        bool accumulate, float *partials) {
    if (!accumulate) memset(dbias, 0, sizeof(float) * dim);
    kernel_row_blocks blocks = kernel_row_blocks_of(rows);
#pragma omp parallel if ((size_t)rows * dim >= kernel_parallel_min_floats)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < blocks.count; b++)
            gelu_bias_backward_block(dpre, partials + (size_t)b * dim, slope, dout, b * blocks.rows_per,
                                     kernel_block_end(blocks, b, rows), dim);
        kernel_add_blocks_on_thread(dbias, partials, blocks.count, (size_t)dim, dim);
    }
}
