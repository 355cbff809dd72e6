/* Private: bf16 products on an fp32 engine, for gemm.c's bf16 engine where
 * oneDNN has no bf16 matmul (a CPU without AVX512_BF16, AMX-BF16 and
 * AVX-512) and MOMFMM_FORCE_BF16=1 asks for bf16 anyway: so that bf16's
 * numbers, and the tests of them, run on every core (docs/scale.md §7). */
#ifndef MOMFMM_GEMM_WIDEN_H
#define MOMFMM_GEMM_WIDEN_H
#include <stdbool.h>
#include <stdint.h>

#include "gemm_split.h"

/* The widened operands' buffers, one pair per thread of a parallel region
 * (GEMM_TEAM_MAX, as gemm_split's spaces), grown to the largest operand
 * met and then reused: after the first step no product allocates. */
typedef struct gemm_widen gemm_widen;
gemm_widen *gemm_widen_create(void);
void gemm_widen_destroy(gemm_widen *widen);

/* gemm.h's product, M, N, K >= 1 (gemm.c has handled the empty ones), with
 * each operand read from its bf16 copy (A16, B16) or, without one, rounded
 * to bf16 as cpu_f32_to_bf16 rounds it; either way widened to fp32, which is
 * exact, and multiplied by OpenBLAS's sgemm cut between the threads
 * (gemm_split_product). A product of two bf16 values is exact in fp32, so C
 * is the fp32 sum of the bf16 products that vdpbf16ps forms, up to the
 * order of the sums. */
void gemm_widen_product(gemm_widen *widen, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                        const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                        float *C, int ldc);
#endif
