/* The dist.timeout watch of the parallel runtime (docs/design.md §8.11;
 * arrivals.c, watchdog.c): every collective of src/parallel/ is a watched
 * operation whose arrivals every rank tells every peer, so that a stalled
 * one names the ranks it waits for.
 * Prefixes: dist_watch dist_timeout_hook */
#ifndef MOMFMM_ARRIVALS_H
#define MOMFMM_ARRIVALS_H
#include <stdbool.h>

#include "base/status.h"

/* The watchdog (dist.timeout, docs/design.md §8.11): from here
 * on, an MPI operation of this module (and a phase named below) that makes
 * no progress for `seconds` calls hook with one line naming the step, the
 * operation, this rank and host, and the ranks (with their hosts) that have
 * not arrived at the operation, from a thread of its own; the hook must end
 * the process without MPI (the command layer's prints and _exits with
 * EXIT_DIST_TIMEOUT). A no-op on one rank; 1 on a failed thread start. */
typedef void (*dist_timeout_hook)(const char *message);
int dist_watch_start(double seconds, dist_timeout_hook hook, status *st);
/* The step the watchdog's message names. */
void dist_watch_step(long long step);
/* Names what the layers above do ("checkpoint write", "eval"; NULL: done):
 * the operations inside carry the name; with `whole`, the phase itself is
 * watched from its start, for the MPI calls made in it by other libraries
 * (parallel HDF5), each of this module's operations counting as progress;
 * a whole phase is entered by every rank (collective: its arrival is
 * announced and awaited like an operation's). */
void dist_watch_phase(const char *phase, bool whole);
#endif
