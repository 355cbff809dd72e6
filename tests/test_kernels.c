/* Finite-difference tests of every layer kernel in kernels.c and gelu.c: each checks
 * the analytic backward against central differences of L = sum(out * w).
 * Tile products and tiled softmax: test_tiles.c. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/float_env.h"
#include "kernels/kernels.h"
#include "kernels/tile_gemm.h"
#include "test_util.h"

static uint64_t rng_state = 42;

typedef struct {
    float *x, *w, *b, *out, *probe, *aux1, *aux2;
    const int32_t *tokens;
    int rows, in, out_dim, T, dh;
    bool causal;
    float *cos_t, *sin_t;
} ctx;

static float *randn(size_t n, float scale) { return fd_random(n, scale, &rng_state); }

/* ---- matmul ---- */
static double matmul_loss(void *p) {
    ctx *c = p;
    matmul_forward(c->out, c->x, c->w, c->b, c->rows, c->in, c->out_dim);
    return fd_dot(c->out, c->probe, (size_t)c->rows * c->out_dim);
}

static void test_matmul(void) {
    ctx c = {0};
    c.rows = 5, c.in = 7, c.out_dim = 6;
    c.x = randn(35, 1), c.w = randn(42, 1), c.b = randn(6, 1), c.out = randn(30, 1), c.probe = randn(30, 1);
    float *dx = calloc(35, 4), *dw = calloc(42, 4), *db = calloc(6, 4);
    float *partials = malloc(sizeof(float) * kernel_sum_partials_floats(c.out_dim));
    matmul_backward(dx, dw, db, c.probe, c.x, c.w, c.rows, c.in, c.out_dim, true, partials);
    fd_check("matmul dinp", c.x, dx, 35, matmul_loss, &c, 1e-2, 1e-3);
    fd_check("matmul dweight", c.w, dw, 42, matmul_loss, &c, 1e-2, 1e-3);
    fd_check("matmul dbias", c.b, db, 6, matmul_loss, &c, 1e-2, 1e-3);
}

/* ---- layernorm ---- */
static double layernorm_loss(void *p) {
    ctx *c = p;
    layernorm_forward(c->out, c->aux1, c->aux2, c->x, c->w, c->b, c->rows, c->in);
    return fd_dot(c->out, c->probe, (size_t)c->rows * c->in);
}

/* dim 9 is all tail, 37 two blocks of lanes and a tail (NORM_LANES 16). */
static void test_layernorm(int dim) {
    ctx c = {0};
    c.rows = 4, c.in = dim;
    size_t n = (size_t)c.rows * dim;
    c.x = randn(n, 2), c.w = randn(dim, 1), c.b = randn(dim, 1), c.out = randn(n, 1), c.probe = randn(n, 1);
    c.aux1 = calloc(4, 4), c.aux2 = calloc(4, 4);
    float *dx = calloc(n, 4), *dw = calloc(dim, 4), *db = calloc(dim, 4);
    layernorm_forward(c.out, c.aux1, c.aux2, c.x, c.w, c.b, c.rows, c.in);
    float *partials = malloc(sizeof(float) * kernel_sum_partials_floats(dim));
    layernorm_backward(dx, dw, db, c.probe, c.x, c.w, c.aux1, c.aux2, c.rows, c.in, true, partials);
    char name[80];
    snprintf(name, sizeof name, "layernorm dinp (dim %d)", dim);
    fd_check(name, c.x, dx, n, layernorm_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "layernorm dweight (dim %d)", dim);
    fd_check(name, c.w, dw, dim, layernorm_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "layernorm dbias (dim %d)", dim);
    fd_check(name, c.b, db, dim, layernorm_loss, &c, 1e-2, 1e-2);
}

/* ---- layernorm with the residual add and the product's bias ---- */
typedef struct {
    float *a, *product_bias, *residual, *x, *w, *b, *out, *mean, *rstd, *probe;
    int rows, dim;
} residual_ctx;

static double residual_loss(void *p) {
    residual_ctx *c = p;
    size_t n = (size_t)c->rows * c->dim;
    memcpy(c->x, c->a, sizeof(float) * n);
    layernorm_residual_forward(c->out, c->mean, c->rstd, c->x, c->product_bias, c->residual, c->w, c->b, c->rows,
                               c->dim);
    return fd_dot(c->out, c->probe, n);
}

/* x = a + product_bias + residual, then LayerNorm: da = dresidual = the
 * norm's dinp, dproduct_bias its column sums; and the fused kernel gives
 * the floats of residual_add followed by layernorm_forward. */
static void test_layernorm_residual(void) {
    enum { ROWS = 3, DIM = 37, N = ROWS * DIM };
    residual_ctx c = {randn(N, 2),  randn(DIM, 1),   randn(N, 2),     calloc(N, 4), randn(DIM, 1), randn(DIM, 1),
                      calloc(N, 4), calloc(ROWS, 4), calloc(ROWS, 4), randn(N, 1),  ROWS,          DIM};
    residual_loss(&c);
    float *dx = calloc(N, 4), *dw = calloc(DIM, 4), *db = calloc(DIM, 4), *dbias = calloc(DIM, 4);
    float *partials = malloc(sizeof(float) * kernel_sum_partials_floats(DIM));
    layernorm_backward(dx, dw, db, c.probe, c.x, c.w, c.mean, c.rstd, ROWS, DIM, false, partials);
    for (int i = 0; i < N; i++) dbias[i % DIM] += dx[i];
    fd_check("layernorm+residual d(product)", c.a, dx, N, residual_loss, &c, 1e-2, 1e-2);
    fd_check("layernorm+residual d(residual)", c.residual, dx, N, residual_loss, &c, 1e-2, 1e-2);
    fd_check("layernorm+residual d(product bias)", c.product_bias, dbias, DIM, residual_loss, &c, 1e-2, 1e-2);
    float *sum = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N), mean[ROWS], rstd[ROWS];
    memcpy(sum, c.a, sizeof(float) * N);
    residual_add(sum, c.product_bias, c.residual, ROWS, DIM);
    layernorm_forward(out, mean, rstd, sum, c.w, c.b, ROWS, DIM);
    residual_loss(&c);
    bool same = !memcmp(sum, c.x, sizeof(float) * N) && !memcmp(out, c.out, sizeof(float) * N) &&
                !memcmp(mean, c.mean, sizeof mean) && !memcmp(rstd, c.rstd, sizeof rstd);
    test_check(same, "layernorm+residual = residual_add, then layernorm (bits)", NULL);
}

/* ---- gelu with the product's bias ---- */
/* x is the pre-activation, made bias-free by the product; aux1 the slope */
static double gelu_loss(void *p) {
    ctx *c = p;
    gelu_bias_forward(c->out, c->aux1, c->x, c->b, c->rows, c->in);
    return fd_dot(c->out, c->probe, (size_t)c->rows * c->in);
}

/* dim 70: the tail after whole vectors of the column ranges (COLUMN_ALIGN 16). */
static void test_gelu(void) {
    enum { ROWS = 3, DIM = 70, N = ROWS * DIM };
    ctx c = {0};
    c.rows = ROWS, c.in = DIM;
    c.x = randn(N, 4), c.b = randn(DIM, 1), c.out = calloc(N, 4), c.probe = randn(N, 1);
    c.aux1 = calloc(N, 4);
    float *dx = calloc(N, 4), *db = calloc(DIM, 4), *again = calloc(DIM, 4), *alone = calloc(N, 4);
    gelu_loss(&c);
    float *partials = malloc(sizeof(float) * kernel_sum_partials_floats(DIM));
    gelu_bias_backward(dx, db, c.aux1, c.probe, ROWS, DIM, false, partials);
    fd_check("gelu+bias dinp", c.x, dx, N, gelu_loss, &c, 1e-3, 1e-2);
    fd_check("gelu+bias dbias", c.b, db, DIM, gelu_loss, &c, 1e-3, 1e-2);
    gelu_loss(&c);
    gelu_bias_forward(alone, NULL, c.x, c.b, ROWS, DIM); /* no slope asked, as the generation stream runs it */
    test_check(!memcmp(alone, c.out, sizeof(float) * N), "gelu+bias without its slope: the same output (bits)", NULL);
    /* accumulate adds the rows' sum (one block of rows here, its rows in
     * order) to what dbias holds; dpre may alias dout */
    float *expected = malloc(sizeof(float) * DIM), *in_place = malloc(sizeof(float) * N), rows_sum[DIM];
    memcpy(again, db, sizeof(float) * DIM), memcpy(expected, db, sizeof(float) * DIM);
    memset(rows_sum, 0, sizeof rows_sum);
    for (int i = 0; i < N; i++) rows_sum[i % DIM] += dx[i];
    for (int i = 0; i < DIM; i++) expected[i] += rows_sum[i];
    memcpy(in_place, c.probe, sizeof(float) * N);
    gelu_bias_backward(in_place, again, c.aux1, in_place, ROWS, DIM, true, partials);
    bool same = !memcmp(again, expected, sizeof(float) * DIM) && !memcmp(in_place, dx, sizeof(float) * N);
    test_check(same, "gelu+bias dbias accumulates, in place (bits)", NULL);
}

/* The vector forms' steps (docs/design.md §8.10) one lane at a time, with
 * fmaf where they fuse: fast_exp8/16_nonpositive, then fast_tanh8/16's
 * sign(u) (1 - t) / (1 + t), then GELU's cubic and output. */
static float exp_steps(float x) {
    x = fminf(88.0f, fmaxf(-87.0f, x));
    float n = nearbyintf(x * 1.44269504f);
    float r = fmaf(-n, 0.693145752f, x);
    r = fmaf(-n, 1.42860677e-6f, r);
    float p = fmaf(1.0f / 720, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24), p = fmaf(p, r, 1.0f / 6), p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f), p = fmaf(p, r, 1.0f);
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* GELU's output, and its slope unfused in C's order (test_kernels.c is
 * strict C11 too: no contraction). */
static float gelu_steps(float x, float *slope) {
    float u = 0.7978845608028654f * fmaf(0.044715f * x * x, x, x), t = exp_steps(-2.0f * fabsf(u));
    float th = copysignf((1.0f - t) / (1.0f + t), u), sech2 = 1.0f - th * th;
    *slope = 0.5f * (1.0f + th) + 0.5f * x * sech2 * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * x * (1.0f + th);
}

/* Where the CPU has AVX2 and FMA: 16 lanes (AVX-512F) and 8 give the
 * steps' bits, the slopes too; a row of 70 leaves a tail of 6 to each, and
 * in place (out over pre, as the generation stream runs it) the tail is the
 * output too. */
static void test_gelu_lanes(void) {
    if (!tile_gemm_available()) return; /* the portable form: other bits, the fd checks above */
    enum { ROWS = 5, DIM = 70, N = ROWS * DIM };
    float *x = randn(N, 3), *bias = randn(DIM, 1), want[N], want_slope[N];
    for (int i = 0; i < N; i++) want[i] = gelu_steps(x[i] + bias[i % DIM], &want_slope[i]);
    for (int wide = 1; wide >= 0; wide--) {
        tile_gemm_set_wide(wide);
        float out[N], slope[N], in_place[N], slope2[N];
        memcpy(in_place, x, sizeof in_place);
        gelu_bias_forward(out, slope, x, bias, ROWS, DIM);
        gelu_bias_forward(in_place, slope2, in_place, bias, ROWS, DIM);
        bool same = !memcmp(out, want, sizeof out) && !memcmp(slope, want_slope, sizeof slope) &&
                    !memcmp(in_place, want, sizeof in_place) && !memcmp(slope2, want_slope, sizeof slope2);
        bool sixteen = wide && __builtin_cpu_supports("avx512f"); /* else 8 lanes run either way */
        test_check(same,
                   sixteen ? "gelu+bias on 16 lanes = the fused steps (bits)"
                           : "gelu+bias on 8 lanes = the fused steps (bits)",
                   NULL);
    }
    tile_gemm_set_wide(-1);
    free(x), free(bias);
}

/* The bf16 outputs (docs/design.md §8.10): the fp32 kernels' floats,
 * rounded by cpu_f32_to_bf16, bit for bit. A row of 1,100 spans two
 * whole pieces of the bf16 row and a tail. */
static void test_gelu_bf16(void) {
    enum { ROWS = 30, DIM = 1100, N = ROWS * DIM };
    float *x = randn(N, 3), *bias = randn(DIM, 1), *out = malloc(sizeof(float) * N);
    float *slope = malloc(sizeof(float) * N), *slope16 = malloc(sizeof(float) * N);
    uint16_t *want = malloc(sizeof(uint16_t) * N), *got = malloc(sizeof(uint16_t) * N);
    gelu_bias_forward(out, slope, x, bias, ROWS, DIM);
    gelu_bias_forward_bf16(got, slope16, x, bias, ROWS, DIM);
    cpu_f32_to_bf16(want, out, N);
    bool same = !memcmp(got, want, sizeof(uint16_t) * N) && !memcmp(slope16, slope, sizeof(float) * N);
    test_check(same, "gelu_bias_forward_bf16 = bf16 of gelu_bias_forward, the slopes too (bits)", NULL);
    free(x), free(bias), free(out), free(slope), free(slope16), free(want), free(got);
}

/* LN1's and LN2's outputs in bf16 (the same reasons as above): the fp32
 * kernels' floats, rounded by cpu_f32_to_bf16, with the same mean, rstd
 * and residual sum, bit for bit; rows of 1,100 as above. */
static void test_layernorm_bf16(void) {
    enum { ROWS = 30, DIM = 1100, N = ROWS * DIM };
    float *x = randn(N, 3), *w = randn(DIM, 1), *b = randn(DIM, 1), *residual = randn(N, 1), *pb = randn(DIM, 1);
    float *out = malloc(sizeof(float) * N), *sum = malloc(sizeof(float) * N), *sum16 = malloc(sizeof(float) * N);
    float stats[4][ROWS];
    uint16_t *want = malloc(sizeof(uint16_t) * N), *got = malloc(sizeof(uint16_t) * N);
    layernorm_forward(out, stats[0], stats[1], x, w, b, ROWS, DIM);
    cpu_f32_to_bf16(want, out, N);
    layernorm_forward_bf16(got, stats[2], stats[3], x, w, b, ROWS, DIM);
    test_check(!memcmp(got, want, sizeof(uint16_t) * N) && !memcmp(stats[0], stats[2], sizeof stats[0]) &&
                   !memcmp(stats[1], stats[3], sizeof stats[1]),
               "layernorm_forward_bf16 = bf16 of layernorm_forward, mean and rstd too (bits)", NULL);
    memcpy(sum, x, sizeof(float) * N), memcpy(sum16, x, sizeof(float) * N);
    layernorm_residual_forward(out, stats[0], stats[1], sum, pb, residual, w, b, ROWS, DIM);
    cpu_f32_to_bf16(want, out, N);
    layernorm_residual_forward_bf16(got, stats[2], stats[3], sum16, pb, residual, w, b, ROWS, DIM);
    test_check(!memcmp(got, want, sizeof(uint16_t) * N) && !memcmp(sum, sum16, sizeof(float) * N) &&
                   !memcmp(stats[0], stats[2], sizeof stats[0]) && !memcmp(stats[1], stats[3], sizeof stats[1]),
               "layernorm_residual_forward_bf16 = bf16 of layernorm_residual_forward, the sum too (bits)", NULL);
    free(x), free(w), free(b), free(residual), free(pb), free(out), free(sum), free(sum16), free(want), free(got);
}

/* ---- the sums over rows on threads ---- */
/* Bias and LayerNorm gradients add fixed blocks of rows, then the blocks
 * in order; the embedding's scatter-add runs by column ranges (kernels.c):
 * the same floats on 1, 2 and 3 threads. 2,051 rows make 63 blocks of 33
 * and a short last one (at most 64 blocks of at least 32 rows), 200
 * columns a range per thread (80, 80 and 40 on 3). out: dx, dgelu
 * [rows, dim]; dw, db, dgelu_bias, dmatmul_bias, dmatmul_weight [dim];
 * dtable [5, dim]. */
enum { SUM_ROWS = 2051, SUM_DIM = 200, SUM_OUT = 2 * SUM_ROWS * SUM_DIM + 5 * SUM_DIM + 5 * SUM_DIM };

static void column_sums(int threads, float *out, const float *dy, const float *x, const float *w, const float *mean,
                        const float *rstd, const int32_t *tokens, float *partials) {
    enum { R = SUM_ROWS, D = SUM_DIM };
    omp_set_num_threads(threads);
    float *dx = out, *dgelu = dx + R * D, *dw = dgelu + R * D, *db = dw + D, *dgelu_bias = db + D;
    float *dmatmul_bias = dgelu_bias + D, *dmatmul_weight = dmatmul_bias + D, *dtable = dmatmul_weight + D;
    memset(out, 0, sizeof(float) * SUM_OUT);
    layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, R, D, false, partials);
    gelu_bias_backward(dgelu, dgelu_bias, w, dy, R, D, false, partials); /* w stands in for the slopes */
    matmul_backward(NULL, dmatmul_weight, dmatmul_bias, dy, x, x, R, 1, D, false, partials);
    embedding_backward(dtable, tokens, dy, R, D);
}

/* The largest relative difference between the float sums over rows and
 * float64 sums of the same floats (dy's columns: LayerNorm's and the
 * product's bias gradients; dgelu's: GELU's). */
static double column_sums_error(const float *out, const float *dy) {
    enum { R = SUM_ROWS, D = SUM_DIM };
    const float *dgelu = out + R * D, *db = out + 2 * R * D + D, *dgelu_bias = db + D, *dmatmul_bias = dgelu_bias + D;
    double worst = 0;
    for (int c = 0; c < D; c++) {
        double of_dy = 0, of_dgelu = 0, scale_dy = 0, scale_dgelu = 0;
        for (int r = 0; r < R; r++) {
            of_dy += dy[r * D + c], scale_dy += fabs(dy[r * D + c]);
            of_dgelu += dgelu[r * D + c], scale_dgelu += fabs(dgelu[r * D + c]);
        }
        double e[3] = {fabs(db[c] - of_dy) / scale_dy, fabs(dmatmul_bias[c] - of_dy) / scale_dy,
                       fabs(dgelu_bias[c] - of_dgelu) / scale_dgelu};
        for (int i = 0; i < 3; i++) worst = e[i] > worst ? e[i] : worst;
    }
    return worst;
}

static void test_column_sums_threads(void) {
    int32_t *tokens = malloc(sizeof(int32_t) * SUM_ROWS);
    for (int r = 0; r < SUM_ROWS; r++) tokens[r] = (r * 7 + r / 3) % 5;
    float *dy = randn(SUM_ROWS * SUM_DIM, 1), *x = randn(SUM_ROWS * SUM_DIM, 1), *w = randn(SUM_ROWS * SUM_DIM, 1);
    float *mean = randn(SUM_ROWS, 0.1f), *rstd = randn(SUM_ROWS, 1);
    float *partials = malloc(sizeof(float) * kernel_sum_partials_floats(SUM_DIM));
    float *out[3];
    int before = omp_get_max_threads();
    kernel_set_parallel_min(1);
    for (int t = 0; t < 3; t++) {
        out[t] = calloc(SUM_OUT, 4);
        column_sums(t + 1, out[t], dy, x, w, mean, rstd, tokens, partials);
    }
    kernel_set_parallel_min(0);
    omp_set_num_threads(before);
    bool same = !memcmp(out[0], out[1], sizeof(float) * SUM_OUT) && !memcmp(out[0], out[2], sizeof(float) * SUM_OUT);
    test_check(same, "sums over rows: the same on 1, 2 and 3 threads (bits)", NULL);
    double error = column_sums_error(out[0], dy);
    test_check(error < 1e-6, "sums over rows by blocks: float64's within 1e-6 of the sum of magnitudes", "%.2e", error);
    for (int t = 0; t < 3; t++) free(out[t]);
    free(tokens), free(dy), free(x), free(w), free(mean), free(rstd), free(partials);
}

/* ---- embedding ---- */
static double embedding_loss(void *p) {
    ctx *c = p;
    embedding_forward(c->out, c->tokens, c->w, c->rows, c->in);
    return fd_dot(c->out, c->probe, (size_t)c->rows * c->in);
}

static void test_embedding(void) {
    static const int32_t tokens[6] = {0, 3, 3, 1, 4, 0};
    ctx c = {0};
    c.rows = 6, c.in = 5, c.tokens = tokens;
    c.w = randn(25, 1), c.out = randn(30, 1), c.probe = randn(30, 1);
    float *dw = calloc(25, 4);
    embedding_backward(dw, tokens, c.probe, 6, 5);
    fd_check("embedding", c.w, dw, 25, embedding_loss, &c, 1e-2, 1e-3);
}

/* ---- rope ---- */
static double rope_loss(void *p) {
    ctx *c = p;
    rope_forward(c->out, c->x, c->cos_t, c->sin_t, c->T, c->dh, 3);
    return fd_dot(c->out, c->probe, (size_t)c->T * c->dh);
}

static void test_rope(void) {
    ctx c = {0};
    c.T = 6, c.dh = 8;
    size_t n = 48;
    c.cos_t = calloc(16 * 4, 4), c.sin_t = calloc(16 * 4, 4);
    rope_tables(c.cos_t, c.sin_t, 16, 8, 10000.0);
    c.x = randn(n, 1), c.out = randn(n, 1), c.probe = randn(n, 1);
    float *dx = malloc(sizeof(float) * n), *in_place = malloc(sizeof(float) * n);
    rope_backward(dx, c.probe, c.cos_t, c.sin_t, c.T, c.dh, 3);
    fd_check("rope", c.x, dx, n, rope_loss, &c, 1e-2, 1e-3);
    memcpy(in_place, c.probe, sizeof(float) * n);
    rope_backward(in_place, in_place, c.cos_t, c.sin_t, c.T, c.dh, 3);
    test_check(memcmp(in_place, dx, sizeof(float) * n) == 0, "rope in place = from another array, bits", NULL);
    free(in_place);
    /* between strided rows (a head's columns of wider rows), the floats of
     * the contiguous rotation, other columns untouched */
    enum { LD = 21, AT = 5 };
    float wide[6 * LD], back[6 * LD], fwd[48];
    for (int i = 0; i < 6 * LD; i++) wide[i] = back[i] = (float)i;
    for (int t = 0; t < 6; t++) memcpy(wide + t * LD + AT, c.x + t * 8, sizeof(float) * 8);
    rope_forward_rows(fwd, 8, wide + AT, LD, c.cos_t, c.sin_t, c.T, c.dh, 3);
    rope_forward(c.out, c.x, c.cos_t, c.sin_t, c.T, c.dh, 3);
    rope_backward_rows(back + AT, LD, c.probe, 8, c.cos_t, c.sin_t, c.T, c.dh, 3);
    bool same = !memcmp(fwd, c.out, sizeof fwd);
    for (int t = 0; t < 6; t++)
        for (int i = 0; i < LD; i++) {
            bool head = i >= AT && i < AT + 8;
            same &= head ? back[t * LD + i] == dx[t * 8 + i - AT] : back[t * LD + i] == (float)(t * LD + i);
        }
    test_check(same, "rope between strided rows = contiguous, bits", NULL);
    /* dh 40: two steps of eight pairs on the AVX-512 path and a tail of
     * four, the bits of the formula written out, both directions (backward
     * in place) */
    enum { WT = 5, WD = 40, WH = WD / 2 };
    float wcos[(3 + WT) * WH], wsin[(3 + WT) * WH], u[WT * WD], got[2][WT * WD], want[2][WT * WD];
    rope_tables(wcos, wsin, 3 + WT, WD, 10000.0);
    fd_fill(u, WT * WD, 1.0f, &rng_state);
    rope_forward(got[0], u, wcos, wsin, WT, WD, 3);
    memcpy(got[1], u, sizeof u);
    rope_backward(got[1], got[1], wcos, wsin, WT, WD, 3); /* in place */
    for (int dir = 0; dir < 2; dir++)
        for (int t = 0; t < WT; t++)
            for (int j = 0; j < WH; j++) {
                float a = u[t * WD + 2 * j], b = u[t * WD + 2 * j + 1], co = wcos[(3 + t) * WH + j];
                float sn = (dir ? -1.0f : 1.0f) * wsin[(3 + t) * WH + j];
                want[dir][t * WD + 2 * j] = a * co - b * sn;
                want[dir][t * WD + 2 * j + 1] = a * sn + b * co;
            }
    test_check(!memcmp(got, want, sizeof got), "rope at dh 40 = its formula, both directions, in place too, bits",
               NULL);
    /* angle check: position 1, pair 0 rotates by exactly 1 radian */
    float v[8] = {1, 0, 1, 0, 1, 0, 1, 0};
    rope_forward(v, v, c.cos_t, c.sin_t, 1, 8, 1);
    test_check(fabsf(v[0] - cosf(1.0f)) < 1e-6f && fabsf(v[1] - sinf(1.0f)) < 1e-6f, "rope angle t*theta_0",
               "(%.8f, %.8f)", v[0], v[1]);
}

/* ---- softmax attention ---- */
static double attention_loss(void *p) {
    ctx *c = p;
    softmax_attention_forward(c->out, c->aux1, c->x, c->w, c->b, c->T, c->T, c->dh, 0, c->causal);
    return fd_dot(c->out, c->probe, (size_t)c->T * c->dh);
}

static void test_attention(bool causal) {
    ctx c = {0};
    c.T = 7, c.dh = 4, c.causal = causal;
    size_t n = 28;
    c.x = randn(n, 1), c.w = randn(n, 1), c.b = randn(n, 1), c.out = randn(n, 1), c.probe = randn(n, 1);
    c.aux1 = calloc(49, 4);
    float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4), *scratch = calloc(49, 4);
    softmax_attention_forward(c.out, c.aux1, c.x, c.w, c.b, c.T, c.T, c.dh, 0, causal);
    softmax_attention_backward(dq, dk, dv, c.probe, c.aux1, c.x, c.w, c.b, scratch, c.T, c.T, c.dh, causal);
    const char *tag = causal ? "causal" : "full";
    char name[64];
    snprintf(name, sizeof name, "attention %s dq", tag);
    fd_check(name, c.x, dq, n, attention_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "attention %s dk", tag);
    fd_check(name, c.w, dk, n, attention_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "attention %s dv", tag);
    fd_check(name, c.b, dv, n, attention_loss, &c, 1e-2, 1e-2);
}

/* ---- cross-entropy ---- */
static double ce_loss(void *p) {
    ctx *c = p;
    memcpy(c->out, c->x, sizeof(float) * c->rows * c->in);
    int32_t pred[8];
    cross_entropy_forward(c->out, c->aux1, pred, c->tokens, c->rows, c->in);
    double sum = 0;
    for (int r = 0; r < c->rows; r++) sum += c->aux1[r] * 0.25;
    return sum;
}

/* Training's fused pass = forward, then backward, bit for bit (losses,
 * predictions, dlogits; a scale of 0 gives zeros); 40 classes take the
 * argmax's chunked search past its first chunk, where the maximum is tied. */
static void test_cross_entropy_fused(void) {
    enum { ROWS = 4, V = 40 };
    static const int32_t targets[ROWS] = {2, -1, 39, 17};
    float *logits = randn(ROWS * V, 3), *two = malloc(sizeof(float) * ROWS * V),
          *one = malloc(sizeof(float) * ROWS * V);
    logits[V + 20] = logits[V + 33] = 9.0f; /* row 1: first maximum at 20 */
    float loss_two[ROWS], loss_one[ROWS];
    int32_t pred_two[ROWS], pred_one[ROWS];
    for (int zero = 0; zero < 2; zero++) {
        float scale = zero ? 0.0f : 0.125f;
        memcpy(two, logits, sizeof(float) * ROWS * V), memcpy(one, logits, sizeof(float) * ROWS * V);
        cross_entropy_forward(two, loss_two, pred_two, targets, ROWS, V);
        cross_entropy_backward(two, targets, ROWS, V, scale);
        cross_entropy_forward_backward(one, loss_one, pred_one, targets, ROWS, V, scale);
        bool same = !memcmp(two, one, sizeof(float) * ROWS * V) && !memcmp(loss_two, loss_one, sizeof loss_one) &&
                    !memcmp(pred_two, pred_one, sizeof pred_one);
        test_check(same && pred_one[1] == 20,
                   zero ? "cross-entropy fused, scale 0 (bits)" : "cross-entropy fused (bits)",
                   "prediction of the tied row %d", pred_one[1]);
    }
}

static void test_cross_entropy(void) {
    static const int32_t targets[4] = {2, -1, 0, 5};
    ctx c = {0};
    c.rows = 4, c.in = 6, c.tokens = targets;
    c.x = randn(24, 3), c.out = calloc(24, 4), c.aux1 = calloc(4, 4);
    ce_loss(&c);
    float *d = malloc(sizeof(float) * 24);
    memcpy(d, c.out, sizeof(float) * 24);
    cross_entropy_backward(d, targets, 4, 6, 0.25f);
    fd_check("cross-entropy (ignored target -1)", c.x, d, 24, ce_loss, &c, 1e-2, 1e-2);
    /* exact value: uniform logits give log(n_classes) */
    float logits[6] = {0}, loss;
    int32_t pred, target = 3;
    cross_entropy_forward(logits, &loss, &pred, &target, 1, 6);
    test_check(fabsf(loss - logf(6.0f)) < 1e-6f, "cross-entropy uniform = log V", "%.8f", loss);
}

/* float_env.h: once flushing is on, a product that would be subnormal is 0
 * (flush-to-zero) and a subnormal operand counts as 0 (denormals-are-zero).
 * Values are judged by their bits: a float comparison made after the mode
 * change would itself read a subnormal as 0. */
#if defined(__x86_64__) || defined(__i386__)
static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static bool is_subnormal(float f) { return (float_bits(f) & 0x7f800000u) == 0 && (float_bits(f) & 0x007fffffu) != 0; }

static void test_flush_denormals(void) {
    volatile float tiny = 1e-30f, scale = 1e-10f, one = 1.0f;
    volatile float subnormal = tiny * scale; /* 1e-40 under IEEE rules */
    float_env_flush_denormals();
    volatile float product = tiny * scale, operand = subnormal * one;
    bool keep = getenv("MOMFMM_KEEP_DENORMALS") != NULL;
    bool ok = is_subnormal(subnormal) &&
              (keep ? is_subnormal(product) && !float_env_flushing()
                    : float_bits(product) == 0 && float_bits(operand) == 0 && float_env_flushing());
    test_check(ok, keep ? "subnormals kept (MOMFMM_KEEP_DENORMALS)" : "subnormals flushed to zero", NULL);
}
#else
static void test_flush_denormals(void) { test_skip("subnormals flushed to zero", "not x86"); }
#endif

int main(void) {
    test_matmul();
    test_layernorm(9);
    test_layernorm(37);
    test_layernorm_residual();
    test_gelu();
    test_gelu_lanes();
    test_gelu_bf16();
    test_layernorm_bf16();
    test_column_sums_threads();
    test_embedding();
    test_rope();
    test_attention(true);
    test_attention(false);
    test_cross_entropy();
    test_cross_entropy_fused();
    test_flush_denormals();
    return test_summary("test_kernels");
}
