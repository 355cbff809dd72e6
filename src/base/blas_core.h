/* OpenBLAS kernel selection and thread count. */
#ifndef MOMFMM_BLAS_CORE_H
#define MOMFMM_BLAS_CORE_H

#include "base/status.h"

/* Debian's OpenBLAS 0.3.21 does not recognise some current CPUs (e.g.
 * virtualised Sapphire Rapids) and falls back to its SSE3 "Prescott"
 * kernels, 6x slower than the AVX-512 ones. OpenBLAS reads
 * OPENBLAS_CORETYPE only when it loads, so when the user has not set it and
 * the library chose a fallback core on a CPU with AVX-512 (or AVX2), this
 * re-executes the program once with OPENBLAS_CORETYPE=SkylakeX (or Haswell).
 * MOMFMM_KEEP_BLAS_CORE=1 turns this off. Returns only if it did not re-exec. */
void blas_core_select(char **argv);

/* The core OpenBLAS runs, and how it was chosen (for start-up lines). */
const char *blas_core_description(void);

/* Threads per rank for the products, OpenBLAS's and oneDNN's alike:
 * OMP_NUM_THREADS, default 1 (docs/design.md §8.10). */
int blas_core_threads(void);
/* Makes OpenMP use that many threads, which the GEMM engine and the other
 * kernels share (docs/design.md §8.10); OpenBLAS runs one thread per call. */
void blas_core_use_threads(int threads);
/* Before the first product: makes OpenBLAS map its buffers (128 MiB of
 * address space per thread) for `threads` threads now. Under an address
 * space limit (ulimit -v, -d) too tight for them, EXIT_USAGE in st instead:
 * OpenBLAS would retry its mmap forever and ignore SIGTERM. */
int blas_core_reserve_buffers(int threads, status *st);
#endif
