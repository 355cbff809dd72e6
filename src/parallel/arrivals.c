/* The watched-wait ("arrivals") protocol of the parallel runtime
 * (docs/design.md §8.11): every rank tells every peer how far it got, so
 * that the watchdog (watchdog.c) can name the ranks a stalled collective
 * waits for. Every collective of src/parallel/ waits through
 * dist_watch_wait (dist_internal.h). */
#include "parallel/arrivals.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "base/sys.h"
#include "parallel/watchdog.h"

#include "dist_internal.h"

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
    int rank, peers;    /* this rank, and size - 1; peer j is rank j + (j >= rank) */
    arrival_peer *peer; /* [peers] */
    MPI_Request *recv;  /* [peers]: the receives together, for MPI_Testsome */
    int *done;          /* [peers]: MPI_Testsome's indices */
    long long seq;      /* this rank's latest mark */
    double sent;        /* when it last went out */
} arrivals = {.comm = MPI_COMM_NULL};

enum { ARRIVAL_TAG = 1 };

static int peer_rank(int j) { return j + (j >= arrivals.rank); }

void dist_arrivals_create(MPI_Comm world, int rank, int size, const char *hosts) {
    int n = arrivals.peers = size - 1;
    arrivals.rank = rank;
    watchdog_init(rank, size, hosts, MPI_MAX_PROCESSOR_NAME);
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

/* After dist_arrivals_shutdown: the receives still posted are cancelled
 * (each peer's final mark may then wait unmatched, which MPI_Finalize
 * allows); the sends have completed. */
void dist_arrivals_free(void) {
    if (arrivals.comm == MPI_COMM_NULL) return;
    for (int j = 0; j < arrivals.peers; j++) {
        MPI_Wait(&arrivals.peer[j].send, MPI_STATUS_IGNORE);
        MPI_Request_free(&arrivals.peer[j].send);
        MPI_Cancel(&arrivals.recv[j]);
        MPI_Wait(&arrivals.recv[j], MPI_STATUS_IGNORE);
        MPI_Request_free(&arrivals.recv[j]);
    }
    MPI_Comm_free(&arrivals.comm);
    free(arrivals.peer), free(arrivals.recv), free(arrivals.done);
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
void dist_send_mark(bool repeat) {
    if (repeat && (!(arrivals.seq & 1) || sys_seconds() - arrivals.sent < WATCHDOG_HEARTBEAT_S)) return;
    if (!repeat) watchdog_announced(++arrivals.seq);
    for (int j = 0; j < arrivals.peers; j++) post(j);
    arrivals.sent = sys_seconds();
}

/* A wait that has lasted WAIT_SPIN_S while a peer has not yet reached it
 * naps between its polls (docs/design.md §8.11): it waits for that peer's
 * work (rank 0 timing the GEMM engines at start-up, or writing alone, a
 * straggler), and where ranks outnumber the cores (`mpirun --oversubscribe`,
 * the quickstart's 8 ranks on 2 cores) a rank that polls on takes the core
 * from the rank it waits for. Once every peer is in, the transfer is under
 * way and MPI moves it only inside our polls (Open MPI's non-blocking
 * collectives advance in MPI_Test), so it polls on; shorter waits, a step's
 * all-reduce, poll as before: naps from the first poll slowed the quickstart
 * by a quarter. */
#define WAIT_SPIN_S 0.02
static bool peer_behind(void) {
    for (int j = 0; j < arrivals.peers; j++)
        if (arrivals.peer[j].seen < arrivals.seq) return true;
    return false;
}

static void nap_if_long(double since) {
    static const struct timespec nap = {0, 50 * 1000};
    if (sys_seconds() - since >= WAIT_SPIN_S && peer_behind()) nanosleep(&nap, NULL);
}

/* Polls until every peer has reached this rank's mark (while the watchdog
 * runs; without it nobody asks who is missing). */
static void await_peers(void) {
    for (double since = sys_seconds(); watchdog_running() && !all_arrived(); nap_if_long(since)) {
        arrivals_poll();
        dist_send_mark(true);
    }
}

/* Both marks of a phase whose MPI calls are not ours (parallel HDF5):
 * every peer has arrived before this rank goes in. */
static void arrive_and_pass(void) {
    dist_send_mark(false);
    await_peers();
    dist_send_mark(false);
}

/* Waits for one non-blocking request while taking in arrivals. */
void dist_wait_polling(MPI_Request *request) {
    for (double since = sys_seconds();; nap_if_long(since)) {
        int flag = 0;
        MPI_Test(request, &flag, MPI_STATUS_IGNORE);
        if (flag) return;
        arrivals_poll();
        dist_send_mark(true);
    }
}

/* Every collective runs non-blocking, polled between its two marks, so
 * that a rank that waits is heard: one inside a blocking call could not
 * tell who else is waiting. */
void dist_watch_wait(const char *operation, MPI_Request *request) { dist_watch_waitall(operation, request, 1); }

/* One operation however many requests (none on a rank with nothing to
 * send or receive): every rank counts the same marks. */
void dist_watch_waitall(const char *operation, MPI_Request *requests, int n) {
    watchdog_enter(operation, 0, 0);
    dist_send_mark(false);
    for (int i = 0; i < n; i++) dist_wait_polling(&requests[i]);
    dist_send_mark(false);
    watchdog_leave();
}

/* The last exchange before MPI_Finalize (docs/design.md §8.11): this rank
 * sends every peer the final mark once, without heartbeats, and waits until
 * it has every peer's and its own have gone out. From then on no peer sends
 * it anything, so it may leave MPI whatever its peers do: MPI_Finalize's own
 * synchronization is the launcher's fence, which srun --mpi=pmix was seen
 * not to hold (a rank still sending to a peer that had left retried the
 * connection for ever). Watched as an operation: a peer that never gets
 * here (stopped, cut off) ends this rank within dist.timeout, naming it. */
void dist_arrivals_shutdown(void) {
    if (arrivals.peers == 0) return;
    watchdog_enter("shutdown", 0, 0);
    watchdog_announced(arrivals.seq = WATCHDOG_FINAL_MARK);
    for (int j = 0; j < arrivals.peers; j++) post(j);
    /* Latency no longer matters here, and the wait may be long (rank 0
     * writing the last checkpoint alone): a nap between polls leaves the
     * core to the ranks still working (8 ranks on 2 cores in the quickstart). */
    const struct timespec nap = {0, 1000 * 1000};
    for (arrivals_poll(); !all_arrived(); arrivals_poll()) nanosleep(&nap, NULL);
    for (int j = 0; j < arrivals.peers; j++) MPI_Wait(&arrivals.peer[j].send, MPI_STATUS_IGNORE);
    watchdog_leave();
}

int dist_watch_start(double seconds, dist_timeout_hook hook, status *st) { return watchdog_start(seconds, hook, st); }

void dist_watch_step(long long step) { watchdog_step(step); }

/* A phase watched as a whole is an operation of its own: every rank enters
 * it (collective), announced and awaited like a blocking collective. */
void dist_watch_phase(const char *phase, bool whole) {
    watchdog_phase(phase, whole);
    if (phase && whole && arrivals.peers > 0) arrive_and_pass();
}
