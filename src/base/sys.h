/* What the operating system gives: memory, a clock, the kind of a file. */
#ifndef MOMFMM_SYS_H
#define MOMFMM_SYS_H
#include <stdbool.h>
#include <stddef.h>

/* calloc and realloc that do not return on failure: running out of memory
 * is a panic (status_panic, exit 1), the one failure that modules do not
 * return as a status (docs/design.md §8.7). */
void *sys_calloc(size_t count, size_t size);
void *sys_realloc(void *p, size_t size);
/* sys_calloc for the large buffers (parameters, gradients, moments,
 * activations): aligned to 2 MiB and advised as transparent huge pages
 * (MADV_HUGEPAGE; this kernel's THP is often "madvise" only), so that the
 * kernels' sweeps over gigabytes take one TLB entry per 2 MiB rather than
 * per 4 KiB. Freed with free(). */
void *sys_calloc_huge(size_t count, size_t size);
/* Seconds of a monotonic clock. */
double sys_seconds(void);
/* CPU seconds this process has run, all its threads (user + system). */
double sys_cpu_seconds(void);

/* MemAvailable of /proc/meminfo in bytes, or 0 when unknown, and no more
 * than sys_address_space_left when ulimit -v or -d sets a limit: the bound
 * on sizes that files and options declare (docs/files.md §4, hostile input)
 * and on a run's memory estimate. */
double sys_memory_available(void);
/* Bytes this process may still map under ulimit -v (RLIMIT_AS, less VmSize)
 * and ulimit -d (RLIMIT_DATA, less VmData), the smaller; -1 without limits. */
double sys_address_space_left(void);
/* The largest file this process may write (ulimit -f, RLIMIT_FSIZE) in
 * bytes, or -1 without a limit: named when a write fails. */
double sys_file_size_limit(void);
/* Whether path names a regular file (or a link to one): FIFOs and devices
 * are refused before opening them, as an open or read could block forever. */
bool sys_is_regular_file(const char *path);
#endif
