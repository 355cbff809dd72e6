/* The GEMM engine: engine choice, CPU check and bf16 conversion; the
 * products cut between threads (OpenBLAS's and our own) are in
 * gemm_split.c, the oneDNN engines in gemm_onednn.c, bf16 on fp32 products
 * where oneDNN has no bf16 in gemm_widen.c, our own kernel in
 * gemm_avx512.c. See gemm.h and docs/scale.md §7 for why. */
#include "kernels/gemm.h"

#include "base/blas_core.h"
#include "base/cpu.h"
#include "base/status.h"
#include "base/sys.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_avx512.h"
#include "gemm_split.h"
#include "gemm_widen.h"
#include "kernels/tile_gemm.h"
#ifdef MOMFMM_HAVE_ONEDNN
#include "gemm_onednn.h"
#endif

struct gemm_ctx {
    gemm_engine engine;
    gemm_engine class_engine[GEMM_CLASSES]; /* GEMM_AUTO's choices */
    gemm_engine small_engine;               /* GEMM_AUTO's small and in-region products (gemm.h) */
#ifdef MOMFMM_HAVE_ONEDNN
    gemm_onednn *dnn; /* NULL for GEMM_OPENBLAS */
    /* A product inside a parallel region (attention's heads) runs on its
     * thread's own oneDNN state, made at its first such product: a state's
     * primitive cache, memory handles, bf16 buffers and scratchpad belong
     * to one call at a time (shared, the heads' threads clobbered each
     * other and oneDNN refused a handle at OMP_NUM_THREADS = 2). */
    gemm_onednn *team[GEMM_TEAM_MAX];
#endif
    gemm_widen *widen;   /* the bf16 engine where oneDNN has no bf16 (bf16_widened) */
    gemm_spaces *spaces; /* our own kernel's, per thread (gemm_split.c) */
    char description[384];
    /* The registered weights (gemm_register_weights): fp32 and bf16 copy. */
    const float *weights;
    uint16_t *weights_bf16;
    size_t n_weights, weights_capacity, refreshes;
    /* The held activation (gemm_hold): its range, its bf16 copy (rows
     * held_ld apart) and its transposed bf16 copy (held_ld_t apart), each
     * kept in a buffer grown to the largest one held. */
    const float *held;
    uint16_t *held_bf16, *held_t;
    size_t held_capacity, held_t_capacity;
    int held_rows, held_cols, held_ld, held_ld_t;
};

static const char *const engine_names[] = {"openblas", "onednn-f32", "onednn-bf16", "auto", "avx512-f32"};
static const char *const class_names[GEMM_CLASSES] = {"forward", "backward_data", "backward_weight"};

const char *gemm_engine_name(gemm_engine engine) { return engine_names[engine]; }

bool gemm_engine_parse(const char *name, gemm_engine *engine) {
    for (int e = GEMM_OPENBLAS; e <= GEMM_AVX512_F32; e++)
        if (strcmp(name, engine_names[e]) == 0) {
            *engine = (gemm_engine)e;
            return true;
        }
    return false;
}

#ifdef MOMFMM_HAVE_ONEDNN
/* Whether the CPU runs bf16 products natively; MOMFMM_FAKE_NO_BF16=1 plays
 * a CPU without, so that tests reach the refusal and the emulations
 * (docs/scale.md §7) on any machine. */
static bool native_bf16(void) {
    const char *fake = getenv("MOMFMM_FAKE_NO_BF16");
    return cpu_has_bf16() && !(fake && strcmp(fake, "1") == 0);
}
#endif

const char *gemm_unavailable_reason(gemm_engine engine) {
    if (engine == GEMM_OPENBLAS || engine == GEMM_AUTO) return NULL; /* auto: OpenBLAS without the others */
    if (engine == GEMM_AVX512_F32) return gemm_avx512_unavailable_reason();
#ifndef MOMFMM_HAVE_ONEDNN
    return "momfmm was built without oneDNN (see cmake/onednn.cmake)";
#else
    const char *force = getenv("MOMFMM_FORCE_BF16");
    bool forced = force && strcmp(force, "1") == 0;
    if (engine == GEMM_ONEDNN_BF16 && !native_bf16() && !forced)
        return "the CPU has neither AVX512_BF16 nor AMX-BF16 (MOMFMM_FORCE_BF16=1 overrides)";
    return NULL;
#endif
}

#ifdef MOMFMM_HAVE_ONEDNN
/* Whether the bf16 engine runs on gemm_widen's fp32 products: oneDNN 2.6
 * emulates bf16 matmul with AVX-512 (avx512_core) only, and on a core
 * without it has no bf16 matmul at all (docs/scale.md §7). */
static bool bf16_widened(gemm_engine engine) {
    return engine == GEMM_ONEDNN_BF16 && !native_bf16() && !cpu_has_avx512_core();
}
#endif

const char *gemm_bf16_how(void) {
#ifdef MOMFMM_HAVE_ONEDNN
    if (bf16_widened(GEMM_ONEDNN_BF16)) return "bf16 values on OpenBLAS's fp32 sgemm";
    return native_bf16() ? "native" : "emulated by oneDNN";
#else
    return "native"; /* never asked: without oneDNN bf16 does not run (gemm_unavailable_reason) */
#endif
}

gemm_ctx *gemm_create(gemm_engine engine, int threads) {
    if (gemm_unavailable_reason(engine)) return NULL;
    gemm_ctx *ctx = sys_calloc(1, sizeof *ctx);
    ctx->engine = engine;
    for (int c = 0; c < GEMM_CLASSES; c++) ctx->class_engine[c] = GEMM_OPENBLAS;
    ctx->small_engine = gemm_unavailable_reason(GEMM_AVX512_F32) ? GEMM_OPENBLAS : GEMM_AVX512_F32;
    ctx->spaces = gemm_spaces_create();
#ifdef MOMFMM_HAVE_ONEDNN
    if (bf16_widened(engine)) ctx->widen = gemm_widen_create();
    else if (engine != GEMM_OPENBLAS && engine != GEMM_AVX512_F32)
        ctx->dnn = gemm_onednn_create(engine == GEMM_ONEDNN_BF16, threads > 0 ? threads : 1);
#else
    (void)threads;
#endif
    return ctx;
}

void gemm_destroy(gemm_ctx *ctx) {
    if (!ctx) return;
#ifdef MOMFMM_HAVE_ONEDNN
    gemm_onednn_destroy(ctx->dnn);
    for (int t = 0; t < GEMM_TEAM_MAX; t++) gemm_onednn_destroy(ctx->team[t]);
#endif
    gemm_widen_destroy(ctx->widen);
    gemm_spaces_destroy(ctx->spaces);
    free(ctx->weights_bf16);
    free(ctx->held_bf16);
    free(ctx->held_t);
    free(ctx);
}

gemm_engine gemm_ctx_engine(const gemm_ctx *ctx) { return ctx->engine; }

const char *gemm_describe(gemm_ctx *ctx) {
    const char *onednn = "";
#ifdef MOMFMM_HAVE_ONEDNN
    if (ctx->dnn) onednn = gemm_onednn_describe(ctx->dnn);
#endif
    if (ctx->engine == GEMM_AUTO) {
        char classes[192];
        gemm_class_engines_format(ctx->class_engine, classes, sizeof classes);
        snprintf(ctx->description, sizeof ctx->description, "auto: %s (OpenBLAS core %s%s%s)", classes,
                 blas_core_description(), *onednn ? "; " : "", onednn);
    } else if (*onednn)
        snprintf(ctx->description, sizeof ctx->description, "%s (%s)", gemm_engine_name(ctx->engine), onednn);
    else if (ctx->widen)
        snprintf(ctx->description, sizeof ctx->description,
                 "%s (no bf16 matmul here: bf16 values on OpenBLAS sgemm, core %s; MOMFMM_FORCE_BF16)",
                 gemm_engine_name(ctx->engine), blas_core_description());
    else if (ctx->engine == GEMM_AVX512_F32)
        snprintf(ctx->description, sizeof ctx->description, "avx512-f32 (momfmm's own blocked kernel)");
    else snprintf(ctx->description, sizeof ctx->description, "openblas sgemm (core %s)", blas_core_description());
    return ctx->description;
}

size_t gemm_primitives_created(const gemm_ctx *ctx) {
#ifdef MOMFMM_HAVE_ONEDNN
    if (ctx->dnn) {
        size_t created = gemm_onednn_primitives(ctx->dnn);
        for (int t = 0; t < GEMM_TEAM_MAX; t++) created += ctx->team[t] ? gemm_onednn_primitives(ctx->team[t]) : 0;
        return created;
    }
#endif
    (void)ctx;
    return 0;
}

/* An empty inner dimension leaves C = beta * C (as BLAS defines it, beta = 0
 * clearing C even of NaN); oneDNN rejects a zero K, so it is done here. */
static void scale_c(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

/* The engine a product runs on (gemm.h, GEMM_AUTO's classes). */
static gemm_engine route(const gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K) {
    if (ctx->engine != GEMM_AUTO) return ctx->engine;
    if (omp_in_parallel() || (double)M * N * K < GEMM_AUTO_MIN_MACS) return ctx->small_engine;
    gemm_class c = trans_a ? GEMM_CLASS_BACKWARD_WEIGHT : trans_b ? GEMM_CLASS_FORWARD : GEMM_CLASS_BACKWARD_DATA;
    return ctx->class_engine[c];
}

#ifdef MOMFMM_HAVE_ONEDNN
/* On the calling thread's oneDNN state: the context's own outside a
 * parallel region, else the thread's (one thread each: the region has the
 * cores). Past GEMM_TEAM_MAX threads, the context's state one call at a
 * time. */
static void run_onednn(gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, gemm_operand A,
                       int lda, gemm_operand B, int ldb, float beta, float *C, int ldc) {
    int t = omp_in_parallel() ? omp_get_thread_num() : -1;
    if (t >= 0 && t < GEMM_TEAM_MAX) {
        if (!ctx->team[t]) ctx->team[t] = gemm_onednn_create(ctx->engine == GEMM_ONEDNN_BF16, 1);
        gemm_onednn_run(ctx->team[t], trans_a, trans_b, M, N, K, alpha, A.f32, A.bf16, lda, B.f32, B.bf16, ldb, beta, C,
                        ldc);
        return;
    }
#pragma omp critical(gemm_onednn_shared)
    gemm_onednn_run(ctx->dnn, trans_a, trans_b, M, N, K, alpha, A.f32, A.bf16, lda, B.f32, B.bf16, ldb, beta, C, ldc);
}
#endif

void gemm_mixed(gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, gemm_operand A, int lda,
                gemm_operand B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    if (ctx->widen) { /* the bf16 engine, which no class routing applies to */
        gemm_widen_product(ctx->widen, trans_a, trans_b, M, N, K, alpha, A.f32, A.bf16, lda, B.f32, B.bf16, ldb, beta,
                           C, ldc);
        return;
    }
    gemm_engine engine = route(ctx, trans_a, trans_b, M, N, K);
#ifdef MOMFMM_HAVE_ONEDNN
    if (ctx->dnn && engine != GEMM_OPENBLAS && engine != GEMM_AVX512_F32) {
        run_onednn(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    gemm_split_product(ctx->spaces, engine == GEMM_AVX512_F32, trans_a, trans_b, M, N, K, alpha, A.f32, lda, B.f32, ldb,
                       beta, C, ldc);
}

void gemm(gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc) {
    gemm_mixed(ctx, trans_a, trans_b, M, N, K, alpha, (gemm_operand){A, NULL}, lda, (gemm_operand){B, NULL}, ldb, beta,
               C, ldc);
}

/* ---- The process-wide engine (gemm.h) ---------------------------------- */

static gemm_ctx *default_ctx;

void gemm_set_default(gemm_ctx *ctx) { default_ctx = ctx; }
gemm_ctx *gemm_default(void) { return default_ctx; }

static bool uses_weight_copy(const gemm_ctx *ctx) { return ctx && ctx->engine == GEMM_ONEDNN_BF16; }

/* The bf16 copy of p when p lies in [base, base + n), whose copy (same
 * layout, so the same offset) is `copy`; else NULL. */
static const uint16_t *copy_within(const float *base, const uint16_t *copy, size_t n, const float *p) {
    if (!base || !copy || p < base || p >= base + n) return NULL;
    return copy + (p - base);
}

/* The held activation's copy of an operand inside it read with the
 * activation's row length as its leading dimension (*ld), at the copy's
 * own (held_ld, set in *ld); else NULL. */
static const uint16_t *held_copy(const gemm_ctx *ctx, const float *p, int *ld) {
    if (!copy_within(ctx->held, ctx->held_bf16, (size_t)ctx->held_rows * ctx->held_cols, p) || *ld != ctx->held_cols)
        return NULL;
    size_t at = (size_t)(p - ctx->held), row = at / (size_t)ctx->held_cols, col = at % (size_t)ctx->held_cols;
    *ld = ctx->held_ld;
    return ctx->held_bf16 + row * (size_t)ctx->held_ld + col;
}

/* An operand's bf16 copy, its leading dimension in *ld: the registered
 * weights' (the same layout), the held activation's (gemm_hold), or none
 * (converted per call). */
static gemm_operand bf16_copy(const gemm_ctx *ctx, gemm_operand x, int *ld) {
    if (x.bf16) return x;
    const uint16_t *copy = copy_within(ctx->weights, ctx->weights_bf16, ctx->n_weights, x.f32);
    if (copy) return (gemm_operand){x.f32, copy};
    copy = held_copy(ctx, x.f32, ld);
    /* the fp32 floats lie at another leading dimension than the copy's */
    return copy ? (gemm_operand){NULL, copy} : x;
}

/* Whether op(A) is the whole held activation transposed (a weight gradient
 * dY^T X): then it is read from the transposed copy, untransposed. */
static bool is_held_transposed(const gemm_ctx *ctx, bool trans_a, gemm_operand A, int M, int K, int lda) {
    return trans_a && !A.bf16 && ctx->held && A.f32 == ctx->held && M == ctx->held_cols && K == ctx->held_rows &&
           lda == ctx->held_cols;
}

void gemm_product_mixed(bool trans_a, bool trans_b, int M, int N, int K, float alpha, gemm_operand A, int lda,
                        gemm_operand B, int ldb, float beta, float *C, int ldc) {
    gemm_ctx *ctx = default_ctx;
    if ((!A.f32 || !B.f32) && !uses_weight_copy(ctx))
        status_panic(1, "a product's operand is in bf16 only, and the engine reads fp32");
    if (!ctx) {
        gemm_split_product(NULL, false, trans_a, trans_b, M, N, K, alpha, A.f32, lda, B.f32, ldb, beta, C, ldc);
        return;
    }
    if (uses_weight_copy(ctx)) {
        if (is_held_transposed(ctx, trans_a, A, M, K, lda)) {
            A = (gemm_operand){NULL, ctx->held_t};
            trans_a = false;
            lda = ctx->held_ld_t;
        }
        A = bf16_copy(ctx, A, &lda);
        B = bf16_copy(ctx, B, &ldb);
    }
    gemm_mixed(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_product(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
    gemm_product_mixed(trans_a, trans_b, M, N, K, alpha, (gemm_operand){A, NULL}, lda, (gemm_operand){B, NULL}, ldb,
                       beta, C, ldc);
}

bool gemm_reads_bf16(void) { return uses_weight_copy(default_ctx); }

#define HELD_MIN ((size_t)1 << 20) /* bf16 elements: 2 MiB */

/* A buffer of at least n bf16 elements, grown only while the first step
 * meets its largest activation; on huge pages (at least one: 2 MiB-aligned),
 * as the activations' own: on 4 KiB pages oneDNN's reads of the copy ran
 * slower than the conversion saved. */
static uint16_t *held_buffer(uint16_t *buffer, size_t *capacity, size_t n) {
    if (n <= *capacity) return buffer;
    free(buffer);
    *capacity = n > HELD_MIN ? n : HELD_MIN;
    return sys_calloc_huge(*capacity, sizeof *buffer);
}

/* The copies' leading dimension: the row length rounded up to whole
 * 64-byte lines, and one line more. The transposed copy's rows exactly
 * 1,024 long (2 KiB apart) ran the weight gradient at 336-355 GFLOP/s, a
 * line more apart at 375-404; the straight copy a line more apart ran the
 * products back to the input 5-14% faster (bench_d768's shapes, one
 * thread; docs/performance.md §9.9). */
static int held_ld_of(int length) { return (length + 31) / 32 * 32 + 32; }

/* Below this many floats the held activation is converted on one thread. */
#define HELD_SPLIT_MIN (1 << 16)

/* Both copies of rows x cols floats, the rows cut into one part per
 * OpenMP thread (whole bands of 32, tile_bf16_transpose's), as the
 * products before and after it are: on one thread the conversion would
 * leave the other cores idle between them. Each element is converted
 * alone, so the copies do not depend on the cut. */
static void held_convert(gemm_ctx *ctx, const float *activation, int rows, int cols) {
    int threads = gemm_cut_threads((double)rows * cols, HELD_SPLIT_MIN);
    int step = gemm_cut_step(rows, threads, 32);
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
    for (int part = 0; part < threads; part++) {
        int lo = part * step, n = rows - lo < step ? rows - lo : step;
        if (n > 0)
            tile_bf16_transpose(ctx->held_t + lo, ctx->held_ld_t, ctx->held_bf16 + (size_t)lo * ctx->held_ld,
                                ctx->held_ld, activation + (size_t)lo * cols, n, cols);
    }
}

/* The weight gradient reads dY transposed (dY^T X); oneDNN's bf16 product
 * ran that layout 10-20% slower than untransposed operands at the model's
 * shapes, so the one pass that converts dY also writes it transposed
 * (docs/design.md §8.10). */
void gemm_hold(const float *activation, int rows, int cols) {
    gemm_ctx *ctx = default_ctx;
    if (!uses_weight_copy(ctx)) return;
    int ld = held_ld_of(cols), ld_t = held_ld_of(rows);
    ctx->held_bf16 = held_buffer(ctx->held_bf16, &ctx->held_capacity, (size_t)rows * ld);
    ctx->held_t = held_buffer(ctx->held_t, &ctx->held_t_capacity, (size_t)cols * ld_t);
    ctx->held_ld = ld, ctx->held_ld_t = ld_t;
    held_convert(ctx, activation, rows, cols);
    ctx->held = activation;
    ctx->held_rows = rows, ctx->held_cols = cols;
}

void gemm_release(void) {
    if (default_ctx) default_ctx->held = NULL;
}

void gemm_register_weights(gemm_ctx *ctx, const float *params, size_t n) {
    if (!uses_weight_copy(ctx)) return;
    if (n > ctx->weights_capacity || !ctx->weights_bf16) {
        free(ctx->weights_bf16);
        /* on huge pages, as the fp32 parameters: AdamW writes it in its
         * sweep over them and every product reads it */
        ctx->weights_bf16 = sys_calloc_huge(n ? n : 1, sizeof *ctx->weights_bf16);
        ctx->weights_capacity = n;
    }
    ctx->weights = params;
    ctx->n_weights = n;
    gemm_refresh_weights(ctx, params);
}

void gemm_refresh_weights(gemm_ctx *ctx, const float *params) {
    if (!uses_weight_copy(ctx) || params != ctx->weights) return;
    cpu_f32_to_bf16(ctx->weights_bf16, params, ctx->n_weights);
    ctx->refreshes++;
}

uint16_t *gemm_weights_for_update(gemm_ctx *ctx, const float *params) {
    if (!uses_weight_copy(ctx) || params != ctx->weights) return NULL;
    ctx->refreshes++;
    return ctx->weights_bf16;
}

void gemm_unregister_weights(gemm_ctx *ctx, const float *params) {
    if (!ctx || params != ctx->weights) return;
    ctx->weights = NULL;
    ctx->n_weights = 0;
}

size_t gemm_weight_refreshes(const gemm_ctx *ctx) { return ctx ? ctx->refreshes : 0; }

void gemm_set_class_engines(gemm_ctx *ctx, const gemm_engine engines[GEMM_CLASSES]) {
    for (int c = 0; c < GEMM_CLASSES; c++)
        ctx->class_engine[c] = gemm_unavailable_reason(engines[c]) ? GEMM_OPENBLAS : engines[c];
}

void gemm_class_engines(const gemm_ctx *ctx, gemm_engine engines[GEMM_CLASSES]) {
    for (int c = 0; c < GEMM_CLASSES; c++) engines[c] = ctx ? ctx->class_engine[c] : GEMM_OPENBLAS;
}

void gemm_class_engines_format(const gemm_engine engines[GEMM_CLASSES], char *out, size_t len) {
    size_t used = 0;
    for (int c = 0; c < GEMM_CLASSES && used < len; c++)
        used +=
            (size_t)snprintf(out + used, len - used, "%s%s=%s", c ? "," : "", class_names[c], engine_names[engines[c]]);
}

/* The engines a product class can be given: the fp32 ones. */
static bool gemm_engine_is_class_choice(gemm_engine e) {
    return e == GEMM_OPENBLAS || e == GEMM_ONEDNN_F32 || e == GEMM_AVX512_F32;
}

bool gemm_class_engines_parse(const char *text, gemm_engine engines[GEMM_CLASSES]) {
    const char *p = text;
    for (int c = 0; c < GEMM_CLASSES; c++) {
        size_t n = strlen(class_names[c]);
        if (strncmp(p, class_names[c], n) != 0 || p[n] != '=') return false;
        p += n + 1;
        size_t len = strcspn(p, ",");
        char name[16] = "";
        if (len >= sizeof name) return false;
        memcpy(name, p, len);
        if (!gemm_engine_parse(name, &engines[c]) || !gemm_engine_is_class_choice(engines[c])) return false;
        p += len;
        if (c + 1 < GEMM_CLASSES && *p++ != ',') return false;
    }
    return *p == '\0';
}
