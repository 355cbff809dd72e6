/* GEMM_AUTO's measurement (gemm.h; docs/design.md §8.10): which engine runs
 * each product class fastest on this machine, timed on the model's own
 * product shapes at start-up. Why measure rather than decide by CPU: at a
 * GPT-2-small shape on an AVX2 EPYC, OpenBLAS led on the weight gradients
 * by 2-6% while oneDNN led on some forward products by 1-3%; on an AVX-512
 * Xeon oneDNN fp32 ran the whole model 30% slower. The ranks of a run can
 * share the shapes out (gemm_tune_part's parts) and add up their timings:
 * each shape's engines are still timed one after another on one core. */
#include <math.h>
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

static double macs(gemm_shape s) { return (double)s.M * s.N * s.K; }

/* The shape as timed: rows (M, or K for a weight gradient) cut so that the
 * product stays within TUNE_MAX_MACS. */
static gemm_shape bounded(gemm_shape s) {
    if (macs(s) <= TUNE_MAX_MACS) return s;
    int *rows = s.cls == GEMM_CLASS_BACKWARD_WEIGHT ? &s.K : &s.M;
    int cut = (int)((double)*rows * TUNE_MAX_MACS / macs(s));
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

/* owner[i]: the part that times shape i, -1 for a shape not timed. The
 * timed shapes, the largest as timed first (a tie: the lower index), each
 * go to the part with the fewest multiply-adds so far (a tie: the lower
 * part), so that the parts end near together; every rank makes the same
 * split from the same shapes. With as many parts as timed shapes or more,
 * shape by shape to the first parts. */
static void split(const gemm_shape *shapes, int n, int parts, int *owner) {
    int *order = sys_calloc((size_t)n + 1, sizeof *order), timed = 0;
    for (int i = 0; i < n; i++) {
        owner[i] = -1;
        if (macs(shapes[i]) >= GEMM_AUTO_MIN_MACS) order[timed++] = i;
    }
    for (int a = 1; a < timed; a++) /* insertion sort: stable, and n is 15 */
        for (int b = a; b > 0 && macs(bounded(shapes[order[b]])) > macs(bounded(shapes[order[b - 1]])); b--) {
            int swap = order[b];
            order[b] = order[b - 1], order[b - 1] = swap;
        }
    int used = parts < timed ? parts : timed;
    double *load = sys_calloc((size_t)used + 1, sizeof *load);
    for (int a = 0; a < timed; a++) {
        int least = 0;
        for (int q = 1; q < used; q++) least = load[q] < load[least] ? q : least;
        owner[order[a]] = least;
        load[least] += macs(bounded(shapes[order[a]]));
    }
    free(load), free(order);
}

/* HUGE_VAL for every engine, then 0 for those auto chooses between that run here. */
static void mark_engines(gemm_timings *t, const gemm_engine *engine, int count) {
    for (int e = 0; e < GEMM_TUNE_ENGINES; e++)
        for (int c = 0; c < GEMM_CLASSES; c++) t->seconds[e][c] = HUGE_VAL;
    for (int k = 0; k < count; k++)
        for (int c = 0; c < GEMM_CLASSES; c++) t->seconds[engine[k]][c] = 0.0;
    t->shapes = 0.0;
}

/* Scratch operands for the largest of the shapes this part times. */
static size_t largest_operand(const gemm_shape *shapes, int n, const int *owner, int part) {
    size_t largest = 1;
    for (int i = 0; i < n; i++) {
        if (owner[i] != part) continue;
        gemm_shape s = bounded(shapes[i]);
        size_t sizes[3] = {(size_t)s.M * s.K, (size_t)s.K * s.N, (size_t)s.M * s.N};
        for (int k = 0; k < 3; k++) largest = sizes[k] > largest ? sizes[k] : largest;
    }
    return largest;
}

/* The rounds over this part's shapes: t->seconds[e][c] the best round's
 * total of engine e on class c. */
static void time_rounds(gemm_ctx *const *timed, const gemm_engine *engine, int count, const gemm_shape *shapes, int n,
                        const int *owner, int part, gemm_timings *t) {
    size_t largest = largest_operand(shapes, n, owner, part);
    float *A = sys_calloc(largest, sizeof(float)), *B = sys_calloc(largest, sizeof(float));
    float *C = sys_calloc(largest, sizeof(float));
    for (size_t i = 0; i < largest; i++) A[i] = (float)(i % 7) * 0.01f, B[i] = (float)(i % 5) * 0.01f;
    double best[3][GEMM_CLASSES];
    for (int e = 0; e < count; e++)
        for (int c = 0; c < GEMM_CLASSES; c++) best[e][c] = HUGE_VAL;
    /* round 0 warms up (oneDNN compiles its kernels, our own kernel makes
     * its packing space); the engines rotate which goes first, so that
     * drifting load hits all alike */
    for (int round = 0; round <= TUNE_ROUNDS; round++) {
        double total[3][GEMM_CLASSES] = {{0}};
        for (int k = 0; k < count; k++) {
            int e = (round + k) % count;
            for (int i = 0; i < n; i++) {
                if (owner[i] != part) continue;
                gemm_shape s = bounded(shapes[i]);
                double scale = macs(shapes[i]) / macs(s);
                total[e][s.cls] += shapes[i].count * scale * time_product(timed[e], &s, A, B, C);
            }
        }
        for (int e = 0; round > 0 && e < count; e++)
            for (int c = 0; c < GEMM_CLASSES; c++) best[e][c] = total[e][c] < best[e][c] ? total[e][c] : best[e][c];
    }
    for (int e = 0; e < count; e++)
        for (int c = 0; c < GEMM_CLASSES; c++) t->seconds[engine[e]][c] = best[e][c];
    free(A), free(B), free(C);
}

int gemm_tune_part(gemm_ctx *ctx, const gemm_shape *shapes, int n, int part, int parts, gemm_timings *out) {
    gemm_engine engine[3];
    int count = candidates(engine);
    mark_engines(out, engine, count);
    if (!ctx || gemm_ctx_engine(ctx) != GEMM_AUTO || count == 1 || n <= 0 || parts < 1) return 0;
    int *owner = sys_calloc((size_t)n, sizeof *owner), mine = 0;
    split(shapes, n, parts, owner);
    for (int i = 0; i < n; i++) mine += owner[i] == part;
    if (mine > 0) {
        int threads = blas_core_threads();
        gemm_ctx *timed[3];
        for (int e = 0; e < count; e++) timed[e] = gemm_create(engine[e], threads);
        time_rounds(timed, engine, count, shapes, n, owner, part, out);
        for (int e = 0; e < count; e++) gemm_destroy(timed[e]);
    }
    free(owner);
    out->shapes = mine;
    return mine;
}

void gemm_tune_pick(const gemm_timings *t, gemm_engine engines[GEMM_CLASSES]) {
    for (int c = 0; c < GEMM_CLASSES; c++) {
        gemm_engine fastest = GEMM_OPENBLAS;
        const double reference = t->seconds[GEMM_OPENBLAS][c];
        for (int e = 0; e < GEMM_TUNE_ENGINES; e++)
            if (t->seconds[e][c] * TUNE_MARGIN < reference && t->seconds[e][c] < t->seconds[fastest][c])
                fastest = (gemm_engine)e;
        engines[c] = fastest;
    }
}
