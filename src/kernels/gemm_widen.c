/* bf16 products on OpenBLAS's fp32 sgemm (gemm_widen.h; docs/scale.md §7):
 * the bf16 engine where oneDNN cannot run bf16. Speed is not its purpose
 * (it runs at fp32's speed less the widening): bf16's numbers on a core
 * without bf16 or AVX-512 are. */
#include "gemm_widen.h"

#include "base/cpu.h"
#include "base/sys.h"

#include <omp.h>
#include <stddef.h>
#include <stdlib.h>

/* One thread's buffers: the two widened operands and a row of bf16. */
typedef struct {
    float *operand[2];
    size_t capacity[2];
    uint16_t *row;
    size_t row_capacity;
} widen_slot;

/* Slot 0 for the calls outside a parallel region, 1 + t for thread t of
 * one (each thread its own: the heads' products run concurrently). */
struct gemm_widen {
    widen_slot slot[GEMM_TEAM_MAX + 1];
};

gemm_widen *gemm_widen_create(void) { return sys_calloc(1, sizeof(gemm_widen)); }

void gemm_widen_destroy(gemm_widen *widen) {
    if (!widen) return;
    for (int s = 0; s <= GEMM_TEAM_MAX; s++) {
        free(widen->slot[s].operand[0]);
        free(widen->slot[s].operand[1]);
        free(widen->slot[s].row);
    }
    free(widen);
}

static void *grown(void *buffer, size_t *capacity, size_t n, size_t size) {
    if (n <= *capacity) return buffer;
    free(buffer);
    *capacity = n;
    return sys_calloc(n, size);
}

/* rows x cols of an operand (ld apart) as bf16 values widened to fp32,
 * contiguous in out: from the bf16 copy where there is one, else rounded
 * from the fp32 values a row at a time. */
static void widen(widen_slot *slot, float *out, const float *x, const uint16_t *x16, int ld, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *row = x16 ? x16 + (size_t)r * ld : slot->row;
        if (!x16) cpu_f32_to_bf16(slot->row, x + (size_t)r * ld, (size_t)cols);
        for (int c = 0; c < cols; c++) out[(size_t)r * cols + c] = cpu_bf16_to_f32(row[c]);
    }
}

static void product(widen_slot *slot, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                    const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                    int ldc) {
    /* as stored: op(A) is M x K, A itself K x M when transposed */
    int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    size_t widest = (size_t)(a_cols > b_cols ? a_cols : b_cols);
    slot->row = grown(slot->row, &slot->row_capacity, widest, sizeof *slot->row);
    slot->operand[0] = grown(slot->operand[0], &slot->capacity[0], (size_t)a_rows * a_cols, sizeof(float));
    slot->operand[1] = grown(slot->operand[1], &slot->capacity[1], (size_t)b_rows * b_cols, sizeof(float));
    widen(slot, slot->operand[0], A, A16, lda, a_rows, a_cols);
    widen(slot, slot->operand[1], B, B16, ldb, b_rows, b_cols);
    gemm_split_product(NULL, false, trans_a, trans_b, M, N, K, alpha, slot->operand[0], a_cols, slot->operand[1],
                       b_cols, beta, C, ldc);
}

void gemm_widen_product(gemm_widen *widen, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                        const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                        float *C, int ldc) {
    int t = omp_in_parallel() ? omp_get_thread_num() : -1;
    if (t < GEMM_TEAM_MAX) {
        product(&widen->slot[t + 1], trans_a, trans_b, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, ldc);
        return;
    }
#pragma omp critical(gemm_widen_shared)
    product(&widen->slot[0], trans_a, trans_b, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, ldc);
}
