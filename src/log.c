/* Logging from rank 0 (log.h). The rank is handed down by the parallel
 * runtime, so that the base layer needs nothing above it (docs/design.md §8.1). */
#include "momfmm/log.h"

#include <stdarg.h>
#include <stdio.h>

static int log_rank;

void log_set_rank(int rank) { log_rank = rank; }

void log_rank0(const char *fmt, ...) {
    if (log_rank != 0) return;
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    fflush(stdout);
}
