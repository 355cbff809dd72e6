/* Logging from rank 0 (log.h). The rank is handed down by the parallel
 * runtime, so that the base layer needs nothing above it (docs/design.md §8.1). */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

static int log_rank;
static bool output_closed;

void log_set_rank(int rank) { log_rank = rank; }

void log_flush(void) {
    if (fflush(stdout) != 0 && errno == EPIPE) output_closed = true;
}

bool log_output_closed(void) { return output_closed; }

void log_rank0(const char *fmt, ...) {
    if (log_rank != 0) return;
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    log_flush();
}
