/* The context group's exchanges (context.h; docs/design.md §8.12). A
 * communicator of its own keeps them apart from the gradient buckets, which
 * may be in flight on the world communicator at the same time (backward);
 * every wait goes through dist_watch_wait, so it is watched by dist.timeout
 * and polls the arrivals like every collective of the runtime. Messages are
 * cut into pieces of one MPI call's count (dist_max_count). */
#include "parallel/context.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"
#include "parallel/dist.h"

#include "dist_internal.h"

enum { TAG_SHIFT = 11, TAG_RING = 12, TAG_SCAN = 13 };

static struct {
    int size, rank, data_rank, data_size;
    context_scan_method scan;
    MPI_Comm comm, reversed;   /* the group; the same in reverse order (exscan of suffixes) */
    float *gathered, *scanned; /* grow-once scratch: an all-gather's pieces; a scan's totals */
    size_t gathered_floats, scanned_floats;
    MPI_Request *requests; /* grow-once: the operation being posted (a ring step's between start and wait) */
    int n_requests, max_requests;
    double bytes_sent, wait_s;
} group = {.size = 1, .data_size = 1, .comm = MPI_COMM_NULL, .reversed = MPI_COMM_NULL};

int context_init(int size, context_scan_method scan, status *st) {
    int world = dist_size();
    if (size < 1 || world % size != 0)
        return status_fail(st, EXIT_USAGE,
                           "dist.context = %d does not divide the %d ranks: np must be a multiple of it (np = D x C)",
                           size, world);
    group.size = size;
    group.scan = scan;
    group.rank = dist_rank() % size;
    group.data_rank = dist_rank() / size;
    group.data_size = world / size;
    if (size == 1) return 0;
    MPI_Comm_split(dist_world(), group.data_rank, group.rank, &group.comm);
    MPI_Comm_split(dist_world(), group.data_rank, size - 1 - group.rank, &group.reversed);
    return 0;
}

void context_free(void) {
    if (group.comm != MPI_COMM_NULL) MPI_Comm_free(&group.comm);
    if (group.reversed != MPI_COMM_NULL) MPI_Comm_free(&group.reversed);
    free(group.gathered), free(group.scanned), free(group.requests);
    group.gathered = group.scanned = NULL, group.requests = NULL;
    group.gathered_floats = group.scanned_floats = 0, group.max_requests = 0;
    group.size = group.data_size = 1, group.rank = group.data_rank = 0;
}

int context_rank(void) { return group.rank; }
int context_size(void) { return group.size; }
int context_data_rank(void) { return group.data_rank; }
int context_data_size(void) { return group.data_size; }

/* ---- the cut */

static int chunk_bound(int T, int chunks, int k) { return (int)((long long)T * k / chunks); }

context_cut context_cut_of(int T, int C, int c, bool zigzag) {
    context_cut cut = {.T_seq = T, .chunks = zigzag && C > 1 ? 2 * C : C};
    cut.n = zigzag && C > 1 ? 2 : 1;
    cut.chunk[0] = c;
    cut.chunk[1] = cut.chunks - 1 - c;
    cut.total = 0;
    for (int i = 0; i < cut.n; i++) {
        cut.start[i] = chunk_bound(T, cut.chunks, cut.chunk[i]);
        cut.len[i] = chunk_bound(T, cut.chunks, cut.chunk[i] + 1) - cut.start[i];
        cut.total += cut.len[i];
    }
    return cut;
}

int context_chunk_len(const context_cut *cut, int k) {
    return chunk_bound(cut->T_seq, cut->chunks, k + 1) - chunk_bound(cut->T_seq, cut->chunks, k);
}

int context_chunk_owner(const context_cut *cut, int k) {
    int C = cut->n == 2 ? cut->chunks / 2 : cut->chunks;
    return k < C ? k : cut->chunks - 1 - k;
}

/* ---- exchanges: each posts its messages, then waits for all of them as
 * one watched operation (dist_watch_waitall), timed */

static int piece(size_t remaining) {
    size_t limit = dist_max_count(sizeof(float));
    return (int)(remaining < limit ? remaining : limit);
}

static int pieces_of(size_t n) {
    int count = 0;
    for (size_t done = 0; done < n; count++) done += (size_t)piece(n - done);
    return count;
}

/* Room for n more requests of the operation being posted. */
static MPI_Request *requests_for(int n) {
    if (group.n_requests + n > group.max_requests) {
        int grown = group.n_requests + n;
        MPI_Request *r = sys_calloc((size_t)grown, sizeof *r);
        if (group.requests) memcpy(r, group.requests, sizeof *r * (size_t)group.n_requests);
        free(group.requests);
        group.requests = r;
        group.max_requests = grown;
    }
    return group.requests + group.n_requests;
}

static void wait_posted(const char *what) {
    double start = sys_seconds();
    dist_watch_waitall(what, group.requests, group.n_requests);
    group.n_requests = 0;
    group.wait_s += sys_seconds() - start;
}

static float *scratch_floats(float **buffer, size_t *have, size_t floats) {
    if (floats > *have) {
        free(*buffer);
        *buffer = sys_calloc(floats, sizeof(float));
        *have = floats;
    }
    return *buffer;
}

/* Piece p of n floats: [p * limit, ...), `count` of them. */
static void post_allgather_pieces(const float *mine, float *parts, size_t n) {
    int k = pieces_of(n);
    MPI_Request *r = requests_for(k);
    size_t done = 0;
    for (int p = 0; p < k; p++) {
        int count = piece(n - done);
        MPI_Iallgather(mine + done, count, MPI_FLOAT, parts + done * group.size, count, MPI_FLOAT, group.comm, &r[p]);
        done += (size_t)count;
    }
    group.n_requests += k;
    group.bytes_sent += (double)n * sizeof(float) * (group.size - 1);
}

/* The pieces' [size][count] blocks into all [size][n]. */
static void unpack_pieces(const float *parts, float *all, size_t n) {
    for (size_t done = 0; done < n;) {
        int count = piece(n - done);
        for (int r = 0; r < group.size; r++)
            memcpy(all + (size_t)r * n + done, parts + done * group.size + (size_t)r * count,
                   (size_t)count * sizeof *all);
        done += (size_t)count;
    }
}

void context_allgather(const float *mine, float *all, size_t n, const char *what) {
    if (group.size == 1) {
        memcpy(all, mine, n * sizeof *all);
        return;
    }
    dist_test_stop(what);
    float *parts = scratch_floats(&group.gathered, &group.gathered_floats, n * group.size);
    post_allgather_pieces(mine, parts, n);
    wait_posted(what);
    unpack_pieces(parts, all, n);
}

void context_sum(float *x, size_t n, const char *what) {
    if (group.size == 1) return;
    dist_test_stop(what);
    int k = pieces_of(n);
    MPI_Request *r = requests_for(k);
    size_t done = 0;
    for (int p = 0; p < k; p++) {
        int count = piece(n - done);
        MPI_Iallreduce(MPI_IN_PLACE, x + done, count, MPI_FLOAT, MPI_SUM, group.comm, &r[p]);
        done += (size_t)count;
    }
    group.n_requests += k;
    group.bytes_sent += 2.0 * (double)n * sizeof(float); /* ring or Rabenseifner: about 2n per rank */
    wait_posted(what);
}

/* LASP-2: every rank's totals, then the sum of those before (after) in order. */
static void scan_allgather(const float *mine, float *out, size_t n, bool reverse, const char *what) {
    float *all = scratch_floats(&group.scanned, &group.scanned_floats, n * group.size);
    context_allgather(mine, all, n, what);
    memset(out, 0, n * sizeof *out);
    int from = reverse ? group.rank + 1 : 0, to = reverse ? group.size : group.rank;
    for (int r = from; r < to; r++)
        for (size_t i = 0; i < n; i++) out[i] += all[(size_t)r * n + i];
}

static void scan_exscan(const float *mine, float *out, size_t n, bool reverse, const char *what) {
    dist_test_stop(what);
    MPI_Comm comm = reverse ? group.reversed : group.comm;
    int k = pieces_of(n);
    MPI_Request *r = requests_for(k);
    size_t done = 0;
    for (int p = 0; p < k; p++) {
        int count = piece(n - done);
        MPI_Iexscan(mine + done, out + done, count, MPI_FLOAT, MPI_SUM, comm, &r[p]);
        done += (size_t)count;
    }
    group.n_requests += k;
    group.bytes_sent += (double)n * sizeof(float);
    wait_posted(what);
    if ((reverse ? group.size - 1 - group.rank : group.rank) == 0) memset(out, 0, n * sizeof *out); /* undefined */
}

/* Posts n floats of buf to (send) or from `peer`, in pieces. */
static void post_point(bool send, float *buf, size_t n, int peer, int tag) {
    int k = pieces_of(n);
    MPI_Request *r = requests_for(k);
    size_t done = 0;
    for (int p = 0; p < k; p++) {
        int count = piece(n - done);
        if (send) MPI_Isend(buf + done, count, MPI_FLOAT, peer, tag, group.comm, &r[p]);
        else MPI_Irecv(buf + done, count, MPI_FLOAT, peer, tag, group.comm, &r[p]);
        done += (size_t)count;
    }
    group.n_requests += k;
    if (send) group.bytes_sent += (double)n * sizeof(float);
}

/* LASP: the prefix travels rank to rank, each adding its own: a receive,
 * then a send, on every rank (the ends with nothing to receive or send). */
static void scan_ring(const float *mine, float *out, size_t n, bool reverse, const char *what) {
    dist_test_stop(what);
    int step = reverse ? -1 : 1, from = group.rank - step, to = group.rank + step;
    bool first = from < 0 || from >= group.size, last = to < 0 || to >= group.size;
    if (first) memset(out, 0, n * sizeof *out);
    else post_point(false, out, n, from, TAG_SCAN);
    wait_posted(what);
    float *sum = scratch_floats(&group.gathered, &group.gathered_floats, n);
    for (size_t i = 0; i < n && !last; i++) sum[i] = out[i] + mine[i];
    if (!last) post_point(true, sum, n, to, TAG_SCAN);
    wait_posted(what);
}

void context_scan(const float *mine, float *out, size_t n, bool reverse, const char *what) {
    if (group.size == 1) {
        memset(out, 0, n * sizeof *out);
        return;
    }
    if (group.scan == CONTEXT_SCAN_EXSCAN) scan_exscan(mine, out, n, reverse, what);
    else if (group.scan == CONTEXT_SCAN_RING) scan_ring(mine, out, n, reverse, what);
    else scan_allgather(mine, out, n, reverse, what);
}

void context_shift(const float *send, size_t n_send, float *recv, size_t n_recv, bool reverse, const char *what) {
    if (group.size == 1) return;
    dist_test_stop(what);
    int step = reverse ? -1 : 1, to = group.rank + step, from = group.rank - step;
    if (from >= 0 && from < group.size) post_point(false, recv, n_recv, from, TAG_SHIFT);
    if (to >= 0 && to < group.size) post_point(true, (float *)send, n_send, to, TAG_SHIFT);
    wait_posted(what);
}

static const char *ring_what;

void context_ring_start(const float *send, float *recv, size_t n, const char *what) {
    if (group.size == 1) {
        memcpy(recv, send, n * sizeof *recv);
        return;
    }
    dist_test_stop(what);
    int next = (group.rank + 1) % group.size, prev = (group.rank + group.size - 1) % group.size;
    post_point(false, recv, n, prev, TAG_RING);
    post_point(true, (float *)send, n, next, TAG_RING);
    ring_what = what;
}

void context_progress(void) {
    if (group.size == 1 || group.n_requests == 0) return;
    int done;
    MPI_Testall(group.n_requests, group.requests, &done, MPI_STATUSES_IGNORE);
}

void context_ring_wait(void) {
    if (group.size == 1) return;
    wait_posted(ring_what);
}

void context_take_stats(double *bytes_sent, double *wait_s) {
    *bytes_sent = group.bytes_sent;
    *wait_s = group.wait_s;
    group.bytes_sent = group.wait_s = 0;
}
