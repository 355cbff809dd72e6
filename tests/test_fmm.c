/* Tests of the FMM attention kernels (src/attention/fmm_head.c, fmm_near.c, fmm_far.c; docs/model.md §1.3).
 *   test_fmm          run every check, one line each; exit 1 on any failure
 *   test_fmm --bench  time fmm_head_forward + fmm_head_backward per token */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include "attention/fmm.h"
#include "config/config.h"
#include "fmm_test_settings.h"
#include "kernels/tile_gemm.h"
#include "kernels/tiled_softmax.h"
#include "test_util.h"

#include <cblas.h> /* openblas_get_corename, for the benchmark header */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* One head's inputs, outputs and buffers                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    fmm_settings s;
    int T, dh;
    float blend_near, blend_far;
    float *q, *k, *v, *w; /* inputs; w = dL/dout of L = Σ out·w */
    float *out, *saved, *scratch;
    float *dq, *dk, *dv;
    float d_blend_near, d_blend_far;
} fmm_case;

static fmm_settings settings(int bandwidth, bool causal, const char *kernels, int chunk) {
    return fmm_test_settings(bandwidth, causal, kernels, chunk);
}

/* The same with the band allowed on tiles (attention.impl = tiled). */
static fmm_settings on_tiles(fmm_settings s) {
    s.band_tiles = true;
    return s;
}

static float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) {
        perror("calloc");
        exit(2);
    }
    return p;
}

static void case_init(fmm_case *c, fmm_settings s, int T, int dh, uint64_t seed, float qk_scale, float blend_near,
                      float blend_far) {
    size_t n = (size_t)T * dh;
    memset(c, 0, sizeof *c);
    c->s = s;
    c->T = T;
    c->dh = dh;
    c->blend_near = blend_near;
    c->blend_far = blend_far;
    c->q = alloc_floats(n);
    c->k = alloc_floats(n);
    c->v = alloc_floats(n);
    c->w = alloc_floats(n);
    c->out = alloc_floats(n);
    c->dq = alloc_floats(n);
    c->dk = alloc_floats(n);
    c->dv = alloc_floats(n);
    c->saved = alloc_floats(fmm_head_saved_floats(&s, T, dh));
    c->scratch = alloc_floats(fmm_head_scratch_floats(&s, T, dh));
    fd_fill(c->q, n, qk_scale, &seed);
    fd_fill(c->k, n, qk_scale, &seed);
    fd_fill(c->v, n, 1.0f, &seed);
    fd_fill(c->w, n, 1.0f, &seed);
}

static void case_free(fmm_case *c) {
    float *bufs[] = {c->q, c->k, c->v, c->w, c->out, c->saved, c->scratch, c->dq, c->dk, c->dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static void case_forward(fmm_case *c) {
    fmm_head_forward(&c->s, NULL, c->q, c->k, c->v, c->blend_near, c->blend_far, c->out, c->saved, c->scratch, c->T,
                     c->dh);
}

static void case_backward(fmm_case *c) {
    c->d_blend_near = c->d_blend_far = 0.0f;
    fmm_head_backward(&c->s, NULL, c->q, c->k, c->v, c->blend_near, c->blend_far, c->saved, c->w, c->dq, c->dk, c->dv,
                      &c->d_blend_near, &c->d_blend_far, c->scratch, c->T, c->dh);
}

static double case_loss(void *ctx) {
    fmm_case *c = ctx;
    case_forward(c);
    return fd_dot(c->out, c->w, (size_t)c->T * c->dh);
}

/* ------------------------------------------------------------------------ */
/* Naive O(T²) double-precision reference of docs/model.md §1.3                        */
/* ------------------------------------------------------------------------ */

static double ref_feature(fmm_feature_map m, double x) {
    switch (m) {
    case FEATURE_ELU: return x > 0 ? x + 1 : exp(x);
    case FEATURE_ELU_FLIP: return -x > 0 ? -x + 1 : exp(-x);
    case FEATURE_TANH: return tanh(x) + 1;
    }
    return 0;
}

static bool in_band(const fmm_settings *s, int i, int j) {
    if (s->causal) return j <= i && j > i - s->bandwidth;
    return abs(i - j) < s->bandwidth;
}

static bool in_range(const fmm_settings *s, int i, int j) { return !s->causal || j <= i; }

static void ref_near_row(const fmm_case *c, int i, double *acc) {
    int T = c->T, dh = c->dh;
    double max = -DBL_MAX, sum = 0, *sc = calloc((size_t)T, sizeof *sc);
    for (int j = 0; j < T; j++) {
        if (!in_band(&c->s, i, j)) continue;
        sc[j] = fd_dot(c->q + (size_t)i * dh, c->k + (size_t)j * dh, dh) / sqrt(dh);
        if (sc[j] > max) max = sc[j];
    }
    for (int j = 0; j < T; j++)
        if (in_band(&c->s, i, j)) sum += exp(sc[j] - max);
    for (int j = 0; j < T; j++) {
        if (!in_band(&c->s, i, j)) continue;
        double p = exp(sc[j] - max) / sum;
        for (int d = 0; d < dh; d++) acc[d] += p * c->v[(size_t)j * dh + d];
    }
    free(sc);
}

static void ref_far_row(const fmm_case *c, fmm_feature_map m, int i, double *acc) {
    int dh = c->dh;
    double den = 0, *num = calloc((size_t)dh, sizeof *num), *fq = calloc((size_t)dh, sizeof *fq);
    for (int d = 0; d < dh; d++) fq[d] = ref_feature(m, c->q[(size_t)i * dh + d]);
    for (int j = 0; j < c->T; j++) {
        if (!in_range(&c->s, i, j)) continue;
        double a = 0;
        for (int d = 0; d < dh; d++) a += fq[d] * ref_feature(m, c->k[(size_t)j * dh + d]);
        den += a;
        for (int d = 0; d < dh; d++) num[d] += a * c->v[(size_t)j * dh + d];
    }
    for (int d = 0; d < dh; d++) acc[d] += num[d] / (den + c->s.eps);
    free(num);
    free(fq);
}

/* out = σ(bn)·near + σ(bf)·(1/r) Σ_l far_l, straight from the definition. */
static void ref_forward(const fmm_case *c, double *out) {
    int dh = c->dh, r = c->s.n_kernels;
    double sn = 1 / (1 + exp(-(double)c->blend_near));
    double sf = 1 / (1 + exp(-(double)c->blend_far));
    double *near = malloc((size_t)dh * sizeof *near), *far = malloc((size_t)dh * sizeof *far);
    for (int i = 0; i < c->T; i++) {
        memset(near, 0, (size_t)dh * sizeof *near);
        memset(far, 0, (size_t)dh * sizeof *far);
        if (c->s.bandwidth > 0) ref_near_row(c, i, near);
        for (int l = 0; l < r; l++) ref_far_row(c, c->s.kernels[l], i, far);
        for (int d = 0; d < dh; d++) out[(size_t)i * dh + d] = sn * near[d] + (r ? sf * far[d] / r : 0);
    }
    free(near);
    free(far);
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d)) return INFINITY; /* NaN must fail, not compare false */
        if (d > m) m = d;
    }
    return m;
}

/* ------------------------------------------------------------------------ */
/* Checks                                                                    */
/* ------------------------------------------------------------------------ */

/* fd_check's comparisons skip NaN (NaN > x is false), so check finiteness here. */
static void all_finite(const char *label, const fmm_case *c) {
    size_t n = (size_t)c->T * c->dh;
    bool ok = isfinite(c->d_blend_near) && isfinite(c->d_blend_far);
    for (size_t i = 0; i < n; i++)
        ok = ok && isfinite(c->out[i]) && isfinite(c->dq[i]) && isfinite(c->dk[i]) && isfinite(c->dv[i]);
    char name[96];
    snprintf(name, sizeof name, "fd %s finite output and gradients", label);
    test_check(ok, name, NULL);
}

/* Finite differences of L = Σ out·w w.r.t. q, k, v and both blend logits. */
static void fd_test(const char *label, fmm_settings s, int T, int dh, double eps) {
    fmm_case c;
    char name[96];
    size_t n = (size_t)T * dh;
    case_init(&c, s, T, dh, 0x5eed + (uint64_t)T * 31 + (uint64_t)s.bandwidth, 1.0f, 0.3f, -0.2f);
    case_forward(&c);
    case_backward(&c);
    all_finite(label, &c);
    const double tol = 1e-2;
    snprintf(name, sizeof name, "fd %s dq", label);
    fd_check(name, c.q, c.dq, n, case_loss, &c, eps, tol);
    snprintf(name, sizeof name, "fd %s dk", label);
    fd_check(name, c.k, c.dk, n, case_loss, &c, eps, tol);
    snprintf(name, sizeof name, "fd %s dv", label);
    fd_check(name, c.v, c.dv, n, case_loss, &c, eps, tol);
    snprintf(name, sizeof name, "fd %s d_blend_near", label);
    fd_check(name, &c.blend_near, &c.d_blend_near, 1, case_loss, &c, eps, tol);
    snprintf(name, sizeof name, "fd %s d_blend_far", label);
    fd_check(name, &c.blend_far, &c.d_blend_far, 1, case_loss, &c, eps, tol);
    case_free(&c);
}

static void fd_tests(void) {
    static const char *kernels[] = {"elu", "elu_flip", "tanh"};
    char label[64];
    for (int causal = 1; causal >= 0; causal--) {
        const char *tag = causal ? "causal" : "noncausal";
        snprintf(label, sizeof label, "near k3 %s T13", tag);
        fd_test(label, settings(3, causal, "", 4), 13, 8, 1e-2);
        for (int l = 0; l < 3; l++) {
            snprintf(label, sizeof label, "far %s %s T13 C4", kernels[l], tag);
            fd_test(label, settings(0, causal, kernels[l], 4), 13, 8, 1e-2);
        }
        for (int T = 13; T <= 16; T += 3) {
            snprintf(label, sizeof label, "blend k5 elu,elu_flip %s T%d C4", tag, T);
            fd_test(label, settings(5, causal, "elu,elu_flip", 4), T, 8, 3e-3);
        }
        /* dh = 6: the scalar tails after the vectorised blocks */
        snprintf(label, sizeof label, "blend k4 tanh,elu dh6 %s T11 C3", tag);
        fd_test(label, settings(4, causal, "tanh,elu", 3), 11, 6, 3e-3);
    }
}

static void reference_test_scaled(const char *label, fmm_settings s, int T, int dh, float qk_scale) {
    fmm_case c;
    case_init(&c, s, T, dh, 0xabc + (uint64_t)T, qk_scale, 0.4f, -0.7f);
    double *ref = malloc((size_t)T * dh * sizeof *ref);
    case_forward(&c);
    ref_forward(&c, ref);
    char name[96];
    snprintf(name, sizeof name, "reference %s", label);
    test_within(name, max_abs_diff(c.out, ref, (size_t)T * dh), 1e-5);
    free(ref);
    case_free(&c);
}

static void reference_test(const char *label, fmm_settings s, int T, int dh) {
    reference_test_scaled(label, s, T, dh, 1.0f);
}

static void reference_tests(void) {
    reference_test("causal k5 elu,elu_flip T37 C8", settings(5, true, "elu,elu_flip", 8), 37, 16);
    reference_test("noncausal k3 tanh T29 C8", settings(3, false, "tanh", 8), 29, 16);
    reference_test("causal k0 elu T64 C16", settings(0, true, "elu", 16), 64, 16);
    reference_test("noncausal k4 none T30", settings(4, false, "", 8), 30, 8);
    reference_test("causal k5 elu T1 (single position)", settings(5, true, "elu", 0), 1, 8);
    reference_test("noncausal k1 tanh T9 (diagonal band)", settings(1, false, "tanh", 4), 9, 8);
    reference_test("causal k3 all3 T23 dh12 C5", settings(3, true, "elu,elu_flip,tanh", 5), 23, 12);
    reference_test("noncausal k2 all3 T17 dh7 C5", settings(2, false, "tanh,elu_flip,elu", 5), 17, 7);
    reference_test("causal k100 all3 T50 C64", settings(100, true, "elu,tanh,elu_flip", 64), 50, 8);
    reference_test("noncausal k100 elu_flip T21", settings(100, false, "elu_flip", 5), 21, 8);
    reference_test("causal k5 elu,elu_flip T200 dh32 C64", settings(5, true, "elu,elu_flip", 64), 200, 32);
    reference_test("noncausal k5 elu,tanh T131 dh32 C0", settings(5, false, "elu,tanh", 0), 131, 32);
    /* scores of several hundred: exp overflows unless the row max is subtracted */
    reference_test_scaled("causal k6 elu q,k x20 T40", settings(6, true, "elu", 8), 40, 16, 20.0f);
    reference_test_scaled("noncausal k6 tanh q,k x20 T40", settings(6, false, "tanh", 8), 40, 16, 20.0f);
    /* long enough for the running state to sum many chunks */
    reference_test("causal k5 elu,elu_flip T2000 dh32 C64", settings(5, true, "elu,elu_flip", 64), 2000, 32);
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double m = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i] - b[i])) return INFINITY;
        if (fabs(a[i] - b[i]) > m) m = fabs(a[i] - b[i]);
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    return m / scale;
}

/* The chunk length only reorders float sums (docs/model.md §1.3 defines no chunking). */
static void chunk_invariance_test(const char *label, bool causal, const char *kernels) {
    const int T = 100, dh = 16, chunks[] = {4, 16, 100, 0};
    fmm_case base, c;
    char name[96];
    case_init(&base, settings(5, causal, kernels, chunks[0]), T, dh, 7, 1.0f, 0.1f, 0.5f);
    case_forward(&base);
    case_backward(&base);
    size_t n = (size_t)T * dh;
    for (int i = 1; i < 4; i++) {
        case_init(&c, settings(5, causal, kernels, chunks[i]), T, dh, 7, 1.0f, 0.1f, 0.5f);
        case_forward(&c);
        case_backward(&c);
        double err = rel_diff(c.out, base.out, n);
        double g = rel_diff(c.dq, base.dq, n);
        if (rel_diff(c.dk, base.dk, n) > g) g = rel_diff(c.dk, base.dk, n);
        if (rel_diff(c.dv, base.dv, n) > g) g = rel_diff(c.dv, base.dv, n);
        float bl[2] = {c.d_blend_near, c.d_blend_far};
        float bb[2] = {base.d_blend_near, base.d_blend_far};
        if (rel_diff(bl, bb, 2) > g) g = rel_diff(bl, bb, 2);
        snprintf(name, sizeof name, "chunk %s C4 vs C%d out", label, chunks[i]);
        test_within(name, err, 1e-5);
        snprintf(name, sizeof name, "chunk %s C4 vs C%d grads", label, chunks[i]);
        test_within(name, g, 1e-5);
        case_free(&c);
    }
    case_free(&base);
}

/* bandwidth >= T, causal, no kernels, blend logit 0: 0.5 · causal softmax. */
static void full_band_test(int bandwidth) {
    const int T = 24, dh = 16;
    fmm_case c;
    case_init(&c, settings(bandwidth, true, "", 8), T, dh, 99, 2.0f, 0.0f, 0.0f);
    case_forward(&c);
    double *ref = calloc((size_t)T * dh, sizeof *ref), *row = calloc((size_t)dh, sizeof *row);
    fmm_settings full = c.s;
    full.bandwidth = T; /* ref_near_row over j <= i: plain causal softmax */
    fmm_case plain = c;
    plain.s = full;
    for (int i = 0; i < T; i++) {
        memset(row, 0, (size_t)dh * sizeof *row);
        ref_near_row(&plain, i, row);
        for (int d = 0; d < dh; d++) ref[(size_t)i * dh + d] = 0.5 * row[d];
    }
    char name[64];
    snprintf(name, sizeof name, "full band k%d = 0.5 softmax", bandwidth);
    test_within(name, max_abs_diff(c.out, ref, (size_t)T * dh), 1e-6);
    free(ref);
    free(row);
    case_free(&c);
}

/* saved and scratch are caller-owned and scratch is reused across heads: the
 * kernels must fully overwrite what they read (NaN garbage must not leak
 * into the results) and must not write past the advertised sizes. */
static void buffer_contract_test(const char *label, fmm_settings s, int T) {
    const int dh = 8, pad = 64;
    fmm_case clean, dirty;
    case_init(&clean, s, T, dh, 3, 1.0f, 0.2f, -0.3f);
    case_init(&dirty, s, T, dh, 3, 1.0f, 0.2f, -0.3f);
    size_t n_saved = fmm_head_saved_floats(&s, T, dh);
    size_t n_scratch = fmm_head_scratch_floats(&s, T, dh);
    free(dirty.saved);
    free(dirty.scratch);
    dirty.saved = alloc_floats(n_saved + pad);
    dirty.scratch = alloc_floats(n_scratch + pad);
    for (size_t i = 0; i < n_saved + pad; i++) dirty.saved[i] = NAN;
    for (size_t i = 0; i < n_scratch + pad; i++) dirty.scratch[i] = NAN;
    float *grads[3] = {dirty.dq, dirty.dk, dirty.dv};
    for (int g = 0; g < 3; g++)
        for (size_t i = 0; i < (size_t)T * dh; i++) grads[g][i] = NAN; /* overwritten */
    case_forward(&clean);
    case_backward(&clean);
    case_forward(&dirty);
    for (size_t i = 0; i < n_scratch; i++) dirty.scratch[i] = NAN; /* another head ran */
    case_backward(&dirty);
    size_t n = (size_t)T * dh;
    bool same =
        memcmp(clean.out, dirty.out, n * sizeof(float)) == 0 && memcmp(clean.dq, dirty.dq, n * sizeof(float)) == 0 &&
        memcmp(clean.dk, dirty.dk, n * sizeof(float)) == 0 && memcmp(clean.dv, dirty.dv, n * sizeof(float)) == 0 &&
        clean.d_blend_near == dirty.d_blend_near && clean.d_blend_far == dirty.d_blend_far;
    bool tails = true;
    for (int i = 0; i < pad; i++)
        tails = tails && isnan(dirty.saved[n_saved + i]) && isnan(dirty.scratch[n_scratch + i]);
    char name[96];
    snprintf(name, sizeof name, "buffers %s", label);
    test_check(same && tails, name, "saved %zu  scratch %zu floats%s%s", n_saved, n_scratch,
               same ? "" : "  (results differ)", tails ? "" : "  (wrote past end)");
    case_free(&clean);
    case_free(&dirty);
}

/* A band of 48 keys or more runs on tiles: the same results as the rows
 * within 1e-5 at T = 1000 (outputs, the three gradients, both blend
 * gradients and fmm_head_weight), and less `saved` (T (dh + 1) floats
 * against T W). */
static void band_tiles_test(const char *label, fmm_settings s, int T, int dh) {
    fmm_case rows, tiles;
    case_init(&rows, s, T, dh, 11, 1.0f, 0.3f, -0.4f);
    case_init(&tiles, on_tiles(s), T, dh, 11, 1.0f, 0.3f, -0.4f);
    fmm_case *both[2] = {&rows, &tiles};
    for (int i = 0; i < 2; i++) case_forward(both[i]), case_backward(both[i]);
    size_t n = (size_t)T * dh;
    double err = rel_diff(tiles.out, rows.out, n);
    float *got[3] = {tiles.dq, tiles.dk, tiles.dv}, *want[3] = {rows.dq, rows.dk, rows.dv};
    for (int g = 0; g < 3; g++) err = fmax(err, rel_diff(got[g], want[g], n));
    float bt[2] = {tiles.d_blend_near, tiles.d_blend_far}, br[2] = {rows.d_blend_near, rows.d_blend_far};
    err = fmax(err, rel_diff(bt, br, 2));
    for (int i = 0; i < T; i += 37)
        for (int j = i > 60 ? i - 60 : 0; j < T && j <= i + 60; j += 7) {
            float a = fmm_head_weight(&tiles.s, tiles.q, tiles.k, 0.3f, -0.4f, tiles.saved, T, dh, i, j);
            float b = fmm_head_weight(&rows.s, rows.q, rows.k, 0.3f, -0.4f, rows.saved, T, dh, i, j);
            err = fmax(err, fabs(a - b) / fmax(fabs(b), 1e-3));
        }
    size_t saved_tiles = fmm_head_saved_floats(&tiles.s, T, dh), saved_rows = fmm_head_saved_floats(&rows.s, T, dh);
    char name[96];
    snprintf(name, sizeof name, "band on tiles = rows %s (out, grads, weights)", label);
    test_check(err <= 1e-5 && saved_tiles < saved_rows, name, "max rel %.3g  saved %zu vs %zu floats", err, saved_tiles,
               saved_rows);
    case_free(&rows);
    case_free(&tiles);
}

static void band_tiles_tests(void) {
    band_tiles_test("causal k48 none T1000 dh32", settings(48, true, "", 0), 1000, 32);
    band_tiles_test("noncausal k25 none T1000 dh32", settings(25, false, "", 0), 1000, 32);
    band_tiles_test("causal k300 elu,elu_flip T1000 dh32", settings(300, true, "elu,elu_flip", 0), 1000, 32);
    band_tiles_test("noncausal k150 tanh T1000 dh16", settings(150, false, "tanh", 8), 1000, 16);
    /* narrower than 48 keys the rows run: the results are the same bits */
    fmm_case rows, tiles;
    case_init(&rows, settings(20, true, "elu", 0), 300, 16, 5, 1.0f, 0.1f, 0.2f);
    case_init(&tiles, on_tiles(settings(20, true, "elu", 0)), 300, 16, 5, 1.0f, 0.1f, 0.2f);
    case_forward(&rows), case_forward(&tiles);
    test_check(memcmp(rows.out, tiles.out, 300 * 16 * sizeof(float)) == 0, "band of 20 keys stays on the rows", NULL);
    case_free(&rows);
    case_free(&tiles);
    reference_test("tiles causal k64 elu,elu_flip T300 dh32", on_tiles(settings(64, true, "elu,elu_flip", 16)), 300,
                   32);
    reference_test("tiles noncausal k40 none T250 dh8", on_tiles(settings(40, false, "", 8)), 250, 8);
    buffer_contract_test("tiles causal k60 elu T130 C4", on_tiles(settings(60, true, "elu", 4)), 130);
    buffer_contract_test("tiles noncausal k30 none T130", on_tiles(settings(30, false, "", 4)), 130);
    fd_test("tiles causal k50 elu T120 dh8", on_tiles(settings(50, true, "elu", 4)), 120, 8, 3e-3);
    fd_test("tiles noncausal k25 none T110 dh8", on_tiles(settings(25, false, "", 4)), 110, 8, 3e-3);
}

/* ---- bf16 (fmm_settings.bf16; docs/design.md §8.10) ---- */
static fmm_settings in_bf16(fmm_settings s) {
    s.bf16 = true;
    return s;
}

/* The largest difference of out, dq, dk, dv and the blend gradients of two
 * runs, relative to each one's largest value; same: every bit equal. */
static double case_diff(const fmm_case *a, const fmm_case *b, bool *same) {
    size_t n = (size_t)a->T * a->dh, bytes = n * sizeof(float);
    const float *got[4] = {a->out, a->dq, a->dk, a->dv}, *want[4] = {b->out, b->dq, b->dk, b->dv};
    double err = 0;
    *same = a->d_blend_near == b->d_blend_near && a->d_blend_far == b->d_blend_far;
    for (int g = 0; g < 4; g++)
        err = fmax(err, rel_diff(got[g], want[g], n)), *same = *same && !memcmp(got[g], want[g], bytes);
    float ba[2] = {a->d_blend_near, a->d_blend_far}, bb[2] = {b->d_blend_near, b->d_blend_far};
    return fmax(err, rel_diff(ba, bb, 2));
}

/* FMM on bf16 operands against fp32, within 2e-2 of the largest value:
 * measured 2e-4 to 8.6e-3, the most without a band (the far field's
 * gradients, sums of many bf16 products that partly cancel); a wrong
 * pair or stride is off by the size of the values. And, where the CPU
 * has AVX512_BF16, vdpbf16ps against the bf16 products' fp32 path, bit
 * for bit. */
static void bf16_test(const char *label, fmm_settings s, int T, int dh) {
    fmm_case runs[3];
    for (int i = 0; i < 3; i++) {
        case_init(&runs[i], i ? in_bf16(s) : s, T, dh, 13, 1.0f, 0.3f, -0.2f);
        tile_gemm_set_bf16_native(i == 1 ? 0 : -1);
        case_forward(&runs[i]), case_backward(&runs[i]);
    }
    tile_gemm_set_bf16_native(-1);
    bool same;
    char name[112];
    snprintf(name, sizeof name, "bf16 = fp32 within 2e-2, %s", label);
    test_within(name, case_diff(&runs[1], &runs[0], &same), 2e-2);
    double apart = case_diff(&runs[2], &runs[1], &same);
    snprintf(name, sizeof name, "bf16 vdpbf16ps = fp32 sums, bits, %s", label);
    if (tile_gemm_bf16_native()) test_check(same, name, "max rel %.3g", apart);
    else test_skip(name, "the CPU has no AVX512_BF16");
    for (int i = 0; i < 3; i++) case_free(&runs[i]);
}

static void bf16_tests(void) {
    bf16_test("causal k5 elu,elu_flip T200 C16 dh32", settings(5, true, "elu,elu_flip", 16), 200, 32);
    bf16_test("noncausal k3 elu,tanh T150 C8 dh16", settings(3, false, "elu,tanh", 8), 150, 16);
    bf16_test("causal k0 elu T101 C7 dh24", settings(0, true, "elu", 7), 101, 24);
    bf16_test("tiles causal k64 elu T300 C16 dh32", on_tiles(settings(64, true, "elu", 16)), 300, 32);
    bf16_test("tiles noncausal k50 tanh T200 C0 dh16", on_tiles(settings(50, false, "tanh", 0)), 200, 16);
    buffer_contract_test("bf16 causal k5 elu,tanh T13 C4", in_bf16(settings(5, true, "elu,tanh", 4)), 13);
    buffer_contract_test("bf16 noncausal k3 elu T37 C5", in_bf16(settings(3, false, "elu", 5)), 37);
    buffer_contract_test("bf16 tiles causal k60 elu T130 C4", in_bf16(on_tiles(settings(60, true, "elu", 4))), 130);
}

/* The model copies fmm.kernels' indices (config.h, CONFIG_FMM_KERNELS) into
 * fmm_settings as fmm_feature_map values: the two orders must agree. */
static void kernel_order_test(void) {
    config c;
    config_defaults(&c);
    status st;
    int rc = config_apply_override(&c, "fmm.kernels=elu,elu_flip,tanh", &st);
    bool ok = rc == 0 && c.fmm_kernels.n == 3 && c.fmm_kernels.items[0] == FEATURE_ELU &&
              c.fmm_kernels.items[1] == FEATURE_ELU_FLIP && c.fmm_kernels.items[2] == FEATURE_TANH;
    test_check(ok, "fmm.kernels names in fmm_feature_map order", NULL);
}

/* ------------------------------------------------------------------------ */
/* Micro-benchmark                                                           */
/* ------------------------------------------------------------------------ */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of several repetitions (the least disturbed by other processes). */
static void bench_one(int T, int chunk, bool causal) {
    fmm_case c;
    case_init(&c, settings(5, causal, "elu,elu_flip", chunk), T, 32, 1, 1.0f, 0.0f, 0.0f);
    double fwd = INFINITY, bwd = INFINITY, spent = 0;
    case_forward(&c); /* warm-up: page in every buffer */
    case_backward(&c);
    for (int rep = 0; rep < 5 || spent < 0.5; rep++) {
        double t0 = now_seconds();
        case_forward(&c);
        double t1 = now_seconds();
        case_backward(&c);
        double t2 = now_seconds();
        fwd = fmin(fwd, t1 - t0);
        bwd = fmin(bwd, t2 - t1);
        spent += t2 - t0;
    }
    double per = 1e9 / T;
    printf("T %6d  chunk %4d  %-9s  fwd %6.0f  bwd %6.0f  total %6.0f ns/token"
           "  saved %zu  scratch %zu floats\n",
           T, chunk, causal ? "causal" : "noncausal", fwd * per, bwd * per, (fwd + bwd) * per,
           fmm_head_saved_floats(&c.s, T, 32), fmm_head_scratch_floats(&c.s, T, 32));
    case_free(&c);
}

/* The near field alone (no far kernels), its band of W keys per row on the
 * rows and on tiled_softmax's tiles, at T 4096, dh 32: where
 * FMM_TILED_BAND_MIN_WIDTH (fmm_near.c) comes from. */
static void bench_band(int T, bool causal, int half) {
    const int dh = 32;
    fmm_case c;
    case_init(&c, settings(half, causal, "", 0), T, dh, 1, 1.0f, 0.0f, 0.0f);
    float *lse = alloc_floats((size_t)T), *scratch = alloc_floats(tiled_softmax_scratch_floats(T, dh));
    double rows = INFINITY, tiles = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        case_forward(&c);
        case_backward(&c);
        double t1 = now_seconds();
        tiled_softmax_band_forward(c.out, lse, c.q, c.k, c.v, T, T, dh, 0, causal, half, false, scratch);
        tiled_softmax_band_backward(c.dq, c.dk, c.dv, c.w, c.out, lse, c.q, c.k, c.v, T, T, dh, 0, causal, half, false,
                                    false, scratch);
        double t2 = now_seconds();
        rows = fmin(rows, t1 - t0), tiles = fmin(tiles, t2 - t1);
    }
    int width = causal ? half : 2 * half - 1;
    printf("band %-9s %4d keys per row (k %4d)  rows %8.2f ms  tiles %8.2f ms  tiles %.2fx faster\n",
           causal ? "causal" : "noncausal", width, half, 1e3 * rows, 1e3 * tiles, rows / tiles);
    free(lse), free(scratch);
    case_free(&c);
}

static int bench(void) {
    printf("fmm_head_forward + backward, dh 32, band 5, kernels elu,elu_flip, best of"
           " >= 5 runs\nOpenBLAS core %s, %d thread(s) (OPENBLAS_CORETYPE,"
           " OPENBLAS_NUM_THREADS)\n",
           openblas_get_corename(), openblas_get_num_threads());
    for (int causal = 1; causal >= 0; causal--)
        for (int T = 1024; T <= 65536; T *= 4) bench_one(T, 16, causal);
    printf("chunk sweep at T 16384:\n");
    for (int C = 8; C <= 256; C *= 2) bench_one(16384, C, true);
    printf("near field alone at T 4096, dh 32, forward + backward, best of 5:\n");
    static const int causal_halves[] = {5, 16, 32, 40, 48, 64, 128, 256, 512, 1024};
    static const int full_halves[] = {3, 8, 16, 20, 24, 32, 64, 128, 256, 512};
    for (int i = 0; i < 10; i++) bench_band(4096, true, causal_halves[i]);
    for (int i = 0; i < 10; i++) bench_band(4096, false, full_halves[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench();
    kernel_order_test();
    reference_tests();
    buffer_contract_test("causal k5 elu,tanh T13 C4", settings(5, true, "elu,tanh", 4), 13);
    buffer_contract_test("noncausal k3 elu_flip T13 C4", settings(3, false, "elu_flip", 4), 13);
    buffer_contract_test("causal k0 elu T40 C0", settings(0, true, "elu", 0), 40);
    buffer_contract_test("noncausal k2 none T9", settings(2, false, "", 4), 9);
    full_band_test(24);
    full_band_test(1000);
    chunk_invariance_test("causal elu,elu_flip", true, "elu,elu_flip");
    chunk_invariance_test("causal tanh", true, "tanh");
    chunk_invariance_test("noncausal elu", false, "elu");
    fd_tests();
    band_tiles_tests();
    bf16_tests();
    return test_summary("test_fmm");
}
