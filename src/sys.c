/* Memory, clock and file kinds (sys.h). */
#include "momfmm/sys.h"

#include <stdio.h>
#include <stdlib.h>
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

double sys_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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
