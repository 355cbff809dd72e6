/* Context parallelism's kernels, without MPI (docs/design.md §8.12): a
 * sequence cut into shards, each computed from what the exchanges would
 * bring it (halo keys, far-field states summed over the other shards, the
 * momentum carries, blocks of keys merged by their log-sum-exp), equals the
 * whole sequence computed at once — outputs and every gradient, halo
 * gradients sent back included. Uneven cuts, causal and not.
 *   test_shards       run every check; exit 1 on any failure */
#include "attention/fmm.h"
#include "attention/momentum.h"
#include "config/config.h"
#include "fmm_test_settings.h"
#include "kernels/tiled_softmax.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static float *floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) {
        perror("calloc");
        exit(2);
    }
    return p;
}

/* The shard boundaries of T positions in C pieces, as the data layer cuts
 * them: floor(T c / C). */
static int cut(int T, int C, int c) { return (int)((long long)T * c / C); }

/* ------------------------------------------------------------------------ */
/* FMM: halos and far-field states                                           */
/* ------------------------------------------------------------------------ */

static fmm_settings fmm_of(int bandwidth, bool causal, const char *kernels, bool tiles) {
    fmm_settings s = fmm_test_settings(bandwidth, causal, kernels, 16);
    s.band_tiles = tiles;
    return s;
}

typedef struct {
    int T, dh;
    float *q, *k, *v, *w;      /* inputs, w = dL/dout */
    float *out, *dq, *dk, *dv; /* results */
    float d_near, d_far;       /* blend gradients */
} head_io;

static void head_alloc(head_io *h, int T, int dh) {
    size_t n = (size_t)T * dh;
    memset(h, 0, sizeof *h);
    h->T = T, h->dh = dh;
    h->q = floats(n), h->k = floats(n), h->v = floats(n), h->w = floats(n);
    h->out = floats(n), h->dq = floats(n), h->dk = floats(n), h->dv = floats(n);
}

static void head_free(head_io *h) {
    float *all[] = {h->q, h->k, h->v, h->w, h->out, h->dq, h->dk, h->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void fmm_whole(const fmm_settings *s, head_io *h, float bn, float bf) {
    float *saved = floats(fmm_head_saved_floats(s, h->T, h->dh));
    float *scratch = floats(fmm_head_scratch_floats(s, h->T, h->dh));
    fmm_head_forward(s, NULL, h->q, h->k, h->v, bn, bf, h->out, saved, scratch, h->T, h->dh);
    fmm_head_backward(s, NULL, h->q, h->k, h->v, bn, bf, saved, h->w, h->dq, h->dk, h->dv, &h->d_near, &h->d_far,
                      scratch, h->T, h->dh);
    free(saved), free(scratch);
}

/* Shard c of C: its rows [lo, hi), halos as the exchange brings them, far_in
 * as the scan (causal: the shards before; else all the others). */
typedef struct {
    int lo, hi, left, right;
    float *k_ext, *v_ext, *dk_ext, *dv_ext, *saved, *scratch, *far_in, *far_grad_in;
} shard_io;

static void fmm_sharded(const fmm_settings *s, const head_io *whole, head_io *got, int C, float bn, float bf) {
    int T = whole->T, dh = whole->dh, half = s->bandwidth < T ? s->bandwidth : T;
    size_t state = fmm_far_state_floats(s, dh);
    float *totals = floats(state * C), *grad_totals = floats(state * C);
    shard_io *sh = calloc((size_t)C, sizeof *sh);
    for (int c = 0; c < C; c++) { /* the totals each shard contributes to the scan */
        shard_io *x = &sh[c];
        x->lo = cut(T, C, c), x->hi = cut(T, C, c + 1);
        int n = x->hi - x->lo;
        x->left = half > 0 ? (x->lo < half - 1 ? x->lo : half - 1) : 0;
        x->right = half > 0 && !s->causal ? (T - x->hi < half - 1 ? T - x->hi : half - 1) : 0;
        int Tk = x->left + n + x->right;
        x->k_ext = floats((size_t)Tk * dh), x->v_ext = floats((size_t)Tk * dh);
        x->dk_ext = floats((size_t)Tk * dh), x->dv_ext = floats((size_t)Tk * dh);
        memcpy(x->k_ext, whole->k + (size_t)(x->lo - x->left) * dh, sizeof(float) * Tk * dh);
        memcpy(x->v_ext, whole->v + (size_t)(x->lo - x->left) * dh, sizeof(float) * Tk * dh);
        x->saved = floats(fmm_head_saved_floats(s, n, dh));
        x->scratch = floats(fmm_head_scratch_floats(s, n, dh) + (size_t)Tk * dh);
        x->far_in = floats(state), x->far_grad_in = floats(state);
        fmm_head_far_totals(s, whole->k + (size_t)x->lo * dh, whole->v + (size_t)x->lo * dh, totals + state * c,
                            x->scratch, n, dh);
    }
    for (int c = 0; c < C; c++) /* the forward's scan */
        for (int o = 0; o < C; o++)
            if (s->causal ? o < c : o != c)
                for (size_t i = 0; i < state; i++) sh[c].far_in[i] += totals[state * o + i];
    got->d_near = got->d_far = 0;
    for (int c = 0; c < C; c++) {
        shard_io *x = &sh[c];
        int n = x->hi - x->lo;
        fmm_shard d = {T, x->left, x->right, x->k_ext, x->v_ext, x->far_in, NULL};
        fmm_head_forward(s, &d, whole->q + (size_t)x->lo * dh, whole->k + (size_t)x->lo * dh,
                         whole->v + (size_t)x->lo * dh, bn, bf, got->out + (size_t)x->lo * dh, x->saved, x->scratch, n,
                         dh);
        fmm_head_far_grad_totals(s, &d, whole->q + (size_t)x->lo * dh, bf, x->saved, whole->w + (size_t)x->lo * dh,
                                 grad_totals + state * c, x->scratch, n, dh);
    }
    for (int c = 0; c < C; c++) /* the backward's reverse scan */
        for (int o = 0; o < C; o++)
            if (s->causal ? o > c : o != c)
                for (size_t i = 0; i < state; i++) sh[c].far_grad_in[i] += grad_totals[state * o + i];
    memset(got->dk, 0, sizeof(float) * T * dh), memset(got->dv, 0, sizeof(float) * T * dh);
    for (int c = 0; c < C; c++) {
        shard_io *x = &sh[c];
        int n = x->hi - x->lo, Tk = x->left + n + x->right;
        fmm_shard d = {T, x->left, x->right, x->k_ext, x->v_ext, x->far_in, x->far_grad_in};
        fmm_head_backward(s, &d, whole->q + (size_t)x->lo * dh, whole->k + (size_t)x->lo * dh,
                          whole->v + (size_t)x->lo * dh, bn, bf, x->saved, whole->w + (size_t)x->lo * dh,
                          got->dq + (size_t)x->lo * dh, x->dk_ext, x->dv_ext, &got->d_near, &got->d_far, x->scratch, n,
                          dh);
        /* the halo gradients go back to the shards that own those keys */
        for (size_t i = 0; i < (size_t)Tk * dh; i++) {
            got->dk[(size_t)(x->lo - x->left) * dh + i] += x->dk_ext[i];
            got->dv[(size_t)(x->lo - x->left) * dh + i] += x->dv_ext[i];
        }
    }
    for (int c = 0; c < C; c++) {
        shard_io *x = &sh[c];
        float *all[] = {x->k_ext, x->v_ext, x->dk_ext, x->dv_ext, x->saved, x->scratch, x->far_in, x->far_grad_in};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
    free(sh), free(totals), free(grad_totals);
}

/* In bf16 (docs/design.md §8.10) the shards' chunks and tiles round other
 * partial sums and probabilities to bf16 than the whole's, so they agree
 * at bf16's precision: within BF16_SHARD_BOUND of the largest value
 * (measured 1e-7 to 2.8e-3; a lost halo or state is off by far more). */
#define BF16_SHARD_BOUND 1e-2

static void fmm_shard_test(const char *label, fmm_settings s, int T, int C) {
    int dh = 16;
    uint64_t seed = 0x5eed + (uint64_t)T * 31 + (uint64_t)C;
    head_io whole, got;
    head_alloc(&whole, T, dh), head_alloc(&got, T, dh);
    size_t n = (size_t)T * dh;
    fd_fill(whole.q, n, 1.0f, &seed), fd_fill(whole.k, n, 1.0f, &seed);
    fd_fill(whole.v, n, 1.0f, &seed), fd_fill(whole.w, n, 1.0f, &seed);
    fmm_whole(&s, &whole, 0.3f, -0.2f);
    fmm_sharded(&s, &whole, &got, C, 0.3f, -0.2f);
    double err = test_rel_error(got.out, whole.out, n);
    err = fmax(err, test_rel_error(got.dq, whole.dq, n));
    err = fmax(err, test_rel_error(got.dk, whole.dk, n));
    err = fmax(err, test_rel_error(got.dv, whole.dv, n));
    err = fmax(err, fabs(got.d_near - whole.d_near) / fmax(fabs(whole.d_near), 1e-3));
    err = fmax(err, fabs(got.d_far - whole.d_far) / fmax(fabs(whole.d_far), 1e-3));
    char name[128];
    snprintf(name, sizeof name, "fmm %s%s, T %d in %d shards = whole", s.bf16 ? "bf16 " : "", label, T, C);
    test_within(name, err, s.bf16 ? BF16_SHARD_BOUND : 2e-5);
    head_free(&whole), head_free(&got);
}

static void fmm_shard_tests(void) {
    int shards[] = {2, 3, 4};
    for (size_t i = 0; i < sizeof shards / sizeof shards[0]; i++) {
        int C = shards[i];
        fmm_shard_test("causal band 5, elu,elu_flip", fmm_of(5, true, "elu,elu_flip", false), 509, C);
        fmm_shard_test("causal band 60 on tiles, elu,tanh", fmm_of(60, true, "elu,tanh", true), 509, C);
        fmm_shard_test("non-causal band 5, elu", fmm_of(5, false, "elu", false), 300, C);
        fmm_shard_test("non-causal band 50 on tiles, tanh", fmm_of(50, false, "tanh", true), 300, C);
        fmm_shard_test("causal band 60 on rows, no far field", fmm_of(60, true, "", false), 300, C);
        fmm_shard_test("causal far field only", fmm_of(0, true, "elu_flip", false), 300, C);
    }
    fmm_settings bf16[] = {fmm_of(5, true, "elu,elu_flip", false), fmm_of(60, true, "elu,tanh", true),
                           fmm_of(50, false, "tanh", true)};
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++) {
        bf16[i].bf16 = true;
        fmm_shard_test(i == 0   ? "causal band 5, elu,elu_flip"
                       : i == 1 ? "causal band 60 on tiles, elu,tanh"
                                : "non-causal band 50 on tiles, tanh",
                       bf16[i], i == 2 ? 300 : 509, 3);
    }
}

/* ------------------------------------------------------------------------ */
/* Momentum: the p carry forward, the u carry backward                       */
/* ------------------------------------------------------------------------ */

/* Shard by shard as the ranks do it: the shares with nothing coming in
 * (gathered), then the carries in shard order, then the shear itself. */
static void momentum_sharded(const float *x, const float *prev, const float *g, momentum_coeffs mc, bool anchored,
                             int T, int dh, int C, float *xhat, float *p, float *dx, float *d_gamma) {
    float *share = floats((size_t)C * dh), *p_end = floats((size_t)C * dh), *zero = floats((size_t)dh);
    float *u_first = floats((size_t)C * dh), *scratch = floats((size_t)dh);
    for (int c = 0; c < C; c++) {
        int lo = cut(T, C, c), n = cut(T, C, c + 1) - lo;
        const float *xc = x + (size_t)lo * dh;
        if (c == 0) momentum_p_end(xc, anchored ? NULL : prev, NULL, mc.beta, share, n, dh);
        else momentum_p_end(xc, zero, NULL, mc.beta, share + (size_t)c * dh, n, dh);
    }
    memcpy(p_end, share, sizeof(float) * dh);
    for (int c = 1; c < C; c++) {
        int lo = cut(T, C, c), n = cut(T, C, c + 1) - lo;
        momentum_carry_p(share + (size_t)c * dh, x + (size_t)(lo - 1) * dh, p_end + (size_t)(c - 1) * dh, mc.beta,
                         p_end + (size_t)c * dh, n, dh);
    }
    for (int c = 0; c < C; c++) {
        int lo = cut(T, C, c), n = cut(T, C, c + 1) - lo;
        const float *xprev = c == 0 ? (anchored ? NULL : prev) : x + (size_t)(lo - 1) * dh;
        const float *pprev = c == 0 ? NULL : p_end + (size_t)(c - 1) * dh;
        momentum_shear_forward(x + (size_t)lo * dh, xprev, pprev, xhat + (size_t)lo * dh, p + (size_t)lo * dh, mc, n,
                               dh);
        momentum_u_first(g + (size_t)lo * dh, NULL, NULL, mc, share + (size_t)c * dh, n, dh);
    }
    memcpy(u_first + (size_t)(C - 1) * dh, share + (size_t)(C - 1) * dh, sizeof(float) * dh);
    for (int c = C - 2; c >= 0; c--) {
        int lo = cut(T, C, c), hi = cut(T, C, c + 1);
        momentum_carry_u(share + (size_t)c * dh, g + (size_t)hi * dh, u_first + (size_t)(c + 1) * dh, mc,
                         u_first + (size_t)c * dh, hi - lo, dh);
    }
    memset(dx, 0, sizeof(float) * T * dh);
    for (int c = 0; c < C; c++) {
        int lo = cut(T, C, c), hi = cut(T, C, c + 1);
        bool last = c == C - 1;
        momentum_shear_backward(g + (size_t)lo * dh, p + (size_t)lo * dh, dx + (size_t)lo * dh, d_gamma, mc,
                                c == 0 && anchored, last ? NULL : g + (size_t)hi * dh,
                                last ? NULL : u_first + (size_t)(c + 1) * dh, scratch, hi - lo, dh);
    }
    free(share), free(p_end), free(zero), free(u_first), free(scratch);
}

static void momentum_shard_test(const char *label, momentum_coeffs mc, bool anchored, int T, int C) {
    int dh = 24;
    size_t n = (size_t)T * dh;
    uint64_t seed = 0xabc + (uint64_t)C;
    float *x = floats(n), *g = floats(n), *prev = floats((size_t)dh);
    float *xhat = floats(n), *p = floats(n), *dx = floats(n), *scratch = floats((size_t)dh);
    float *xhat_s = floats(n), *p_s = floats(n), *dx_s = floats(n);
    fd_fill(x, n, 1.0f, &seed), fd_fill(g, n, 1.0f, &seed), fd_fill(prev, (size_t)dh, 1.0f, &seed);
    float dg = 0, dg_s = 0;
    momentum_shear_forward(x, anchored ? NULL : prev, NULL, xhat, p, mc, T, dh);
    momentum_shear_backward(g, p, dx, &dg, mc, anchored, NULL, NULL, scratch, T, dh);
    momentum_sharded(x, prev, g, mc, anchored, T, dh, C, xhat_s, p_s, dx_s, &dg_s);
    double err = fmax(test_rel_error(xhat_s, xhat, n), test_rel_error(p_s, p, n));
    err = fmax(err, test_rel_error(dx_s, dx, n));
    err = fmax(err, fabs(dg_s - dg) / fmax(fabs(dg), 1e-3));
    char name[128];
    snprintf(name, sizeof name, "momentum %s, T %d in %d shards = whole", label, T, C);
    test_within(name, err, 1e-5);
    free(x), free(g), free(prev), free(xhat), free(p), free(dx), free(scratch), free(xhat_s), free(p_s), free(dx_s);
}

static void momentum_shard_tests(void) {
    for (int C = 2; C <= 4; C++) {
        momentum_shard_test("gamma 0.3", (momentum_coeffs){0.3f, 0.0f, 0.0f}, true, 509, C);
        momentum_shard_test("gamma 0.3 beta 0.9 gamma2 0.2", (momentum_coeffs){0.3f, 0.9f, 0.2f}, true, 509, C);
        momentum_shard_test("beta -0.5 gamma2 -0.3, unanchored", (momentum_coeffs){0.5f, -0.5f, -0.3f}, false, 300, C);
    }
}

/* ------------------------------------------------------------------------ */
/* Softmax: blocks of keys merged by their log-sum-exp (ring attention)      */
/* ------------------------------------------------------------------------ */

/* Query chunk qc against key chunk kc of a sequence cut in n chunks: +1
 * every key visible, 0 the causal diagonal, -1 none. */
static int pair_kind(bool causal, int qc, int kc) { return !causal || kc < qc ? 1 : kc == qc ? 0 : -1; }

static void ring_softmax_test(bool causal, int T, int chunks, bool bf16) {
    int dh = 32;
    size_t n = (size_t)T * dh;
    uint64_t seed = 0xfeed + (uint64_t)chunks;
    head_io whole, got;
    head_alloc(&whole, T, dh), head_alloc(&got, T, dh);
    fd_fill(whole.q, n, 1.0f, &seed), fd_fill(whole.k, n, 1.0f, &seed);
    fd_fill(whole.v, n, 1.0f, &seed), fd_fill(whole.w, n, 1.0f, &seed);
    float *lse = floats((size_t)T), *scratch = floats(tiled_softmax_scratch_floats(T, dh));
    tiled_softmax_forward(whole.out, lse, whole.q, whole.k, whole.v, T, T, dh, 0, causal, bf16, scratch);
    tiled_softmax_backward(whole.dq, whole.dk, whole.dv, whole.w, whole.out, lse, whole.q, whole.k, whole.v, T, dh,
                           causal, bf16, scratch);
    float *glse = floats((size_t)T), *bout = floats(n), *blse = floats((size_t)T);
    for (int i = 0; i < T; i++) glse[i] = -INFINITY;
    for (int qc = 0; qc < chunks; qc++) { /* forward: each query chunk merges the blocks it sees */
        int q0 = cut(T, chunks, qc), tq = cut(T, chunks, qc + 1) - q0;
        for (int kc = chunks - 1; kc >= 0; kc--) { /* in ring order: not the keys' order */
            int kind = pair_kind(causal, qc, kc), k0 = cut(T, chunks, kc), tk = cut(T, chunks, kc + 1) - k0;
            if (kind < 0) continue;
            tiled_softmax_forward(bout, blse, whole.q + (size_t)q0 * dh, whole.k + (size_t)k0 * dh,
                                  whole.v + (size_t)k0 * dh, tq, tk, dh, kind == 0 ? 0 : q0 - k0, kind == 0, bf16,
                                  scratch);
            tiled_softmax_merge(got.out + (size_t)q0 * dh, glse + q0, bout, blse, tq, dh);
        }
    }
    memset(got.dq, 0, n * sizeof(float)), memset(got.dk, 0, n * sizeof(float)), memset(got.dv, 0, n * sizeof(float));
    for (int qc = 0; qc < chunks; qc++) /* backward: each pair adds into dq and the key chunk's dk, dv */
        for (int kc = 0; kc < chunks; kc++) {
            int kind = pair_kind(causal, qc, kc), q0 = cut(T, chunks, qc), tq = cut(T, chunks, qc + 1) - q0;
            int k0 = cut(T, chunks, kc), tk = cut(T, chunks, kc + 1) - k0;
            if (kind < 0) continue;
            tiled_softmax_band_backward(got.dq + (size_t)q0 * dh, got.dk + (size_t)k0 * dh, got.dv + (size_t)k0 * dh,
                                        whole.w + (size_t)q0 * dh, got.out + (size_t)q0 * dh, glse + q0,
                                        whole.q + (size_t)q0 * dh, whole.k + (size_t)k0 * dh, whole.v + (size_t)k0 * dh,
                                        tq, tk, dh, kind == 0 ? 0 : q0 - k0, kind == 0, 0, true, bf16, scratch);
        }
    double err = fmax(test_rel_error(got.out, whole.out, n), test_rel_error(got.dq, whole.dq, n));
    err = fmax(err, fmax(test_rel_error(got.dk, whole.dk, n), test_rel_error(got.dv, whole.dv, n)));
    err = fmax(err, test_rel_error(glse, lse, (size_t)T));
    char name[128];
    snprintf(name, sizeof name, "softmax %s%s, T %d in %d key blocks = whole", bf16 ? "bf16 " : "",
             causal ? "causal" : "non-causal", T, chunks);
    test_within(name, err, bf16 ? BF16_SHARD_BOUND : 2e-5);
    head_free(&whole), head_free(&got);
    free(lse), free(scratch), free(glse), free(bout), free(blse);
}

static void ring_softmax_tests(void) {
    ring_softmax_test(true, 509, 4, false);
    ring_softmax_test(true, 509, 8, false);
    ring_softmax_test(false, 509, 6, false);
    ring_softmax_test(true, 300, 3, false);
    ring_softmax_test(true, 509, 4, true);
    ring_softmax_test(false, 509, 6, true);
}

int main(void) {
    fmm_shard_tests();
    momentum_shard_tests();
    ring_softmax_tests();
    return test_summary("test_shards");
}
