/* Tests of the momentum shear (docs/model.md §1.2): finite differences of dx and dgamma,
 * a double-precision reference forward, the identity at zero coefficients and
 * segmented (streaming) forwards.  One line per check (tests/test_util.h). */
#include "attention/momentum.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static float *alloc_f(size_t n) {
    float *a = calloc(n ? n : 1, sizeof *a);
    if (!a) {
        perror("calloc");
        exit(2);
    }
    return a;
}

static momentum_coeffs coeffs(float gamma, float beta, float gamma2) {
    momentum_coeffs c = {gamma, beta, gamma2};
    return c;
}

/* Reference forward in double, written straight from docs/model.md §1.2 with one column
 * at a time.  p_init (NULL: p_{-1} = 0) is the extra state a stream carries. */
static void naive_forward(const float *x, const float *prev, const double *p_init, double *xhat, double *p,
                          momentum_coeffs c, int T, int dh) {
    for (int i = 0; i < dh; i++) {
        double pm = p_init ? p_init[i] : 0.0;
        for (int t = 0; t < T; t++) {
            double xt = x[(size_t)t * dh + i], d;
            if (t > 0) d = xt - x[(size_t)(t - 1) * dh + i];
            else d = prev ? xt - prev[i] : 0.0;
            double pt = d + (double)c.beta * pm;
            double at = pt - pm;
            xhat[(size_t)t * dh + i] = xt + (double)c.gamma * pt + (double)c.gamma2 * at;
            p[(size_t)t * dh + i] = pt;
            pm = pt;
        }
    }
}

/* ---- finite differences: L = sum(xhat * w) ---- */
typedef struct {
    int T, dh;
    momentum_coeffs c;
    float *x, *prev, *w, *xhat; /* prev NULL = anchored */
} fd_ctx;

static double fd_loss(void *v) {
    fd_ctx *k = v;
    momentum_shear_forward(k->x, k->prev, NULL, k->xhat, NULL, k->c, k->T, k->dh);
    return fd_dot(k->xhat, k->w, (size_t)k->T * k->dh);
}

static void fd_case(const char *name, int T, int dh, momentum_coeffs c, int anchored, uint64_t seed) {
    size_t n = (size_t)T * dh;
    fd_ctx k = {T, dh, c, alloc_f(n), anchored ? NULL : alloc_f(dh), alloc_f(n), alloc_f(n)};
    float *p = alloc_f(n), *dx = alloc_f(n), *dx0 = alloc_f(n), *ana = alloc_f(n);
    float *scratch = alloc_f(dh);
    fd_fill(k.x, n, 1.0f, &seed);
    if (k.prev) fd_fill(k.prev, dh, 1.0f, &seed);
    fd_fill(k.w, n, 1.0f, &seed);
    fd_fill(dx0, n, 1.0f, &seed); /* the backward must add, not overwrite */
    memcpy(dx, dx0, n * sizeof *dx);
    const float dg0 = 0.75f;
    float dg = dg0;

    momentum_shear_forward(k.x, k.prev, NULL, k.xhat, p, c, T, dh);
    momentum_shear_backward(k.w, p, dx, &dg, c, anchored, NULL, NULL, scratch, T, dh);
    for (size_t i = 0; i < n; i++) ana[i] = dx[i] - dx0[i];
    float dg_ana = dg - dg0;

    /* L is linear in x and in gamma, so a large eps is exact up to rounding. */
    char label[128];
    snprintf(label, sizeof label, "fd dx     %s", name);
    fd_check(label, k.x, ana, n, fd_loss, &k, 1e-2, 2e-3);
    snprintf(label, sizeof label, "fd dgamma %s", name);
    fd_check(label, &k.c.gamma, &dg_ana, 1, fd_loss, &k, 1e-2, 2e-3);

    free(k.x);
    free(k.prev);
    free(k.w);
    free(k.xhat);
    free(p);
    free(dx);
    free(dx0);
    free(ana);
    free(scratch);
}

/* ---- forward against the double reference, including the p output ---- */
static void forward_case(const char *name, int T, int dh, momentum_coeffs c, int anchored, uint64_t seed) {
    size_t n = (size_t)T * dh;
    float *x = alloc_f(n), *prev = anchored ? NULL : alloc_f(dh);
    float *xhat = alloc_f(n), *xhat2 = alloc_f(n), *p = alloc_f(n);
    double *rx = malloc(n * sizeof *rx), *rp = malloc(n * sizeof *rp);
    if (!rx || !rp) {
        perror("malloc");
        exit(2);
    }
    fd_fill(x, n, 2.0f, &seed);
    if (prev) fd_fill(prev, dh, 2.0f, &seed);
    momentum_shear_forward(x, prev, NULL, xhat, p, c, T, dh);
    momentum_shear_forward(x, prev, NULL, xhat2, NULL, c, T, dh); /* p == NULL path */
    naive_forward(x, prev, NULL, rx, rp, c, T, dh);
    double ex = 0, ep = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(xhat[i] - rx[i]) / (1 + fabs(rx[i]));
        if (e > ex) ex = e;
        e = fabs(p[i] - rp[i]) / (1 + fabs(rp[i]));
        if (e > ep) ep = e;
    }
    int same = memcmp(xhat, xhat2, n * sizeof *xhat) == 0;
    char label[128];
    snprintf(label, sizeof label, "fwd vs ref %s%s", name, same ? "" : " (p=NULL differs)");
    test_check(same && ex <= 1e-5 && ep <= 1e-5, label, "rel err xhat %.2e  p %.2e", ex, ep);
    free(x);
    free(prev);
    free(xhat);
    free(xhat2);
    free(p);
    free(rx);
    free(rp);
}

/* ---- gamma = beta = gamma2 = 0: xhat is x bit for bit (even -0.0) ---- */
static void identity_case(void) {
    enum { T = 6, DH = 7, N = T * DH };
    float x[N], xhat[N], xhat2[N], p[N], prev[DH];
    uint64_t seed = 11;
    fd_fill(x, N, 3.0f, &seed);
    fd_fill(prev, DH, 3.0f, &seed);
    x[0] = -0.0f;
    x[9] = -0.0f;
    x[10] = 1e30f;
    x[11] = -1e-40f; /* denormal */
    momentum_coeffs z = coeffs(0, 0, 0);
    momentum_shear_forward(x, NULL, NULL, xhat, p, z, T, DH);
    momentum_shear_forward(x, prev, NULL, xhat2, NULL, z, T, DH);
    test_check(memcmp(x, xhat, sizeof x) == 0 && memcmp(x, xhat2, sizeof x) == 0, "zero coeffs: xhat == x bitwise",
               NULL);
}

/* ---- d_gamma == NULL and p == NULL give the same dx ---- */
static void backward_null_case(void) {
    enum { T = 5, DH = 6, N = T * DH };
    float x[N], xhat[N], p[N], g[N], dx1[N], dx2[N], scratch[DH];
    uint64_t seed = 12;
    fd_fill(x, N, 1.0f, &seed);
    fd_fill(g, N, 1.0f, &seed);
    fd_fill(dx1, N, 1.0f, &seed);
    memcpy(dx2, dx1, sizeof dx1);
    momentum_coeffs c = coeffs(0.3f, 0.5f, 0.1f);
    float dg = 0;
    momentum_shear_forward(x, NULL, NULL, xhat, p, c, T, DH);
    momentum_shear_backward(g, p, dx1, &dg, c, 1, NULL, NULL, scratch, T, DH);
    momentum_shear_backward(g, NULL, dx2, NULL, c, 1, NULL, NULL, scratch, T, DH);
    test_check(memcmp(dx1, dx2, sizeof dx1) == 0, "bwd: p/d_gamma NULL gives same dx", NULL);
}

/* ---- segmentation with beta = gamma2 = 0: [0,T1) then [T1,T) with
 * prev = x_{T1-1} equals the whole sequence bit for bit ---- */
static void segment_case(const char *name, int anchored, momentum_coeffs c) {
    enum { T = 10, T1 = 4, DH = 5, N = T * DH };
    float x[N], buf[DH], whole[N], pw[N], seg[N], ps[N];
    uint64_t seed = 13;
    fd_fill(x, N, 1.0f, &seed);
    fd_fill(buf, DH, 1.0f, &seed);
    const float *prev = anchored ? NULL : buf;
    momentum_shear_forward(x, prev, NULL, whole, pw, c, T, DH);
    momentum_shear_forward(x, prev, NULL, seg, ps, c, T1, DH);
    momentum_shear_forward(x + T1 * DH, x + (T1 - 1) * DH, ps + (T1 - 1) * DH, seg + T1 * DH, ps + T1 * DH, c, T - T1,
                           DH);
    test_check(memcmp(whole, seg, sizeof whole) == 0 && memcmp(pw, ps, sizeof pw) == 0, name, NULL);
}

/* ---- with beta, gamma2 != 0 a stream must carry (x_{T1-1}, p_{T1-1}),
 * and carrying x alone is not enough (checked on the reference) ---- */
static void stream_state_case(void) {
    enum { T = 10, T1 = 4, DH = 5, N = T * DH };
    float x[N];
    double whole[N], pw[N], seg[N], ps[N], seg_noc[N], ps_noc[N];
    uint64_t seed = 14;
    fd_fill(x, N, 1.0f, &seed);
    momentum_coeffs c = coeffs(0.3f, 0.5f, 0.1f);
    naive_forward(x, NULL, NULL, whole, pw, c, T, DH);
    naive_forward(x, NULL, NULL, seg, ps, c, T1, DH);
    naive_forward(x + T1 * DH, x + (T1 - 1) * DH, ps + (T1 - 1) * DH, seg + T1 * DH, ps + T1 * DH, c, T - T1, DH);
    naive_forward(x + T1 * DH, x + (T1 - 1) * DH, NULL, seg_noc, ps_noc, c, T - T1, DH);
    double e = 0, e_noc = 0;
    for (int i = T1 * DH; i < N; i++) {
        if (fabs(seg[i] - whole[i]) > e) e = fabs(seg[i] - whole[i]);
        if (fabs(seg_noc[i - T1 * DH] - whole[i]) > e_noc) e_noc = fabs(seg_noc[i - T1 * DH] - whole[i]);
    }
    test_check(e == 0 && e_noc > 1e-3, "ref stream carrying (prev, p_{-1})", "max diff %.2e  (prev only: %.2e)", e,
               e_noc);
}

int main(void) {
    fd_case("g=0.2 anchored", 7, 5, coeffs(0.2f, 0, 0), 1, 1);
    fd_case("g=0.2 unanchored", 7, 5, coeffs(0.2f, 0, 0), 0, 2);
    fd_case("g=0.2 b=0.5", 7, 5, coeffs(0.2f, 0.5f, 0), 1, 3);
    fd_case("g=0.2 g2=0.1", 7, 5, coeffs(0.2f, 0, 0.1f), 1, 4);
    fd_case("all g=.3 b=.5 g2=.1 unanch", 9, 70, coeffs(0.3f, 0.5f, 0.1f), 0, 5);
    fd_case("all, anchored", 9, 6, coeffs(0.3f, 0.5f, 0.1f), 1, 6);
    fd_case("T=1 all, anchored", 1, 5, coeffs(0.3f, 0.5f, 0.1f), 1, 7);
    fd_case("T=1 all, unanchored", 1, 5, coeffs(0.3f, 0.5f, 0.1f), 0, 8);

    forward_case("g=.2 anch", 7, 5, coeffs(0.2f, 0, 0), 1, 21);
    forward_case("all unanch dh=130", 33, 130, coeffs(0.3f, 0.5f, 0.1f), 0, 22);
    forward_case("all anch dh=64", 16, 64, coeffs(-0.4f, 0.9f, 0.25f), 1, 23);
    forward_case("g=0 b=.5 (p still out)", 8, 3, coeffs(0, 0.5f, 0), 0, 24);
    forward_case("T=1 unanch", 1, 9, coeffs(0.3f, 0.5f, 0.1f), 0, 25);

    identity_case();
    backward_null_case();
    segment_case("segmented == whole (anchored)", 1, coeffs(0.3f, 0, 0));
    segment_case("segmented == whole (unanchored)", 0, coeffs(0.3f, 0, 0));
    segment_case("segmented, carried p: b=.5 g2=.1 anchored", 1, coeffs(0.3f, 0.5f, 0.1f));
    segment_case("segmented, carried p: b=.5 g2=.1 unanchored", 0, coeffs(0.3f, 0.5f, 0.1f));
    stream_state_case();

    return test_summary("test_momentum");
}
