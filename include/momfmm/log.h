/* Progress lines on stdout from one rank (docs/cli.md §5: what train prints). */
#ifndef MOMFMM_LOG_H
#define MOMFMM_LOG_H

/* Which rank this process is; 0 until the parallel runtime says otherwise
 * (dist_init), so that a single process logs. */
void log_set_rank(int rank);
/* Prints (and flushes) a message on rank 0 only. */
void log_rank0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
