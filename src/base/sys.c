/* Memory, clock and file kinds (sys.h; docs/files.md §4). */
#include "base/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"

void *sys_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) status_panic(1, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *sys_realloc(void *p, size_t size) {
    void *q = realloc(p, size ? size : 1);
    if (!q) status_panic(1, "out of memory allocating %zu bytes", size);
    return q;
}

#define HUGE_PAGE ((size_t)2 << 20)

void *sys_calloc_huge(size_t count, size_t size) {
    if (size && count > (SIZE_MAX - HUGE_PAGE) / size)
        status_panic(1, "out of memory allocating %zu x %zu bytes", count, size);
    size_t bytes = count * size;
    if (bytes < HUGE_PAGE) return sys_calloc(count, size);
    size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, rounded) != 0)
        status_panic(1, "out of memory allocating %zu x %zu bytes", count, size);
    madvise(p, rounded, MADV_HUGEPAGE); /* advice: without THP the pages are ordinary ones */
    memset(p, 0, bytes);
    return p;
}

double sys_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double sys_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent. */
static double proc_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    double kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%lf", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : kb * 1024.0;
}

double sys_address_space_left(void) {
    struct rlimit as, data;
    double left = -1;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        double used = proc_kb("/proc/self/status", "VmSize");
        left = (double)as.rlim_cur - (used > 0 ? used : 0);
    }
    /* ulimit -d: since Linux 4.7 private writable mappings count, as malloc's */
    if (getrlimit(RLIMIT_DATA, &data) == 0 && data.rlim_cur != RLIM_INFINITY) {
        double used = proc_kb("/proc/self/status", "VmData"), d = (double)data.rlim_cur - (used > 0 ? used : 0);
        if (left < 0 || d < left) left = d;
    }
    return left < 0 ? -1 : left > 0 ? left : 0;
}

double sys_file_size_limit(void) {
    struct rlimit f;
    return getrlimit(RLIMIT_FSIZE, &f) == 0 && f.rlim_cur != RLIM_INFINITY ? (double)f.rlim_cur : -1;
}

double sys_memory_available(void) {
    double available = proc_kb("/proc/meminfo", "MemAvailable");
    if (available < 0) available = 0;
    double left = sys_address_space_left();
    if (left >= 0 && (available == 0 || left < available)) available = left > 0 ? left : 1;
    /* test hook: a smaller machine (tests/test_ranges.c), where a config whose
     * model cannot fit is refused as it would be there, without ulimit -v
     * (which the sanitizer build's shadow memory cannot live under) */
    const char *cap = getenv("MOMFMM_TEST_MEMORY_AVAILABLE");
    double bytes = cap ? atof(cap) : 0;
    if (bytes > 0 && (available == 0 || bytes < available)) available = bytes;
    return available;
}

static const char *kind_of(mode_t mode) {
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISLNK(mode)  ? "a symbolic link (momfmm never writes through one)"
                            : "not a regular file";
}

/* status_fail for sys_open_file, whose failures return -1 (not a descriptor). */
static int refuse(status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(status *st, const char *fmt, ...) {
    char message[sizeof st->message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    status_fail(st, EXIT_BAD_FILE, "%s", message);
    return -1;
}

static int open_flags(sys_open_how how) {
    int flags = O_NONBLOCK | O_CLOEXEC;
    if (how == SYS_READ) return flags | O_RDONLY;
    flags |= O_NOFOLLOW | O_CREAT | (how == SYS_LOCK ? O_RDWR : O_WRONLY);
    return how == SYS_CREATE ? flags | O_EXCL : flags;
}

int sys_open_file(const char *path, sys_open_how how, const char *what, status *st) {
    bool writes = how != SYS_READ;
    const char *verb = how == SYS_CREATE ? "create" : "open", *space = what ? " " : "", *noun = what ? what : "";
    struct stat s;
    /* the look before the open: a device is never opened, a link never written through */
    if ((writes ? lstat(path, &s) : stat(path, &s)) == 0) {
        if (how == SYS_CREATE)
            return refuse(st, "%s: cannot create%s%s: exists already (%s)", path, space, noun, kind_of(s.st_mode));
        if (!S_ISREG(s.st_mode))
            return refuse(st, "%s: cannot open%s%s: not a regular file but %s", path, space, noun, kind_of(s.st_mode));
    } else if (!writes || errno != ENOENT) {
        return refuse(st, "%s: cannot open%s%s: %s", path, space, noun, strerror(errno));
    }
    int fd = open(path, open_flags(how), 0666);
    if (fd < 0)
        return refuse(st, "%s: cannot %s%s%s: %s", path, verb, space, noun,
                      errno == ELOOP ? "a symbolic link (momfmm never writes through one)" : strerror(errno));
    const char *why = fstat(fd, &s) != 0                            ? strerror(errno)
                      : !S_ISREG(s.st_mode)                         ? kind_of(s.st_mode)
                      : how == SYS_REPLACE && ftruncate(fd, 0) != 0 ? strerror(errno)
                                                                    : NULL;
    if (!why) return fd;
    close(fd);
    return refuse(st, "%s: cannot %s%s%s: %s%s", path, verb, space, noun,
                  S_ISREG(s.st_mode) ? "" : "not a regular file but ", why);
}

int sys_check_replaceable(const char *path, status *st) {
    struct stat s;
    if (lstat(path, &s) != 0) return errno == ENOENT ? 0 : refuse(st, "%s: %s", path, strerror(errno));
    if (S_ISREG(s.st_mode)) return 0;
    return refuse(st, "%s: exists and is %s: not replaced (only a regular file is)", path, kind_of(s.st_mode));
}

bool sys_same_file(int fd, const char *path) {
    struct stat open_file, named;
    return fstat(fd, &open_file) == 0 && lstat(path, &named) == 0 && S_ISREG(named.st_mode) &&
           open_file.st_dev == named.st_dev && open_file.st_ino == named.st_ino;
}

const char *sys_descriptor_path(int fd, char *buf, size_t len) {
    snprintf(buf, len, "/proc/self/fd/%d", fd);
    struct stat via_proc, open_file;
    /* the same file through /proc: mounted, and naming this descriptor's file */
    bool same = stat(buf, &via_proc) == 0 && fstat(fd, &open_file) == 0 && via_proc.st_dev == open_file.st_dev &&
                via_proc.st_ino == open_file.st_ino;
    return same ? buf : NULL;
}

bool sys_has_hdf5_signature(const void *head, size_t len) {
    static const unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    return len >= sizeof signature && memcmp(head, signature, sizeof signature) == 0;
}

double sys_free_bytes(const char *path) {
    struct statvfs fs;
    return statvfs(path, &fs) == 0 ? (double)fs.f_bavail * (double)fs.f_frsize : -1;
}
