/* Memory, clock and file kinds (sys.h). */
#include "base/sys.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

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
    return available;
}

bool sys_is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
