/* Stop signals (docs/cli.md §5, docs/design.md §8.7): SIGTERM, SIGINT and
 * SIGUSR1 ask `train` to checkpoint its last finished step and exit 0; a
 * second SIGINT ends it at once. The one set of signals and the flags their
 * handlers set live here, and the file size limit's SIGXFSZ. */
#ifndef MOMFMM_SIGNALS_H
#define MOMFMM_SIGNALS_H
#include <stdbool.h>

/* Before main (a constructor of the executable): installs the handler,
 * which only records the signal, and blocks the stop signals, so that one
 * arriving during start-up (BLAS re-exec, MPI_Init, config) is held or
 * recorded, never fatal. The blocked mask survives execv and is inherited
 * by MPI's threads. SIGXFSZ (ulimit -f) is recorded, for every command:
 * the write that crosses the limit then fails (EFBIG) and is reported. */
void signals_guard_startup(void);
/* train: the handler in place and the signals unblocked; one that came
 * during start-up is delivered now, as a stop request. A SIGINT after a
 * stop request ends the process at once (exit 130). SIGPIPE is ignored: a
 * closed stdout shows as EPIPE (log_output_closed). */
void signals_catch_stops(void);
/* Every other command: default actions again, and a stop signal that came
 * during start-up takes its default action now. */
void signals_release(void);
/* The stop signal received (its number), or 0. */
int signals_stop_requested(void);
/* After signals_catch_stops: a descriptor that becomes readable (a byte
 * per wake) when a stop signal arrives or signals_wake is called, so that
 * a thread can block on read() until then; -1 before. */
int signals_wake_fd(void);
void signals_wake(void);
/* Whether a write crossed the file size limit (SIGXFSZ) since the last
 * signals_clear_file_limit. */
bool signals_file_limit_reached(void);
void signals_clear_file_limit(void);
#endif
