/* The parallel runtime over MPI (docs/design.md §8.3). This is the only file
 * that calls MPI: it owns the communicators, the thread level and the
 * int-count limit of every MPI call. It sees buffers and spans, not the
 * model. The loss is scaled by 1 / (global count of targets) before
 * backward, so the gradient all-reduce is a plain sum. */
#include "momfmm/dist.h"

#include <hdf5.h>

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "momfmm/dist_hdf5.h"
#include "momfmm/log.h"
#include "momfmm/sys.h"

/* Created once in dist_init, freed in dist_finalize. A private duplicate of
 * the world keeps our collectives apart from any other library's traffic; the
 * node communicator (ranks sharing memory) serves dist_node_ranks. */
static MPI_Comm world = MPI_COMM_NULL;
static MPI_Comm node = MPI_COMM_NULL;
/* The world's rank and size, kept from dist_init so that dist_rank and
 * dist_size make no MPI call (a second thread may ask: MPI_THREAD_FUNNELED
 * allows MPI calls from the main thread only). */
static int world_rank = 0, world_size = 1, node_size = 1;

/* MPI counts are int, so a size_t count goes out in pieces of at most this
 * many bytes (docs/design.md §8.3). 1 GiB also stays clear of transports that
 * mishandle single messages above 2 GiB; tests lower it to exercise the split. */
static size_t max_message_bytes = (size_t)1 << 30;

void dist_set_max_message_bytes(size_t bytes) {
    max_message_bytes = bytes > 0 && bytes < ((size_t)1 << 30) ? bytes : (size_t)1 << 30;
}

/* Elements of `element_size` bytes that one MPI call may carry. */
static size_t max_count(size_t element_size) {
    size_t n = max_message_bytes / element_size;
    if (n > INT_MAX) n = INT_MAX;
    return n > 0 ? n : 1;
}

static int piece(size_t remaining, size_t element_size) {
    size_t limit = max_count(element_size);
    return (int)(remaining < limit ? remaining : limit);
}

/* The watchdog (dist.timeout, docs/design.md §8.11). A peer that stops
 * answering (its host gone, its link down, the process stopped) leaves the
 * others inside an MPI call that never returns; MPI itself has no timeout.
 * So every call of ours into MPI records what it is and when it last
 * progressed, and a thread that never calls MPI checks every 100 ms; past
 * the limit it hands one line to the command layer's hook, which exits. A
 * phase named by the layers above (a checkpoint write through parallel
 * HDF5, whose MPI calls are not ours) is watched as a whole. */
static struct {
    _Atomic double since;            /* last progress of the operation in flight; 0: none */
    _Atomic(const char *) operation; /* what is in flight, or NULL */
    _Atomic int bucket, buckets;     /* bucket (1-based) of buckets, 0: not a bucket */
    _Atomic(const char *) phase;     /* the phase named by dist_watch_phase, or NULL */
    atomic_bool whole;               /* the phase is watched as a whole */
    _Atomic long long step;
    atomic_bool running;
    double seconds;
    int rank, size; /* the thread calls no MPI, not even MPI_Comm_rank (MPI_THREAD_FUNNELED) */
    dist_timeout_hook hook;
    pthread_t thread;
    char host[MPI_MAX_PROCESSOR_NAME];
} watch;

static void watch_enter(const char *operation, int bucket, int buckets) {
    atomic_store(&watch.operation, operation);
    atomic_store(&watch.bucket, bucket);
    atomic_store(&watch.buckets, buckets);
    atomic_store(&watch.since, sys_seconds());
}

/* An operation done is progress; inside a phase the clock goes on. */
static void watch_leave(void) {
    atomic_store(&watch.operation, (const char *)NULL);
    atomic_store(&watch.since, atomic_load(&watch.whole) ? sys_seconds() : 0.0);
}

void dist_watch_phase(const char *phase, bool whole) {
    atomic_store(&watch.phase, phase);
    atomic_store(&watch.whole, phase && whole);
    atomic_store(&watch.since, phase && whole ? sys_seconds() : 0.0);
}

void dist_watch_step(long long step) { atomic_store(&watch.step, step); }

static void watch_describe(char *out, size_t len, double waited) {
    const char *operation = atomic_load(&watch.operation), *phase = atomic_load(&watch.phase);
    int bucket = atomic_load(&watch.bucket), buckets = atomic_load(&watch.buckets);
    char what[160];
    int n = snprintf(what, sizeof what, "%s%s%s", phase ? phase : "", phase && operation ? ": " : "",
                     operation ? operation : "");
    if (bucket > 0 && n > 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, " bucket %d of %d", bucket, buckets);
    snprintf(out, len,
             "dist.timeout: step %lld: %s did not complete in %.0f s (dist.timeout = %g) on rank %d of %d (host "
             "%s): a peer rank or its host stopped answering (MPI does not say which); exiting %d",
             atomic_load(&watch.step), what, waited, watch.seconds, watch.rank, watch.size, watch.host,
             EXIT_DIST_TIMEOUT);
}

static void *watch_loop(void *unused) {
    (void)unused;
    const struct timespec tick = {0, 100 * 1000 * 1000};
    while (atomic_load(&watch.running)) {
        nanosleep(&tick, NULL);
        double since = atomic_load(&watch.since), waited = sys_seconds() - since;
        if (since > 0 && waited > watch.seconds) {
            char line[1024];
            watch_describe(line, sizeof line, waited);
            watch.hook(line);
        }
    }
    return NULL;
}

int dist_watch_start(double seconds, dist_timeout_hook hook, status *st) {
    if (dist_size() == 1 || atomic_load(&watch.running)) return 0;
    int len = 0;
    MPI_Get_processor_name(watch.host, &len);
    watch.seconds = seconds;
    watch.rank = dist_rank();
    watch.size = dist_size();
    watch.hook = hook;
    atomic_store(&watch.running, true);
    if (pthread_create(&watch.thread, NULL, watch_loop, NULL) != 0) {
        atomic_store(&watch.running, false);
        return status_fail(st, 1, "dist.timeout: cannot start the watchdog thread");
    }
    return 0;
}

static void watch_stop(void) {
    if (!atomic_load(&watch.running)) return;
    atomic_store(&watch.running, false);
    pthread_join(watch.thread, NULL);
}

/* The panic hook (status.h): a failure on one rank that no caller can
 * handle ends the whole job, so that no rank waits for it in a collective. */
static void abort_job(int exit_code) {
    if (dist_size() > 1) dist_abort(exit_code);
}

/* MPI_THREAD_FUNNELED: OpenBLAS and oneDNN run their own worker threads, so
 * MPI_THREAD_SINGLE would promise MPI a single-threaded process that we are
 * not; every MPI call, including the progress calls between backward
 * kernels, comes from the main thread, so nothing above FUNNELED is needed.
 * An MPI that provides less is refused rather than trusted (exit 1,
 * docs/design.md §8.7). */
int dist_init(int *argc, char ***argv, status *st) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(world, &world_rank);
    MPI_Comm_size(world, &world_size);
    MPI_Comm_size(node, &node_size);
    log_set_rank(dist_rank());
    status_at_panic(abort_job);
    if (provided < MPI_THREAD_FUNNELED)
        return status_fail(st, 1,
                           "MPI provides thread level %d, below MPI_THREAD_FUNNELED (%d) that OpenBLAS threads "
                           "need: use an MPI library built with thread support",
                           provided, MPI_THREAD_FUNNELED);
    return 0;
}

void dist_build_version(char *out, size_t len) {
#ifdef OMPI_MAJOR_VERSION
    snprintf(out, len, "Open MPI %d.%d.%d, MPI %d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION,
             MPI_VERSION, MPI_SUBVERSION);
#else
    snprintf(out, len, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#endif
}

void dist_library_version(char *out, size_t len) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(text, &n);
    text[n] = '\0';
    snprintf(out, len, "%.*s", (int)strcspn(text, "\n"), text);
}

/* The variables by which a launcher tells its processes that they belong to
 * an MPI job: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), PMIx (srun
 * --mpi=pmix, PRRTE, Open MPI 5: PMIX_RANK), PMI-1/2 (MPICH's Hydra, srun
 * --mpi=pmi2: PMI_RANK, PMI_SIZE, PMI_FD). */
bool dist_launched(void) {
    static const char *const VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD"};
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++)
        if (getenv(VARS[i])) return true;
    return false;
}

void dist_finalize(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    watch_stop();
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    world_rank = 0, world_size = node_size = 1;
    MPI_Finalize();
}

_Noreturn void dist_abort(int exit_code) {
    if (world != MPI_COMM_NULL) MPI_Abort(world, exit_code);
    exit(exit_code);
}

int dist_rank(void) { return world_rank; }
int dist_size(void) { return world_size; }

void dist_host_names(char *out, size_t len) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int host_len = 0, size = dist_size(), rank = dist_rank();
    if (world != MPI_COMM_NULL) MPI_Get_processor_name(host, &host_len);
    else gethostname(host, sizeof host - 1); /* a world of one without MPI */
    char *all = rank == 0 ? sys_calloc((size_t)size, MPI_MAX_PROCESSOR_NAME) : NULL;
    if (size > 1) {
        watch_enter("host-name gather", 0, 0);
        MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, world);
        watch_leave();
    } else if (all) memcpy(all, host, MPI_MAX_PROCESSOR_NAME);
    if (len) out[0] = '\0';
    size_t used = 0;
    for (int r = 0; rank == 0 && r < size && used < len; r++) {
        const char *h = all + (size_t)r * MPI_MAX_PROCESSOR_NAME;
        bool seen = false;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(h, all + (size_t)q * MPI_MAX_PROCESSOR_NAME) == 0;
        if (!seen) used += (size_t)snprintf(out + used, len - used, " %s", h);
    }
    free(all);
}

int dist_check_launch(status *st) {
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (tasks && atoi(tasks) > 1 && dist_size() == 1 && getenv("SLURM_PROCID"))
        return status_fail(st, EXIT_USAGE,
                           "srun started %s tasks but MPI sees a world of 1: launch with 'srun --mpi=pmix ...' "
                           "or 'mpirun' inside the allocation",
                           tasks);
    return 0;
}

void dist_sum_doubles(double *x, size_t n) {
    if (dist_size() == 1) return;
    watch_enter("sum all-reduce", 0, 0);
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, sizeof(double));
        MPI_Allreduce(MPI_IN_PLACE, x + done, count, MPI_DOUBLE, MPI_SUM, world);
        done += (size_t)count;
    }
    watch_leave();
}

double dist_max_double(double x) {
    double out = x;
    if (dist_size() == 1) return out;
    watch_enter("max all-reduce", 0, 0);
    MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, world);
    watch_leave();
    return out;
}

bool dist_any(bool mine) {
    int in = mine ? 1 : 0, out = in;
    if (dist_size() == 1) return out != 0;
    watch_enter("agreement all-reduce", 0, 0);
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, world);
    watch_leave();
    return out != 0;
}

void dist_barrier(void) {
    if (dist_size() == 1) return;
    watch_enter("barrier", 0, 0);
    MPI_Barrier(world);
    watch_leave();
}

int dist_node_ranks(void) { return node_size; }

void dist_broadcast_bytes(void *x, size_t n) {
    if (dist_size() == 1) return;
    char *p = x;
    watch_enter("broadcast", 0, 0);
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, 1);
        MPI_Bcast(p + done, count, MPI_BYTE, 0, world);
        done += (size_t)count;
    }
    watch_leave();
}

void dist_broadcast_floats(float *x, size_t n) { dist_broadcast_bytes(x, n * sizeof(float)); }

static uint64_t checksum(const void *bytes, size_t n) {
    /* FNV-1a over the bit patterns: any difference in any byte shows. */
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* Every rank gathers every checksum, so every rank returns the same status. */
int dist_check_consistency(const void *bytes, size_t n, long long step, status *st) {
    int size = dist_size();
    if (size == 1) return 0;
    uint64_t mine = checksum(bytes, n);
    uint64_t *all = sys_calloc((size_t)size, sizeof(uint64_t));
    watch_enter("checksum all-gather", 0, 0);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, world);
    watch_leave();
    int code = 0;
    for (int r = 1; r < size && code == 0; r++)
        if (all[r] != all[0])
            code =
                status_fail(st, 1, "step %lld: parameters of rank %d differ from rank 0 (checksum %016llx vs %016llx)",
                            step, r, (unsigned long long)all[r], (unsigned long long)all[0]);
    free(all);
    return code;
}

uint64_t dist_checksum(const void *bytes, size_t n) { return checksum(bytes, n); }

int dist_first_differing_rank(uint64_t mine) {
    int size = dist_size();
    if (size == 1) return -1;
    uint64_t *all = sys_calloc((size_t)size, sizeof(uint64_t));
    watch_enter("checksum all-gather", 0, 0);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, world);
    watch_leave();
    int first = -1;
    for (int r = 1; r < size && first < 0; r++)
        if (all[r] != all[0]) first = r;
    free(all);
    return first;
}

void dist_broadcast_bytes_from(int root, void *x, size_t n) {
    if (dist_size() == 1) return;
    char *p = x;
    watch_enter("broadcast", 0, 0);
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, 1);
        MPI_Bcast(p + done, count, MPI_BYTE, root, world);
        done += (size_t)count;
    }
    watch_leave();
}

void dist_partition(size_t n, int rank, int ranks, size_t *first, size_t *count) {
    size_t lo = n * (size_t)rank / (size_t)ranks, hi = n * (size_t)(rank + 1) / (size_t)ranks;
    *first = lo;
    *count = hi - lo;
}

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
     * the flat buffer; slice receives its reduced gradients; counts and
     * displs give every rank's part of each bucket ([n_buckets][ranks]) */
    bool sharded;
    size_t first, count;
    float *slice;
    int *counts, *displs;
};

/* Buckets of about bucket_mb, cut at span boundaries, built from the end
 * of the buffer because backward finishes the last blocks first. A bucket
 * never exceeds one MPI call's count (max_count): a larger span is cut
 * inside, so each bucket is one non-blocking all-reduce (docs/design.md §8.3). */
dist_reducer *dist_reducer_create(float *grads, size_t n, const dist_span *spans, int n_spans, double bucket_mb,
                                  bool overlap) {
    dist_reducer *r = sys_calloc(1, sizeof *r);
    r->grads = grads;
    r->n = n;
    r->overlap = overlap;
    r->active = dist_size() > 1;
    size_t cap = max_count(sizeof(float));
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
    r->sharded = true;
    dist_partition(r->n, dist_rank(), ranks, &r->first, &r->count);
    if (!r->active) return; /* one rank: the slice is the whole buffer */
    r->slice = sys_calloc(r->count ? r->count : 1, sizeof(float));
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

float *dist_reducer_slice(dist_reducer *r) { return r->slice ? r->slice : r->grads + r->first; }

/* MPI_Waitall bucket by bucket, so that the watchdog can name the bucket
 * that does not complete; the total wait is the same. */
static void wait_buckets(dist_reducer *r, const char *operation) {
    for (int i = 0; i < r->n_buckets; i++) {
        watch_enter(operation, i + 1, r->n_buckets);
        MPI_Wait(&r->requests[i], MPI_STATUS_IGNORE);
    }
    watch_leave();
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
                        r->displs + i * ranks, MPI_FLOAT, world, &r->requests[i]);
        int done;
        MPI_Testall(i + 1, r->requests, &done, MPI_STATUSES_IGNORE);
    }
    double start = sys_seconds();
    wait_buckets(r, "parameter all-gather");
    return sys_seconds() - start;
}

int dist_hdf5_mpio(hid_t fapl) { return H5Pset_fapl_mpio(fapl, world, MPI_INFO_NULL) < 0 ? -1 : 0; }

void dist_reducer_free(dist_reducer *r) {
    if (!r) return;
    free(r->slice);
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
     * identical reduction order, so overlap does not change the weights. */
    if (r->sharded) {
        /* each rank receives the sum of its part of the bucket (ZeRO-1):
         * the data volume of a reduce-scatter, half an all-reduce's */
        size_t lo, hi;
        float *recv = my_part(r, index, &lo, &hi) ? r->slice + (lo - r->first) : r->slice;
        MPI_Ireduce_scatter(r->grads + b->start, recv, r->counts + (size_t)index * dist_size(), MPI_FLOAT, MPI_SUM,
                            world, &r->requests[index]);
    } else {
        MPI_Iallreduce(MPI_IN_PLACE, r->grads + b->start, (int)b->count, MPI_FLOAT, MPI_SUM, world,
                       &r->requests[index]);
    }
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
    wait_buckets(r, r->sharded ? "gradient reduce-scatter" : "gradient all-reduce");
    double waited = sys_seconds() - start;
    for (int i = 0; i < r->n_buckets; i++) {
        r->buckets[i].launched = false;
        r->requests[i] = MPI_REQUEST_NULL;
    }
    r->n_launched = 0;
    return waited;
}
