/* Stop signals (docs/cli.md §5, docs/design.md §8.7): SIGTERM, SIGINT and
 * SIGUSR1 ask `train` to finish its step, checkpoint and exit 0. The one set
 * of signals and the one flag their handler sets live here. */
#ifndef MOMFMM_SIGNALS_H
#define MOMFMM_SIGNALS_H

/* Before main (a constructor of the executable): installs the handler,
 * which only records the signal, and blocks the stop signals, so that one
 * arriving during start-up (BLAS re-exec, MPI_Init, config) is held or
 * recorded, never fatal. The blocked mask survives execv and is inherited
 * by MPI's threads. */
void signals_guard_startup(void);
/* train: the handler in place and the signals unblocked; one that came
 * during start-up is delivered now, as a stop request. */
void signals_catch_stops(void);
/* Every other command: default actions again, and a stop signal that came
 * during start-up takes its default action now. */
void signals_release(void);
/* The stop signal received (its number), or 0. */
int signals_stop_requested(void);
#endif
