/* The watchdog of the parallel runtime (dist.timeout, docs/design.md §8.11):
 * a thread that never calls MPI and ends the process, through the command
 * layer's hook, when the operation in flight has made no progress for too
 * long, with one line naming the step, the operation, this rank and host,
 * and the ranks (and their hosts) whose arrival at the operation has not
 * been seen. dist.c tells it what is in flight and who has arrived; it
 * makes no MPI call itself (MPI_THREAD_FUNNELED). */
#ifndef MOMFMM_WATCHDOG_H
#define MOMFMM_WATCHDOG_H
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* The ranks of the job and their host names (hosts: [size][stride], kept,
 * not copied: it must live until watchdog_free); allocates the arrival
 * table once. */
void watchdog_init(int rank, int size, const char *hosts, size_t stride);
/* Stops the thread and frees the table. */
void watchdog_free(void);
/* Starts the thread: past `seconds` without progress it calls hook with
 * the line (the hook must end the process without MPI); 1 on a failed
 * thread start. */
typedef void (*watchdog_hook)(const char *message);
int watchdog_start(double seconds, watchdog_hook hook, status *st);
bool watchdog_running(void);
/* An operation starts (bucket i of n, 0: not a bucket) / is done. */
void watchdog_enter(const char *operation, int bucket, int buckets);
void watchdog_leave(void);
void watchdog_phase(const char *phase, bool whole);
void watchdog_step(long long step);
/* This rank's latest mark (dist.c: operation s has marks 2s-1, a polled
 * wait during which a rank repeats it every WATCHDOG_HEARTBEAT_S, and 2s),
 * and the highest mark received from rank `rank`, now. */
#define WATCHDOG_HEARTBEAT_S 0.5
/* The last mark of every rank, sent once as it shuts down (arrivals.c,
 * dist_arrivals_shutdown) and never repeated: a peer that has sent it is
 * done, not silent. Odd: a polled wait. */
#define WATCHDOG_FINAL_MARK LLONG_MAX
void watchdog_announced(long long mark);
void watchdog_arrived(int rank, long long mark);
#endif
