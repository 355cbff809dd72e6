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

/* True where the kernel runs: x86-64 with AVX2 and FMA, and not turned off
 * by tile_gemm_set_enabled (the tests compare it with gemm_product). */
bool tile_gemm_available(void);
void tile_gemm_set_enabled(bool enabled);
/* True where full 32-column blocks run on the AVX-512 kernel: the CPU has
 * AVX-512F, or the tests chose it (tile_gemm_set_wide(1); 0 turns it off,
 * -1 goes back to the CPU's). Both kernels give the same bits. */
bool tile_gemm_wide(void);
void tile_gemm_set_wide(int choice);

/* C[m x n] = alpha A B, or C += alpha A B with accumulate, where A's element
 * (i, p) is a[i * a_row + p * a_col], B's element (p, j) is b[p * ldb + j]
 * and C's element (i, j) is c[i * ldc + j]. Any m, n, k >= 0; for a given
 * shape the result does not depend on the operands' addresses. */
void tile_gemm(int m, int n, int k, float alpha, const float *a, ptrdiff_t a_row, ptrdiff_t a_col, const float *b,
               ptrdiff_t ldb, bool accumulate, float *c, ptrdiff_t ldc);

/* dst[p * ld_dst + j] = src[j * ld_src + p] for j < rows, p < cols: a
 * [rows x cols] block transposed, to serve as tile_gemm's B. */
void tile_gemm_transpose(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int rows, int cols);
#endif
