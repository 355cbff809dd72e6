/* GFLOP/s of the GEMM engines (gemm.h) at the matrix products of a model
 * config, one thread, for choosing the default engine (docs/scale.md §7).
 *
 *   build/bench_gemm [configs/bench_d256.ini] [rounds]
 *
 * The products are those of the model's linear layers (qkv, proj, fc,
 * mlp_proj, head) on rows = batch_size x seq_len:
 *   fwd  NT  out[rows x o] = in[rows x i] W^T        (W is o x i)
 *   bwdD NN  din[rows x i] = dout[rows x o] W
 *   bwdW TN  dW[o x i]    += dout^T in               (beta = 1)
 * Engines: OpenBLAS sgemm, oneDNN fp32, oneDNN bf16 as the model would run
 * it (weights passed with a bf16 copy, activations converted per call), and
 * oneDNN bf16 with both operands pre-converted (the matmul alone), and our
 * own AVX-512 kernel (gemm_avx512.c) where the CPU has AVX-512F. Each
 * round runs every shape on every engine, starting with a different engine
 * each round so that drifting machine load spreads over all of them; the
 * first round (JIT, first touch) is discarded and the median over the rest
 * is printed. Times are the process's CPU time (one thread): on a shared
 * core the time another process holds it is not counted. The last line
 * gives each engine's total as a fraction of the core's measured peak
 * (cpu_measure_peak: fp32 FMAs for the fp32 engines, vdpbf16ps for bf16). */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tool_args.h"

#include "base/blas_core.h"
#include "base/cpu.h"
#include "base/status.h"
#include "base/sys.h"
#include "config/config.h"
#include "kernels/gemm.h"

typedef struct {
    int d_model, d_ff, vocab, seq_len, batch;
} dims;

typedef struct {
    char name[32];
    bool trans_a, trans_b, weight_b; /* weight_b: B is a weight (has a bf16 copy) */
    int M, N, K;
    float beta;
} product;

enum { ENGINES = 5, MAX_PRODUCTS = 15, MAX_ROUNDS = 64 };
static const char *const engine_labels[ENGINES] = {"openblas", "onednn-f32", "onednn-bf16", "bf16-preconv",
                                                   "avx512-f32"};
static const gemm_engine engine_of[ENGINES] = {GEMM_OPENBLAS, GEMM_ONEDNN_F32, GEMM_ONEDNN_BF16, GEMM_ONEDNN_BF16,
                                               GEMM_AVX512_F32};

static int model_products(const dims *d, product *out) {
    const struct {
        const char *name;
        int in, out;
    } layers[] = {{"qkv", d->d_model, 3 * d->d_model},
                  {"proj", d->d_model, d->d_model},
                  {"fc", d->d_model, d->d_ff},
                  {"mlp_proj", d->d_ff, d->d_model},
                  {"head", d->d_model, d->vocab}};
    int rows = d->batch * d->seq_len, n = 0;
    for (int l = 0; l < 5; l++) {
        int i = layers[l].in, o = layers[l].out;
        product *p = out + n;
        p[0] = (product){"", false, true, true, rows, o, i, 0.0f};
        p[1] = (product){"", false, false, true, rows, i, o, 0.0f};
        p[2] = (product){"", true, false, false, o, i, rows, 1.0f};
        snprintf(p[0].name, sizeof p[0].name, "%s fwd NT", layers[l].name);
        snprintf(p[1].name, sizeof p[1].name, "%s bwdD NN", layers[l].name);
        snprintf(p[2].name, sizeof p[2].name, "%s bwdW TN", layers[l].name);
        n += 3;
    }
    return n;
}

typedef struct {
    float *A, *B, *C;
    uint16_t *A16, *B16;
} operands;

/* Dense operands for a product (leading dimension = stored columns). */
static void run_product(gemm_ctx *ctx, int engine, const product *p, const operands *x) {
    int lda = p->trans_a ? p->M : p->K, ldb = p->trans_b ? p->K : p->N;
    gemm_operand A = {x->A, engine == 3 ? x->A16 : NULL};
    gemm_operand B = {x->B, engine == 3 || (engine == 2 && p->weight_b) ? x->B16 : NULL};
    gemm_mixed(ctx, p->trans_a, p->trans_b, p->M, p->N, p->K, 1.0f, A, lda, B, ldb, p->beta, x->C, p->N);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    blas_core_select(argv);
    const char *path = argc > 1 ? argv[1] : "configs/bench_d256.ini";
    long asked = 7;
    if (argc > 3) {
        fprintf(stderr, "bench_gemm: unexpected argument '%s'; usage: bench_gemm [CONFIG] [rounds]\n", argv[3]);
        return 2;
    }
    if (argc > 2 && !tool_long(argv[2], 2, MAX_ROUNDS, &asked)) {
        fprintf(stderr, "bench_gemm: rounds '%s': an integer in [2, %d]\n", argv[2], MAX_ROUNDS);
        return 2;
    }
    int rounds = (int)asked;
    config c;
    status err;
    config_defaults(&c);
    if (config_load_file(&c, path, &err) != 0) {
        fprintf(stderr, "bench_gemm: %s\n", err.message);
        return 2;
    }
    dims d = {c.d_model, c.d_ff, c.vocab_size, c.seq_len, c.batch_size};
    product products[MAX_PRODUCTS];
    int n = model_products(&d, products);

    openblas_set_num_threads(1);
    gemm_ctx *ctx[ENGINES];
    for (int e = 0; e < ENGINES; e++) ctx[e] = gemm_create(engine_of[e], 1);
    size_t most = 0;
    for (int s = 0; s < n; s++) {
        size_t m = (size_t)products[s].M, k = (size_t)products[s].K, nn = (size_t)products[s].N;
        most = m * k > most ? m * k : most;
        most = k * nn > most ? k * nn : most;
        most = m * nn > most ? m * nn : most;
    }
    operands x = {sys_calloc(most, sizeof(float)), sys_calloc(most, sizeof(float)), sys_calloc(most, sizeof(float)),
                  sys_calloc(most, sizeof(uint16_t)), sys_calloc(most, sizeof(uint16_t))};
    uint64_t state = 1;
    for (size_t i = 0; i < most; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        x.A[i] = x.B[i] = (float)((state >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    cpu_f32_to_bf16(x.A16, x.A, most);
    cpu_f32_to_bf16(x.B16, x.B, most);

    printf("bench_gemm %s: rows %d, d_model %d, d_ff %d, vocab %d, 1 thread, %d rounds (first discarded)\n", path,
           d.batch * d.seq_len, d.d_model, d.d_ff, d.vocab, rounds);
    for (int e = 0; e < ENGINES; e++)
        printf("  %-13s %s\n", engine_labels[e],
               ctx[e] ? gemm_describe(ctx[e]) : gemm_unavailable_reason(engine_of[e]));

    static double gflops[MAX_PRODUCTS][ENGINES][MAX_ROUNDS];
    const int reps = 3;
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < n; s++)
            for (int j = 0; j < ENGINES; j++) {
                int e = (j + r) % ENGINES;
                if (!ctx[e]) continue;
                const product *p = &products[s];
                double t0 = cpu_seconds();
                for (int k = 0; k < reps; k++) run_product(ctx[e], e, p, &x);
                double seconds = cpu_seconds() - t0;
                gflops[s][e][r] = 2.0 * p->M * p->N * p->K * reps / seconds * 1e-9;
            }

    printf("\nmedian GFLOP/s over %d rounds\n%-18s %5s %5s %5s", rounds - 1, "product", "M", "N", "K");
    for (int e = 0; e < ENGINES; e++) printf(" %12s", engine_labels[e]);
    printf("\n");
    double step_seconds[ENGINES] = {0}, step_flops = 0;
    for (int s = 0; s < n; s++) {
        const product *p = &products[s];
        double flops = 2.0 * p->M * p->N * p->K;
        step_flops += flops;
        printf("%-18s %5d %5d %5d", p->name, p->M, p->N, p->K);
        for (int e = 0; e < ENGINES; e++) {
            if (!ctx[e]) {
                printf(" %12s", "-");
                continue;
            }
            double m = median(gflops[s][e] + 1, rounds - 1);
            step_seconds[e] += flops / (m * 1e9);
            printf(" %12.1f", m);
        }
        printf("\n");
    }
    printf("%-36s", "all products (total flops / time)");
    for (int e = 0; e < ENGINES; e++) {
        if (ctx[e]) printf(" %12.1f", step_flops / step_seconds[e] * 1e-9);
        else printf(" %12s", "-");
    }
    cpu_peak peak = cpu_measure_peak(1, 0.5);
    printf("\n%-36s", "fraction of the peak");
    for (int e = 0; e < ENGINES; e++) {
        double top = engine_of[e] == GEMM_ONEDNN_BF16 ? peak.bf16_gflops : peak.fp32_gflops;
        if (ctx[e] && top > 0) printf(" %11.0f%%", 100 * step_flops / step_seconds[e] * 1e-9 / top);
        else printf(" %12s", "-");
    }
    printf("\npeaks (1 thread, measured): fp32 FMA %.1f GFLOP/s (%s), bf16 dot products %.1f\n", peak.fp32_gflops,
           peak.isa, peak.bf16_gflops);
    for (int e = 0; e < ENGINES; e++) gemm_destroy(ctx[e]);
    free(x.A), free(x.B), free(x.C), free(x.A16), free(x.B16);
    return 0;
}
