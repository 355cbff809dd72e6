/* OpenBLAS kernel selection; see blas_core.h for why. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT: before any header */
#include "base/blas_core.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/status.h"
#include "base/sys.h"

static bool is_fallback_core(const char *core) {
    static const char *fallbacks[] = {"Prescott", "Core2", "Katmai", "Coppermine", "Northwood", "Banias", "Atom"};
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++)
        if (strcasecmp(core, fallbacks[i]) == 0) return true;
    return false;
}

/* The core to run instead of OpenBLAS's fallback choice, or NULL. */
static const char *better_core(void) {
    if (getenv("OPENBLAS_CORETYPE") || getenv("MOMFMM_KEEP_BLAS_CORE")) return NULL;
    if (!is_fallback_core(openblas_get_corename())) return NULL;
    __builtin_cpu_init();
    return cpu_has_avx512f() && __builtin_cpu_supports("avx512bw")           ? "SkylakeX" /* as played too (cpu.h) */
           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                             : NULL;
}

/* OpenBLAS's pthreads build starts a pool of threads in its library
 * constructor (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the cores,
 * less one), and each maps a 128 MiB buffer as it starts, retrying forever
 * when that fails. momfmm runs OpenBLAS on one thread per call, so the pool
 * never works; under an address space limit (ulimit -v or -d) it only
 * takes the space or hangs: the program then runs again without it. */
static bool pool_in_the_way(void) {
    const char *n = getenv("OPENBLAS_NUM_THREADS");
    return !(n && strcmp(n, "1") == 0) && sys_address_space_left() >= 0;
}

void blas_core_select(char **argv) {
    const char *core = better_core();
    bool pool = pool_in_the_way();
    if (!core && !pool) return;
    if (core) {
        setenv("OPENBLAS_CORETYPE", core, 1);
        setenv("MOMFMM_BLAS_CORE_FROM", openblas_get_corename(), 1);
    }
    if (pool) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the fallback kernels */
    if (core) unsetenv("OPENBLAS_CORETYPE");
}

const char *blas_core_description(void) {
    static char text[128];
    const char *from = getenv("MOMFMM_BLAS_CORE_FROM");
    if (from) snprintf(text, sizeof text, "%s (chosen by momfmm; OpenBLAS detected %s)", openblas_get_corename(), from);
    else snprintf(text, sizeof text, "%s", openblas_get_corename());
    return text;
}

/* The machine's CPUs: the online ones, or (without that count) those of
 * this process's affinity mask. Not the mask first: mpirun binds each rank
 * to one core by default, and two threads a rank there is the launcher's
 * binding, which the user may change (--bind-to), not a count that breaks
 * anything; 100000 threads is. */
static int available_cpus(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0) return online < 1 << 20 ? (int)online : 1 << 20;
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
}

void blas_core_cpu_mask(unsigned char *bits, size_t bytes) {
    memset(bits, 0, bytes);
    cpu_set_t set;
    bool read = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0;
    int cpus = read ? CPU_SETSIZE : available_cpus();
    for (int i = 0; i < cpus && (size_t)i / 8 < bytes; i++)
        if (!read || CPU_ISSET(i, &set)) bits[i / 8] |= (unsigned char)(1u << (i % 8));
}

static int bounded_threads; /* 0 until blas_core_bound_threads or blas_core_threads ran */

/* OMP_NUM_THREADS as a count: its first item ("4" or "4,2"), -1 when that
 * is not a positive integer, 1 when unset or empty. */
static long requested_threads(const char *env) {
    if (!env || !env[0]) return 1;
    char *end;
    errno = 0;
    long n = strtol(env, &end, 10);
    bool number = end != env && (*end == '\0' || *end == ',') && env[0] >= '0' && env[0] <= '9';
    return number && errno == 0 && n > 0 ? n : -1;
}

int blas_core_bound_threads(char *note, size_t len, status *st) {
    const char *env = getenv("OMP_NUM_THREADS");
    long requested = requested_threads(env);
    int cpus = available_cpus();
    note[0] = '\0';
    bounded_threads = requested < 1 ? 1 : requested > cpus ? cpus : (int)requested;
    if (requested > cpus)
        snprintf(note, len, "OMP_NUM_THREADS = %ld is more than the %d CPU%s of this machine: using %d", requested,
                 cpus, cpus == 1 ? "" : "s", cpus);
    /* the threads are OpenMP's (libgomp would otherwise take OMP_NUM_THREADS
     * as it is, or every core when unset): the GEMM engine splits large
     * products over them and runs OpenBLAS itself on one thread per call
     * (gemm.c), so that one pool of threads serves every kernel */
    openblas_set_num_threads(1);
    omp_set_num_threads(bounded_threads);
    if (requested < 0)
        return status_fail(st, EXIT_USAGE, "OMP_NUM_THREADS = '%s': not a number of threads (a positive integer)", env);
    return 0;
}

int blas_core_threads(void) {
    if (bounded_threads == 0) {
        long requested = requested_threads(getenv("OMP_NUM_THREADS"));
        int cpus = available_cpus();
        bounded_threads = requested < 1 ? 1 : requested > cpus ? cpus : (int)requested;
    }
    return bounded_threads;
}

/* OpenBLAS 0.3.21 maps a buffer of BUFFER_SIZE (128 MiB on x86-64; seen as
 * mmap(NULL, 134217728, ...) in its blas_memory_alloc) for each thread that
 * runs a level-3 product at once, and when that mmap fails it retries
 * forever, deaf to SIGTERM (its loop never returns to code of ours). With
 * a little room for its bookkeeping: */
#define OPENBLAS_BUFFER_BYTES ((double)(128 << 20) + (double)(8 << 20))

int blas_core_reserve_buffers(int threads, status *st) {
    if (threads < 1) threads = 1;
    double need = threads * OPENBLAS_BUFFER_BYTES, left = sys_address_space_left();
    if (left >= 0) {
        /* probe the mapping OpenBLAS is about to make, rather than trust
         * arithmetic on VmSize: a failed probe costs nothing */
        void *p = left >= need ? mmap(NULL, (size_t)need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                               : MAP_FAILED;
        if (p == MAP_FAILED)
            return status_fail(st, EXIT_USAGE,
                               "address space limit (ulimit -v or -d): %.0f MB left, and OpenBLAS maps %.0f MB for "
                               "its buffers (128 MiB per thread, OMP_NUM_THREADS = %d) before this run's own memory: "
                               "raise the limit or use fewer threads",
                               left / 1e6, need / 1e6, threads);
        munmap(p, (size_t)need);
    }
    /* one tiny product on every thread maps each thread's buffer now, while
     * it is known to fit, and counts it in VmSize before the model's
     * memory is estimated and allocated */
    float a[4] = {0}, b[4] = {0};
#pragma omp parallel num_threads(threads)
    {
        float c[4];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    }
    return 0;
}
