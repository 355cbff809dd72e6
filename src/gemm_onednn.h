/* Private: the oneDNN half of the GEMM engine (gemm.h), compiled only when
 * cmake/onednn.cmake found oneDNN (MOMFMM_HAVE_ONEDNN). */
#ifndef MOMFMM_GEMM_ONEDNN_H
#define MOMFMM_GEMM_ONEDNN_H
#include "momfmm/gemm.h"

typedef struct gemm_onednn gemm_onednn;

gemm_onednn *gemm_onednn_create(bool bf16, int threads);
void gemm_onednn_destroy(gemm_onednn *dnn);
/* M, N, K >= 1 here; gemm.c has handled the empty products. */
void gemm_onednn_run(gemm_onednn *dnn, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                     gemm_operand A, int lda, gemm_operand B, int ldb, float beta, float *C, int ldc);
size_t gemm_onednn_primitives(const gemm_onednn *dnn);
/* "oneDNN 2.6.3: brg:avx512_core_bf16, gemm:jit" */
const char *gemm_onednn_describe(gemm_onednn *dnn);
#endif
