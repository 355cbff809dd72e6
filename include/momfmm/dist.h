/* Data parallelism over MPI (docs/model.md §1.2, 2; issue "Data parallel"): ranks run
 * forward and backward on their shard; gradients are summed with bucketed
 * non-blocking all-reduce launched during backward. */
#ifndef MOMFMM_DIST_H
#define MOMFMM_DIST_H
#include <stdbool.h>
#include <stddef.h>

#include "momfmm/common.h"
#include "momfmm/model.h"

/* Starts MPI, creates the world and node communicators and sets the OpenBLAS
 * threads; a failed status (exit 1) when MPI lacks the thread support needed.
 * The command layer's dist_init (cmd_common.h) exits on that status. */
int dist_try_init(int *argc, char ***argv, status *st);
/* The MPI this binary was built against ("Open MPI 4.1.4, MPI 3.1") and the
 * one it runs with (first line of MPI_Get_library_version, which MPI allows
 * before MPI_Init: `momfmm --version` does not start MPI; docs/cli.md §5). */
void dist_build_version(char *out, size_t len);
void dist_library_version(char *out, size_t len);
/* Frees the communicators and finalises MPI; a no-op when MPI is not running. */
void dist_finalize(void);
/* Ends every rank of the job with exit_code (MPI_Abort): for a failure only
 * this rank has seen, which would leave the others waiting in a collective. */
_Noreturn void dist_abort(int exit_code);
/* Test hook: the largest message of one MPI call, in bytes (default and
 * ceiling 1 GiB); size_t counts go out in pieces of at most this size. */
void dist_set_max_message_bytes(size_t bytes);
/* Threads per rank from OMP_NUM_THREADS (default 1), applied to OpenBLAS. */
int dist_threads(void);
/* One start-up line: ranks x threads and hosts. */
void dist_describe(void);
/* EXIT_USAGE when srun started several tasks that MPI does not see as one job. */
int dist_try_check_launch(status *st);

/* In-place sum over ranks, in pieces of one MPI call each. */
void dist_sum_doubles(double *x, size_t n);
/* Collectives on the world communicator for the layers above (dist.c is the
 * only file that calls MPI, docs/design.md §8.3); each is a no-op returning
 * its argument on one rank. */
double dist_max_double(double x);
bool dist_any(bool mine);
void dist_barrier(void);
/* Ranks sharing this rank's node (MPI_COMM_TYPE_SHARED). */
int dist_node_ranks(void);
void dist_broadcast_floats(float *x, size_t n);
void dist_broadcast_bytes(void *x, size_t n);

/* Parameter checksum compared across ranks; every rank gets the same failed
 * status (code 1) naming the step and the first rank that differs from rank 0. */
int dist_try_check_consistency(const model *m, long long step, status *st);

typedef struct grad_reducer grad_reducer;
grad_reducer *grad_reducer_create(const model *m, double bucket_mb, bool overlap);
void grad_reducer_free(grad_reducer *r);
/* The backward hooks of model_backward for this reducer: block_done
 * launches the buckets that are complete, progress (between kernels) lets
 * MPI advance those in flight. */
backward_hooks grad_reducer_hooks(grad_reducer *r);
/* Waits for every bucket; returns seconds spent waiting here. */
double grad_reducer_finish(grad_reducer *r);

/* ZeRO-1 (dist.zero = 1, docs/scale.md §7). grad_reducer_shard switches the
 * reducer to reduce-scatter: each bucket is one non-blocking
 * MPI_Ireduce_scatter delivering the sum of this rank's part (m's moment
 * range) into the slice buffer, same buckets and overlap as the all-reduce. */
void grad_reducer_shard(grad_reducer *r, const model *m);
/* The reduced gradients of this rank's slice (element 0 = m->moment_first),
 * after grad_reducer_finish; writable (clipping scales them). */
float *grad_reducer_slice(grad_reducer *r);
/* Updates elements [lo, hi) of the flat buffer, inside this rank's slice. */
typedef void (*slice_update)(void *ctx, size_t lo, size_t hi);
/* Bucket by bucket: update this rank's part, then launch a non-blocking
 * in-place MPI_Iallgatherv of the bucket's parameters; waits for all.
 * Returns seconds spent waiting. */
double grad_reducer_gather(grad_reducer *r, float *params, slice_update update, void *ctx);
#endif
