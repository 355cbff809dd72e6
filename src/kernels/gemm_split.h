/* Private: products cut between OpenMP's threads, for gemm.c's OpenBLAS
 * engine and our own kernel (docs/design.md §8.10): by rows or columns of
 * C, each part a product of its own, or in two fixed halves of K. */
#ifndef MOMFMM_GEMM_SPLIT_H
#define MOMFMM_GEMM_SPLIT_H
#include <stdbool.h>

/* Threads of one parallel region with state of their own (a oneDNN state,
 * a packing space, a scratch). */
#define GEMM_TEAM_MAX 256

/* Our own kernel's per-thread packing spaces and K-half scratches. */
typedef struct gemm_spaces gemm_spaces;
gemm_spaces *gemm_spaces_create(void);
void gemm_spaces_destroy(gemm_spaces *spaces);

/* C = beta C + alpha op(A) op(B), M, N, K >= 1, on our own kernel (own) or
 * OpenBLAS, cut between OpenMP's threads outside a parallel region; spaces
 * may be NULL for OpenBLAS. */
void gemm_split_product(gemm_spaces *spaces, bool own, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The threads a piece of work is cut between: one inside a parallel
 * region (the region has the cores) or below `least` units of work, else
 * OpenMP's count. */
int gemm_cut_threads(double work, double least);
/* The length of each of `parts` parts of `extent`, rounded up to a
 * multiple of `align` (the last part may be shorter, or empty). */
int gemm_cut_step(int extent, int parts, int align);
#endif
