/* The collectives of dist.c split size_t counts into pieces of one MPI call
 * each (docs/design.md §8.3). A real > 2^31-element message is too big for a
 * test, so the test lowers the per-call limit (dist_set_max_message_bytes) to
 * a few elements and checks that sums, shared parts and the gradient buckets
 * still cover every element exactly once; and dist_node_cpus ORs the
 * node's affinity masks. Started on its own, the test runs
 * itself again under `mpirun -np 3`, since on one rank the collectives are
 * no-ops. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT: before any header */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "parallel/dist.h"
#include "parallel/reducer.h"
#include "test_util.h"

#define RELAUNCH_MARK "MOMFMM_TEST_DIST_RANKS"
#define GUARD 4
#define SENTINEL -7.0

/* The per-call limit run_all is checking, for the detail of each check. */
static const char *limit = "";

/* Each rank adds (rank + 1) * i + 0.5; integers and halves sum exactly. */
static void test_sum_doubles(size_t n) {
    int size = dist_size(), rank = dist_rank();
    double *x = malloc(sizeof(double) * (n + GUARD));
    for (size_t i = 0; i < n; i++) x[i] = (double)(rank + 1) * (double)i + 0.5;
    for (size_t i = n; i < n + GUARD; i++) x[i] = SENTINEL;
    dist_sum_doubles(x, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= x[i] == (double)i * size * (size + 1) / 2 + 0.5 * size;
    for (size_t i = n; i < n + GUARD; i++) ok &= x[i] == SENTINEL;
    test_check(ok, "dist_sum_doubles: every element summed once, nothing past n written", "rank %d of %d, n %zu, %s",
               rank, size, n, limit);
    free(x);
}

/* Each rank's part holds 0.25 i, the rest -1 (as a rank's own draws of
 * the initial weights leave it): afterwards 0.25 i everywhere. */
static void test_share_partitions(size_t n) {
    float *x = malloc(sizeof(float) * (n + GUARD));
    size_t first, count;
    dist_partition(n, dist_rank(), dist_size(), &first, &count);
    for (size_t i = 0; i < n; i++) x[i] = i >= first && i < first + count ? 0.25f * (float)i : -1.0f;
    for (size_t i = n; i < n + GUARD; i++) x[i] = (float)SENTINEL;
    dist_share_partitions(x, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= x[i] == 0.25f * (float)i;
    for (size_t i = n; i < n + GUARD; i++) ok &= x[i] == (float)SENTINEL;
    test_check(ok, "dist_share_partitions: every rank's part everywhere, nothing past n written",
               "rank %d of %d, n %zu, %s", dist_rank(), dist_size(), n, limit);
    free(x);
}

/* Gradients in spans of uneven sizes through the bucketed all-reduce, as
 * backward drives it: every block's hook from the last block down, then
 * finish. Spans of blocks 2, 1, 0 and the embedding's (-1) mimic a model. */
static void test_reducer(bool overlap) {
    enum { N_SPANS = 7 };
    const size_t sizes[N_SPANS] = {13, 5, 40, 1, 17, 64, 9};
    const int ready[N_SPANS] = {-1, 0, 0, 1, 1, 2, 2};
    dist_span spans[N_SPANS];
    size_t n = 0;
    for (int i = 0; i < N_SPANS; i++) {
        spans[i] = (dist_span){n, sizes[i], ready[i]};
        n += sizes[i];
    }
    float *grads = malloc(sizeof(float) * (n + GUARD));
    int size = dist_size(), rank = dist_rank();
    for (size_t i = 0; i < n; i++) grads[i] = (float)((rank + 1) * (int)(i % 13));
    for (size_t i = n; i < n + GUARD; i++) grads[i] = (float)SENTINEL;
    dist_reducer *r = dist_reducer_create(grads, n, spans, N_SPANS, 0.0001, overlap);
    for (int layer = 2; layer >= 0; layer--) dist_reducer_block_done(r, layer);
    dist_reducer_finish(r);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= grads[i] == (float)((int)(i % 13) * size * (size + 1) / 2);
    for (size_t i = n; i < n + GUARD; i++) ok &= grads[i] == (float)SENTINEL;
    test_check(ok,
               overlap ? "dist_reducer (overlap): every gradient summed once"
                       : "dist_reducer (no overlap): every gradient summed once",
               "rank %d of %d, %s", rank, size, limit);
    dist_reducer_free(r);
    free(grads);
}

/* dist_partition covers n exactly once, in rank order. */
static void test_partition(void) {
    bool ok = true;
    for (size_t n = 0; n < 20; n++)
        for (int ranks = 1; ranks <= 5; ranks++) {
            size_t next = 0;
            for (int q = 0; q < ranks; q++) {
                size_t first, count;
                dist_partition(n, q, ranks, &first, &count);
                ok &= first == next;
                next = first + count;
            }
            ok &= next == n;
        }
    test_check(ok, "dist_partition: contiguous parts in rank order covering every element once", "rank %d of %d, %s",
               dist_rank(), dist_size(), limit);
}

static void run_all(const char *limit_name) {
    limit = limit_name;
    size_t sizes[] = {0, 1, 5, 6, 7, 100, 1001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        test_sum_doubles(sizes[k]);
        test_share_partitions(sizes[k]);
    }
    test_reducer(false);
    test_reducer(true);
    test_partition();
}

/* Once more under mpirun when started as a single process; when mpirun is
 * missing, carry on with one rank (the pieces still cover the arrays). */
static void relaunch_under_mpirun(char **argv) {
    if (getenv(RELAUNCH_MARK)) return;
    setenv(RELAUNCH_MARK, "3", 1);
    char *args[] = {"mpirun", "--oversubscribe", "-np", "3", argv[0], NULL};
    execvp(args[0], args);
    perror("test_dist: mpirun not started, testing one rank");
}

/* dist_node_cpus ORs the node's masks: each rank pinned to the (rank mod
 * n)-th of the n CPUs it may use, the node's ranks together use min(ranks,
 * n) of them; then the masks as they were. */
static void test_node_cpus(void) {
    cpu_set_t mine, one;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
        test_skip("dist_node_cpus", "sched_getaffinity failed");
        return;
    }
    int n = CPU_COUNT(&mine), want = dist_rank() % n, seen = 0, cpu = 0;
    for (; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &mine) && seen++ == want) break;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    bool pinned = sched_setaffinity(0, sizeof one, &one) == 0;
    int together = dist_node_cpus(), expected = dist_size() < n ? dist_size() : n;
    test_check(pinned && together == expected, "dist_node_cpus: the node's ranks' CPUs together",
               "rank %d pinned to CPU %d: %d CPUs, expected %d", dist_rank(), cpu, together, expected);
    sched_setaffinity(0, sizeof mine, &mine);
    together = dist_node_cpus();
    test_check(together >= n, "dist_node_cpus: at least this rank's own CPUs", "%d of %d", together, n);
}

int main(int argc, char **argv) {
    relaunch_under_mpirun(argv);
    cmd_dist_init(&argc, &argv);
    run_all("the default limit");
    dist_set_max_message_bytes(24); /* 3 doubles, 6 floats per MPI call */
    run_all("24-byte messages");
    dist_set_max_message_bytes(4); /* one float per gradient bucket */
    run_all("4-byte messages");
    int rank = dist_rank(), size = dist_size();
    test_check(dist_node_ranks() == size, "dist_node_ranks: all ranks of this test share the node", "rank %d of %d",
               rank, size);
    test_check(dist_max_double((double)rank) == (double)(size - 1), "dist_max_double", "rank %d of %d", rank, size);
    test_node_cpus();
    test_check(dist_any(rank == size - 1), "dist_any", "rank %d of %d", rank, size);
    /* Every rank exits with the verdict of all, so that a failure on one
     * rank cannot hide behind another's pass: the most failures of any rank,
     * and the fewest checks (a rank that ran none fails the test). Rank 0
     * prints the summary. */
    test_counts.failed = (int)dist_max_double((double)test_counts.failed);
    test_counts.checks = -(int)dist_max_double(-(double)test_counts.checks);
    char suite[64];
    snprintf(suite, sizeof suite, "test_dist (worst of %d rank(s))", size);
    int rc = test_summary(rank == 0 ? suite : NULL);
    dist_finalize();
    return rc;
}
