/* What the operating system gives: memory, a clock, the kind of a file. */
#ifndef MOMFMM_SYS_H
#define MOMFMM_SYS_H
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

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
 * and on a run's memory estimate. MOMFMM_TEST_MEMORY_AVAILABLE=BYTES (a test
 * hook) lowers it further. */
double sys_memory_available(void);
/* Bytes this process may still map under ulimit -v (RLIMIT_AS, less VmSize)
 * and ulimit -d (RLIMIT_DATA, less VmData), the smaller; -1 without limits. */
double sys_address_space_left(void);
/* The largest file this process may write (ulimit -f, RLIMIT_FSIZE) in
 * bytes, or -1 without a limit: named when a write fails. */
double sys_file_size_limit(void);
/* File kinds (docs/files.md §4, file kinds): every file momfmm reads, locks
 * or writes is opened here, and only a regular file is taken. A look at the
 * path first (stat, or lstat where it writes) refuses a FIFO, a device, a
 * socket or a directory before it is opened (opening a device can act on
 * it); the open is non-blocking, so that a FIFO swapped in meanwhile cannot
 * block it; fstat on the descriptor confirms what was opened. Where it
 * writes, the last component is never followed (O_NOFOLLOW): a symbolic
 * link there is refused, never written through. */
typedef enum {
    SYS_READ,    /* read; a symbolic link to a regular file is followed (the user's own link) */
    SYS_LOCK,    /* read and write, created when absent: a lock file */
    SYS_REPLACE, /* write, created when absent, emptied: a marker, metrics.h5 */
    SYS_CREATE,  /* write a new file (O_EXCL): a temporary, never over anything, a link included */
} sys_open_how;
/* The descriptor (O_CLOEXEC), or -1 and EXIT_BAD_FILE in st with the
 * message "PATH: cannot open WHAT: <why>" (`what` may be NULL; why: "not a
 * regular file but a FIFO", "a symbolic link (...)", strerror). A caller
 * that needs another exit code sets st->code. */
int sys_open_file(const char *path, sys_open_how how, const char *what, status *st);
/* Whether `path` may be replaced by a rename onto it: absent, or a regular
 * file (not a symbolic link, whose target the user may think is written).
 * 0, or -1 and EXIT_BAD_FILE in st naming what is there. */
int sys_check_replaceable(const char *path, status *st);
/* Whether `path` (not followed) is the regular file open as fd: nobody
 * replaced it since it was opened. */
bool sys_same_file(int fd, const char *path);
/* "/proc/self/fd/N" in buf: a name of the file open as fd that no rename or
 * link can redirect, for libraries that open files by name (HDF5); NULL
 * where /proc is not mounted (the caller then uses the path and checks it
 * with sys_same_file afterwards). */
const char *sys_descriptor_path(int fd, char *buf, size_t len);
/* Whether a file's first `len` bytes start with the 8 every HDF5 file made
 * by HDF5 or h5py starts with: where a text or binary file of another kind
 * is expected, an HDF5 file is named as one. */
bool sys_has_hdf5_signature(const void *head, size_t len);
/* Bytes free for an unprivileged writer in the file system holding `path`
 * (statvfs f_bavail), or -1 when unknown: named when a write fails. */
double sys_free_bytes(const char *path);
#endif
