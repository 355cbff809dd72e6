/* Register-blocked products for the tiles of softmax attention
 * (tiled_softmax.c; docs/design.md §8.10). The tiles are small and thin
 * (64 x 256 scores, a head dimension of 32 or 64), and half their operands
 * are transposed views: through cblas_sgemm each one paid the call, the
 * packing and a kernel built for long inner products, and ran at a third
 * of the FMA peak. Here one AVX2 micro-kernel (6 rows x 16 columns in
 * twelve accumulators; 6 x 32 on AVX-512) reads A through any pair of strides, so P^T and dS^T
 * need no copy, and B row by row, so only K^T and V^T are packed, once per
 * key tile. Where the CPU has no AVX2 and FMA, tile_gemm_available() is
 * false and the caller uses gemm_product. */
#ifndef MOMFMM_TILE_GEMM_H
#define MOMFMM_TILE_GEMM_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True where the kernel runs: x86-64 with AVX2 and FMA, and not turned off
 * by tile_gemm_set_enabled (the tests compare it with gemm_product). */
bool tile_gemm_available(void);
void tile_gemm_set_enabled(bool enabled);
/* True where full 32-column blocks run on the AVX-512 kernel: the CPU has
 * AVX-512F, or the tests chose it (tile_gemm_set_wide(1); 0 turns it off,
 * -1 goes back to the CPU's). Both kernels give the same bits. */
bool tile_gemm_wide(void);
void tile_gemm_set_wide(int choice);
/* True where the kernels' 16-lane AVX-512 forms run (the wide products,
 * the tiles' transposes and exponentials, GELU): tile_gemm_wide on a CPU
 * that has AVX-512F. The tests may force tile_gemm_wide on a CPU without
 * it, which then runs the wide products' AVX2 build and the 8-lane forms. */
bool tile_gemm_avx512(void);

/* C[m x n] = alpha A B, or C += alpha A B with accumulate, where A's element
 * (i, p) is a[i * a_row + p * a_col], B's element (p, j) is b[p * ldb + j]
 * and C's element (i, j) is c[i * ldc + j]. Any m, n, k >= 0; for a given
 * shape the result does not depend on the operands' addresses. */
void tile_gemm(int m, int n, int k, float alpha, const float *a, ptrdiff_t a_row, ptrdiff_t a_col, const float *b,
               ptrdiff_t ldb, bool accumulate, float *c, ptrdiff_t ldc);

/* dst[p * ld_dst + j] = src[j * ld_src + p] for j < rows, p < cols: a
 * [rows x cols] block transposed, to serve as tile_gemm's B. */
void tile_gemm_transpose(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int rows, int cols);

/* ---- bf16 operands (train.precision = bf16; docs/design.md §8.10) ----
 * The same products on operands rounded to bf16, summed in fp32. An
 * operand is stored as pairs along the inner dimension k: two adjacent
 * uint16_t, element 2pp then 2pp + 1 (a 0 past an odd k), which is what
 * vdpbf16ps multiplies and adds into one fp32 lane. Strides count pairs.
 * Where the CPU has AVX512_BF16 the products run on vdpbf16ps; elsewhere
 * (or when the tests choose it) the same sums run in fp32: each product of
 * two bf16 numbers is exact in fp32, and every lane adds its pair's odd
 * product first, then the even one, as vdpbf16ps does, so both paths give
 * the same bits (test_kernels checks it; values below 2^-126 aside, which
 * vdpbf16ps flushes to zero). */

/* True where tile_gemm_bf16 runs on vdpbf16ps: the CPU has AVX512_BF16
 * (cpu_has_avx512_bf16) and tile_gemm_set_bf16_native did not turn it off
 * (0: the fp32 path; 1 or -1: the CPU's choice). */
bool tile_gemm_bf16_native(void);
void tile_gemm_set_bf16_native(int choice);

/* Packs k x n values of src, element (p, j) at src[p * s_k + j * s_n],
 * into pairs along k: pair (pp, j) at dst + 2 * (pp * d_k + j * d_n), for
 * pp < (k + 1) / 2. The rounding is cpu_f32_to_bf16's. Contiguous rows
 * (s_n = d_n = 1) and contiguous pairs (s_k = d_k = 1) are the fast cases;
 * other strides are gathered first. */
void tile_bf16_pack(uint16_t *dst, ptrdiff_t d_k, ptrdiff_t d_n, const float *src, ptrdiff_t s_k, ptrdiff_t s_n, int k,
                    int n);

/* rows x cols of src (contiguous rows) in bf16, cpu_f32_to_bf16's rounding,
 * in one pass over src: as they lie into dst, element (r, c) at
 * dst[r * ld + c], and transposed into dst_t, element (r, c) at
 * dst_t[c * ld_t + r]. For the bf16 engine's held dY (gemm.c): its weight
 * gradient dY^T X then runs as a product of untransposed operands
 * (docs/design.md §8.10). */
void tile_bf16_transpose(uint16_t *dst_t, ptrdiff_t ld_t, uint16_t *dst, ptrdiff_t ld, const float *src, int rows,
                         int cols);

/* C[m x n] = alpha A B, or C += alpha A B with accumulate (the fp32 C as
 * tile_gemm's): A's pair (i, pp) at a + 2 * (i * a_row + pp * a_col), B's
 * pair (pp, j) at b + 2 * (pp * ldb + j); nothing past column n of B is
 * read. */
void tile_gemm_bf16(int m, int n, int k, float alpha, const uint16_t *a, ptrdiff_t a_row, ptrdiff_t a_col,
                    const uint16_t *b, ptrdiff_t ldb, bool accumulate, float *c, ptrdiff_t ldc);
#endif
