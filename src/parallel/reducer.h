/* The gradient reducer of the parallel runtime (docs/design.md §8.3;
 * reducer.c): it sees one flat buffer and spans of it, never the model:
 * what a span is (a tensor, and after which block of backward its gradient
 * is final) is the training layer's to say.
 * Prefixes: dist_reducer dist_span dist_slice_update */
#ifndef MOMFMM_REDUCER_H
#define MOMFMM_REDUCER_H
#include <stdbool.h>
#include <stddef.h>

/* A span [offset, offset + count) of the flat gradient buffer whose sum is
 * final once backward has finished block `ready_after` (-1: only at the
 * very end). Spans are given in buffer order, without gaps. */
typedef struct {
    size_t offset, count;
    int ready_after;
} dist_span;

/* The gradient reducer over `grads` [n]: buckets of about bucket_mb, cut at
 * span boundaries from the end of the buffer (backward finishes the last
 * blocks first), each one non-blocking in-place all-reduce; with overlap,
 * launched as backward reports blocks done (docs/design.md §8.3). */
typedef struct dist_reducer dist_reducer;
dist_reducer *dist_reducer_create(float *grads, size_t n, const dist_span *spans, int n_spans, double bucket_mb,
                                  bool overlap);
void dist_reducer_free(dist_reducer *r);
/* After backward has finished block `layer` (-1: all of it): launches the
 * buckets whose spans are all final. */
void dist_reducer_block_done(dist_reducer *r, int layer);
/* Between kernels: lets MPI advance the buckets in flight (Open MPI moves
 * non-blocking collectives only inside MPI calls). */
void dist_reducer_progress(dist_reducer *r);
/* Waits for every bucket; returns seconds spent waiting here. */
double dist_reducer_finish(dist_reducer *r);

/* ZeRO-1 (dist.zero = 1, docs/scale.md §7): gives this rank a slice of the
 * buffer (dist_partition) to update and all-gather; the buckets are reduced
 * by the same all-reduce as without it (dist_init's algorithm is a
 * reduce-scatter and an all-gather itself). */
void dist_reducer_shard(dist_reducer *r);
/* The reduced gradients of this rank's slice (element 0 = the slice's first
 * element of the buffer), after dist_reducer_finish; writable (clipping
 * scales them). */
float *dist_reducer_slice(dist_reducer *r);
/* Updates elements [lo, hi) of the flat buffer, inside this rank's slice. */
typedef void (*dist_slice_update)(void *ctx, size_t lo, size_t hi);
/* Bucket by bucket: update this rank's part, then launch a non-blocking
 * in-place MPI_Iallgatherv of the bucket's parameters; waits for all.
 * Returns seconds spent waiting. */
double dist_reducer_gather(dist_reducer *r, float *params, dist_slice_update update, void *ctx);
#endif
