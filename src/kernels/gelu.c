/* GELU (tanh form) with its product's bias, forward and backward, of
 * kernels.h (docs/model.md §1): the bias add and the activation in one
 * pass; the forward on fused vector steps where the CPU has them, in fp32
 * or straight into bf16 for the products that read it; the backward and
 * the bias gradient in one pass over fixed blocks of rows (docs/design.md
 * §8.10). Split from kernels.c, whose other layers do not read these. */
#include "kernels/kernels.h"

#include <omp.h>
#include <string.h>

#include "base/cpu.h"
#include "base/fast_math.h"
#include "kernels/tile_gemm.h"

#include "kernels_internal.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static inline float gelu_tanh_term(float x) { return fast_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)); }

/* Elementwise kernels run in chunks of this many floats, one per task. */
#define ELEMENT_CHUNK 16384

static size_t element_chunks(size_t n) { return (n + ELEMENT_CHUNK - 1) / ELEMENT_CHUNK; }
static size_t chunk_length(size_t n, size_t chunk) {
    size_t left = n - chunk * ELEMENT_CHUNK;
    return left < ELEMENT_CHUNK ? left : ELEMENT_CHUNK;
}

/* pre += bias, then GELU of it, along one row: the bias add costs no pass
 * of its own (docs/design.md §8.10). The portable form, for CPUs without
 * AVX2 and FMA. */
VECTOR_CLONES static void gelu_bias_forward_row_portable(float *out, float *tanh_saved, float *pre, const float *bias,
                                                         int dim) {
    for (int i = 0; i < dim; i++) {
        float x = pre[i] + bias[i], th = gelu_tanh_term(x);
        pre[i] = x;
        tanh_saved[i] = th;
        out[i] = 0.5f * x * (1.0f + th);
    }
}

#if FAST_EXP8_AVAILABLE
/* The same on eight or sixteen lanes with fused multiply-adds in the cubic
 * and in tanh's exponential (fast_tanh8/16): the tanh term's work bounds
 * the pass, and the compiler, bound by strict C11 to separate multiplies
 * and adds, made it about 1.5 times as long (docs/performance.md §9.9). The
 * two widths take the same steps, so the same bits; the output is
 * 0.5 x (1 + th) in the portable form's order, unfused, so that
 * gelu_from_tanh remakes it bit for bit. A row's tail runs as one more
 * vector of lanes copied into zeros. */
#define GELU_LANES(width, vec, load, store, add, mul, fma, set1, tanh_lanes)                                         \
    static inline void gelu_lanes##width(float *out, float *tanh_saved, float *pre, const float *bias) {             \
        vec x = add(load(pre), load(bias));                                                                          \
        vec cubic = mul(mul(set1(0.044715f), x), x);                                                                 \
        vec th = tanh_lanes(mul(set1(GELU_SCALE), fma(cubic, x, x)));                                                \
        store(pre, x), store(tanh_saved, th);                                                                        \
        store(out, mul(mul(set1(0.5f), x), add(set1(1.0f), th)));                                                    \
    }                                                                                                                \
    static void gelu_row##width(float *out, float *tanh_saved, float *pre, const float *bias, int dim) {             \
        int i = 0;                                                                                                   \
        for (; i + (width) <= dim; i += (width)) gelu_lanes##width(out + i, tanh_saved + i, pre + i, bias + i);      \
        if (i == dim) return;                                                                                        \
        size_t tail = sizeof(float) * (size_t)(dim - i);                                                             \
        float o[width], t[width], p[width] = {0}, b[width] = {0};                                                    \
        memcpy(p, pre + i, tail), memcpy(b, bias + i, tail);                                                         \
        gelu_lanes##width(o, t, p, b);                                                                               \
        memcpy(pre + i, p, tail), memcpy(tanh_saved + i, t, tail), memcpy(out + i, o, tail); /* out may alias pre */ \
    }
#pragma GCC push_options
#pragma GCC target("avx2,fma")
GELU_LANES(8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_mul_ps, _mm256_fmadd_ps, _mm256_set1_ps,
           fast_tanh8)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
GELU_LANES(16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_mul_ps, _mm512_fmadd_ps, _mm512_set1_ps,
           fast_tanh16)
#pragma GCC pop_options
#endif

/* Which form runs: 16 lanes where the CPU has AVX-512F and the tests did
 * not turn the wide kernels off (tile_gemm_wide), 8 where it has AVX2 and
 * FMA, else the portable one (other bits: no fused steps). */
static void gelu_bias_forward_row(float *out, float *tanh_saved, float *pre, const float *bias, int dim) {
#if FAST_EXP8_AVAILABLE
    if (tile_gemm_avx512()) {
        gelu_row16(out, tanh_saved, pre, bias, dim);
        return;
    }
    if (tile_gemm_available()) {
        gelu_row8(out, tanh_saved, pre, bias, dim);
        return;
    }
#endif
    gelu_bias_forward_row_portable(out, tanh_saved, pre, bias, dim);
}

void gelu_bias_forward(float *out, float *tanh_saved, float *pre, const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        gelu_bias_forward_row(out + at, tanh_saved + at, pre + at, bias, dim);
    }
}

VECTOR_CLONES static void gelu_from_tanh_chunk(float *out, const float *inp, const float *tanh_saved, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + tanh_saved[i]);
}

void gelu_from_tanh(float *out, const float *inp, const float *tanh_saved, size_t n) {
#pragma omp parallel for schedule(static) if (element_chunks(n) > 1)
    for (size_t c = 0; c < element_chunks(n); c++) {
        size_t at = c * ELEMENT_CHUNK;
        gelu_from_tanh_chunk(out + at, inp + at, tanh_saved + at, chunk_length(n, c));
    }
}

/* gelu_bias_forward_row's output in bf16, piece by piece. */
static void gelu_bias_forward_row_bf16(uint16_t *out, float *tanh_saved, float *pre, const float *bias, int dim) {
    float piece[KERNEL_BF16_PIECE];
    for (int i = 0; i < dim; i += KERNEL_BF16_PIECE) {
        int n = dim - i < KERNEL_BF16_PIECE ? dim - i : KERNEL_BF16_PIECE;
        gelu_bias_forward_row(piece, tanh_saved + i, pre + i, bias + i, n);
        cpu_f32_to_bf16(out + i, piece, (size_t)n);
    }
}

void gelu_bias_forward_bf16(uint16_t *out, float *tanh_saved, float *pre, const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        gelu_bias_forward_row_bf16(out + at, tanh_saved + at, pre + at, bias, dim);
    }
}

static void gelu_from_tanh_chunk_bf16(uint16_t *out, const float *inp, const float *tanh_saved, size_t n) {
    float piece[KERNEL_BF16_PIECE];
    for (size_t i = 0; i < n; i += KERNEL_BF16_PIECE) {
        size_t len = n - i < KERNEL_BF16_PIECE ? n - i : KERNEL_BF16_PIECE;
        gelu_from_tanh_chunk(piece, inp + i, tanh_saved + i, len);
        cpu_f32_to_bf16(out + i, piece, len);
    }
}

void gelu_from_tanh_bf16(uint16_t *out, const float *inp, const float *tanh_saved, size_t n) {
#pragma omp parallel for schedule(static) if (element_chunks(n) > 1)
    for (size_t c = 0; c < element_chunks(n); c++) {
        size_t at = c * ELEMENT_CHUNK;
        gelu_from_tanh_chunk_bf16(out + at, inp + at, tanh_saved + at, chunk_length(n, c));
    }
}

/* Rows [r0, r1) of dpre = dout * gelu'(pre), each row added into the
 * block's bias partials as it is made: GELU's backward and the bias
 * gradient in one pass (docs/design.md §8.10). */
VECTOR_CLONES static void gelu_bias_backward_block(float *dpre, float *partial, const float *pre,
                                                   const float *tanh_saved, const float *dout, int r0, int r1,
                                                   int dim) {
    memset(partial, 0, sizeof(float) * dim);
    for (int r = r0; r < r1; r++) {
        size_t at = (size_t)r * dim;
        for (int c = 0; c < dim; c++) {
            float x = pre[at + c], th = tanh_saved[at + c];
            float sech2 = 1.0f - th * th;
            float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
            dpre[at + c] = dout[at + c] * grad;
            partial[c] += dpre[at + c];
        }
    }
}

void gelu_bias_backward(float *dpre, float *dbias, const float *pre, const float *tanh_saved, const float *dout,
                        int rows, int dim, bool accumulate, float *partials) {
    if (!accumulate) memset(dbias, 0, sizeof(float) * dim);
    kernel_row_blocks blocks = kernel_row_blocks_of(rows);
#pragma omp parallel if ((size_t)rows * dim >= kernel_parallel_min_floats)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < blocks.count; b++)
            gelu_bias_backward_block(dpre, partials + (size_t)b * dim, pre, tanh_saved, dout, b * blocks.rows_per,
                                     kernel_block_end(blocks, b, rows), dim);
        kernel_add_blocks_on_thread(dbias, partials, blocks.count, (size_t)dim, dim);
    }
}
