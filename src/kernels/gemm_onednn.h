/* Private: the oneDNN half of the GEMM engine (gemm.h), compiled only when
 * cmake/onednn.cmake found oneDNN (MOMFMM_HAVE_ONEDNN). */
#ifndef MOMFMM_GEMM_ONEDNN_H
#define MOMFMM_GEMM_ONEDNN_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gemm_onednn gemm_onednn;

gemm_onednn *gemm_onednn_create(bool bf16, int threads);
void gemm_onednn_destroy(gemm_onednn *dnn);
/* gemm.h's product, M, N, K >= 1 here (gemm.c has handled the empty
 * products); A16 and B16 are the operands' bf16 copies or NULL (converted
 * per call by the bf16 engine; the fp32 engine reads only A and B). */
void gemm_onednn_run(gemm_onednn *dnn, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                     int ldc);
size_t gemm_onednn_primitives(const gemm_onednn *dnn);
/* "oneDNN 2.6.3: brg:avx512_core_bf16, gemm:jit" */
const char *gemm_onednn_describe(gemm_onednn *dnn);
#endif
