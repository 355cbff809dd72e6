/* What the files of the parallel runtime share and nothing above sees
 * (docs/design.md §8.1, §8.3): the world communicator, the int-count limit
 * of one MPI call, and the watched wait through which every collective of
 * src/parallel/ completes (arrivals.c, docs/design.md §8.11). */
#ifndef MOMFMM_DIST_INTERNAL_H
#define MOMFMM_DIST_INTERNAL_H
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

/* dist.c: the private duplicate of MPI_COMM_WORLD made in dist_init. */
MPI_Comm dist_world(void);
/* dist.c: elements of `element_size` bytes that one MPI call may carry
 * (dist_set_max_message_bytes). */
size_t dist_max_count(size_t element_size);

/* arrivals.c: the persistent requests of the protocol on a duplicate of
 * `world`, made once in dist_init after the host table `hosts`
 * ([size][MPI_MAX_PROCESSOR_NAME]) is gathered, freed in dist_finalize. */
void dist_arrivals_create(MPI_Comm world, int rank, int size, const char *hosts);
void dist_arrivals_free(void);
/* arrivals.c: every peer's final mark received and this rank's sent: the
 * last exchange before MPI_Finalize (watched as "shutdown"). */
void dist_arrivals_shutdown(void);
/* arrivals.c: this rank's next mark to every peer; with `repeat`, the same
 * mark again while a polled wait lasts (a heartbeat). */
void dist_send_mark(bool repeat);
/* arrivals.c: waits for one non-blocking request while taking in arrivals. */
void dist_wait_polling(MPI_Request *request);
/* arrivals.c: a whole watched operation named `operation`: marks on entry
 * and when done, the request polled between them. */
void dist_watch_wait(const char *operation, MPI_Request *request);
/* arrivals.c: the same for n requests (n may be 0) as one watched
 * operation, so that ranks with more or fewer messages (the ends of a
 * context group, a message cut into pieces) still count the same marks. */
void dist_watch_waitall(const char *operation, MPI_Request *requests, int n);
/* dist.c, a test hook (tests/e2e/test_multihost.py, test_mpi.py):
 * MOMFMM_TEST_STOP="RANK:N:OPERATION" stops world rank RANK (SIGSTOP to
 * itself) as it enters OPERATION for the Nth time. */
void dist_test_stop(const char *operation);
#endif
