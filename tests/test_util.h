/* The one check helper of the C unit tests (after Redis's testhelp.h): every
 * check goes through test_check, which prints one line and counts it, and a
 * test's main ends with `return test_summary("test_x")`. A single recording
 * path means a check cannot be computed and then dropped, and the exit
 * status is decided in one place.
 *
 *   test_check(ok, name, detail_fmt, ...)  any condition; detail_fmt may be NULL
 *   test_within(name, err, bound)          an error against its bound (NaN fails)
 *   test_skip(name, why)                   a check this build or CPU cannot run
 *   fd_check(...)                          central finite differences (below)
 *   test_scratch_make(suite), test_path(name), test_scratch_remove()
 *                                          a scratch directory for files (below)
 *   test_summary(suite)                    prints the counts, returns the status
 *
 * Everything is static inline: each test is one translation unit with its
 * own counters, and a test that uses only part of the header must not trip
 * -Werror=unused-function. */
#ifndef MOMFMM_TEST_UTIL_H
#define MOMFMM_TEST_UTIL_H
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Checks recorded and failed so far in this test binary. A parallel test
 * replaces them with the counts of all ranks before test_summary. */
static struct { int checks, failed; } test_counts;

/* Width of the name column, wide enough for most names so that the
 * verdicts line up; longer names push their verdict right. */
enum { TEST_NAME_WIDTH = 56 };

/* Records one check and prints `name  ok|FAIL  detail` (detail_fmt NULL:
 * no detail). Returns ok, so that a test can stop where a failed step
 * leaves nothing to check: `if (!test_check(...)) return;`. */
static inline __attribute__((format(printf, 3, 4))) bool test_check(bool ok, const char *name, const char *detail_fmt,
                                                                    ...) {
    test_counts.checks++;
    if (!ok) test_counts.failed++;
    printf("%-*s %s", TEST_NAME_WIDTH, name, ok ? "ok" : "FAIL");
    if (detail_fmt) {
        printf(ok ? "    " : "  ");
        va_list ap;
        va_start(ap, detail_fmt);
        vprintf(detail_fmt, ap);
        va_end(ap);
    }
    putchar('\n');
    /* Line by line, so that a crash later in the test still shows every
     * verdict before it, and the ranks of test_dist do not split lines. */
    fflush(stdout);
    return ok;
}

/* err <= bound, written so that a NaN error fails. */
static inline bool test_within(const char *name, double err, double bound) {
    return test_check(err <= bound, name, "err %.3e  bound %.3e", err, bound);
}

/* Not a check (not counted): says why one could not run here. */
static inline void test_skip(const char *name, const char *why) {
    printf("%-*s skipped (%s)\n", TEST_NAME_WIDTH, name, why);
    fflush(stdout);
}

/* Prints "suite: N checks, F failed" (suite NULL: prints nothing, for the
 * ranks other than the one that reports) and returns the exit status: 0
 * only if at least one check ran and none failed. A test that ran no check
 * at all (a loop over an empty list, an early return) must not pass. */
static inline int test_summary(const char *suite) {
    if (suite)
        printf("%s: %d checks, %d failed%s\n", suite, test_counts.checks, test_counts.failed,
               test_counts.checks == 0 ? " (no check ran)" : "");
    return test_counts.checks > 0 && test_counts.failed == 0 ? 0 : 1;
}

/* ---- A scratch directory for the tests that write files ----
 * One per test binary: test_scratch_make("test_x") makes a fresh
 * /tmp/test_x_XXXXXX, test_path("name") names a file in it, and
 * test_scratch_remove() removes it with everything in it; making and
 * removing it are checks. The last four paths test_path returned stay
 * valid, so that one call may take several. */
enum { TEST_SCRATCH_MAX = 128 };

static inline char *test_scratch_dir(void) {
    static char dir[TEST_SCRATCH_MAX];
    return dir;
}

static inline bool test_scratch_make(const char *suite) {
    char *dir = test_scratch_dir();
    snprintf(dir, TEST_SCRATCH_MAX, "/tmp/%s_XXXXXX", suite);
    return test_check(mkdtemp(dir) != NULL, "scratch directory made", "%s", dir);
}

static inline const char *test_path(const char *name) {
    static char path[4][512];
    static int next;
    next = (next + 1) % 4;
    snprintf(path[next], sizeof path[next], "%s/%s", test_scratch_dir(), name);
    return path[next];
}

static inline void test_scratch_remove(void) {
    char command[TEST_SCRATCH_MAX + 16];
    snprintf(command, sizeof command, "rm -rf '%s'", test_scratch_dir());
    test_check(system(command) == 0, "scratch directory removed", "%s", test_scratch_dir());
}

/* ---- Central finite differences against an analytic gradient ----
 * Each kernel test defines a scalar loss L = sum(out * w) (w random, fixed),
 * so that dL/dout = w feeds the backward under test. */

typedef double (*fd_loss_fn)(void *ctx);

/* A fixed LCG: the tests' inputs are the same on every machine and run. */
static inline float fd_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* x[i] uniform in [-scale, scale). */
static inline void fd_fill(float *x, size_t n, float scale, uint64_t *state) {
    for (size_t i = 0; i < n; i++) x[i] = scale * fd_uniform(state);
}

/* n floats uniform in [-scale, scale), malloc'd (the caller frees them). */
static inline float *fd_random(size_t n, float scale, uint64_t *state) {
    float *x = malloc(sizeof(float) * n);
    if (x) fd_fill(x, n, scale, state);
    return x;
}

/* Largest |a - b| relative to max |b| (1 when b is all zero). */
static inline double test_rel_error(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / (scale > 0 ? scale : 1);
}

/* Accumulated in double, so that the loss itself adds little rounding. */
static inline double fd_dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* Perturbs each x[i] by +-eps and compares (L+ - L-)/2eps with analytic[i];
 * records one check that passes when max |num - ana| <= tol * max(max|ana|,
 * 1e-3) (relative to the gradient's scale, with a floor so that a vanishing
 * gradient is not held to rounding noise). Returns whether it passed. */
static inline bool fd_check(const char *name, float *x, const float *analytic, size_t n, fd_loss_fn loss, void *ctx,
                            double eps, double tol) {
    double max_err = 0, max_ana = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        x[i] = saved + (float)eps;
        double lp = loss(ctx);
        x[i] = saved - (float)eps;
        double lm = loss(ctx);
        x[i] = saved;
        double num = (lp - lm) / (2 * eps);
        double err = fabs(num - analytic[i]);
        if (!(err <= max_err)) {
            max_err = err;
            worst = i;
        } /* NaN counts as the worst */
        if (isnan(err)) break;
        if (fabs(analytic[i]) > max_ana) max_ana = fabs(analytic[i]);
    }
    double bound = tol * (max_ana > 1e-3 ? max_ana : 1e-3);
    return test_check(max_err <= bound, name, "max_err %.3e (at %zu)  max|grad| %.3e  bound %.3e", max_err, worst,
                      max_ana, bound); /* false for NaN */
}
#endif
