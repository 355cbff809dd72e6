/* OpenBLAS kernel selection and thread count. */
#ifndef MOMFMM_BLAS_CORE_H
#define MOMFMM_BLAS_CORE_H

#include <stddef.h>

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

/* Threads per rank for the products, OpenBLAS's and oneDNN's alike, and
 * for every OpenMP region (docs/design.md §8.10): OMP_NUM_THREADS (its
 * first item, for a list), default 1, at most the machine's online CPUs
 * (sysconf; the affinity mask's without it). Read once, before any pool
 * starts: main calls blas_core_bound_threads first. */
int blas_core_threads(void);
/* Reads and bounds OMP_NUM_THREADS and makes OpenMP use that many threads
 * (OpenBLAS runs one thread per call; docs/cli.md §5, threads). A value
 * above the machine's CPUs is clamped to them, with a
 * one-line note in `note` (else ""); a value that is not a positive integer
 * is EXIT_USAGE in st, naming it (with one thread in use meanwhile). libgomp read the variable when it loaded
 * but starts no thread until the first parallel region, so nothing has run
 * with the unbounded count (100000 threads segfaulted, 20000 took 80 s). */
int blas_core_bound_threads(char *note, size_t len, status *st);
/* Before the first product: makes OpenBLAS map its buffers (128 MiB of
 * address space per thread) for `threads` threads now. Under an address
 * space limit (ulimit -v, -d) too tight for them, EXIT_USAGE in st instead:
 * OpenBLAS would retry its mmap forever and ignore SIGTERM. */
int blas_core_reserve_buffers(int threads, status *st);
/* This process's affinity mask as bits (CPU i: bit i % 8 of byte i / 8) in
 * `bytes` bytes, the machine's online CPUs where the mask cannot be read:
 * what the parallel runtime ORs over a node's ranks to tell whether each
 * rank has CPUs of its own (dist_node_cpus). */
void blas_core_cpu_mask(unsigned char *bits, size_t bytes);
#endif
