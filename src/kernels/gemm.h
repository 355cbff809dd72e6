/* The GEMM engine: every fp32 matrix product of the model, through OpenBLAS,
 * oneDNN or our own AVX-512 kernel, with optional bf16 operands
 * (docs/scale.md §7).
 *
 * Why an engine layer: at the model's shapes (M = batch x seq rows = 2048,
 * N, K = 256..1024, one thread per rank) the products are where the time
 * goes, and oneDNN's matmul beats OpenBLAS sgemm on AVX-512 CPUs. The bf16
 * engine keeps what docs/scale.md §7 asks of mixed precision: operands
 * rounded to bf16 (8 significant bits), products accumulated and stored in
 * fp32, so the optimizer still sees fp32 gradients and master weights.
 * Whether bf16 is faster depends on the CPU: it needs AMX or a vdpbf16ps
 * that keeps pace with the fp32 FMAs; where vdpbf16ps delivers half the
 * FLOP rate of the FMAs (measured on a virtualised Xeon with AVX512_BF16 and
 * no AMX) bf16 is slower than oneDNN fp32. tools/bench_gemm.c measures it at a config's
 * shapes.
 *
 * Conventions are cblas_sgemm's, row-major:
 *   C[M x N] = alpha * op(A)[M x K] * op(B)[K x N] + beta * C
 * where op(A) = A (A is M x K, leading dimension lda >= K) or, with trans_a,
 * A^T (A stored K x M, lda >= M); likewise B. The engine is chosen once at
 * start-up; a gemm_ctx belongs to one model (not shared between threads). */
#ifndef MOMFMM_GEMM_H
#define MOMFMM_GEMM_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GEMM_OPENBLAS,    /* cblas_sgemm: the reference, always available */
    GEMM_ONEDNN_F32,  /* oneDNN matmul primitive, fp32 operands */
    GEMM_ONEDNN_BF16, /* oneDNN matmul primitive, bf16 operands, fp32 accumulate and C */
    GEMM_AUTO,        /* fp32: OpenBLAS, oneDNN or our own per product class, chosen by measurement */
    GEMM_AVX512_F32,  /* the project's own blocked fp32 kernel, AVX-512 cores (gemm_avx512.c) */
} gemm_engine;

/* The product classes of GEMM_AUTO, told apart by their transposes: the
 * linear layers' forward (x W^T), backward to the input (dY W) and to the
 * weight (dY^T X). Products inside a parallel region (attention's heads)
 * and small ones (below GEMM_AUTO_MIN_MACS) are not measured but run on a
 * fixed engine: our own AVX-512 kernel where the CPU has AVX-512F, else
 * OpenBLAS. A product of a fraction of a millisecond is too short for a
 * start-up measurement to rank the engines the same way twice (at d 64 the
 * choice flipped from run to run, so two runs of one config differed in the
 * last bits; docs/design.md §8.10); and at attention's block products
 * (64 rows x 256 keys x 64) our own kernel took 190-200 ms of a
 * bench_d768 step where OpenBLAS's AVX2 kernels (pinned by
 * OPENBLAS_CORETYPE on such machines) took 260-290. */
#define GEMM_AUTO_MIN_MACS (1 << 24)
typedef enum { GEMM_CLASS_FORWARD, GEMM_CLASS_BACKWARD_DATA, GEMM_CLASS_BACKWARD_WEIGHT, GEMM_CLASSES } gemm_class;

/* "openblas", "onednn-f32", "onednn-bf16", "auto", "avx512-f32". */
const char *gemm_engine_name(gemm_engine engine);
/* Parses one of those names; false when it is none of them. */
bool gemm_engine_parse(const char *name, gemm_engine *engine);

/* NULL when the engine can run here; otherwise why not, in one line: momfmm
 * built without oneDNN (cmake/onednn.cmake), or, for bf16, a CPU without
 * AVX512_BF16 / AMX-BF16, where bf16 would run slower than fp32.
 * MOMFMM_FORCE_BF16=1 skips the CPU check (tests, and bf16's numbers on any
 * core): oneDNN emulates bf16 where the CPU has AVX-512, gemm_widen.c runs
 * it on OpenBLAS where it has not (docs/scale.md §7). */
const char *gemm_unavailable_reason(gemm_engine engine);
/* How bf16 products run here when they run (docs/scale.md §7): "native",
 * "emulated by oneDNN" (AVX-512 without bf16, forced) or "bf16 values on
 * OpenBLAS's fp32 sgemm" (no AVX-512 either, forced: gemm_widen.c). */
const char *gemm_bf16_how(void);

typedef struct gemm_ctx gemm_ctx;

/* A context for one engine, or NULL when gemm_unavailable_reason(engine) is
 * not NULL. threads is the thread count oneDNN uses (its OpenMP runtime);
 * OpenBLAS and our own kernel are cut into blocks between OpenMP's threads;
 * pass the one OpenBLAS was given (blas_core_threads()), so that both engines run
 * with the same parallelism — one thread per rank by default. */
gemm_ctx *gemm_create(gemm_engine engine, int threads);
void gemm_destroy(gemm_ctx *ctx);
gemm_engine gemm_ctx_engine(const gemm_ctx *ctx);

/* For the start-up line, e.g. "onednn-bf16 (oneDNN 2.6.3: brg:avx512_core_bf16)":
 * the engine and the implementations oneDNN picked so far (a probe shape at
 * creation, then every cached primitive). Owned by ctx, rewritten by the
 * next gemm_describe. */
const char *gemm_describe(gemm_ctx *ctx);

/* An operand in fp32 and, optionally, a bf16 copy of it with the same layout
 * and leading dimension. The model keeps bf16 copies of its weights,
 * refreshed once per optimizer step (cpu_f32_to_bf16, cpu.h), and passes them here
 * so that weights are converted once per step while activations — new at
 * every call — are converted by the bf16 engine per call. The fp32 engines
 * read only f32 and ignore bf16; f32 may be NULL only where the engine reads
 * bf16 (gemm_reads_bf16): an activation the model makes in bf16 alone
 * because only products read it (docs/design.md §8.10). */
typedef struct {
    const float *f32;
    const uint16_t *bf16; /* NULL: converted from f32 per call (bf16 engine only) */
} gemm_operand;

/* C = alpha * op(A) * op(B) + beta * C with both operands given in fp32. */
void gemm(gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc);

/* The same with operands that may carry bf16 copies (see gemm_operand). */
void gemm_mixed(gemm_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, gemm_operand A, int lda,
                gemm_operand B, int ldb, float beta, float *C, int ldc);

/* oneDNN primitives this context has created (a cache miss each); the count
 * stays put once every shape has been seen, which the tests check. Always 0
 * for GEMM_OPENBLAS. */
size_t gemm_primitives_created(const gemm_ctx *ctx);

/* ---- The process-wide engine the model's products run on ---------------
 * cblas is process-wide, so the engine is too: the command layer picks it
 * once at start-up from train.precision and train.gemm (docs/scale.md §7)
 * and the kernels (kernels.c, fmm_far.c) call gemm_product, which runs on it.
 * With no engine set, or GEMM_OPENBLAS, gemm_product is exactly the
 * cblas_sgemm call the kernels made before (an empty product is C = beta C
 * either way), so fp32 results stay bit-identical. The default context is not destroyed by the setter. */
void gemm_set_default(gemm_ctx *ctx);
gemm_ctx *gemm_default(void); /* NULL when none is set */

/* gemm() on the default engine; with the bf16 engine an operand that lies
 * inside the registered weights is read from their bf16 copy. */
void gemm_product(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc);
/* The same with operands that may carry bf16 copies (gemm_operand); an fp32
 * operand without one is looked up as gemm_product's are. */
void gemm_product_mixed(bool trans_a, bool trans_b, int M, int N, int K, float alpha, gemm_operand A, int lda,
                        gemm_operand B, int ldb, float beta, float *C, int ldc);
/* Whether the default engine reads its operands in bf16 (train.precision =
 * bf16): then an activation read only by products may be made in bf16 alone,
 * rounded as the engine would round it (cpu_f32_to_bf16), the same bits. */
bool gemm_reads_bf16(void);

/* An activation that two products in a row read (matmul_backward's dY,
 * for the weight's gradient and for the input's): with the bf16 engine,
 * gemm_hold converts its rows x cols floats (contiguous rows) once, and
 * until gemm_release a gemm_product operand inside them, read with the
 * activation's row length as its leading dimension, is read from that
 * copy instead of being converted per call (the same rounding; the copy's
 * rows lie further apart, which oneDNN reads faster). The same pass writes
 * a transposed copy, from which a product reading the whole activation
 * transposed (the weight gradient dY^T X) reads it untransposed, the
 * layout oneDNN runs faster (docs/design.md §8.10). The floats must not
 * change while held. No-ops for the fp32 engines. */
void gemm_hold(const float *activation, int rows, int cols);
void gemm_release(void);

/* The model's parameters are one contiguous buffer of n floats; with the
 * bf16 engine, registering allocates its bf16 copy once (no-op for the fp32
 * engines or a NULL ctx). gemm_refresh_weights reconverts the whole copy: the
 * model calls it whenever the fp32 parameters change (initialisation,
 * loading, a ZeRO-1 step), unless the change wrote the copy too
 * (gemm_weights_for_update). gemm_unregister_weights forgets them (the
 * model is freed) when `params` is the registered buffer. */
void gemm_register_weights(gemm_ctx *ctx, const float *params, size_t n);
void gemm_refresh_weights(gemm_ctx *ctx, const float *params);
void gemm_unregister_weights(gemm_ctx *ctx, const float *params);
/* For a pass that updates all the registered weights and converts each block to bf16 while it is in cache (the
 * optimizer, docs/design.md §8.10), instead of a refresh that reads them again: the copy to write, at the weights'
 * offsets, or NULL when ctx keeps none of `params` (then nothing is to be written). The caller converts every
 * element with cpu_f32_to_bf16; this counts as that step's refresh. */
uint16_t *gemm_weights_for_update(gemm_ctx *ctx, const float *params);
/* GEMM_AUTO: the engine of each class (OpenBLAS until set). An engine that
 * cannot run here (a checkpoint's choice made on another machine) is set as
 * OpenBLAS. */
void gemm_set_class_engines(gemm_ctx *ctx, const gemm_engine engines[GEMM_CLASSES]);
void gemm_class_engines(const gemm_ctx *ctx, gemm_engine engines[GEMM_CLASSES]);
/* "forward=onednn-f32,backward_data=openblas,backward_weight=openblas", and
 * back: the form a checkpoint records them in (docs/files.md §4), so that a
 * resumed run computes with the same engines. Parse returns false for text
 * that is not such a list (engines other than openblas, onednn-f32 and
 * avx512-f32 included). */
void gemm_class_engines_format(const gemm_engine engines[GEMM_CLASSES], char *out, size_t len);
bool gemm_class_engines_parse(const char *text, gemm_engine engines[GEMM_CLASSES]);

/* A product to time, of class cls, that a step runs `count` times
 * (gemm_tune.c). */
typedef struct {
    gemm_class cls;
    int M, N, K;
    float beta;
    int count;
} gemm_shape;
/* What gemm_tune_part measures: each engine's seconds on each class's shapes
 * (indexed by gemm_engine; a shape's time weighted by its count) and the
 * shapes timed. HUGE_VAL marks an engine that does not run here or that
 * auto does not choose (onednn-bf16, auto itself). Timings of disjoint
 * parts of the shapes, made on different ranks, add up element by element
 * (docs/design.md §8.10): a sum of doubles, so that the runtime can add
 * them in one all-reduce, and an engine missing on one rank stays HUGE_VAL. */
#define GEMM_TUNE_ENGINES (GEMM_AVX512_F32 + 1)
typedef struct {
    double seconds[GEMM_TUNE_ENGINES][GEMM_CLASSES];
    double shapes;
} gemm_timings;
_Static_assert(sizeof(gemm_timings) % sizeof(double) == 0, "gemm_timings adds up as doubles");
/* Times part `part` of `parts` of the shapes (a split that every caller
 * makes alike, balanced by multiply-adds) on OpenBLAS, on oneDNN fp32 and
 * on our own AVX-512 kernel, those that run here: alternating rounds, the
 * best round of each. Shapes below GEMM_AUTO_MIN_MACS are not timed (they
 * run on OpenBLAS), shapes above 2^32 multiply-adds (about 80 ms) are timed
 * on fewer rows. A part past the shapes (part >= parts, or more parts than
 * shapes) times nothing and reports only which engines run here, as does a
 * ctx that is not GEMM_AUTO or a machine where OpenBLAS alone runs. Returns
 * the number of shapes this part timed. */
int gemm_tune_part(gemm_ctx *ctx, const gemm_shape *shapes, int n, int part, int parts, gemm_timings *out);
/* The engine of each class that ran its shapes fastest in t; another than
 * OpenBLAS only when it is at least 3% faster, so that a near tie (and a
 * class with nothing timed) stays with the reference engine. */
void gemm_tune_pick(const gemm_timings *t, gemm_engine engines[GEMM_CLASSES]);

/* How many times the bf16 copy was (re)converted: once per optimizer step. */
size_t gemm_weight_refreshes(const gemm_ctx *ctx);
#endif
