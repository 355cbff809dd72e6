/* The parallel runtime over MPI (docs/design.md §8.3). This is the only file
 * that calls MPI: it owns the communicators, the thread level and the
 * int-count limit of every MPI call. It sees buffers and spans, not the
 * model. The loss is scaled by 1 / (global count of targets) before
 * backward, so the gradient all-reduce is a plain sum. */
#include "parallel/dist.h"

#include <hdf5.h>

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/sys.h"
#include "parallel/dist_hdf5.h"
#include "parallel/watchdog.h"

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

/* Arrivals (docs/design.md §8.11): MPI does not say which peer a
 * collective waits for, so every rank numbers the watched operations it
 * enters (every rank enters the same ones in the same order) and tells each
 * peer how far it got, one number per message on a communicator of their
 * own, through persistent requests made once; a receive from every peer is
 * always posted, and messages of one pair arrive in order. Operation s has
 * two marks: 2s-1 on entering its polled wait (every collective is
 * non-blocking), 2s when done. While a rank polls at an odd mark it repeats
 * it every WATCHDOG_HEARTBEAT_S, so a peer that has gone silent is not
 * answering (watchdog.c). Allocated in dist_init, freed in dist_finalize;
 * nothing per operation. */
typedef struct {
    MPI_Request recv, send;  /* persistent: recv always started, send from outbox */
    long long inbox, outbox; /* the mark received, the mark on its way */
    long long seen;          /* highest mark received */
    bool owed;               /* the latest mark is still to go out */
} arrival_peer;

static struct {
    MPI_Comm comm;
    int peers;           /* size - 1; peer j is rank j + (j >= rank) */
    arrival_peer *peer;  /* [peers] */
    MPI_Request *recv;   /* [peers]: the receives together, for MPI_Testsome */
    int *done;           /* [peers]: MPI_Testsome's indices */
    long long seq;       /* this rank's latest mark */
    double sent;         /* when it last went out */
    char *hosts;         /* [size][MPI_MAX_PROCESSOR_NAME], gathered once */
    uint64_t *checksums; /* [size]: dist_first_differing_rank's */
} arrivals = {.comm = MPI_COMM_NULL};

enum { ARRIVAL_TAG = 1 };

static int peer_rank(int j) { return j + (j >= world_rank); }

static void arrivals_create(void) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int host_len = 0, n = arrivals.peers = world_size - 1;
    MPI_Get_processor_name(host, &host_len);
    arrivals.hosts = sys_calloc((size_t)world_size, MPI_MAX_PROCESSOR_NAME);
    arrivals.checksums = sys_calloc((size_t)world_size, sizeof(uint64_t));
    MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, arrivals.hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);
    watchdog_init(world_rank, world_size, arrivals.hosts, MPI_MAX_PROCESSOR_NAME);
    MPI_Comm_dup(world, &arrivals.comm);
    arrivals.peer = sys_calloc((size_t)n + 1, sizeof(arrival_peer));
    arrivals.recv = sys_calloc((size_t)n + 1, sizeof(MPI_Request));
    arrivals.done = sys_calloc((size_t)n + 1, sizeof(int));
    for (int j = 0; j < n; j++) {
        arrival_peer *q = &arrivals.peer[j];
        MPI_Recv_init(&q->inbox, 1, MPI_LONG_LONG, peer_rank(j), ARRIVAL_TAG, arrivals.comm, &arrivals.recv[j]);
        MPI_Send_init(&q->outbox, 1, MPI_LONG_LONG, peer_rank(j), ARRIVAL_TAG, arrivals.comm, &q->send);
    }
    if (n > 0) MPI_Startall(n, arrivals.recv);
}

/* The receives still posted are cancelled (each peer's last message may
 * then wait unmatched, which MPI_Finalize allows); the sends (one number
 * each, to peers that are all here) complete. */
static void arrivals_free(void) {
    if (arrivals.comm == MPI_COMM_NULL) return;
    for (int j = 0; j < arrivals.peers; j++) {
        MPI_Wait(&arrivals.peer[j].send, MPI_STATUS_IGNORE);
        MPI_Request_free(&arrivals.peer[j].send);
        MPI_Cancel(&arrivals.recv[j]);
        MPI_Wait(&arrivals.recv[j], MPI_STATUS_IGNORE);
        MPI_Request_free(&arrivals.recv[j]);
    }
    MPI_Comm_free(&arrivals.comm);
    free(arrivals.peer), free(arrivals.recv), free(arrivals.done), free(arrivals.hosts), free(arrivals.checksums);
    arrivals.hosts = NULL, arrivals.checksums = NULL;
    arrivals.peers = 0;
}

/* The latest mark to peer j, once its previous message has gone out (a
 * send to a stopped peer may not complete: this rank does not wait for it,
 * and the peer gets the latest mark when it can). */
static void post(int j) {
    arrival_peer *q = &arrivals.peer[j];
    int gone = 0;
    MPI_Test(&q->send, &gone, MPI_STATUS_IGNORE);
    q->owed = !gone;
    if (!gone) return;
    q->outbox = arrivals.seq;
    MPI_Start(&q->send);
}

/* Takes in the arrivals that came, posts the next receive of each, and
 * sends what is owed. */
static void arrivals_poll(void) {
    int n = 0;
    MPI_Testsome(arrivals.peers, arrivals.recv, &n, arrivals.done, MPI_STATUSES_IGNORE);
    for (int i = 0; i < n && n != MPI_UNDEFINED; i++) {
        int j = arrivals.done[i];
        arrival_peer *q = &arrivals.peer[j];
        if (q->inbox > q->seen) q->seen = q->inbox;
        watchdog_arrived(peer_rank(j), q->seen);
        MPI_Start(&arrivals.recv[j]);
    }
    for (int j = 0; j < arrivals.peers; j++)
        if (arrivals.peer[j].owed) post(j);
}

/* Every peer has reached this rank's mark, and this rank's mark has gone
 * out to every peer: one left owed would never go while this rank is in
 * calls that are not ours, and a peer still waiting for it would hang. */
static bool all_arrived(void) {
    for (int j = 0; j < arrivals.peers; j++)
        if (arrivals.peer[j].seen < arrivals.seq || arrivals.peer[j].owed) return false;
    return true;
}

/* This rank's next mark to every peer; or (repeat), at an odd mark (a
 * polled wait), the same mark again now and then: this rank is alive and
 * still waiting. */
static void send_mark(bool repeat) {
    if (repeat && (!(arrivals.seq & 1) || sys_seconds() - arrivals.sent < WATCHDOG_HEARTBEAT_S)) return;
    if (!repeat) watchdog_announced(++arrivals.seq);
    for (int j = 0; j < arrivals.peers; j++) post(j);
    arrivals.sent = sys_seconds();
}

/* Polls until every peer has reached this rank's mark (while the watchdog
 * runs; without it nobody asks who is missing). */
static void await_peers(void) {
    while (watchdog_running() && !all_arrived()) {
        arrivals_poll();
        send_mark(true);
    }
}

/* Both marks of a phase whose MPI calls are not ours (parallel HDF5):
 * every peer has arrived before this rank goes in. */
static void arrive_and_pass(void) {
    send_mark(false);
    await_peers();
    send_mark(false);
}

/* Waits for one non-blocking request while taking in arrivals. */
static void wait_polling(MPI_Request *request) {
    for (int flag = 0;;) {
        MPI_Test(request, &flag, MPI_STATUS_IGNORE);
        if (flag) return;
        arrivals_poll();
        send_mark(true);
    }
}

/* Every collective runs non-blocking, polled between its two marks, so
 * that a rank that waits is heard: one inside a blocking call could not
 * tell who else is waiting. */
static void watch_wait(const char *operation, MPI_Request *request) {
    watchdog_enter(operation, 0, 0);
    send_mark(false);
    wait_polling(request);
    send_mark(false);
    watchdog_leave();
}

int dist_watch_start(double seconds, dist_timeout_hook hook, status *st) { return watchdog_start(seconds, hook, st); }

void dist_watch_step(long long step) { watchdog_step(step); }

/* A phase watched as a whole is an operation of its own: every rank enters
 * it (collective), announced and awaited like a blocking collective. */
void dist_watch_phase(const char *phase, bool whole) {
    watchdog_phase(phase, whole);
    if (phase && whole && world_size > 1) arrive_and_pass();
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
    /* Rabenseifner's, not libnbc's binomial tree; --mca stays (docs/design.md §8.3) */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(world, &world_rank);
    MPI_Comm_size(world, &world_size);
    MPI_Comm_size(node, &node_size);
    arrivals_create();
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

/* Read back through MPI_T (0, libnbc's in-place default, is binomial). */
const char *dist_allreduce_algorithm(void) {
    static const char *const NAMES[] = {"binomial", "ring", "binomial", "rabenseifner", "recursive doubling"};
    int provided, index, count, value = -1;
    MPI_T_cvar_handle handle;
    if (MPI_T_init_thread(MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return "unknown";
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(index, NULL, &handle, &count) == MPI_SUCCESS) {
        if (count != 1 || MPI_T_cvar_read(handle, &value) != MPI_SUCCESS) value = -1;
        MPI_T_cvar_handle_free(&handle);
    }
    MPI_T_finalize();
    return value >= 0 && value < (int)(sizeof NAMES / sizeof NAMES[0]) ? NAMES[value] : "unknown";
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
    watchdog_free();
    arrivals_free();
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

/* From the table gathered in dist_init: no MPI call. */
void dist_host_names(char *out, size_t len) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    if (!arrivals.hosts) gethostname(host, sizeof host - 1); /* a world of one without MPI */
    if (len) out[0] = '\0';
    size_t used = 0;
    for (int r = 0; r < dist_size() && used < len; r++) {
        const char *h = arrivals.hosts ? arrivals.hosts + (size_t)r * MPI_MAX_PROCESSOR_NAME : host;
        bool seen = false;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(h, arrivals.hosts + (size_t)q * MPI_MAX_PROCESSOR_NAME) == 0;
        if (!seen) used += (size_t)snprintf(out + used, len - used, " %s", h);
    }
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
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, sizeof(double));
        MPI_Request request;
        MPI_Iallreduce(MPI_IN_PLACE, x + done, count, MPI_DOUBLE, MPI_SUM, world, &request);
        watch_wait("sum all-reduce", &request);
        done += (size_t)count;
    }
}

double dist_max_double(double x) {
    double out = x;
    if (dist_size() == 1) return out;
    MPI_Request request;
    MPI_Iallreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, world, &request);
    watch_wait("max all-reduce", &request);
    return out;
}

bool dist_any(bool mine) {
    int in = mine ? 1 : 0, out = in;
    if (dist_size() == 1) return out != 0;
    MPI_Request request;
    MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, world, &request);
    watch_wait("agreement all-reduce", &request);
    return out != 0;
}

void dist_barrier(void) {
    if (dist_size() == 1) return;
    MPI_Request request;
    MPI_Ibarrier(world, &request);
    watch_wait("barrier", &request);
}

int dist_node_ranks(void) { return node_size; }

void dist_broadcast_bytes(void *x, size_t n) { dist_broadcast_bytes_from(0, x, n); }

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
    int r = dist_first_differing_rank(checksum(bytes, n));
    if (r < 0) return 0;
    const uint64_t *all = arrivals.checksums;
    return status_fail(st, 1, "step %lld: parameters of rank %d differ from rank 0 (checksum %016llx vs %016llx)", step,
                       r, (unsigned long long)all[r], (unsigned long long)all[0]);
}

uint64_t dist_checksum(const void *bytes, size_t n) { return checksum(bytes, n); }

/* Into the table made at start-up: no allocation per call. */
int dist_first_differing_rank(uint64_t mine) {
    if (dist_size() == 1) return -1;
    MPI_Request request;
    MPI_Iallgather(&mine, 1, MPI_UINT64_T, arrivals.checksums, 1, MPI_UINT64_T, world, &request);
    watch_wait("checksum all-gather", &request);
    for (int r = 1; r < dist_size(); r++)
        if (arrivals.checksums[r] != arrivals.checksums[0]) return r;
    return -1;
}

void dist_broadcast_bytes_from(int root, void *x, size_t n) {
    if (dist_size() == 1) return;
    char *p = x;
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, 1);
        MPI_Request request;
        MPI_Ibcast(p + done, count, MPI_BYTE, root, world, &request);
        watch_wait("broadcast", &request);
        done += (size_t)count;
    }
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
    /* ZeRO-1 (scale.md §7): this rank's slice; every rank's part of each bucket */
    size_t first, count;
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
 * marked on entering (backward done, this rank waits) and when done. */
static void wait_buckets(dist_reducer *r, const char *operation) {
    send_mark(false);
    for (int i = 0; i < r->n_buckets; i++) {
        watchdog_enter(operation, i + 1, r->n_buckets);
        wait_polling(&r->requests[i]);
    }
    send_mark(false);
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
    free(r->counts);
    free(r->displs);
    free(r->buckets);
    free(r->requests);
    free(r);
}

static void launch(dist_reducer *r, int index) {
    bucket *b = &r->buckets[index];
    b->launched = true;
    /* Same buckets and call with overlap off and with ZeRO-1 (docs/scale.md
     * §7): same reduction order, so neither changes the weights. */
    MPI_Iallreduce(MPI_IN_PLACE, r->grads + b->start, (int)b->count, MPI_FLOAT, MPI_SUM, world, &r->requests[index]);
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
