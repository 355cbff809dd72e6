/* Data parallelism over MPI (SPEC 1.2, 2; issue "Data parallel"): ranks run
 * forward and backward on their shard; gradients are summed with bucketed
 * non-blocking all-reduce launched during backward. */
#ifndef MOMFMM_DIST_H
#define MOMFMM_DIST_H
#include <stdbool.h>
#include <stddef.h>

#include "momfmm/model.h"

void dist_init(int *argc, char ***argv);
void dist_finalize(void);
/* Threads per rank from OMP_NUM_THREADS (default 1), applied to OpenBLAS. */
int dist_threads(void);
/* One start-up line: ranks x threads and hosts. */
void dist_describe(void);
/* Exits 2 when srun started several tasks that MPI does not see as one job. */
void dist_check_launch(void);

void dist_sum_doubles(double *x, int n);
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

/* Parameter checksum compared across ranks; aborts naming the step and the
 * ranks that disagree. */
void dist_check_consistency(const model *m, long long step);

typedef struct grad_reducer grad_reducer;
grad_reducer *grad_reducer_create(const model *m, double bucket_mb, bool overlap);
void grad_reducer_free(grad_reducer *r);
/* The backward hooks of model_backward for this reducer: block_done
 * launches the buckets that are complete, progress (between kernels) lets
 * MPI advance those in flight. */
backward_hooks grad_reducer_hooks(grad_reducer *r);
/* Waits for every bucket; returns seconds spent waiting here. */
double grad_reducer_finish(grad_reducer *r);
#endif
