/* The GEMM engine (gemm.h; docs/scale.md §7): oneDNN fp32 and bf16 and our
 * own AVX-512 kernel against cblas_sgemm for every transpose combination,
 * odd sizes, padded leading dimensions, alpha and beta, and for our own
 * products past its packed blocks; the bf16 rounding itself; bf16 copies
 * of operands; the primitive cache. Engines this build or CPU lacks are
 * reported as skipped. CTest runs it twice: as the CPU is, and as a CPU
 * without bf16 or AVX-512 with MOMFMM_FORCE_BF16=1 (test_gemm_widened), where
 * the bf16 engine runs on OpenBLAS's sgemm (gemm_widen.c) and every bf16
 * check here walks that path. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "base/cpu.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "test_util.h"
#include "training/optimizer.h"

/* Error bounds, elementwise and worst-case (no statistical √K argument, so
 * they hold for every input). With S = |op(A)| |op(B)| (products of
 * magnitudes summed over K) and u = 2^-24 the fp32 unit roundoff:
 * - an fp32 engine's C differs from the exact alpha A B + beta C0 by at most
 *   (gamma_K + 3u) (|alpha| S + |beta C0|), gamma_K = K u / (1 - K u) for
 *   the K-term sum, 3u for scaling by alpha, adding beta C0 and storing;
 * - the bf16 engine first rounds each operand to 8 significant bits
 *   (relative error <= u16 = 2^-8, half the 2^-7 spacing above 1), so each product a' b' is within
 *   (2 u16 + u16^2) |a b| of a b, then accumulates in fp32 as above.
 * Comparing two engines adds their bounds. The bf16 bound is loose on
 * random data (errors cancel), so a second check compares the bf16 engine
 * with the exact product of the bf16-rounded operands, where only the fp32
 * bound remains: that catches a wrong rounding (truncation, say). */
static const double U32 = 1.0 / 16777216.0, U16 = 1.0 / 256.0;

static double fp32_bound(int K, float alpha, double S, float beta, float c0) {
    double gamma = K * U32 / (1.0 - K * U32);
    return (gamma + 3 * U32) * (fabs(alpha) * S + fabs(beta * c0));
}

static double bf16_bound(int K, float alpha, double S, float beta, float c0) {
    double rounding = 2 * U16 + U16 * U16;
    return fabs(alpha) * rounding * S + fp32_bound(K, alpha, (1 + rounding) * S, beta, c0);
}

typedef struct {
    bool trans_a, trans_b;
    int M, N, K, lda, ldb, ldc;
    float alpha, beta;
    float *A, *B, *C0; /* C0: C before the call, padding included */
} problem;

static int rows_of(bool trans, int r, int c) { return trans ? c : r; }
static int cols_of(bool trans, int r, int c) { return trans ? r : c; }
static float element(const float *X, bool trans, int ld, int r, int c) {
    return trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

/* Padding between rows holds NaN in A and B (must never be read) and a
 * sentinel in C (must never be written). */
static float *matrix(int rows, int cols, int ld, float padding, uint64_t *rng) {
    float *X = malloc(sizeof(float) * (size_t)rows * ld);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++) X[(size_t)r * ld + c] = c < cols ? fd_uniform(rng) : padding;
    return X;
}

static problem make_problem(bool ta, bool tb, int M, int N, int K, int pad, float alpha, float beta, uint64_t *rng) {
    problem p = {ta,    tb,   M,    N,    K,   cols_of(ta, M, K) + pad, cols_of(tb, K, N) + 2 * pad, N + pad,
                 alpha, beta, NULL, NULL, NULL};
    p.A = matrix(rows_of(ta, M, K), cols_of(ta, M, K), p.lda, NAN, rng);
    p.B = matrix(rows_of(tb, K, N), cols_of(tb, K, N), p.ldb, NAN, rng);
    p.C0 = matrix(M, N, p.ldc, 12345.0f, rng);
    return p;
}

static void free_problem(problem *p) { free(p->A), free(p->B), free(p->C0); }

static float *run(gemm_ctx *ctx, const problem *p) {
    size_t n = (size_t)p->M * p->ldc;
    float *C = malloc(sizeof(float) * n);
    memcpy(C, p->C0, sizeof(float) * n);
    gemm(ctx, p->trans_a, p->trans_b, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb, p->beta, C, p->ldc);
    return C;
}

static float *run_cblas(const problem *p) {
    size_t n = (size_t)p->M * p->ldc;
    float *C = malloc(sizeof(float) * n);
    memcpy(C, p->C0, sizeof(float) * n);
    cblas_sgemm(CblasRowMajor, p->trans_a ? CblasTrans : CblasNoTrans, p->trans_b ? CblasTrans : CblasNoTrans, p->M,
                p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb, p->beta, C, p->ldc);
    return C;
}

static float round_bf16(float x) {
    uint16_t h;
    cpu_f32_to_bf16_portable(&h, &x, 1);
    return cpu_bf16_to_f32(h);
}

/* max over C of |C - C_ref| / bound (<= 1 passes); a touched padding
 * element counts as infinitely wrong. exact_bf16: C_ref is the exact
 * product of the bf16-rounded operands, else cblas_sgemm's result. */
static double error_ratio(const problem *p, const float *C, const float *cblas_C, bool bf16_engine, bool exact_bf16) {
    double worst = 0;
    for (int i = 0; i < p->M; i++) {
        for (int j = p->N; j < p->ldc; j++)
            if (C[(size_t)i * p->ldc + j] != 12345.0f) return INFINITY;
        for (int j = 0; j < p->N; j++) {
            double S = 0, exact = 0;
            for (int k = 0; k < p->K; k++) {
                double a = element(p->A, p->trans_a, p->lda, i, k), b = element(p->B, p->trans_b, p->ldb, k, j);
                if (exact_bf16) a = round_bf16((float)a), b = round_bf16((float)b);
                S += fabs(a * b);
                exact += a * b;
            }
            float c0 = p->C0[(size_t)i * p->ldc + j];
            double ref = exact_bf16 ? p->alpha * exact + p->beta * c0 : cblas_C[(size_t)i * p->ldc + j];
            double bound = exact_bf16 ? fp32_bound(p->K, p->alpha, S, p->beta, c0)
                                      : fp32_bound(p->K, p->alpha, S, p->beta, c0) +
                                            (bf16_engine ? bf16_bound : fp32_bound)(p->K, p->alpha, S, p->beta, c0);
            double ratio = fabs(C[(size_t)i * p->ldc + j] - ref) / (bound + 1e-30);
            if (!(ratio <= worst)) worst = ratio; /* NaN propagates as a failure */
        }
    }
    return worst;
}

static const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {129, 3, 257}, {64, 96, 128}};
enum { SHAPES = sizeof shapes / sizeof shapes[0] };

/* Every shape x transposes x leading dims (minimal, padded) x alpha x beta;
 * returns the worst error ratio (and the one against exact bf16 products). */
static double sweep(gemm_ctx *ctx, bool bf16_engine, double *worst_exact) {
    uint64_t rng = 42;
    double worst = 0;
    *worst_exact = 0;
    for (int s = 0; s < SHAPES; s++)
        for (int t = 0; t < 4; t++)
            for (int pad = 0; pad <= 3; pad += 3)
                for (int ab = 0; ab < 4; ab++) {
                    problem p = make_problem(t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                                             ab & 1 ? 0.5f : 1.0f, ab & 2 ? 1.0f : 0.0f, &rng);
                    float *C = run(ctx, &p), *R = run_cblas(&p);
                    double r = error_ratio(&p, C, R, bf16_engine, false);
                    if (!(r <= worst)) worst = r;
                    if (bf16_engine) {
                        double e = error_ratio(&p, C, R, true, true);
                        if (!(e <= *worst_exact)) *worst_exact = e;
                    }
                    free(C), free(R), free_problem(&p);
                }
    return worst;
}

static void test_conversion(void) {
    const float specials[] = {1.0f,       1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -2.5f,         0.0f,
                              -0.0f,      INFINITY,       -INFINITY,      NAN,           0x1p-130f,
                              -0x1p-140f, 3.4028235e38f,  0x1p-126f,      1.0f + 0x1p-9f};
    const uint16_t expected[] = {0x3f80, 0x3f80, 0x3f82, 0xc020, 0x0000, 0x8000, 0x7f80,
                                 0xff80, 0x7fc0, 0x0000, 0x8000, 0x7f80, 0x0080, 0x3f80};
    enum { NS = sizeof specials / sizeof specials[0] };
    uint16_t got[NS];
    cpu_f32_to_bf16_portable(got, specials, NS);
    test_check(memcmp(got, expected, sizeof got) == 0, "bf16: round to nearest even, NaN, inf, subnormal -> 0", NULL);

    /* The AVX512_BF16 path against the portable one, bit for bit, with a
     * length that leaves a masked tail. */
    enum { N = 1000 + 17 };
    float x[N];
    uint64_t rng = 7;
    for (int i = 0; i < N; i++) x[i] = fd_uniform(&rng) * ldexpf(1.0f, (int)(fd_uniform(&rng) * 140.0f));
    memcpy(x, specials, sizeof specials);
    uint16_t native[N], portable[N];
    cpu_f32_to_bf16(native, x, N);
    cpu_f32_to_bf16_portable(portable, x, N);
    if (cpu_has_bf16())
        test_check(memcmp(native, portable, sizeof native) == 0, "bf16: vcvtne2ps2bf16 path == portable, bit for bit",
                   NULL);
    else test_skip("bf16: vcvtne2ps2bf16 path == portable", "no AVX512_BF16");
}

/* A bf16 copy passed with the operand gives the same bits as converting per
 * call (both dense, so the same primitive runs). */
static void test_bf16_copies(gemm_ctx *ctx) {
    uint64_t rng = 3;
    problem p = make_problem(false, true, 48, 40, 72, 0, 1.0f, 1.0f, &rng);
    size_t na = (size_t)p.M * p.lda, nb = (size_t)p.N * p.ldb, nc = (size_t)p.M * p.ldc;
    uint16_t *A16 = malloc(2 * na), *B16 = malloc(2 * nb);
    cpu_f32_to_bf16(A16, p.A, na);
    cpu_f32_to_bf16(B16, p.B, nb);
    float *C = run(ctx, &p), *C2 = malloc(sizeof(float) * nc);
    memcpy(C2, p.C0, sizeof(float) * nc);
    gemm_mixed(ctx, false, true, p.M, p.N, p.K, 1.0f, (gemm_operand){p.A, A16}, p.lda, (gemm_operand){p.B, B16}, p.ldb,
               1.0f, C2, p.ldc);
    test_check(memcmp(C, C2, sizeof(float) * nc) == 0, "bf16: pre-converted operands == per-call conversion", NULL);
    free(A16), free(B16), free(C), free(C2), free_problem(&p);
}

static void test_edges(gemm_ctx *ctx) {
    float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8}, C[4] = {1, NAN, 3, 4};
    gemm(ctx, false, false, 2, 2, 0, 1.0f, A, 1, B, 2, 0.0f, C, 2);
    int ok = C[0] == 0 && C[1] == 0 && C[2] == 0 && C[3] == 0;
    float D[4] = {1, 2, 3, 4};
    gemm(ctx, false, false, 2, 2, 0, 1.0f, A, 1, B, 2, 2.0f, D, 2);
    ok = ok && D[0] == 2 && D[3] == 8;
    gemm(ctx, false, false, 0, 2, 2, 1.0f, A, 2, B, 2, 0.0f, D, 2);
    ok = ok && D[0] == 2;
    test_check(ok, "K = 0 gives beta C (beta 0 clears NaN); M = 0 is a no-op", NULL);
}

/* Products from every thread of one parallel region at once, as
 * attention's heads make them (docs/design.md §8.10), each shape first seen
 * there: each thread's C equals the same product made alone afterwards,
 * bit for bit. Threads that shared one oneDNN state (its primitive cache,
 * a primitive's memory handles, the bf16 buffers, the scratchpad) clobbered
 * each other: oneDNN refused a handle and the run panicked. */
static void test_threads(gemm_ctx *ctx) {
    enum { TEAM = 4, ROUNDS = 8 };
    uint64_t rng = 99;
    bool same = true;
    int before = omp_get_max_threads();
    omp_set_num_threads(TEAM);
    for (int round = 0; round < ROUNDS && same; round++) {
        problem p[TEAM];
        float *together[TEAM];
        for (int t = 0; t < TEAM; t++)
            p[t] = make_problem(t % 2, round % 2, 40 + 4 * round + t, 72 + t, 56 + 8 * t, t, 1.0f, 0.5f * t, &rng);
#pragma omp parallel for schedule(static, 1) num_threads(TEAM)
        for (int t = 0; t < TEAM; t++) together[t] = run(ctx, &p[t]);
        for (int t = 0; t < TEAM; t++) {
            float *alone = run(ctx, &p[t]);
            same = same && !memcmp(alone, together[t], sizeof(float) * (size_t)p[t].M * p[t].ldc);
            free(alone), free(together[t]), free_problem(&p[t]);
        }
    }
    omp_set_num_threads(before);
    char name[96];
    snprintf(name, sizeof name, "%s: products from %d threads at once (bits)", gemm_engine_name(gemm_ctx_engine(ctx)),
             TEAM);
    test_check(same, name, NULL);
}

/* Our own kernel (gemm_avx512.c) past its packed blocks: rows past MC (168),
 * columns past NC (768), the inner dimension past KC (384), with ragged
 * edges in each (neither 14 rows nor 32 columns divide them), and rows past
 * MS (1344) with columns past NC (A's packed blocks kept across B's column
 * blocks, then packed again for the next rows, also past MS rows a thread
 * on two threads); and the same bits whichever number of threads cuts a
 * product (gemm_split.c cuts it by rows or columns, and the kernel sums each
 * element in one order). */
static void test_blocks(gemm_ctx *ctx) {
    uint64_t rng = 5;
    double worst = 0;
    bool same = true;
    int before = omp_get_max_threads();
    for (int t = 0; t < 8; t++) {
        int M = t & 1 ? 801 : 179, N = t & 1 ? 171 : 797; /* the cut runs along the longer of M and N */
        if (t >= 4) M = t >= 6 ? 2903 : 1501, N = 797;    /* 2903: past MS rows a thread on 2 */
        problem p = make_problem(t & 1, (t >> 1) & 1, M, N, 389, t, 0.5f, t >= 2 ? 1.0f : 0.0f, &rng);
        omp_set_num_threads(1);
        float *C = run(ctx, &p), *R = run_cblas(&p);
        double r = error_ratio(&p, C, R, false, false);
        if (!(r <= worst)) worst = r;
        for (int threads = 2; threads <= 3; threads++) {
            omp_set_num_threads(threads);
            float *Ct = run(ctx, &p);
            same = same && !memcmp(C, Ct, sizeof(float) * (size_t)p.M * p.ldc);
            free(Ct);
        }
        free(C), free(R), free_problem(&p);
    }
    omp_set_num_threads(before);
    test_check(worst <= 1.0, "avx512-f32: products past its blocks, ragged edges, all transposes", "%.3g", worst);
    test_check(same, "avx512-f32: the same bits on 1, 2 and 3 threads", NULL);
}

/* C = beta C + alpha op(A) op(B) made as gemm_split.c makes a product whose K
 * is long beside C (docs/design.md §8.10): the first half of K into C, the
 * second into a zeroed S, then C += S; each half a product of its own. */
static float *run_in_halves(gemm_ctx *ctx, const problem *p, int k1) {
    problem first = *p, second = *p;
    first.K = k1;
    second.K = p->K - k1, second.beta = 0.0f;
    second.A = p->trans_a ? p->A + (size_t)k1 * p->lda : p->A + k1;
    second.B = p->trans_b ? p->B + k1 : p->B + (size_t)k1 * p->ldb;
    float *C = run(ctx, &first), *S = run(ctx, &second);
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->N; j++) C[(size_t)i * p->ldc + j] += S[(size_t)i * p->ldc + j];
    free(S);
    return C;
}

/* Our own kernel's products whose K is at least 2,048 and twice C's longer
 * side, C at most 2^18 floats (a weight gradient dY^T X of a long batch),
 * are summed in two halves of K, the second added last, so that two
 * threads each take a half: the bits are those of the two halves made one
 * after the other (K's first half rounded up to 32), on 1, 2, 3 and 4
 * threads, and from four threads of a parallel region at once (each its
 * own scratch). The scratch is
 * reused from product to product: a half read from it would carry the last
 * product's sums. */
static void test_k_halves(gemm_ctx *ctx) {
    uint64_t rng = 17;
    double worst = 0;
    bool as_halves = true, same = true, together = true;
    int before = omp_get_max_threads();
    for (int t = 0; t < 4; t++) {
        int M = t & 1 ? 97 : 45, N = t & 1 ? 45 : 1024, K = t & 1 ? 2051 : 2048;
        problem p = make_problem(t & 1, t >> 1, M, N, K, t, t & 1 ? 0.5f : 1.0f, t >= 2 ? 1.0f : 0.0f, &rng);
        omp_set_num_threads(1);
        float *C = run(ctx, &p), *R = run_cblas(&p), *H = run_in_halves(ctx, &p, (K / 2 + 31) / 32 * 32);
        double r = error_ratio(&p, C, R, false, false);
        if (!(r <= worst)) worst = r;
        size_t bytes = sizeof(float) * (size_t)p.M * p.ldc;
        as_halves = as_halves && !memcmp(C, H, bytes);
        for (int threads = 2; threads <= 4; threads++) {
            omp_set_num_threads(threads);
            float *Ct = run(ctx, &p);
            same = same && !memcmp(C, Ct, bytes);
            free(Ct);
        }
        float *team[4];
        omp_set_num_threads(4);
#pragma omp parallel for schedule(static, 1) num_threads(4)
        for (int i = 0; i < 4; i++) team[i] = run(ctx, &p);
        for (int i = 0; i < 4; i++) together = together && !memcmp(C, team[i], bytes), free(team[i]);
        free(C), free(R), free(H), free_problem(&p);
    }
    /* past 2^18 floats of C the product is made whole: other bits */
    problem big = make_problem(true, false, 600, 512, 2048, 0, 1.0f, 1.0f, &rng);
    float *whole = run(ctx, &big), *halves = run_in_halves(ctx, &big, 1024);
    bool made_whole = memcmp(whole, halves, sizeof(float) * (size_t)big.M * big.ldc) != 0;
    free(whole), free(halves), free_problem(&big);
    omp_set_num_threads(before);
    test_check(made_whole, "avx512-f32: a C past 2^18 floats is not summed in K halves", NULL);
    test_check(worst <= 1.0, "avx512-f32: products summed in K halves, all transposes, beta 0 and 1", "%.3g", worst);
    test_check(as_halves, "avx512-f32: a long K summed as its two halves one after the other (bits)", NULL);
    test_check(same, "avx512-f32: K halves, the same bits on 1, 2, 3 and 4 threads", NULL);
    test_check(together, "avx512-f32: K halves from 4 threads of a region at once (bits)", NULL);
}

/* Whether the bf16 engine runs on fp32 products here (gemm_widen.c): no
 * oneDNN primitive then. */
static bool bf16_widened(void) { return strncmp(gemm_bf16_how(), "bf16 values", 11) == 0; }

static void test_engine(gemm_engine engine) {
    const char *why = gemm_unavailable_reason(engine);
    gemm_ctx *ctx = gemm_create(engine, 1);
    char name[96];
    snprintf(name, sizeof name, "%s: created iff available", gemm_engine_name(engine));
    test_check((ctx == NULL) == (why != NULL), name, NULL);
    if (!ctx) {
        test_skip(gemm_engine_name(engine), why ? why : "not created");
        return;
    }
    bool bf16 = engine == GEMM_ONEDNN_BF16;
    double exact, worst = sweep(ctx, bf16, &exact);
    size_t created = gemm_primitives_created(ctx);
    double again_exact, again = sweep(ctx, bf16, &again_exact);
    printf("  %s: worst |C - cblas| / bound %.3g", gemm_describe(ctx), worst);
    if (bf16) printf(", vs exact bf16 products %.3g", exact);
    printf(", %zu primitives\n", created);
    snprintf(name, sizeof name, "%s: NN/NT/TN/TT, odd sizes, lds, alpha, beta", gemm_engine_name(engine));
    test_check(worst <= 1.0 && again <= 1.0, name, NULL);
    if (bf16)
        test_check(exact <= 1.0 && again_exact <= 1.0, "bf16: round-to-nearest operands, fp32 accumulation", NULL);
    snprintf(name, sizeof name, "%s: primitive cache reused on repeated shapes", gemm_engine_name(engine));
    bool onednn = engine == GEMM_ONEDNN_F32 || (engine == GEMM_ONEDNN_BF16 && !bf16_widened());
    test_check(!onednn ? created == 0 : created > 0 && gemm_primitives_created(ctx) == created, name, NULL);
    if (bf16) {
        snprintf(name, sizeof name, "bf16 %s: the start-up line names it (%s)", gemm_bf16_how(), gemm_describe(ctx));
        test_check(bf16_widened() == (strstr(gemm_describe(ctx), "OpenBLAS sgemm") != NULL), name, NULL);
    }
    test_edges(ctx);
    if (engine == GEMM_AVX512_F32) test_blocks(ctx), test_k_halves(ctx);
    if (bf16) test_bf16_copies(ctx);
    test_threads(ctx);
    gemm_destroy(ctx);
}

/* The process-wide engine as the model uses it (docs/scale.md §7): a
 * product whose operand lies in the registered parameters reads their bf16
 * copy (a change of the fp32 weights is invisible until the refresh); a
 * training step (fmm and softmax models) creates no primitive after the
 * first steps, and refreshes the copy exactly once, in AdamW's pass
 * (docs/design.md §8.10): a forward then gives the losses it gives after
 * a refresh of the whole copy (*fresh). Returns whether the model could be
 * created. */
static bool train_steps(gemm_ctx *ctx, int attention, size_t *created_at_2, size_t *refreshes, bool *fresh) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 19, cfg.d_model = 32, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 48, cfg.seq_len = 24;
    cfg.attention = attention, cfg.fmm_chunk = 8, cfg.gamma = 0.2;
    enum { B = 3, T = 24 };
    int32_t inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) inputs[i] = (int32_t)((i * 7 + 3) % 19), targets[i] = (int32_t)((i * 5 + 1) % 19);
    model m;
    status st;
    int rc = model_create(&m, &cfg, &st);
    if (!test_check(rc == 0, "model_create", rc ? "%s" : NULL, st.message)) return false;
    model_init_parameters(&m);
    size_t refresh0 = gemm_weight_refreshes(ctx);
    optimizer_settings s = {1e-3, 0.9, 0.95, 1e-8, 0.0, 1.0f};
    for (int step = 1; step <= 10; step++) {
        model_forward(&m, inputs, targets, NULL, B, T, m.momentum);
        model_backward(&m, inputs, targets, NULL, B, T, 1.0f / (B * T), NULL, false);
        optimizer_step_model(&m, step, &s);
        if (step == 2) *created_at_2 = gemm_primitives_created(ctx);
    }
    *refreshes = gemm_weight_refreshes(ctx) - refresh0;
    float losses[B * T];
    model_forward(&m, inputs, targets, NULL, B, T, false);
    memcpy(losses, m.acts.losses, sizeof losses);
    model_params_changed(&m);
    model_forward(&m, inputs, targets, NULL, B, T, false);
    *fresh = !memcmp(losses, m.acts.losses, sizeof losses);
    model_free(&m);
    return true;
}

/* gemm_hold (the default engine being bf16): products reading a held
 * activation, inside its range, give the exact products of its
 * bf16-rounded floats within fp32 rounding (read from the copy at the
 * copy's own leading dimension: oneDNN's last bits may differ from a
 * conversion per call); the copy is read while held (a change to the
 * floats is not seen) and no longer after gemm_release. */
static void test_hold(void) {
    uint64_t rng = 5;
    problem p = make_problem(false, false, 40, 24, 36, 0, 1.0f, 0.0f, &rng);
    size_t nc = (size_t)p.M * p.ldc;
    float *C[2];
    for (int i = 0; i < 2; i++) {
        C[i] = malloc(sizeof(float) * nc);
        memcpy(C[i], p.C0, sizeof(float) * nc);
    }
    gemm_hold(p.A, p.M, p.lda);
    float kept = p.A[0];
    gemm_product(false, false, p.M - 1, p.N, p.K, 1.0f, p.A + p.lda, p.lda, p.B, p.ldb, 0.0f, C[0] + p.ldc, p.ldc);
    p.A[0] = kept + 1.0f; /* not seen while held */
    gemm_product(false, false, 1, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb, 0.0f, C[0], p.ldc);
    gemm_release();
    gemm_product(false, false, 1, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb, 0.0f, C[1], p.ldc);
    double seen = fabs(C[1][0] - C[0][0]); /* about |B[0][0]|: the change, read after the release */
    p.A[0] = kept;
    double r = error_ratio(&p, C[0], NULL, true, true);
    test_check(r <= 1.0 && seen > 1e-3,
               "bf16: a held activation is converted once and read from its copy until released", "%.3g %.3g", r, seen);
    for (int i = 0; i < 2; i++) free(C[i]);
    free_problem(&p);
}

/* A held activation read whole and transposed (the weight gradient dY^T X,
 * K rows of M columns held) comes from the transposed copy as an
 * untransposed operand: a new oneDNN primitive beside the one that
 * converting per call made, and within fp32 rounding of the exact product
 * of the bf16-rounded operands (the order of the sums is oneDNN's, so not
 * the per-call bits). Ragged shapes cover the copy's partial bands of 32
 * rows and blocks of 16 columns; beta 1 accumulates as micro-batches do.
 * A product over part of the held rows reads the straight copy: a change
 * to the floats made after gemm_hold is not seen. */
static void test_hold_transposed(gemm_ctx *ctx) {
    static const int held_shapes[][3] = {{1, 1, 2}, {17, 5, 33}, {40, 24, 70}, {96, 64, 256}, {33, 48, 100}};
    uint64_t rng = 7;
    double worst = 0, worst_part = 0;
    bool routed = true;
    for (size_t s = 0; s < sizeof held_shapes / sizeof held_shapes[0]; s++)
        for (int beta = 0; beta < 2; beta++) {
            int M = held_shapes[s][0], N = held_shapes[s][1], K = held_shapes[s][2];
            problem p = make_problem(true, false, M, N, K, 0, 1.0f, (float)beta, &rng);
            float *C = run(ctx, &p), *part = run(ctx, &p); /* makes the per-call TN primitive */
            size_t before = gemm_primitives_created(ctx), bytes = sizeof(float) * (size_t)M * p.ldc;
            gemm_hold(p.A, K, M);
            memcpy(C, p.C0, bytes);
            gemm_product(true, false, M, N, K, 1.0f, p.A, p.lda, p.B, p.ldb, (float)beta, C, p.ldc);
            routed = routed && gemm_primitives_created(ctx) == before + 1;
            float kept = p.A[0];
            p.A[0] = kept + 1.0f; /* not seen: read from the copy */
            memcpy(part, p.C0, bytes);
            gemm_product(true, false, M, N, K - 1, 1.0f, p.A, p.lda, p.B, p.ldb, (float)beta, part, p.ldc);
            gemm_release();
            p.A[0] = kept;
            double r = error_ratio(&p, C, NULL, true, true);
            if (!(r <= worst)) worst = r;
            problem first = p;
            first.K = K - 1;
            r = error_ratio(&first, part, NULL, true, true);
            if (!(r <= worst_part)) worst_part = r;
            free(C), free(part), free_problem(&p);
        }
    if (bf16_widened()) /* no primitives to count; the values are the same from either copy */
        test_skip("bf16: a held activation's whole transposed product runs on its transposed copy",
                  "widened bf16 makes no oneDNN primitive");
    else test_check(routed, "bf16: a held activation's whole transposed product runs on its transposed copy", NULL);
    test_check(worst <= 1.0, "bf16: ... within fp32 rounding of the exact bf16 products", "%.3g", worst);
    test_check(worst_part <= 1.0, "bf16: a product over part of a held activation reads its straight copy", "%.3g",
               worst_part);
}

/* A held activation of 300 x 256 floats (past the size from which its
 * conversion is cut between the threads) converted on two threads gives
 * the copies one thread gives: the same bits from both products that read
 * them (the products themselves on the context's one thread). */
static void test_hold_threads(void) {
    enum { ROWS = 300, COLS = 256, N = 16 };
    uint64_t rng = 13;
    float *dy = matrix(ROWS, COLS, COLS, 0, &rng), *x = matrix(ROWS, N, N, 0, &rng), *w = matrix(COLS, N, N, 0, &rng);
    float *dw[2], *dx[2];
    int threads = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        dw[t] = malloc(sizeof(float) * COLS * N), dx[t] = malloc(sizeof(float) * ROWS * N);
        omp_set_num_threads(t + 1);
        gemm_hold(dy, ROWS, COLS);
        omp_set_num_threads(threads);
        gemm_product(true, false, COLS, N, ROWS, 1.0f, dy, COLS, x, N, 0.0f, dw[t], N);
        gemm_product(false, false, ROWS, N, COLS, 1.0f, dy, COLS, w, N, 0.0f, dx[t], N);
        gemm_release();
    }
    test_check(!memcmp(dw[0], dw[1], sizeof(float) * COLS * N) && !memcmp(dx[0], dx[1], sizeof(float) * ROWS * N),
               "bf16: a held activation converted on two threads = on one (both products, bits)", NULL);
    for (int t = 0; t < 2; t++) free(dw[t]), free(dx[t]);
    free(dy), free(x), free(w);
}

/* An input made in bf16 alone (the GELU output, docs/design.md §8.10):
 * matmul_forward_bf16 and matmul_backward_bf16 give the bits of the fp32
 * input converted per call, with dinp written over the input's memory as
 * the model writes it. */
static void test_bf16_inputs(void) {
    enum { ROWS = 70, IN = 96, OUT = 40 };
    uint64_t rng = 9;
    float *x = matrix(ROWS, IN, IN, 0, &rng), *w = matrix(OUT, IN, IN, 0, &rng), *b = matrix(1, OUT, OUT, 0, &rng);
    float *dy = matrix(ROWS, OUT, OUT, 0, &rng), *partials = malloc(sizeof(float) * kernel_sum_partials_floats(OUT));
    float *y[2], *dw[2], *db[2], *dx[2];
    for (int i = 0; i < 2; i++) {
        y[i] = malloc(sizeof(float) * ROWS * OUT), dw[i] = malloc(sizeof(float) * OUT * IN);
        db[i] = malloc(sizeof(float) * OUT), dx[i] = malloc(sizeof(float) * ROWS * IN);
    }
    float *shared = malloc(sizeof(float) * ROWS * IN); /* the bf16 input, then dinp over it */
    uint16_t *x16 = (uint16_t *)shared;
    cpu_f32_to_bf16(x16, x, (size_t)ROWS * IN);
    matmul_forward(y[0], x, w, b, ROWS, IN, OUT);
    matmul_forward_bf16(y[1], x16, w, b, ROWS, IN, OUT);
    matmul_backward(dx[0], dw[0], db[0], dy, x, w, ROWS, IN, OUT, false, partials);
    matmul_backward_bf16(shared, dw[1], db[1], dy, x16, w, ROWS, IN, OUT, false, partials);
    memcpy(dx[1], shared, sizeof(float) * ROWS * IN);
    bool same = !memcmp(y[0], y[1], sizeof(float) * ROWS * OUT) && !memcmp(dw[0], dw[1], sizeof(float) * OUT * IN) &&
                !memcmp(db[0], db[1], sizeof(float) * OUT) && !memcmp(dx[0], dx[1], sizeof(float) * ROWS * IN);
    test_check(same, "bf16: an input in bf16 alone = the fp32 input converted per call (forward, backward, bits)",
               NULL);
    for (int i = 0; i < 2; i++) free(y[i]), free(dw[i]), free(db[i]), free(dx[i]);
    free(x), free(w), free(b), free(dy), free(partials), free(shared);
}

static void test_default_engine(gemm_engine engine) {
    gemm_ctx *ctx = gemm_create(engine, 1);
    if (!ctx) return; /* reported by test_engine */
    gemm_set_default(ctx);
    char name[96];
    if (engine == GEMM_ONEDNN_BF16) {
        float W[6] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}, x[3] = {1.0f, 1.0f, 1.0f}, y[2];
        gemm_register_weights(ctx, W, 6);
        W[0] = 1.0f + 1.0f / 64; /* changes the bf16 value: 1 + 2^-6 */
        gemm_product(false, true, 1, 2, 3, 1.0f, x, 3, W, 3, 0.0f, y, 2);
        bool stale = y[0] == 6.0f;
        gemm_refresh_weights(ctx, W);
        gemm_product(false, true, 1, 2, 3, 1.0f, x, 3, W, 3, 0.0f, y, 2);
        test_check(stale && y[0] == 6.0f + 1.0f / 64, "bf16: weights read from their copy until refreshed", NULL);
        gemm_unregister_weights(ctx, W);
        test_hold();
        test_hold_transposed(ctx);
        test_hold_threads();
        test_bf16_inputs();
    }
    for (int attention = ATTENTION_SOFTMAX; attention <= ATTENTION_FMM; attention++) {
        size_t at_2 = 0, refreshes = 0;
        bool fresh = false;
        if (!train_steps(ctx, attention, &at_2, &refreshes, &fresh)) continue;
        size_t at_10 = gemm_primitives_created(ctx);
        snprintf(name, sizeof name, "%s %s: no new primitive after step 2 (%zu)", gemm_engine_name(engine),
                 attention == ATTENTION_FMM ? "fmm" : "softmax", at_10);
        bool onednn = engine == GEMM_ONEDNN_F32 || !bf16_widened();
        test_check(at_10 == at_2 && (at_10 > 0) == onednn, name, NULL);
        if (engine == GEMM_ONEDNN_BF16) {
            snprintf(name, sizeof name, "bf16 %s: weights refreshed once per step (%zu in 10 steps)",
                     attention == ATTENTION_FMM ? "fmm" : "softmax", refreshes);
            test_check(refreshes == 10, name, NULL);
            snprintf(name, sizeof name, "bf16 %s: AdamW's copy = a refresh's (the same losses)",
                     attention == ATTENTION_FMM ? "fmm" : "softmax");
            test_check(fresh, name, NULL);
        }
    }
    gemm_set_default(NULL);
    gemm_destroy(ctx);
}

/* GEMM_AUTO (docs/design.md §8.10): the class of a product is read off its
 * transposes; a class set to oneDNN runs there (its primitive cache grows),
 * the others, small products and products inside a parallel region do not
 * (those run on our own kernel or OpenBLAS); the choice's text form reads
 * back. */
/* A class given to our own kernel: its products equal cblas's to fp32
 * rounding (the routing itself is route()'s, which test_auto checks
 * through oneDNN's primitive count). */
static void test_auto_own(void) {
    gemm_ctx *ctx = gemm_create(GEMM_AUTO, 1);
    if (gemm_unavailable_reason(GEMM_AVX512_F32)) {
        test_skip("auto: a class on avx512-f32", gemm_unavailable_reason(GEMM_AVX512_F32));
        gemm_destroy(ctx);
        return;
    }
    gemm_engine set[GEMM_CLASSES] = {GEMM_OPENBLAS, GEMM_AVX512_F32, GEMM_OPENBLAS};
    gemm_set_class_engines(ctx, set);
    uint64_t rng = 11;
    problem p = make_problem(false, false, 256, 256, 300, 0, 1.0f, 0.0f, &rng); /* backward_data: NN */
    float *C = run(ctx, &p), *R = run_cblas(&p);
    double r = error_ratio(&p, C, R, false, false);
    test_check(r <= 1.0, "auto: the backward_data class on avx512-f32, within fp32 rounding", "%.3g", r);
    free(C), free(R), free_problem(&p);
    gemm_destroy(ctx);
}

static void test_auto(void) {
    gemm_engine set[GEMM_CLASSES] = {GEMM_ONEDNN_F32, GEMM_OPENBLAS, GEMM_OPENBLAS}, back[GEMM_CLASSES];
    char text[160];
    gemm_class_engines_format(set, text, sizeof text);
    test_check(!strcmp(text, "forward=onednn-f32,backward_data=openblas,backward_weight=openblas") &&
                   gemm_class_engines_parse(text, back) && !memcmp(set, back, sizeof set),
               "auto: the class engines read back from their text", "%s", text);
    const char *bad[] = {"", "forward=openblas", "forward=openblas,backward_data=openblas,backward_weight=x",
                         "forward=onednn-bf16,backward_data=openblas,backward_weight=openblas",
                         "forward=openblas,backward_data=openblas,backward_weight=openblas,"};
    bool refused = true;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused &= !gemm_class_engines_parse(bad[i], back);
    test_check(refused, "auto: malformed class engines refused", NULL);
    gemm_engine own[GEMM_CLASSES] = {GEMM_OPENBLAS, GEMM_AVX512_F32, GEMM_ONEDNN_F32};
    gemm_class_engines_format(own, text, sizeof text);
    test_check(!strcmp(text, "forward=openblas,backward_data=avx512-f32,backward_weight=onednn-f32") &&
                   gemm_class_engines_parse(text, back) && !memcmp(own, back, sizeof own),
               "auto: our own kernel's name reads back", "%s", text);
    test_auto_own();
    gemm_ctx *ctx = gemm_create(GEMM_AUTO, 1);
    if (!test_check(ctx != NULL, "auto: always available", NULL)) return;
    if (gemm_unavailable_reason(GEMM_ONEDNN_F32)) {
        test_skip("auto: classes routed to oneDNN", gemm_unavailable_reason(GEMM_ONEDNN_F32));
        gemm_destroy(ctx);
        return;
    }
    gemm_set_class_engines(ctx, set);
    enum { M = 256, N = 256, K = 256 }; /* 2^24 multiply-adds: not below GEMM_AUTO_MIN_MACS */
    float *A = calloc((size_t)M * K, sizeof(float)), *B = calloc((size_t)K * N, sizeof(float));
    float *C = calloc((size_t)M * N, sizeof(float)), *R = calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 13) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)(i % 7) * 0.1f;
    size_t before = gemm_primitives_created(ctx);
    gemm(ctx, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N); /* forward: oneDNN */
    size_t after_forward = gemm_primitives_created(ctx);
    gemm(ctx, true, false, M, N, K, 1.0f, A, M, B, N, 0.0f, C, N); /* weight gradient: OpenBLAS */
    gemm(ctx, false, true, 8, 8, 8, 1.0f, A, 8, B, 8, 0.0f, C, 8); /* small: OpenBLAS */
    test_check(after_forward == before + 1 && gemm_primitives_created(ctx) == after_forward,
               "auto: the forward class on oneDNN, the other classes and small products not", "%zu %zu %zu", before,
               after_forward, gemm_primitives_created(ctx));
    gemm(ctx, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, R, N);
    double worst = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) worst = fmax(worst, fabs(C[i] - R[i]) / (fabs(R[i]) + 1e-3));
    test_check(worst < 1e-5, "auto: oneDNN's forward equals cblas to fp32 rounding", "%.3g", worst);
    free(A), free(B), free(C), free(R);
    gemm_destroy(ctx);
}

/* gemm_tune_part's split between ranks (docs/design.md §8.10): over any
 * number of parts every timed shape is timed once, by the part the
 * multiply-adds balance; a part past the shapes times nothing but says
 * which engines run here; and the pick over timings added up keeps the
 * 3% margin, the tie, and an engine that one rank cannot run out. */
static void test_tune_parts(void) {
    gemm_ctx *ctx = gemm_create(GEMM_AUTO, 1);
    /* one shape of 2^27 multiply-adds, eight of 2^24, one below the floor */
    gemm_shape shapes[10];
    for (int i = 0; i < 10; i++) shapes[i] = (gemm_shape){(gemm_class)(i % GEMM_CLASSES), 256, 256, 256, 0.0f, 1};
    shapes[3] = (gemm_shape){GEMM_CLASS_FORWARD, 512, 512, 512, 0.0f, 2};
    shapes[7].M = 64;
    bool can_choose = !gemm_unavailable_reason(GEMM_ONEDNN_F32) || !gemm_unavailable_reason(GEMM_AVX512_F32);
    const int partings[] = {1, 2, 3, 20};
    for (size_t k = 0; k < sizeof partings / sizeof partings[0]; k++) {
        int parts = partings[k], total = 0, counts[21] = {0};
        for (int part = 0; part <= parts; part++) { /* and one part past them */
            gemm_timings t;
            counts[part] = gemm_tune_part(ctx, shapes, 10, part, parts, &t);
            if (part < parts) total += counts[part];
            bool marks = t.seconds[GEMM_ONEDNN_BF16][0] == HUGE_VAL && t.seconds[GEMM_AUTO][1] == HUGE_VAL &&
                         t.seconds[GEMM_OPENBLAS][2] < HUGE_VAL && t.shapes == counts[part];
            if (part == parts)
                test_check(counts[part] == 0 && marks && t.seconds[GEMM_OPENBLAS][0] == 0.0,
                           "tune: a part past the shapes times nothing, marking the engines", "parts %d: %d", parts,
                           counts[part]);
            else if (!marks)
                test_check(false, "tune: the engines auto does not choose are marked", "parts %d part %d", parts, part);
        }
        test_check(total == (can_choose ? 9 : 0), "tune: every timed shape timed by one part", "parts %d: %d of 9",
                   parts, total);
        if (parts == 2 && can_choose)
            test_check(counts[0] == 1 && counts[1] == 8, "tune: the parts balanced by multiply-adds",
                       "the large shape's part %d, the other %d", counts[0], counts[1]);
    }
    gemm_destroy(ctx);
    gemm_timings t = {0};
    for (int e = 0; e < GEMM_TUNE_ENGINES; e++)
        for (int c = 0; c < GEMM_CLASSES; c++) t.seconds[e][c] = HUGE_VAL;
    double ref = 1.0;
    t.seconds[GEMM_OPENBLAS][0] = ref, t.seconds[GEMM_ONEDNN_F32][0] = ref / 1.02; /* within the margin */
    t.seconds[GEMM_OPENBLAS][1] = ref, t.seconds[GEMM_ONEDNN_F32][1] = 0.8, t.seconds[GEMM_AVX512_F32][1] = 0.7;
    t.seconds[GEMM_OPENBLAS][2] = 0.0, t.seconds[GEMM_AVX512_F32][2] = 0.0; /* nothing timed */
    gemm_engine picked[GEMM_CLASSES];
    gemm_tune_pick(&t, picked);
    test_check(picked[0] == GEMM_OPENBLAS && picked[1] == GEMM_AVX512_F32 && picked[2] == GEMM_OPENBLAS,
               "tune: the pick keeps the margin and the tie", "%d %d %d", picked[0], picked[1], picked[2]);
    t.seconds[GEMM_AVX512_F32][1] += HUGE_VAL; /* a rank that cannot run it added its mark */
    gemm_tune_pick(&t, picked);
    test_check(picked[1] == GEMM_ONEDNN_F32, "tune: an engine one rank lacks is not picked", "%d", picked[1]);
}

int main(void) {
    test_conversion();
    gemm_engine parsed;
    test_check(gemm_engine_parse("onednn-bf16", &parsed) && parsed == GEMM_ONEDNN_BF16 &&
                   !gemm_engine_parse("bf16", &parsed),
               "engine names parse", NULL);
    for (int e = GEMM_OPENBLAS; e <= GEMM_ONEDNN_BF16; e++) test_engine((gemm_engine)e);
    test_engine(GEMM_AVX512_F32);
    for (int e = GEMM_ONEDNN_F32; e <= GEMM_ONEDNN_BF16; e++) test_default_engine((gemm_engine)e);
    test_auto();
    test_tune_parts();
    return test_summary("test_gemm");
}
