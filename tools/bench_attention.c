/* GFLOP/s of tiled softmax attention for one head (src/kernels/tiled_softmax.c,
 * docs/design.md §8.10), one thread: the whole causal forward and backward,
 * and each of its seven tile products alone, as a fraction of the core's
 * measured peak (the probes `momfmm bench` runs): the fp32 FMA peak, or
 * for bf16 the vdpbf16ps one. This tells whether the products or the
 * softmax around them bound the kernel, and compares the paths side by side.
 *
 *   build/bench_attention [T] [dh] [path]   (defaults: 4096 32 fp32, bench_fmm's head)
 *
 * path: fp32 (the CPU's widest fp32 kernel: AVX-512 where it has it),
 * avx2 (the 16-column AVX2 kernel alone), bf16 (tile_gemm_bf16: vdpbf16ps
 * where the CPU has AVX512_BF16) or bf16-fp32 (the bf16 products' fp32
 * path, which gives the same bits). FLOPs count what the causal kernel
 * computes: 2 (QK^T, PV) + 5 (backward: QK^T again, dP, dV, dQ, dK) products
 * of T^2/2 x dh multiply-adds. Each figure is the best of 5 rounds (the
 * whole forward and backward: rounds of about 20 ms of calls), timed in
 * the thread's CPU time: on a shared core the time another process
 * holds it is not counted (the peaks are wall-clock, best of 20 ms rounds). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/cpu.h"
#include "kernels/tile_gemm.h"
#include "kernels/tiled_softmax.h"
#include "tool_args.h"

#define ROUNDS 5

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *random_floats(size_t n) {
    float *x = malloc(n * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_attention: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return x;
}

/* One tile product as tiled_softmax.c calls it: C (=|+=) alpha A B; A's
 * strides in floats (fp32) and in pairs (bf16, as the packed operands). */
typedef struct {
    const char *name;
    int m, n, k, a_row, a_col, ldb, accumulate, ldc;
    int pair_row, pair_col, pair_ldb;
} product;

static double product_gflops(const product *p, bool bf16) {
    float *a = random_floats(1 << 16), *b = random_floats(1 << 16), *c = random_floats(1 << 16);
    uint16_t *a16 = malloc(2 << 16), *b16 = malloc(2 << 16);
    tile_bf16_pack(a16, 1, 1 << 14, a, 1, 1, 1 << 14, 2); /* any bf16 values: the kernel's time does not depend */
    tile_bf16_pack(b16, 1, 1 << 14, b, 1, 1, 1 << 14, 2);
    int reps = 2000;
    double best = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            if (bf16)
                tile_gemm_bf16(p->m, p->n, p->k, 0.5f, a16, p->pair_row, p->pair_col, b16, p->pair_ldb, p->accumulate,
                               c, p->ldc);
            else tile_gemm(p->m, p->n, p->k, 0.5f, a, p->a_row, p->a_col, b, p->ldb, p->accumulate, c, p->ldc);
        }
        double t = now() - t0;
        best = t < best ? t : best;
    }
    free(a), free(b), free(c), free(a16), free(b16);
    return 2.0 * p->m * p->n * p->k * reps / best / 1e9;
}

/* One head's causal forward or backward, as the timing loop calls it. */
typedef struct {
    int T, dh;
    bool bf16;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *scratch;
} head_call;

static void call_head(const head_call *h, bool backward) {
    if (backward)
        tiled_softmax_backward(h->dq, h->dk, h->dv, h->dout, h->out, h->lse, h->q, h->k, h->v, h->T, h->dh, true,
                               h->bf16, h->scratch);
    else tiled_softmax_forward(h->out, h->lse, h->q, h->k, h->v, h->T, h->T, h->dh, 0, true, h->bf16, h->scratch);
}

/* Seconds a call takes: the best of ROUNDS rounds of as many calls as fill
 * about 20 ms. A head at T = 256 takes tens of microseconds, where one call
 * timed alone read 0.03 or 0.04 ms and the differences this tool is for
 * (a few percent) were below its resolution. */
static double seconds_per_call(const head_call *h, bool backward) {
    double t0 = now();
    call_head(h, backward); /* warm, and a first estimate */
    double once = now() - t0;
    long reps = once > 0.02 ? 1 : once > 2e-7 ? (long)(0.02 / once) : 100000;
    double best = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        t0 = now();
        for (long i = 0; i < reps; i++) call_head(h, backward);
        double t = (now() - t0) / (double)reps;
        best = t < best ? t : best;
    }
    return best;
}

/* argv[i] (tool_long), or `fallback` when absent; -1 when it is anything
 * else. */
static long argument(int argc, char **argv, int i, long fallback, long lo, long hi) {
    long v;
    if (i >= argc) return fallback;
    return tool_long(argv[i], lo, hi, &v) ? v : -1;
}

/* Chooses the kernels of `path`; false when it is none of the four. */
static bool choose_path(const char *path, bool *bf16) {
    *bf16 = strncmp(path, "bf16", 4) == 0;
    if (!strcmp(path, "fp32")) return true;
    if (!strcmp(path, "avx2")) tile_gemm_set_wide(0);
    else if (!strcmp(path, "bf16-fp32")) tile_gemm_set_bf16_native(0);
    else if (strcmp(path, "bf16")) return false;
    return true;
}

static const char *kernel_name(bool bf16) {
    if (bf16) return tile_gemm_bf16_native() ? "vdpbf16ps (8 x 32)" : "the bf16 products' fp32 path";
    return tile_gemm_wide()        ? "the AVX-512 micro-kernel (full 32-column blocks) and the AVX2 one"
           : tile_gemm_available() ? "the AVX2 micro-kernel"
                                   : "portable C";
}

int main(int argc, char **argv) {
    int T = (int)argument(argc, argv, 1, 4096, 1, 1 << 20), dh = (int)argument(argc, argv, 2, 32, 1, 256);
    bool bf16;
    if (argc > 4 || T < 1 || dh < 1 || !choose_path(argc > 3 ? argv[3] : "fp32", &bf16)) {
        fprintf(stderr, "usage: bench_attention [T in 1..1048576] [dh in 1..256] [fp32|avx2|bf16|bf16-fp32]\n");
        return 2;
    }
    double fp32_peak = cpu_fma_peak_gflops(0.5), bf16_peak = cpu_measure_peak(1, 0.5).bf16_gflops;
    double peak = bf16 && bf16_peak > 0 ? bf16_peak : fp32_peak;
    printf("fp32 FMA peak %.1f GFLOP/s (%s), bf16 dot-product peak %.1f (1 thread, measured); tile products on %s; "
           "percentages of the %s peak\n",
           fp32_peak, cpu_fma_isa(), bf16_peak, kernel_name(bf16), bf16 && bf16_peak > 0 ? "bf16" : "fp32");
    size_t n = (size_t)T * dh;
    float *q = random_floats(n), *k = random_floats(n), *v = random_floats(n), *out = random_floats(n);
    float *dout = random_floats(n), *dq = random_floats(n), *dk = random_floats(n), *dv = random_floats(n);
    float *lse = random_floats((size_t)T), *scratch = random_floats(tiled_softmax_scratch_floats(T, dh));
    head_call h = {T, dh, bf16, q, k, v, out, lse, dout, dq, dk, dv, scratch};
    double forward = seconds_per_call(&h, false), backward = seconds_per_call(&h, true);
    double half = (double)T * T / 2 * dh * 2; /* one product over the causal half, in FLOPs */
    printf("T=%d dh=%d causal: forward %.2f us %.1f GFLOP/s (%.0f%%) | backward %.2f us %.1f GFLOP/s (%.0f%%)\n", T, dh,
           1e6 * forward, 2 * half / forward / 1e9, 100 * 2 * half / forward / 1e9 / peak, 1e6 * backward,
           5 * half / backward / 1e9, 100 * 5 * half / backward / 1e9 / peak);
    /* tiled_softmax.c's tiles: 96 query rows, forward key tiles of 192, backward of 96; bf16 A strides in pairs */
    int hp = (dh + 1) / 2;
    const product products[] = {
        {"forward  S^T = K Q^T", 192, 96, dh, dh, 1, 96, 0, 96, hp, 1, 96},
        {"forward  acc += P V", 96, dh, 192, 1, 96, dh, 1, dh, 1, 96, dh},
        {"backward S = Q K^T", 96, 96, dh, dh, 1, 96, 0, 96, hp, 1, 96},
        {"backward dV += P^T dO", 96, dh, 96, 1, 96, dh, 1, dh, 1, 96, dh},
        {"backward dP = dO V^T", 96, 96, dh, dh, 1, 96, 0, 96, hp, 1, 96},
        {"backward dQ += dS K", 96, dh, 96, 96, 1, dh, 1, dh, 48, 1, dh},
        {"backward dK += dS^T Q", 96, dh, 96, 1, 96, dh, 1, dh, 1, 96, dh},
    };
    for (size_t i = 0; i < sizeof products / sizeof products[0]; i++) {
        double g = product_gflops(&products[i], bf16);
        printf("  %-24s %3d x %3d x %3d  %6.1f GFLOP/s (%.0f%%)\n", products[i].name, products[i].m, products[i].n,
               products[i].k, g, 100 * g / peak);
    }
    free(q), free(k), free(v), free(out), free(dout), free(dq), free(dk), free(dv), free(lse), free(scratch);
    return 0;
}
