/* Logging from rank 0 (log.h). The rank is handed down by the parallel
 * runtime, so that the base layer needs nothing above it (docs/design.md §8.1). */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

static int log_rank;
static bool output_closed;
static int first_error; /* errno of the first failed flush, 0 while none failed */

void log_set_rank(int rank) { log_rank = rank; }

void log_flush(void) {
    if (fflush(stdout) == 0) return;
    if (!first_error) first_error = errno;
    if (errno == EPIPE) output_closed = true;
}

bool log_output_closed(void) { return output_closed; }

int log_output_error(void) { return first_error; }

void log_rank0(const char *fmt, ...) {
    if (log_rank != 0) return;
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    log_flush();
}
