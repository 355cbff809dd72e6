/* Central finite differences against an analytic gradient, for kernel tests.
 * Each test defines a scalar loss L = sum(out * w) (w random, fixed), so that
 * dL/dout = w feeds the backward under test. */
#ifndef MOMFMM_FD_CHECK_H
#define MOMFMM_FD_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>

typedef double (*fd_loss_fn)(void *ctx);

static inline float fd_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static inline void fd_fill(float *x, size_t n, float scale, uint64_t *state) {
    for (size_t i = 0; i < n; i++) x[i] = scale * fd_uniform(state);
}

static inline double fd_dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* Perturbs each x[i] by +-eps, compares (L+ - L-)/2eps with analytic[i].
 * Passes when max |num - ana| <= tol * max(max|ana|, 1e-3). Returns 0 on pass. */
static inline int fd_check(const char *name, float *x, const float *analytic,
                           size_t n, fd_loss_fn loss, void *ctx, double eps,
                           double tol) {
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
        if (!(err <= max_err)) { max_err = err; worst = i; } /* NaN counts as the worst */
        if (isnan(err)) break;
        if (fabs(analytic[i]) > max_ana) max_ana = fabs(analytic[i]);
    }
    double bound = tol * (max_ana > 1e-3 ? max_ana : 1e-3);
    int ok = max_err <= bound; /* false for NaN */
    printf("%-40s %s  max_err %.3e (at %zu)  max|grad| %.3e  bound %.3e\n", name,
           ok ? "ok  " : "FAIL", max_err, worst, max_ana, bound);
    return ok ? 0 : 1;
}
#endif
