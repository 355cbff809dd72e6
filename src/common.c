/* Failure reporting and small utilities (docs/cli.md §5: exit codes). MPI itself
 * (rank, abort, finalise) is dist.c's (docs/design.md §8.3). */
#include "momfmm/common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "momfmm/dist.h"

static void print_message(const char *fmt, va_list args) {
    fputs("momfmm: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    fflush(stderr);
}

static _Noreturn void finish(int exit_code) {
    dist_finalize();
    exit(exit_code);
}

_Noreturn void fail(int exit_code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    print_message(fmt, args);
    va_end(args);
    /* A lone failing rank would leave the others waiting in a collective:
     * take the whole job down with the same code. */
    if (process_count() > 1) dist_abort(exit_code);
    finish(exit_code);
}

_Noreturn void fail_all(int exit_code, const char *fmt, ...) {
    if (process_rank() == 0) {
        va_list args;
        va_start(args, fmt);
        print_message(fmt, args);
        va_end(args);
    }
    finish(exit_code);
}

int status_fail(status *st, int code, const char *fmt, ...) {
    if (!st) return code;
    va_list args;
    va_start(args, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, args);
    va_end(args);
    st->code = code;
    return code;
}

void log_rank0(const char *fmt, ...) {
    if (process_rank() != 0) return;
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    fflush(stdout);
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fail(1, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc(void *p, size_t size) {
    void *q = realloc(p, size ? size : 1);
    if (!q) fail(1, "out of memory allocating %zu bytes", size);
    return q;
}

double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* %.17g always round-trips, so the loop ends by 17 at the latest; infinities
 * and NaN print as %g does. Whole numbers below 1e16 keep their digits
 * (10000, not 1e+04). */
char *format_shortest_double(double x, char *out, size_t len) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, len, "%.*g", digits, x);
        if (isnan(x) || strtod(out, NULL) == x) break;
    }
    if (strchr(out, 'e') && x == floor(x) && fabs(x) < 1e16) snprintf(out, len, "%.0f", x);
    return out;
}

double memory_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024.0;
}

bool path_is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
