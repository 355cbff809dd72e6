/* The collectives of dist.c split size_t counts into pieces of one MPI call
 * each (docs/design.md §8.3). A real > 2^31-element message is too big for a
 * test, so the test lowers the per-call limit (dist_set_max_message_bytes) to
 * a few elements and checks that sums, broadcasts and the gradient buckets
 * still cover every element exactly once. Started on its own, the test runs
 * itself again under `mpirun -np 3`, since on one rank the collectives are
 * no-ops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "momfmm/cmd_common.h"
#include "momfmm/common.h"
#include "momfmm/dist.h"
#include "momfmm/model.h"

#define RELAUNCH_MARK "MOMFMM_TEST_DIST_RANKS"
#define GUARD 4
#define SENTINEL -7.0

static int failures;

static void check(bool ok, const char *what) {
    if (!ok) {
        failures++;
        fprintf(stderr, "rank %d: FAIL %s\n", process_rank(), what);
    }
}

/* Each rank adds (rank + 1) * i + 0.5; integers and halves sum exactly. */
static void test_sum_doubles(size_t n) {
    int size = process_count(), rank = process_rank();
    double *x = malloc(sizeof(double) * (n + GUARD));
    for (size_t i = 0; i < n; i++) x[i] = (double)(rank + 1) * (double)i + 0.5;
    for (size_t i = n; i < n + GUARD; i++) x[i] = SENTINEL;
    dist_sum_doubles(x, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= x[i] == (double)i * size * (size + 1) / 2 + 0.5 * size;
    for (size_t i = n; i < n + GUARD; i++) ok &= x[i] == SENTINEL;
    check(ok, "dist_sum_doubles: every element summed once, nothing past n written");
    free(x);
}

static void test_broadcast_floats(size_t n) {
    float *x = malloc(sizeof(float) * (n + GUARD));
    for (size_t i = 0; i < n; i++) x[i] = process_rank() == 0 ? 0.25f * (float)i : -1.0f;
    for (size_t i = n; i < n + GUARD; i++) x[i] = (float)SENTINEL;
    dist_broadcast_floats(x, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= x[i] == 0.25f * (float)i;
    for (size_t i = n; i < n + GUARD; i++) ok &= x[i] == (float)SENTINEL;
    check(ok, "dist_broadcast_floats: rank 0's values everywhere, nothing past n written");
    free(x);
}

/* A small model's gradients through the bucketed all-reduce, as backward
 * drives it: every block's hook from the last block down, then finish. */
static void test_grad_reducer(bool overlap) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 11, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 24, cfg.seq_len = 8;
    model m;
    model_create(&m, &cfg, NULL);
    int size = process_count(), rank = process_rank();
    for (size_t i = 0; i < m.n_params; i++) m.grads[i] = (float)((rank + 1) * (int)(i % 13));
    grad_reducer *r = grad_reducer_create(&m, 0.0001, overlap);
    backward_hooks hooks = grad_reducer_hooks(r);
    for (int layer = m.L - 1; layer >= 0; layer--) hooks.block_done(hooks.ctx, layer);
    grad_reducer_finish(r);
    bool ok = true;
    for (size_t i = 0; i < m.n_params; i++) ok &= m.grads[i] == (float)((int)(i % 13) * size * (size + 1) / 2);
    check(ok, overlap ? "grad_reducer (overlap): every gradient summed once"
                      : "grad_reducer (no overlap): every gradient summed once");
    grad_reducer_free(r);
    model_free(&m);
}

static void run_all(const char *limit) {
    size_t sizes[] = {0, 1, 5, 6, 7, 100, 1001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        test_sum_doubles(sizes[k]);
        test_broadcast_floats(sizes[k]);
    }
    test_grad_reducer(false);
    test_grad_reducer(true);
    if (process_rank() == 0) printf("checked with %s\n", limit);
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

int main(int argc, char **argv) {
    relaunch_under_mpirun(argv);
    dist_init(&argc, &argv);
    run_all("the default limit");
    dist_set_max_message_bytes(24); /* 3 doubles, 6 floats per MPI call */
    run_all("24-byte messages");
    dist_set_max_message_bytes(4); /* one float per gradient bucket */
    run_all("4-byte messages");
    check(dist_node_ranks() == process_count(), "dist_node_ranks: all ranks of this test share the node");
    check(dist_max_double((double)process_rank()) == (double)(process_count() - 1), "dist_max_double");
    check(dist_any(process_rank() == process_count() - 1), "dist_any");
    int fails = (int)dist_max_double((double)failures);
    if (process_rank() == 0) printf("%s on %d rank(s): %d failure(s)\n", fails ? "FAILED" : "PASSED", process_count(), fails);
    dist_finalize();
    return fails != 0;
}
