/* GEMM_AUTO's measurement (gemm.h; docs/design.md §8.10): which engine runs
 * each product class fastest on this machine, timed on the model's own
 * product shapes at start-up. Why measure rather than decide by CPU: at a
 * GPT-2-small shape on an AVX2 EPYC, OpenBLAS led on the weight gradients
 * by 2-6% while oneDNN led on some forward products by 1-3%; on an AVX-512
 * Xeon oneDNN fp32 ran the whole model 30% slower. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/blas_core.h"
#include "base/sys.h"
#include "kernels/gemm.h"

/* Timed at full size, since the engines' ranking changed when the rows were
 * cut to a quarter: a cheaper proxy picked oneDNN for the weight gradients,
 * where OpenBLAS is 5% faster at the real shape. */
#define TUNE_MAX_MACS 4294967296.0 /* about 80 ms per product at 100 GFLOP/s */
#define TUNE_ROUNDS 2
#define TUNE_MARGIN 1.03 /* another engine must beat OpenBLAS by this factor */

/* The shape as timed: rows (M, or K for a weight gradient) cut so that the
 * product stays within TUNE_MAX_MACS. */
static gemm_shape bounded(gemm_shape s) {
    double macs = (double)s.M * s.N * s.K;
    if (macs <= TUNE_MAX_MACS) return s;
    int *rows = s.cls == GEMM_CLASS_BACKWARD_WEIGHT ? &s.K : &s.M;
    int cut = (int)((double)*rows * TUNE_MAX_MACS / macs);
    *rows = cut < 64 ? 64 : cut;
    return s;
}

static void transposes(gemm_class c, bool *trans_a, bool *trans_b) {
    *trans_a = c == GEMM_CLASS_BACKWARD_WEIGHT;
    *trans_b = c == GEMM_CLASS_FORWARD;
}

/* Seconds of one product on ctx's engine. */
static double time_product(gemm_ctx *ctx, const gemm_shape *s, const float *A, const float *B, float *C) {
    bool ta, tb;
    transposes(s->cls, &ta, &tb);
    int lda = ta ? s->M : s->K, ldb = tb ? s->K : s->N;
    double start = sys_seconds();
    gemm(ctx, ta, tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
    return sys_seconds() - start;
}

/* The engines to time: OpenBLAS first (the reference), then those of
 * oneDNN fp32 and our own kernel that run here. */
static int candidates(gemm_engine out[3]) {
    int n = 0;
    out[n++] = GEMM_OPENBLAS;
    if (!gemm_unavailable_reason(GEMM_ONEDNN_F32)) out[n++] = GEMM_ONEDNN_F32;
    if (!gemm_unavailable_reason(GEMM_AVX512_F32)) out[n++] = GEMM_AVX512_F32;
    return n;
}

/* The fastest engine of each class: another than OpenBLAS only when it
 * beats OpenBLAS by TUNE_MARGIN. */
static void pick(const double best[][GEMM_CLASSES], const gemm_engine *engine, int n,
                 gemm_engine engines[GEMM_CLASSES]) {
    for (int c = 0; c < GEMM_CLASSES; c++) {
        int fastest = 0;
        for (int e = 1; e < n; e++)
            if (best[e][c] * TUNE_MARGIN < best[0][c] && best[e][c] < best[fastest][c]) fastest = e;
        engines[c] = engine[fastest];
    }
}

/* The shapes large enough to be timed. */
static int timed_shapes(const gemm_shape *shapes, int n) {
    int timed = 0;
    for (int i = 0; i < n; i++) timed += (double)shapes[i].M * shapes[i].N * shapes[i].K >= GEMM_AUTO_MIN_MACS;
    return timed;
}

int gemm_tune(gemm_ctx *ctx, const gemm_shape *shapes, int n, gemm_engine engines[GEMM_CLASSES]) {
    for (int c = 0; c < GEMM_CLASSES; c++) engines[c] = GEMM_OPENBLAS;
    gemm_engine engine[3];
    int count = candidates(engine);
    if (!ctx || gemm_ctx_engine(ctx) != GEMM_AUTO || count == 1 || n <= 0) return 0;
    int threads = blas_core_threads();
    gemm_ctx *timed[3];
    for (int e = 0; e < count; e++) timed[e] = gemm_create(engine[e], threads);
    size_t largest = 1;
    for (int i = 0; i < n; i++) {
        gemm_shape s = bounded(shapes[i]);
        size_t sizes[3] = {(size_t)s.M * s.K, (size_t)s.K * s.N, (size_t)s.M * s.N};
        for (int k = 0; k < 3; k++) largest = sizes[k] > largest ? sizes[k] : largest;
    }
    float *A = sys_calloc(largest, sizeof(float)), *B = sys_calloc(largest, sizeof(float));
    float *C = sys_calloc(largest, sizeof(float));
    for (size_t i = 0; i < largest; i++) A[i] = (float)(i % 7) * 0.01f, B[i] = (float)(i % 5) * 0.01f;
    double best[3][GEMM_CLASSES];
    for (int e = 0; e < count; e++)
        for (int c = 0; c < GEMM_CLASSES; c++) best[e][c] = 1e300;
    /* round 0 warms up (oneDNN compiles its kernels, our own kernel makes
     * its packing space); the engines rotate which goes first, so that
     * drifting load hits all alike */
    for (int round = 0; round <= TUNE_ROUNDS; round++) {
        double total[3][GEMM_CLASSES] = {{0}};
        for (int k = 0; k < count; k++) {
            int e = (round + k) % count;
            for (int i = 0; i < n; i++) {
                if ((double)shapes[i].M * shapes[i].N * shapes[i].K < GEMM_AUTO_MIN_MACS) continue;
                gemm_shape s = bounded(shapes[i]);
                double scale = (double)shapes[i].M * shapes[i].N * shapes[i].K / ((double)s.M * s.N * s.K);
                total[e][s.cls] += shapes[i].count * scale * time_product(timed[e], &s, A, B, C);
            }
        }
        for (int e = 0; round > 0 && e < count; e++)
            for (int c = 0; c < GEMM_CLASSES; c++) best[e][c] = total[e][c] < best[e][c] ? total[e][c] : best[e][c];
    }
    pick(best, engine, count, engines);
    free(A), free(B), free(C);
    for (int e = 0; e < count; e++) gemm_destroy(timed[e]);
    return timed_shapes(shapes, n);
}
