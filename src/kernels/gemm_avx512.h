/* Private: the project's own fp32 product for AVX-512 cores, one engine of
 * gemm.h (GEMM_AVX512_F32; docs/design.md §8.10 says why it exists). */
#ifndef MOMFMM_GEMM_AVX512_H
#define MOMFMM_GEMM_AVX512_H
#include <stdbool.h>

/* The packed blocks of one thread's products: fixed in size, so made once
 * per thread and reused by every product (no allocation per step). */
typedef struct gemm_avx512_space gemm_avx512_space;

/* NULL when the kernel runs here (x86-64 GCC build, CPU with AVX-512F);
 * otherwise why not, in one line. */
const char *gemm_avx512_unavailable_reason(void);
gemm_avx512_space *gemm_avx512_space_create(void);
void gemm_avx512_space_destroy(gemm_avx512_space *space);

/* gemm.h's product on the calling thread, M, N, K >= 1 (gemm.c handles the
 * empty ones and cuts large products between threads). */
void gemm_avx512_run(gemm_avx512_space *space, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
#endif
