/* The peak floating-point throughput of this machine's cores, measured with
 * register-only loops (src/base/cpu.c; docs/design.md §8.10): fp32 FMAs at the
 * widest width the CPU has, and bf16 dot products where it has AVX512_BF16.
 * `momfmm bench` runs the same probe at start-up and states its GFLOP/s as a
 * fraction of this peak.
 *
 *   build/fma_peak [--threads N] [--seconds S]
 *
 * With N threads the probe runs on N threads at once (the peak of N cores,
 * which may run at a lower clock than one alone). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"

int main(int argc, char **argv) {
    int threads = 1;
    double seconds = 0.5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: fma_peak [--threads N] [--seconds S]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 1024 || !(seconds > 0 && seconds < 600)) {
        fprintf(stderr, "fma_peak: --threads in [1, 1024], --seconds in (0, 600)\n");
        return 2;
    }
    cpu_peak peak = cpu_measure_peak(threads, seconds);
    double fp32 = peak.fp32_gflops, bf16 = peak.bf16_gflops;
    threads = peak.threads;
    printf("fp32 FMA peak (%s): %.1f GFLOP/s on %d thread%s (%.1f per thread)\n", peak.isa, fp32, threads,
           threads == 1 ? "" : "s", fp32 / threads);
    if (bf16 > 0)
        printf("bf16 dot-product peak (vdpbf16ps): %.1f GFLOP/s, %.2f x fp32\n", bf16, fp32 > 0 ? bf16 / fp32 : 0);
    else printf("bf16 dot-product peak: none (no AVX512_BF16)\n");
    return 0;
}
