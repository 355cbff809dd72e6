/* Memory, clock and file kinds (sys.h). */
#include "momfmm/sys.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "momfmm/status.h"

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

double sys_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024.0;
}

bool sys_is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
