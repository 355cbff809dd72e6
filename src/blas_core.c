/* OpenBLAS kernel selection; see blas_core.h for why. */
#include "momfmm/blas_core.h"

#include <cblas.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

static bool is_fallback_core(const char *core) {
    static const char *fallbacks[] = {"Prescott", "Core2", "Katmai", "Coppermine", "Northwood", "Banias", "Atom"};
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++)
        if (strcasecmp(core, fallbacks[i]) == 0) return true;
    return false;
}

void blas_core_select(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") || getenv("MOMFMM_KEEP_BLAS_CORE")) return;
    if (!is_fallback_core(openblas_get_corename())) return;
    __builtin_cpu_init();
    const char *core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")       ? "Haswell"
                                                                                               : NULL;
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("MOMFMM_BLAS_CORE_FROM", openblas_get_corename(), 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the fallback kernels */
    unsetenv("OPENBLAS_CORETYPE");
}

const char *blas_core_description(void) {
    static char text[128];
    const char *from = getenv("MOMFMM_BLAS_CORE_FROM");
    if (from) snprintf(text, sizeof text, "%s (chosen by momfmm; OpenBLAS detected %s)", openblas_get_corename(), from);
    else snprintf(text, sizeof text, "%s", openblas_get_corename());
    return text;
}

int blas_core_threads(void) {
    const char *env = getenv("OMP_NUM_THREADS");
    int n = env ? atoi(env) : 1;
    return n > 0 ? n : 1;
}

/* The threads are OpenMP's (libgomp would otherwise take every core when
 * OMP_NUM_THREADS is unset): the GEMM engine splits large products over
 * them and runs OpenBLAS itself on one thread per call (gemm.c), so that
 * one pool of threads serves every kernel. */
void blas_core_use_threads(int threads) {
    openblas_set_num_threads(1);
    omp_set_num_threads(threads > 0 ? threads : 1);
}
