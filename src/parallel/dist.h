/* The parallel runtime (docs/design.md §8.3): MPI start-up and shut-down, the
 * collectives the layers above use (the dist.timeout watch has arrivals.h, the
 * bucketed gradient reducer reducer.h). It
 * sees buffers of bytes, doubles and floats and spans of one flat buffer,
 * never the model: what a span is (a tensor, and after which block of
 * backward its gradient is final) is the training layer's to say. */
#ifndef MOMFMM_DIST_H
#define MOMFMM_DIST_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Starts MPI, creates the world and node communicators, hands the rank to
 * the logger and installs the panic hook that ends every rank of the job
 * (status.h); a failed status (exit 1) when MPI lacks the thread support
 * needed. */
int dist_init(int *argc, char ***argv, status *st);
/* Whether an MPI launcher (mpirun, srun with PMI or PMIx, Hydra) started
 * this process, read from the environment it sets. A process started
 * otherwise is a world of one that needs no MPI runtime: dist_init is then
 * not called, and every collective below returns at once (docs/cli.md §5). */
bool dist_launched(void);
/* The MPI this binary was built against ("Open MPI 4.1.4, MPI 3.1") and the
 * one it runs with (first line of MPI_Get_library_version, which MPI allows
 * before MPI_Init: `momfmm --version` does not start MPI; docs/cli.md §5). */
void dist_build_version(char *out, size_t len);
void dist_library_version(char *out, size_t len);
/* The algorithm of the gradient all-reduce: "rabenseifner" unless mpirun chose
 * another (docs/design.md §8.3); "unknown" outside Open MPI. */
const char *dist_allreduce_algorithm(void);
/* Frees the communicators and finalises MPI; a no-op when MPI is not running. */
void dist_finalize(void);
/* Ends every rank of the job with exit_code (MPI_Abort): for a failure only
 * this rank has seen, which would leave the others waiting in a collective. */
_Noreturn void dist_abort(int exit_code);
/* This rank and the number of ranks: 0 and 1 before dist_init and after
 * dist_finalize (a world of one). */
int dist_rank(void);
int dist_size(void);
/* Test hook: the largest message of one MPI call, in bytes (default and
 * ceiling 1 GiB); size_t counts go out in pieces of at most this size. */
void dist_set_max_message_bytes(size_t bytes);
/* The distinct host names of the ranks in rank order, each after a space
 * (" node1 node2"), from the table gathered once in dist_init (no MPI call). */
void dist_host_names(char *out, size_t len);
/* EXIT_USAGE when srun started several tasks that MPI does not see as one job. */
int dist_check_launch(status *st);

/* In-place sum over ranks, in pieces of one MPI call each. */
void dist_sum_doubles(double *x, size_t n);
/* Collectives on the world communicator; each is a no-op returning its
 * argument on one rank. */
double dist_max_double(double x);
bool dist_any(bool mine);
void dist_barrier(void);
/* Ranks sharing this rank's node (MPI_COMM_TYPE_SHARED). */
int dist_node_ranks(void);
/* The CPUs that this node's ranks may run on, together: their affinity
 * masks ORed (a collective on the node's ranks; every rank calls it). */
int dist_node_cpus(void);
/* x holds this rank's dist_partition part of n floats (the rest of x is
 * not read); afterwards every rank holds every rank's part: each part is
 * broadcast from its rank, the bytes of one broadcast of x. */
void dist_share_partitions(float *x, size_t n);
void dist_broadcast_bytes(void *x, size_t n);

/* A 64-bit checksum of n bytes compared across ranks (docs/design.md §8.3,
 * consistency check); every rank gets the same failed status (code 1)
 * naming the step and the first rank that differs from rank 0. */
int dist_check_consistency(const void *bytes, size_t n, long long step, status *st);

/* The FNV-1a checksum of n bytes that dist_check_consistency compares. */
uint64_t dist_checksum(const void *bytes, size_t n);
/* Collective: every rank's 64-bit value gathered; the lowest rank whose
 * value differs from rank 0's, or -1 when all agree (every rank gets the
 * same answer). */
int dist_first_differing_rank(uint64_t mine);
/* dist_broadcast_bytes from rank `root`. */
void dist_broadcast_bytes_from(int root, void *x, size_t n);
/* Collective, after a step every rank ran on its own (reading a file that
 * may fail on one rank alone: a node-local path): `rc` is this rank's
 * outcome, 0 or an exit code with its message in st. When any rank failed,
 * every rank returns the lowest failing rank's code with its status in st,
 * so that all go on alike (out with one line from rank 0, or past the next
 * collective, which a rank that failed alone would never reach); 0 when
 * none failed (st untouched). */
int dist_agree_status(int rc, status *st);

/* Rank `rank`'s part of n elements split over `ranks` (ZeRO-1, docs/scale.md
 * §7): [n*rank/ranks, n*(rank+1)/ranks), contiguous and in rank order,
 * uneven when ranks does not divide n. */
void dist_partition(size_t n, int rank, int ranks, size_t *first, size_t *count);

#endif
