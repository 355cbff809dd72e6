/* The bucketed gradient reducer and the ZeRO-1 parameter gather of the
 * parallel runtime (docs/design.md §8.3, docs/scale.md §7): non-blocking
 * in-place all-reduces over buckets of one flat buffer, launched as backward
 * finishes blocks, each waited through the arrivals (dist_internal.h). */
#include "parallel/reducer.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "base/sys.h"
#include "parallel/dist.h"
#include "parallel/watchdog.h"

#include "dist_internal.h"

typedef struct {
    size_t start, count;
    int ready_after; /* launch once backward has finished block `ready_after` (-1: all) */
    bool launched;
} bucket;

struct dist_reducer {
    float *grads;
    size_t n;
    bucket *buckets;
    MPI_Request *requests;
    int n_buckets, n_launched;
    bool overlap, active;
    /* ZeRO-1 (docs/scale.md §7): this rank's slice [first, first + count) of
     * the flat buffer; counts and displs give every rank's part of each
     * bucket ([n_buckets][ranks]) */
    size_t first, count;
    int *counts, *displs;
};

/* Buckets of about bucket_mb, cut at span boundaries, built from the end
 * of the buffer because backward finishes the last blocks first. A bucket
 * never exceeds one MPI call's count (dist_max_count): a larger span is cut
 * inside, so each bucket is one non-blocking all-reduce (docs/design.md §8.3). */
dist_reducer *dist_reducer_create(float *grads, size_t n, const dist_span *spans, int n_spans, double bucket_mb,
                                  bool overlap) {
    dist_reducer *r = sys_calloc(1, sizeof *r);
    r->grads = grads;
    r->n = n;
    r->overlap = overlap;
    r->active = dist_size() > 1;
    size_t cap = dist_max_count(sizeof(float));
    /* every bucket starts at a span's end or follows a full one */
    size_t max_buckets = (size_t)n_spans + n / cap + 1;
    r->buckets = sys_calloc(max_buckets, sizeof(bucket));
    r->requests = sys_calloc(max_buckets, sizeof(MPI_Request));
    for (size_t i = 0; i < max_buckets; i++) r->requests[i] = MPI_REQUEST_NULL;
    size_t limit = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
    if (limit < 1) limit = 1;
    bucket *current = NULL;
    for (int i = n_spans - 1; i >= 0; i--) {
        const dist_span *e = &spans[i];
        size_t end = e->offset + e->count; /* [e->offset, end) is not in a bucket yet */
        do {
            if (!current || current->count >= limit || current->count >= cap) {
                current = &r->buckets[r->n_buckets++];
                current->start = end;
                current->ready_after = INT_MAX;
            }
            size_t room = cap - current->count, left = end - e->offset;
            size_t taken = left < room ? left : room;
            current->start -= taken;
            current->count += taken;
            end -= taken;
            if (e->ready_after < current->ready_after) current->ready_after = e->ready_after;
        } while (end > e->offset);
    }
    return r;
}

void dist_reducer_shard(dist_reducer *r) {
    int ranks = dist_size();
    dist_partition(r->n, dist_rank(), ranks, &r->first, &r->count);
    if (!r->active) return; /* one rank: the slice is the whole buffer */
    r->counts = sys_calloc((size_t)r->n_buckets * ranks, sizeof(int));
    r->displs = sys_calloc((size_t)r->n_buckets * ranks, sizeof(int));
    for (int i = 0; i < r->n_buckets; i++)
        for (int q = 0; q < ranks; q++) {
            size_t first, count, start = r->buckets[i].start, end = start + r->buckets[i].count;
            dist_partition(r->n, q, ranks, &first, &count);
            size_t lo = first > start ? first : start, hi = first + count < end ? first + count : end;
            r->counts[i * ranks + q] = lo < hi ? (int)(hi - lo) : 0;
            r->displs[i * ranks + q] = lo < hi ? (int)(lo - start) : 0;
        }
}

float *dist_reducer_slice(dist_reducer *r) { return r->grads + r->first; }

/* Bucket by bucket, so that the watchdog can name the bucket that does not
 * complete, each polled with the arrivals (the total wait is the same);
 * marked on entering (this rank has finished backward and waits) and when
 * done. */
static void wait_buckets(dist_reducer *r, const char *operation) {
    dist_send_mark(false);
    for (int i = 0; i < r->n_buckets; i++) {
        watchdog_enter(operation, i + 1, r->n_buckets);
        dist_wait_polling(&r->requests[i]);
    }
    dist_send_mark(false);
    watchdog_leave();
}

/* This rank's part [lo, hi) of bucket i; false when empty. */
static bool my_part(const dist_reducer *r, int i, size_t *lo, size_t *hi) {
    size_t start = r->buckets[i].start, end = start + r->buckets[i].count;
    *lo = r->first > start ? r->first : start;
    *hi = r->first + r->count < end ? r->first + r->count : end;
    return *lo < *hi;
}

double dist_reducer_gather(dist_reducer *r, float *params, dist_slice_update update, void *ctx) {
    if (!r->active) {
        update(ctx, r->first, r->first + r->count);
        return 0.0;
    }
    int ranks = dist_size();
    /* update a bucket's part, then start its all-gather while the next
     * part updates */
    for (int i = 0; i < r->n_buckets; i++) {
        size_t lo, hi;
        if (my_part(r, i, &lo, &hi)) update(ctx, lo, hi);
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params + r->buckets[i].start, r->counts + i * ranks,
                        r->displs + i * ranks, MPI_FLOAT, dist_world(), &r->requests[i]);
        int done;
        MPI_Testall(i + 1, r->requests, &done, MPI_STATUSES_IGNORE);
    }
    double start = sys_seconds();
    wait_buckets(r, "parameter all-gather");
    return sys_seconds() - start;
}

void dist_reducer_free(dist_reducer *r) {
    if (!r) return;
    free(r->counts);
    free(r->displs);
    free(r->buckets);
    free(r->requests);
    free(r);
}

static void launch(dist_reducer *r, int index) {
    bucket *b = &r->buckets[index];
    b->launched = true;
    /* Same buckets with and without overlap: identical message sizes give
     * identical reduction order, so overlap does not change the weights.
     * ZeRO-1 too: libnbc's MPI_Ireduce_scatter is a binomial reduce to
     * rank 0, slower; and zero = 1 stays bitwise zero = 0 (docs/scale.md §7) */
    MPI_Iallreduce(MPI_IN_PLACE, r->grads + b->start, (int)b->count, MPI_FLOAT, MPI_SUM, dist_world(),
                   &r->requests[index]);
    r->n_launched++;
}

void dist_reducer_progress(dist_reducer *r) {
    if (!r || !r->active || r->n_launched == 0) return;
    int done;
    MPI_Testall(r->n_buckets, r->requests, &done, MPI_STATUSES_IGNORE);
}

void dist_reducer_block_done(dist_reducer *r, int layer) {
    if (!r->active || (!r->overlap && layer >= 0)) return;
    for (int i = 0; i < r->n_buckets; i++)
        if (!r->buckets[i].launched && (layer < 0 || r->buckets[i].ready_after >= layer)) launch(r, i);
    dist_reducer_progress(r);
}

double dist_reducer_finish(dist_reducer *r) {
    if (!r->active) return 0.0;
    dist_reducer_block_done(r, -1);
    double start = sys_seconds();
    wait_buckets(r, "gradient all-reduce");
    double waited = sys_seconds() - start;
    for (int i = 0; i < r->n_buckets; i++) {
        r->buckets[i].launched = false;
        r->requests[i] = MPI_REQUEST_NULL;
    }
    r->n_launched = 0;
    return waited;
}
