/* Progress lines on stdout from one rank (docs/cli.md §5: what train prints). */
#ifndef MOMFMM_LOG_H
#define MOMFMM_LOG_H
#include <stdbool.h>

/* Which rank this process is; 0 until the parallel runtime says otherwise
 * (dist_init), so that a single process logs. */
void log_set_rank(int rank);
/* Prints (and flushes) a message on rank 0 only. */
void log_rank0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fflush(stdout), noting a closed stdout (EPIPE: a reader such as `head`
 * went away, with SIGPIPE ignored) for log_output_closed. */
void log_flush(void);
bool log_output_closed(void);
/* errno of the first flush of stdout that failed (ENOSPC on a full device,
 * EPIPE, EIO), or 0: the cause named when the command layer checks stdout
 * at exit (cmd_finish_output). */
int log_output_error(void);
#endif
