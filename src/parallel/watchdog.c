/* The watchdog (dist.timeout, docs/design.md §8.11). A peer that stops
 * answering (its host gone, its link down, the process stopped) leaves the
 * others inside an MPI call that never returns; MPI itself has no timeout.
 * So every MPI operation of dist.c records what it is and when it last
 * progressed, and a thread that never calls MPI checks every 100 ms; past
 * the limit it hands one line to the command layer's hook, which exits. A
 * phase named by the layers above (a checkpoint write through parallel
 * HDF5, whose MPI calls are not ours) is watched as a whole.
 *
 * Which peer is missing MPI does not say, so dist.c numbers its watched
 * operations (every rank calls them in the same order) and each rank tells
 * the others how far it got (marks 2s-1 and 2s of operation s); the line
 * names the peers behind this rank's mark and, at an odd mark (a polled
 * wait, where every waiting rank repeats its mark), the peers at the same
 * mark that have gone silent: stopped, or cut off. */
#include "parallel/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/sys.h"

static struct {
    _Atomic double since;            /* last progress of the operation in flight; 0: none */
    _Atomic(const char *) operation; /* what is in flight, or NULL */
    _Atomic int bucket, buckets;     /* bucket (1-based) of buckets, 0: not a bucket */
    _Atomic(const char *) phase;     /* the phase named by watchdog_phase, or NULL */
    atomic_bool whole;               /* the phase is watched as a whole */
    _Atomic long long step;
    _Atomic long long announced; /* this rank's latest mark */
    _Atomic long long *arrived;  /* [size]: the highest mark received from each rank */
    _Atomic double *heard;       /* [size]: when its last message came */
    atomic_bool running;
    double seconds;
    int rank, size;
    const char *hosts; /* [size][stride] */
    size_t stride;
    watchdog_hook hook;
    pthread_t thread;
} watch;

void watchdog_init(int rank, int size, const char *hosts, size_t stride) {
    watch.rank = rank, watch.size = size, watch.hosts = hosts, watch.stride = stride;
    watch.arrived = sys_calloc((size_t)size, sizeof *watch.arrived);
    watch.heard = sys_calloc((size_t)size, sizeof *watch.heard);
    for (int r = 0; r < size; r++) atomic_init(&watch.arrived[r], 0), atomic_init(&watch.heard[r], sys_seconds());
    atomic_store(&watch.announced, 0);
}

void watchdog_enter(const char *operation, int bucket, int buckets) {
    atomic_store(&watch.operation, operation);
    atomic_store(&watch.bucket, bucket);
    atomic_store(&watch.buckets, buckets);
    atomic_store(&watch.since, sys_seconds());
}

/* An operation done is progress; inside a phase the clock goes on. */
void watchdog_leave(void) {
    atomic_store(&watch.operation, (const char *)NULL);
    atomic_store(&watch.since, atomic_load(&watch.whole) ? sys_seconds() : 0.0);
}

void watchdog_phase(const char *phase, bool whole) {
    atomic_store(&watch.phase, phase);
    atomic_store(&watch.whole, phase && whole);
    atomic_store(&watch.since, phase && whole ? sys_seconds() : 0.0);
}

void watchdog_step(long long step) { atomic_store(&watch.step, step); }
void watchdog_announced(long long mark) { atomic_store(&watch.announced, mark); }

void watchdog_arrived(int rank, long long mark) {
    if (!watch.arrived || rank < 0 || rank >= watch.size) return;
    atomic_store(&watch.arrived[rank], mark);
    atomic_store(&watch.heard[rank], sys_seconds());
}

static const char *host_of(int rank) { return watch.hosts + (size_t)rank * watch.stride; }
/* While this rank polls (an odd mark) it hears its peers: one is missing
 * when it has been silent for four repeats at an odd mark (it would repeat
 * it), or for half of dist.timeout at an even one (it computes, or it
 * stopped, possibly with data for this rank unsent; not inside a phase
 * watched as a whole, where it may be inside parallel HDF5's calls); a
 * peer that is heard is alive, even if behind (it waits for someone else);
 * one that has sent the final mark has shut down and says no more.
 * At an even mark this rank waits in calls that are not ours (a phase's
 * parallel HDF5), has heard nothing since its last operation and names no
 * one: marks of that operation still unread prove nothing (a broadcast's
 * root completes before the others arrive; they may have arrived since). */
static bool missing(int rank, long long mark, double now) {
    if (rank == watch.rank || !(mark & 1)) return false;
    long long theirs = atomic_load(&watch.arrived[rank]);
    if (mark == WATCHDOG_FINAL_MARK && theirs == mark) return false;
    double silent = now - atomic_load(&watch.heard[rank]), repeats = 4 * WATCHDOG_HEARTBEAT_S;
    if (theirs & 1) return silent > repeats;
    return !atomic_load(&watch.whole) && silent > (repeats > watch.seconds / 2 ? repeats : watch.seconds / 2);
}

/* "no answer from ranks 2, 3 (host h2); rank 5 (host h3)": the ranks whose
 * arrival at the operation has not been seen, host by host in rank order;
 * or that every rank arrived and the transfer itself stalls. */
static void describe_missing(char *out, size_t len) {
    long long seq = atomic_load(&watch.announced);
    double now = sys_seconds();
    size_t used = (size_t)snprintf(out, len, "no answer from");
    bool any = false;
    for (int h = 0; h < watch.size && used < len; h++) {
        int count = 0;
        bool first_of_host = true;
        for (int q = 0; q < h && first_of_host; q++) first_of_host = strcmp(host_of(q), host_of(h)) != 0;
        for (int r = h; r < watch.size && first_of_host; r++)
            count += missing(r, seq, now) && strcmp(host_of(r), host_of(h)) == 0;
        if (count == 0) continue;
        used += (size_t)snprintf(out + used, len - used, "%s rank%s", any ? ";" : "", count > 1 ? "s" : "");
        for (int r = h, n = 0; r < watch.size && used < len; r++)
            if (missing(r, seq, now) && strcmp(host_of(r), host_of(h)) == 0)
                used += (size_t)snprintf(out + used, len - used, "%s %d", n++ ? "," : "", r);
        if (used < len) used += (size_t)snprintf(out + used, len - used, " (host %s)", host_of(h));
        any = true;
    }
    if (!any)
        snprintf(out, len, "%s",
                 (atomic_load(&watch.announced) & 1) && !atomic_load(&watch.whole)
                     ? "every rank answered; the transfer itself stalled"
                     : "every rank arrived; it stalled inside (which rank is not known)");
}

static void describe(char *out, size_t len, double waited) {
    const char *operation = atomic_load(&watch.operation), *phase = atomic_load(&watch.phase);
    int bucket = atomic_load(&watch.bucket), buckets = atomic_load(&watch.buckets);
    char what[160], who[600];
    int n = snprintf(what, sizeof what, "%s%s%s", phase ? phase : "", phase && operation ? ": " : "",
                     operation ? operation : "");
    if (bucket > 0 && n > 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, " bucket %d of %d", bucket, buckets);
    describe_missing(who, sizeof who);
    snprintf(out, len,
             "dist.timeout: step %lld: %s did not complete in %.0f s (dist.timeout = %g) on rank %d of %d (host "
             "%s): %s; exiting %d",
             atomic_load(&watch.step), what, waited, watch.seconds, watch.rank, watch.size, host_of(watch.rank), who,
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
            describe(line, sizeof line, waited);
            watch.hook(line);
        }
    }
    return NULL;
}

int watchdog_start(double seconds, watchdog_hook hook, status *st) {
    if (watch.size <= 1 || atomic_load(&watch.running)) return 0;
    watch.seconds = seconds;
    watch.hook = hook;
    atomic_store(&watch.running, true);
    if (pthread_create(&watch.thread, NULL, watch_loop, NULL) != 0) {
        atomic_store(&watch.running, false);
        return status_fail(st, 1, "dist.timeout: cannot start the watchdog thread");
    }
    return 0;
}

bool watchdog_running(void) { return atomic_load(&watch.running); }

void watchdog_free(void) {
    if (atomic_load(&watch.running)) {
        atomic_store(&watch.running, false);
        pthread_join(watch.thread, NULL);
    }
    free((void *)watch.arrived);
    free((void *)watch.heard);
    watch.arrived = NULL, watch.heard = NULL;
    watch.size = 0;
}
