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
#include "tool_args.h"

int main(int argc, char **argv) {
    long threads = 1;
    double seconds = 0.5;
    for (int i = 1; i < argc; i++) {
        bool known = i + 1 < argc && (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "--seconds"));
        if (!known) {
            fprintf(stderr, "usage: fma_peak [--threads N] [--seconds S]\n");
            return 2;
        }
        const char *flag = argv[i], *value = argv[++i];
        bool threads_flag = !strcmp(flag, "--threads");
        if (threads_flag ? !tool_long(value, 1, 1024, &threads) : !tool_double(value, 1e-3, 600, &seconds)) {
            fprintf(stderr, "fma_peak: %s '%s': %s\n", flag, value,
                    threads_flag ? "an integer in [1, 1024]" : "seconds in [0.001, 600]");
            return 2;
        }
    }
    cpu_peak peak = cpu_measure_peak((int)threads, seconds);
    double fp32 = peak.fp32_gflops, bf16 = peak.bf16_gflops;
    printf("fp32 FMA peak (%s): %.1f GFLOP/s on %d thread%s (%.1f per thread)\n", peak.isa, fp32, peak.threads,
           peak.threads == 1 ? "" : "s", fp32 / peak.threads);
    if (bf16 > 0)
        printf("bf16 dot-product peak (vdpbf16ps): %.1f GFLOP/s, %.2f x fp32\n", bf16, fp32 > 0 ? bf16 / fp32 : 0);
    else printf("bf16 dot-product peak: none (no AVX512_BF16)\n");
    return 0;
}
