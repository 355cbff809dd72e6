/* Tile products (tile_gemm.c: fp32 and bf16, every path against the
 * others and a double-precision product) and tiled softmax attention
 * (tiled_softmax.c): finite differences of its backward, full, causal and
 * banded, and tiled = dense. The other layer kernels: test_kernels.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/fast_math.h"
#include "kernels/kernels.h"
#include "kernels/tile_gemm.h"
#include "kernels/tiled_softmax.h"
#include "test_util.h"

static uint64_t rng_state = 42;

/* One head's tiled attention for the finite differences: q, k, v in x, w,
 * b; lse in aux1, the scratch in aux2. */
typedef struct {
    float *x, *w, *b, *out, *probe, *aux1, *aux2;
    int T, dh, half;
    bool causal;
} tiled_ctx;

static float *randn(size_t n, float scale) { return fd_random(n, scale, &rng_state); }

/* ---- tiled softmax attention (tiled_softmax.c) ---- */
static double tiled_loss(void *p) {
    tiled_ctx *c = p;
    tiled_softmax_band_forward(c->out, c->aux1, c->x, c->w, c->b, c->T, c->T, c->dh, 0, c->causal, c->half, false,
                               c->aux2);
    return fd_dot(c->out, c->probe, (size_t)c->T * c->dh);
}

/* Finite differences of the tiled backward, at T = 7 (one tile) and T = 300
 * (four query tiles, ragged edges); half > 0 restricts it to FMM's band
 * (|i - j| < half), narrower than a tile (7) or wider (150). */
static void test_tiled(bool causal, int T, int dh, int half) {
    tiled_ctx c = {0};
    c.T = T, c.dh = dh, c.causal = causal, c.half = half;
    size_t n = (size_t)T * dh;
    c.x = randn(n, 1), c.w = randn(n, 1), c.b = randn(n, 1), c.out = randn(n, 1), c.probe = randn(n, 1);
    c.aux1 = calloc((size_t)T, 4), c.aux2 = calloc(tiled_softmax_scratch_floats(T, dh), 4);
    float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4);
    tiled_softmax_band_forward(c.out, c.aux1, c.x, c.w, c.b, T, T, dh, 0, causal, half, false, c.aux2);
    tiled_softmax_band_backward(dq, dk, dv, c.probe, c.out, c.aux1, c.x, c.w, c.b, T, T, dh, 0, causal, half, false,
                                false, c.aux2);
    char name[80], tag[32];
    snprintf(tag, sizeof tag, half ? "%s band %d" : "%s", causal ? "causal" : "full", half);
    snprintf(name, sizeof name, "tiled attention %s T=%d dq", tag, T);
    fd_check(name, c.x, dq, n, tiled_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "tiled attention %s T=%d dk", tag, T);
    fd_check(name, c.w, dk, n, tiled_loss, &c, 1e-2, 1e-2);
    snprintf(name, sizeof name, "tiled attention %s T=%d dv", tag, T);
    fd_check(name, c.b, dv, n, tiled_loss, &c, 1e-2, 1e-2);
    free(c.x), free(c.w), free(c.b), free(c.out), free(c.probe), free(c.aux1), free(c.aux2), free(dq), free(dk),
        free(dv);
}

/* Tiled equals dense within 1e-5 relative at T = 1000: outputs, the three
 * gradients, and a streamed segment (37 queries at position 500). */
static void test_tiled_equals_dense(bool causal) {
    enum { T = 1000, DH = 16 };
    size_t n = (size_t)T * DH;
    float *q = randn(n, 1), *k = randn(n, 1), *v = randn(n, 1), *dout = randn(n, 1);
    float *probs = calloc((size_t)T * T, 4), *dense_scratch = calloc((size_t)T * T, 4);
    float *lse = calloc(T, 4), *scratch = calloc(tiled_softmax_scratch_floats(T, DH), 4);
    float *out[2], *dq[2], *dk[2], *dv[2];
    for (int i = 0; i < 2; i++) out[i] = calloc(n, 4), dq[i] = calloc(n, 4), dk[i] = calloc(n, 4), dv[i] = calloc(n, 4);
    softmax_attention_forward(out[0], probs, q, k, v, T, T, DH, 0, causal);
    softmax_attention_backward(dq[0], dk[0], dv[0], dout, probs, q, k, v, dense_scratch, T, T, DH, causal);
    tiled_softmax_forward(out[1], lse, q, k, v, T, T, DH, 0, causal, false, scratch);
    tiled_softmax_backward(dq[1], dk[1], dv[1], dout, out[1], lse, q, k, v, T, DH, causal, false, scratch);
    double worst = fmax(fmax(test_rel_error(out[1], out[0], n), test_rel_error(dq[1], dq[0], n)),
                        fmax(test_rel_error(dk[1], dk[0], n), test_rel_error(dv[1], dv[0], n)));
    char name[80];
    snprintf(name, sizeof name, "tiled = dense, %s T=1000: out, dq, dk, dv", causal ? "causal" : "full");
    test_check(worst <= 1e-5, name, "max rel %.3g", worst);
    if (causal) { /* a streamed segment: queries 500..536 against keys 0..536 */
        enum { N = 37, POS = 500 };
        softmax_attention_forward(out[0], probs, q + (size_t)POS * DH, k, v, N, POS + N, DH, POS, true);
        tiled_softmax_forward(out[1], lse, q + (size_t)POS * DH, k, v, N, POS + N, DH, POS, true, false, scratch);
        double seg = test_rel_error(out[1], out[0], (size_t)N * DH);
        test_check(seg <= 1e-5, "tiled = dense, a segment at position 500 (streaming)", "max rel %.3g", seg);
    }
    for (int i = 0; i < 2; i++) free(out[i]), free(dq[i]), free(dk[i]), free(dv[i]);
    free(q), free(k), free(v), free(dout), free(probs), free(dense_scratch), free(lse), free(scratch);
}

/* ---- tile products (tile_gemm.c) ---- */
/* Both paths (AVX2 where the CPU has it, and the portable C) against a
 * double-precision product, for shapes that are and are not multiples of
 * the 6 x 16 micro-tile, A read plainly and as a transposed view, with and
 * without accumulation; the error bound is the fp32 dot product's,
 * (k + 2) u sum |a b|, plus the accumulated C's rounding. */
static double tile_gemm_error(int m, int n, int k, bool transposed_a, bool accumulate) {
    int lda = transposed_a ? m + 3 : k + 2, ldb = n + 5, ldc = n + 1;
    float *a = randn((size_t)(transposed_a ? k : m) * lda, 1), *b = randn((size_t)k * ldb, 1);
    float *c = randn((size_t)m * ldc, 1), *c0 = malloc(sizeof(float) * (size_t)m * ldc);
    memcpy(c0, c, sizeof(float) * (size_t)m * ldc);
    ptrdiff_t a_row = transposed_a ? 1 : lda, a_col = transposed_a ? lda : 1;
    tile_gemm(m, n, k, 0.5f, a, a_row, a_col, b, ldb, accumulate, c, ldc);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            double exact = accumulate || j >= n ? c0[i * ldc + j] : 0, magnitude = fabs(exact);
            for (int p = 0; j < n && p < k; p++) {
                double term = 0.5 * a[i * a_row + p * a_col] * b[p * ldb + j];
                exact += term, magnitude += fabs(term);
            }
            double bound = (k + 3) * 0x1p-24 * magnitude + 1e-30;
            worst = fmax(worst, fabs(c[i * ldc + j] - exact) / bound);
        }
    free(a), free(b), free(c), free(c0);
    return worst; /* <= 1 within the bound; columns past n must be untouched */
}

static void test_tile_gemm_path(const char *path) {
    static const int shapes[][3] = {{1, 1, 1},     {6, 16, 32}, {7, 17, 5},  {13, 29, 96}, {8, 12, 9},
                                    {96, 32, 192}, {5, 3, 0},   {7, 70, 33}, {11, 64, 3},  {6, 48, 1}};
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mode = 0; mode < 4; mode++)
            worst = fmax(worst, tile_gemm_error(shapes[s][0], shapes[s][1], shapes[s][2], mode & 1, mode & 2));
    char name[96];
    snprintf(name, sizeof name, "tile_gemm (%s): odd shapes, transposed A, accumulate, within fp32 bounds", path);
    test_within(name, worst, 1.0);
}

/* Tiled attention forward and backward at T = 300 twice, its products
 * chosen by choose(0), then choose(1) (which returns whether that way runs
 * on bf16 operands): the largest relative difference of out, dq, dk and
 * dv, and whether every bit agrees. half > 0: FMM's band. */
typedef struct {
    double max_rel;
    bool same_bits;
} two_ways;

static two_ways tiled_two_ways(int DH, int half, bool (*choose)(int way)) {
    enum { T = 300 };
    size_t n = (size_t)T * DH;
    float *q = randn(n, 1), *k = randn(n, 1), *v = randn(n, 1), *dout = randn(n, 1), *lse = calloc(T, 4);
    float *scratch = calloc(tiled_softmax_scratch_floats(T, DH), 4), *got[2][4];
    for (int way = 0; way < 2; way++) {
        for (int i = 0; i < 4; i++) got[way][i] = calloc(n, 4);
        bool bf16 = choose(way);
        tiled_softmax_band_forward(got[way][0], lse, q, k, v, T, T, DH, 0, true, half, bf16, scratch);
        tiled_softmax_band_backward(got[way][1], got[way][2], got[way][3], dout, got[way][0], lse, q, k, v, T, T, DH, 0,
                                    true, half, false, bf16, scratch);
    }
    two_ways r = {0, true};
    for (int i = 0; i < 4; i++) {
        r.max_rel = fmax(r.max_rel, test_rel_error(got[0][i], got[1][i], n));
        r.same_bits = r.same_bits && memcmp(got[0][i], got[1][i], n * sizeof(float)) == 0;
    }
    for (int way = 0; way < 2; way++)
        for (int i = 0; i < 4; i++) free(got[way][i]);
    free(q), free(k), free(v), free(dout), free(lse), free(scratch);
    return r;
}

static bool avx2_then_portable(int way) {
    tile_gemm_set_enabled(way == 0);
    return false;
}
static bool avx2_then_wide(int way) {
    tile_gemm_set_wide(way);
    return false;
}
static bool fp32_then_bf16(int way) { return way == 1; }
static bool bf16_fp32_sums_then_native(int way) {
    tile_gemm_set_bf16_native(way);
    return true;
}

/* The tiled attention on the portable products equals it on AVX2 ones. */
static void test_tile_gemm_paths_agree(void) {
    two_ways r = tiled_two_ways(24, 0, avx2_then_portable);
    tile_gemm_set_enabled(true);
    test_check(r.max_rel <= 1e-5, "tiled attention: AVX2 and portable products agree (T=300, dh=24)", "max rel %.3g",
               r.max_rel);
}

/* The AVX-512 kernel (6 x 32, full column blocks) gives the same bits as
 * the AVX2 one: tiled attention forward and backward, T = 300, dh 64 (two
 * wide blocks of the head dimension) and 24 (none: the fallback). The
 * AVX-512 maxima and exponentials too, whose masks of the rows that see a
 * key (tiled_rows16_see) are walked causal and in bands narrower and
 * wider than a tile. Where the CPU has no AVX-512 the same source runs
 * built for AVX2. */
static void test_tile_gemm_wide_same_bits(int DH, int half) {
    two_ways r = tiled_two_ways(DH, half, avx2_then_wide);
    tile_gemm_set_wide(-1);
    char name[112];
    snprintf(name, sizeof name, "tiled attention: the AVX-512 kernel gives the AVX2 one's bits (T=300, dh=%d, band %d)",
             DH, half);
    test_check(r.same_bits, name, NULL);
}

/* tile_gemm_transpose writes dst[p * ld_dst + j] = src[j * ld_src + p] for
 * j < rows, p < cols and nothing else, on the path in force: shapes with
 * and without full 16 x 16 blocks and ragged edges both ways, rows and
 * columns apart by more than their lengths. */
static bool transpose_exact(int rows, int cols) {
    ptrdiff_t ld_src = cols + 3, ld_dst = rows + 5;
    size_t n_src = (size_t)rows * ld_src, n_dst = (size_t)cols * ld_dst;
    float *src = randn(n_src, 1), *dst = malloc(sizeof(float) * n_dst);
    for (size_t i = 0; i < n_dst; i++) dst[i] = -7.0f;
    tile_gemm_transpose(dst, ld_dst, src, ld_src, rows, cols);
    bool exact = true;
    for (int p = 0; p < cols; p++)
        for (ptrdiff_t j = 0; j < ld_dst; j++) exact &= dst[p * ld_dst + j] == (j < rows ? src[j * ld_src + p] : -7.0f);
    free(src), free(dst);
    return exact;
}

static void test_tile_transpose(const char *path) {
    static const int shapes[][2] = {{1, 1}, {15, 17}, {16, 16}, {33, 48}, {96, 64}, {70, 33}, {5, 32}};
    bool exact = true;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) exact &= transpose_exact(shapes[i][0], shapes[i][1]);
    char name[80];
    snprintf(name, sizeof name, "tile_gemm_transpose (%s): the transpose, nothing outside it", path);
    test_check(exact, name, NULL);
}

static void test_tile_gemm(void) {
    tile_gemm_set_wide(0);
    test_tile_transpose("element by element");
    tile_gemm_set_wide(1);
    test_tile_transpose(tile_gemm_available() && __builtin_cpu_supports("avx512f") ? "AVX-512" : "element by element");
    tile_gemm_set_wide(-1);
    if (tile_gemm_available()) {
        tile_gemm_set_wide(0);
        test_tile_gemm_path("AVX2");
        tile_gemm_set_wide(1);
        test_tile_gemm_path(__builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX-512's source as AVX2");
        tile_gemm_set_wide(-1);
        test_tile_gemm_wide_same_bits(64, 0);
        test_tile_gemm_wide_same_bits(24, 0);
        test_tile_gemm_wide_same_bits(64, 7);
        test_tile_gemm_wide_same_bits(64, 150);
    } else test_skip("tile_gemm (AVX2, AVX-512)", "the CPU has no AVX2 and FMA");
    tile_gemm_set_enabled(false);
    test_tile_gemm_path("portable");
    tile_gemm_set_enabled(true);
    if (tile_gemm_available()) test_tile_gemm_paths_agree();
    else test_skip("tiled attention: AVX2 and portable products agree", "the CPU has no AVX2 and FMA");
}

/* ---- bf16 tile products (tile_gemm.c) ---- */
static float bf16_round(float x) {
    uint16_t h;
    cpu_f32_to_bf16(&h, &x, 1);
    return cpu_bf16_to_f32(h);
}

/* One product C = 0.5 A B (+ C) on bf16 operands: A [m x k] packed with
 * its pairs contiguous (a_row = ld, a_col = 1) or across rows (a_row = 1,
 * a_col = ld), B [k x n] in pairs along k; returns C [m x (n + 1)] (its
 * last column must stay as it was) and the inputs for the reference. */
typedef struct {
    int m, n, k;
    float *a, *b, *c0, *c; /* a [m x k], b [k x n], c0 the C before */
} bf16_product;

static bf16_product run_bf16_product(int m, int n, int k, bool pairs_across, bool accumulate) {
    bf16_product r = {m, n, k, randn((size_t)m * k + 1, 1), randn((size_t)k * n + 1, 1), NULL, NULL};
    int pairs = (k + 1) / 2, ldc = n + 1;
    r.c0 = randn((size_t)m * ldc, 1), r.c = malloc(sizeof(float) * (size_t)m * ldc);
    memcpy(r.c, r.c0, sizeof(float) * (size_t)m * ldc);
    uint16_t *a16 = calloc(2 * (size_t)(m + 1) * (pairs + 1), 2), *b16 = calloc(2 * (size_t)pairs * (n + 3), 2);
    ptrdiff_t a_row = pairs_across ? 1 : pairs + 1, a_col = pairs_across ? m + 1 : 1;
    /* A's element (i, p) is a[i * k + p]: p runs along k */
    tile_bf16_pack(a16, a_col, a_row, r.a, 1, k, k, m);
    tile_bf16_pack(b16, n + 3, 1, r.b, n, 1, k, n);
    tile_gemm_bf16(m, n, k, 0.5f, a16, a_row, a_col, b16, n + 3, accumulate, r.c, ldc);
    if (!accumulate)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) r.c0[i * ldc + j] = 0.0f;
    free(a16), free(b16);
    return r;
}

static void free_product(bf16_product *r) { free(r->a), free(r->b), free(r->c0), free(r->c); }

/* Against the double-precision product of the bf16-rounded operands,
 * within the fp32 sum's bound (k + 3) u sum |a b|. */
static double bf16_product_error(const bf16_product *r) {
    double worst = 0;
    int ldc = r->n + 1;
    for (int i = 0; i < r->m; i++)
        for (int j = 0; j < ldc; j++) {
            double exact = r->c0[i * ldc + j], magnitude = fabs(exact);
            for (int p = 0; j < r->n && p < r->k; p++) {
                double term = 0.5 * bf16_round(r->a[i * r->k + p]) * bf16_round(r->b[p * r->n + j]);
                exact += term, magnitude += fabs(term);
            }
            double bound = (r->k + 3) * 0x1p-24 * magnitude + 1e-30;
            worst = fmax(worst, fabs(r->c[i * ldc + j] - exact) / bound);
        }
    return worst;
}

static const int bf16_shapes[][3] = {{1, 1, 1}, {6, 32, 32}, {7, 17, 5},  {13, 29, 96}, {8, 12, 9},   {96, 32, 192},
                                     {5, 3, 0}, {7, 70, 33}, {11, 64, 3}, {6, 48, 1},   {33, 33, 17}, {4, 16, 2}};

static void test_tile_bf16_path(const char *path) {
    double worst = 0;
    for (size_t s = 0; s < sizeof bf16_shapes / sizeof bf16_shapes[0]; s++)
        for (int mode = 0; mode < 4; mode++) {
            bf16_product r =
                run_bf16_product(bf16_shapes[s][0], bf16_shapes[s][1], bf16_shapes[s][2], mode & 1, mode & 2);
            worst = fmax(worst, bf16_product_error(&r));
            free_product(&r);
        }
    char name[96];
    snprintf(name, sizeof name, "tile_gemm_bf16 (%s): odd shapes, both A layouts, accumulate", path);
    test_within(name, worst, 1.0);
}

/* vdpbf16ps and the fp32 path give the same bits on every shape. */
static void test_tile_bf16_same_bits(void) {
    bool same = true;
    for (size_t s = 0; s < sizeof bf16_shapes / sizeof bf16_shapes[0]; s++)
        for (int mode = 0; mode < 4; mode++) {
            bf16_product r[2];
            for (int way = 0; way < 2; way++) {
                uint64_t seed = rng_state;
                tile_gemm_set_bf16_native(way);
                r[way] = run_bf16_product(bf16_shapes[s][0], bf16_shapes[s][1], bf16_shapes[s][2], mode & 1, mode & 2);
                if (way == 0) rng_state = seed; /* the same operands twice */
            }
            size_t bytes = sizeof(float) * (size_t)bf16_shapes[s][0] * (bf16_shapes[s][1] + 1);
            same = same && memcmp(r[0].c, r[1].c, bytes) == 0;
            free_product(&r[0]), free_product(&r[1]);
        }
    tile_gemm_set_bf16_native(-1);
    test_check(same, "tile_gemm_bf16: vdpbf16ps gives the fp32 path's bits", NULL);
}

/* Rows of contiguous values into pair rows (the packing of a query tile
 * and a key tile): the transposing path on vdpbf16ps cores gives the bytes
 * of the scalar one, writes nothing between the pair rows (d_k > n) and
 * rounds an odd k's last pair up with a zero. */
static void test_tile_bf16_pack_transposed(void) {
    static const int ks[] = {1, 2, 3, 31, 32, 33, 64, 65, 97}, ns[] = {1, 15, 16, 17, 96, 101};
    bool same = true;
    for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            int k = ks[a], n = ns[b], pairs = (k + 1) / 2;
            ptrdiff_t d_k = n + 5;
            float *src = randn((size_t)k * n, 1);
            uint16_t *got[2];
            for (int way = 0; way < 2; way++) {
                got[way] = malloc(2 * sizeof(uint16_t) * (size_t)pairs * d_k);
                memset(got[way], 0xA5, 2 * sizeof(uint16_t) * (size_t)pairs * d_k);
                tile_gemm_set_bf16_native(way == 0 ? 0 : -1);
                tile_bf16_pack(got[way], d_k, 1, src, 1, k, k, n);
            }
            same = same && memcmp(got[0], got[1], 2 * sizeof(uint16_t) * (size_t)pairs * d_k) == 0;
            free(src), free(got[0]), free(got[1]);
        }
    tile_gemm_set_bf16_native(-1);
    test_check(same, "tile_bf16_pack: rows into pair rows, vdpbf16ps path = scalar path's bytes", NULL);
}

/* The held dY's conversion (gemm.c): the straight copy = cpu_f32_to_bf16's
 * rows, the transposed copy element by element, nothing written between
 * or past the rows of either (ld > cols, ld_t > rows), and the vdpbf16ps
 * path's bytes = the portable one's. Ragged bands (rows not a multiple of
 * 32), column blocks (not of 16) and steps (more than 1,024 columns). */
static void test_tile_bf16_transpose(void) {
    static const int rows_of[] = {1, 15, 31, 32, 33, 70, 100}, cols_of[] = {1, 15, 16, 17, 40, 1030};
    bool right = true, same = true;
    for (size_t a = 0; a < sizeof rows_of / sizeof rows_of[0]; a++)
        for (size_t b = 0; b < sizeof cols_of / sizeof cols_of[0]; b++) {
            int rows = rows_of[a], cols = cols_of[b];
            ptrdiff_t ld = cols + 3, ld_t = rows + 7;
            size_t n = (size_t)rows * cols, n_s = (size_t)rows * ld, n_t = (size_t)cols * ld_t;
            float *src = randn(n, 1);
            uint16_t *want = malloc(sizeof(uint16_t) * n), *got[2][2];
            cpu_f32_to_bf16(want, src, n);
            for (int way = 0; way < 2; way++) {
                got[way][0] = malloc(sizeof(uint16_t) * n_s), got[way][1] = malloc(sizeof(uint16_t) * n_t);
                memset(got[way][0], 0xA5, sizeof(uint16_t) * n_s);
                memset(got[way][1], 0xA5, sizeof(uint16_t) * n_t);
                tile_gemm_set_bf16_native(way == 0 ? 0 : -1);
                tile_bf16_transpose(got[way][1], ld_t, got[way][0], ld, src, rows, cols);
            }
            for (int way = 0; way < 2; way++) {
                bool ok = true;
                for (int r = 0; r < rows; r++)
                    for (ptrdiff_t c = 0; c < ld; c++) {
                        uint16_t at = got[way][0][r * ld + c];
                        ok = ok && (c < cols ? at == want[(size_t)r * cols + c] : at == 0xA5A5);
                    }
                for (int c = 0; c < cols; c++)
                    for (ptrdiff_t r = 0; r < ld_t; r++) {
                        uint16_t at = got[way][1][c * ld_t + r];
                        ok = ok && (r < rows ? at == want[(size_t)r * cols + c] : at == 0xA5A5);
                    }
                right = right && ok;
            }
            same = same && !memcmp(got[0][0], got[1][0], sizeof(uint16_t) * n_s) &&
                   !memcmp(got[0][1], got[1][1], sizeof(uint16_t) * n_t);
            free(src), free(want);
            for (int way = 0; way < 2; way++) free(got[way][0]), free(got[way][1]);
        }
    tile_gemm_set_bf16_native(-1);
    test_check(right, "tile_bf16_transpose: straight and transposed copies, nothing between or past their rows", NULL);
    if (tile_gemm_bf16_native()) test_check(same, "tile_bf16_transpose: vdpbf16ps path = portable path's bytes", NULL);
    else test_skip("tile_bf16_transpose: vdpbf16ps path", "the CPU has no AVX512_BF16");
}

/* Tiled attention on bf16 operands against the fp32 kernel (T = 300:
 * ragged tiles; causal, a band narrower than a tile and one wider): out,
 * dq, dk, dv within BF16_TILED_BOUND of the largest value. An operand in
 * bf16 carries a relative error of up to 2^-8; the products, P and dS
 * each add one such rounding, so a few times 2^-8 on sums of random
 * signs; measured: 3.5e-3 to 5.2e-3 (dh 24 and 64). A wrong stride or pair
 * is off by the size of the values (~1). */
#define BF16_TILED_BOUND 1e-2

static void test_tiled_bf16(int DH, int half) {
    two_ways r = tiled_two_ways(DH, half, fp32_then_bf16);
    char name[96];
    snprintf(name, sizeof name, "tiled attention bf16 = fp32 within 1e-2 (T=300, dh=%d, band %d)", DH, half);
    test_within(name, r.max_rel, BF16_TILED_BOUND);
}

/* The bf16 attention on vdpbf16ps gives the bits of its fp32 path. */
static void test_tiled_bf16_same_bits(int DH, int half) {
    two_ways r = tiled_two_ways(DH, half, bf16_fp32_sums_then_native);
    tile_gemm_set_bf16_native(-1);
    char name[96];
    snprintf(name, sizeof name, "tiled attention bf16: vdpbf16ps = fp32 sums, bits (dh=%d, band %d)", DH, half);
    test_check(r.same_bits, name, NULL);
}

/* bf16 forward packs a head's K and V once for all its query tiles where
 * they fit the scratch's rows part (tiled_softmax.c, whole_keys), else
 * each key tile once per query tile: the rows of each query tile run
 * alone (96 rows, TILE_Q of tiled_softmax_internal.h: one tile, packed
 * per tile) give the bits of the whole call.
 * Tq queries at positions Tk - Tq.. against Tk keys, the scratch exactly
 * tiled_softmax_scratch_floats(Tq, dh) (the sanitizer build sees a pack
 * past it): Tk = Tq and Tk a little more (packed once), Tk far more
 * (per tile), and a band (per tile). */
static void test_tiled_bf16_tiles_alone(bool causal, int Tq, int Tk, int dh, int half) {
    size_t n = (size_t)Tq * dh;
    float *q = randn(n, 1), *k = randn((size_t)Tk * dh, 1), *v = randn((size_t)Tk * dh, 1);
    float *out = calloc(n, 4), *lse = calloc((size_t)Tq, 4), *part = calloc(n, 4), *part_lse = calloc((size_t)Tq, 4);
    float *scratch = malloc(tiled_softmax_scratch_floats(Tq, dh) * sizeof(float));
    tiled_softmax_band_forward(out, lse, q, k, v, Tq, Tk, dh, Tk - Tq, causal, half, true, scratch);
    for (int i0 = 0; i0 < Tq; i0 += 96) {
        int rows = Tq - i0 < 96 ? Tq - i0 : 96;
        size_t at = (size_t)i0 * dh;
        tiled_softmax_band_forward(part + at, part_lse + i0, q + at, k, v, rows, Tk, dh, Tk - Tq + i0, causal, half,
                                   true, scratch);
    }
    char name[128];
    snprintf(name, sizeof name,
             "tiled attention bf16: query tiles alone give the whole call's bits (%s, Tq=%d, Tk=%d, dh=%d, band %d)",
             causal ? "causal" : "full", Tq, Tk, dh, half);
    test_check(memcmp(out, part, n * sizeof(float)) == 0 && memcmp(lse, part_lse, (size_t)Tq * sizeof(float)) == 0,
               name, NULL);
    free(q), free(k), free(v), free(out), free(lse), free(part), free(part_lse), free(scratch);
}

/* In bf16 the tiles' exponentials are fast_exp_coarse's (fast_math.h: P
 * is rounded to bf16 next), in fp32 fast_exp_nonpositive's, on every
 * path. Scores exact on every path (bf16-exact operands, one nonzero term,
 * the scale 1/2 of dh 4): each of 27 query rows (a group of 16, one of 8
 * and a tail of 3, the exponentials' three widths) sees key 0 at score 0
 * and 7 keys at -11/32, where the two polynomials differ by 2.2e-6 of the
 * value: the log-sum-exp, log(1 + 7 e^-11/32) summed in key order as the
 * kernel sums, tells them apart by 14 ulp. */
#define COARSE_KEYS 8
static double coarse_exp_lse(bool bf16) {
    float l = 1.0f;
    for (int j = 1; j < COARSE_KEYS; j++) l += bf16 ? fast_exp_coarse(-0.34375f) : fast_exp_nonpositive(-0.34375f);
    return log((double)l);
}

static void test_tiled_coarse_exp(const char *path) {
    enum { TQ = 27, TK = COARSE_KEYS, DH = 4 };
    float q[TQ * DH] = {0}, k[TK * DH] = {0}, v[TK * DH] = {0}, out[TQ * DH], lse[TQ];
    for (int i = 0; i < TQ; i++) q[i * DH] = 1.0f;
    for (int j = 1; j < TK; j++) k[j * DH] = -0.6875f, v[j * DH] = 1.0f;
    float *scratch = malloc(tiled_softmax_scratch_floats(TQ, DH) * sizeof(float));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        double want = coarse_exp_lse(bf16);
        tiled_softmax_forward(out, lse, q, k, v, TQ, TK, DH, 0, false, bf16, scratch);
        double worst = 0;
        for (int i = 0; i < TQ; i++) worst = fmax(worst, fabs(lse[i] - want));
        char name[112];
        snprintf(name, sizeof name, "tiled attention %s (%s): the exponentials of %s", bf16 ? "bf16" : "fp32", path,
                 bf16 ? "fast_exp_coarse" : "fast_exp_nonpositive");
        test_within(name, worst, 2.5e-7);
    }
    free(scratch);
}

/* x's bf16, rounded to nearest even as the products' operands are, and
 * *margin: x's distance in fp32 ulps from the nearest rounding midpoint. */
static uint16_t bf16_of(float x, int *margin) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    *margin = abs((int)(u & 0xFFFF) - 0x8000);
    uint16_t b;
    cpu_f32_to_bf16_portable(&b, &x, 1);
    return b;
}

/* The backward's probabilities in bf16 are the coarse ones too: dV = P^T
 * dO with dO's row i the unit vector e_i shows bf16(P_ij) itself in
 * dv[j][i] (one nonzero term), and the scores are exact (a_i b_j / 8 with
 * a, b bf16-exact, dh 64), so each P_ij is fast_exp_coarse(s_ij - lse_i)
 * up to an ulp or two of the vector forms. Checked wherever P lies 8 ulp
 * or more from bf16's rounding midpoint; where fast_exp_nonpositive would
 * round to another bf16 (about one pair in 4,000 here), only the coarse
 * exponentials pass. 2,059 keys: 16-key groups, one of 8 and a tail of 3. */
static void test_tiled_coarse_exp_backward(const char *path) {
    enum { TQ = 64, TK = 2059, DH = 64 };
    float *q = calloc((size_t)TQ * DH, 4), *k = calloc((size_t)TK * DH, 4), *v = calloc((size_t)TK * DH, 4);
    float *dout = calloc((size_t)TQ * DH, 4), *out = calloc((size_t)TQ * DH, 4), *lse = calloc(TQ, 4);
    float *dq = calloc((size_t)TQ * DH, 4), *dk = calloc((size_t)TK * DH, 4), *dv = calloc((size_t)TK * DH, 4);
    float *scratch = malloc(tiled_softmax_scratch_floats(TK, DH) * sizeof(float));
    for (int i = 0; i < TQ; i++) q[i * DH] = 1.0f + i / 64.0f, dout[i * DH + i] = 1.0f;
    for (int j = 0; j < TK; j++) k[j * DH] = -(float)(j % 251) / 32.0f;
    tiled_softmax_band_forward(out, lse, q, k, v, TQ, TK, DH, 0, false, 0, true, scratch);
    tiled_softmax_band_backward(dq, dk, dv, dout, out, lse, q, k, v, TQ, TK, DH, 0, false, 0, false, true, scratch);
    int checked = 0, telling = 0, wrong = 0;
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < TK; j++) {
            float x = q[i * DH] * k[j * DH] / 8.0f - lse[i];
            int margin, full_margin;
            uint16_t want = bf16_of(fast_exp_coarse(x), &margin), full = bf16_of(fast_exp_nonpositive(x), &full_margin);
            if (margin < 8) continue;
            uint32_t bits = (uint32_t)want << 16, got;
            memcpy(&got, &dv[(size_t)j * DH + i], sizeof got);
            checked++, wrong += got != bits, telling += full != want && full_margin >= 8;
        }
    char name[128];
    snprintf(name, sizeof name, "tiled attention bf16 (%s): backward's P = bf16(fast_exp_coarse), %d of %d tell", path,
             telling, checked);
    test_check(wrong == 0 && telling >= 5, name, "%d wrong", wrong);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(scratch);
}

/* A NaN query row (a NaN logit upstream) stays in its row: its output,
 * log-sum-exp and dq are NaN (fast_exp_nonpositive and _coarse pass NaN
 * through, the maxima skip it), and every other row's out, lse and dq
 * are the bits of the run with that row zero (T = 150: two query tiles,
 * causal). Keys the row sees get NaN in dk and dv, as they should. */
static void test_tiled_nan_row(bool bf16, const char *path) {
    enum { T = 150, DH = 24, BAD = 37 };
    size_t n = (size_t)T * DH;
    float *q = randn(n, 1), *k = randn(n, 1), *v = randn(n, 1), *dout = randn(n, 1);
    float *scratch = malloc(tiled_softmax_scratch_floats(T, DH) * sizeof(float)), *got[2][5];
    for (int way = 0; way < 2; way++) {
        for (int c = 0; c < DH; c++) q[BAD * DH + c] = way ? NAN : 0.0f;
        for (int i = 0; i < 5; i++) got[way][i] = calloc(n, 4);
        tiled_softmax_forward(got[way][0], got[way][1], q, k, v, T, T, DH, 0, true, bf16, scratch);
        tiled_softmax_backward(got[way][2], got[way][3], got[way][4], dout, got[way][0], got[way][1], q, k, v, T, DH,
                               true, bf16, scratch);
    }
    bool nan_row = isnan(got[1][1][BAD]), others = true;
    for (int c = 0; c < DH; c++) nan_row = nan_row && isnan(got[1][0][BAD * DH + c]) && isnan(got[1][2][BAD * DH + c]);
    for (int r = 0; r < T; r++) {
        if (r == BAD) continue;
        size_t at = (size_t)r * DH, bytes = DH * sizeof(float);
        others = others && got[0][1][r] == got[1][1][r] && !memcmp(got[0][0] + at, got[1][0] + at, bytes) &&
                 !memcmp(got[0][2] + at, got[1][2] + at, bytes);
    }
    char name[112];
    snprintf(name, sizeof name, "tiled attention %s (%s): a NaN query row stays in its row", bf16 ? "bf16" : "fp32",
             path);
    test_check(nan_row && others && isnan(got[1][4][0]), name, "row NaN %d, others equal %d", nan_row, others);
    for (int way = 0; way < 2; way++)
        for (int i = 0; i < 5; i++) free(got[way][i]);
    free(q), free(k), free(v), free(dout), free(scratch);
}

static void test_tiled_bf16_packing(void) {
    test_tiled_bf16_tiles_alone(true, 300, 300, 24, 0);
    test_tiled_bf16_tiles_alone(false, 300, 300, 63, 0);
    test_tiled_bf16_tiles_alone(true, 200, 237, 64, 0);
    test_tiled_bf16_tiles_alone(true, 150, 1000, 32, 0);
    test_tiled_bf16_tiles_alone(true, 300, 300, 32, 150);
}

static void test_tile_bf16(void) {
    double apart = fabs(coarse_exp_lse(true) - coarse_exp_lse(false));
    test_check(apart > 1e-6, "tiled attention: the two exponentials' log-sum-exps differ by > 1e-6", "%.3g", apart);
    test_tiled_coarse_exp("the CPU's kernels");
    test_tiled_coarse_exp_backward("the CPU's kernels");
    for (int bf16 = 0; bf16 < 2; bf16++) test_tiled_nan_row(bf16, "the CPU's kernels");
    tile_gemm_set_wide(0);
    test_tiled_coarse_exp("AVX2 kernels");
    test_tiled_coarse_exp_backward("AVX2 kernels");
    for (int bf16 = 0; bf16 < 2; bf16++) test_tiled_nan_row(bf16, "AVX2 kernels");
    tile_gemm_set_wide(-1);
    tile_gemm_set_bf16_native(0);
    test_tiled_coarse_exp("bf16 as fp32 sums");
    test_tiled_coarse_exp_backward("bf16 as fp32 sums");
    test_tiled_nan_row(true, "bf16 as fp32 sums");
    tile_gemm_set_bf16_native(-1);
    tile_gemm_set_enabled(false);
    test_tiled_coarse_exp("portable products");
    test_tiled_coarse_exp_backward("portable products");
    for (int bf16 = 0; bf16 < 2; bf16++) test_tiled_nan_row(bf16, "portable products");
    tile_gemm_set_enabled(true);
    test_tile_bf16_transpose();
    tile_gemm_set_bf16_native(0);
    test_tile_bf16_path("fp32 sums");
    for (int way = 0; way < 2; way++) {
        test_tiled_bf16_packing();
        test_tiled_bf16(24, 0);
        test_tiled_bf16(64, 7);
        test_tiled_bf16(64, 150);
        tile_gemm_set_bf16_native(-1);
        if (!tile_gemm_bf16_native()) break;
    }
    if (tile_gemm_bf16_native()) {
        test_tile_bf16_path("vdpbf16ps");
        test_tile_bf16_same_bits();
        test_tile_bf16_pack_transposed();
        test_tiled_bf16_same_bits(24, 0);
        test_tiled_bf16_same_bits(64, 150);
    } else test_skip("tile_gemm_bf16 and tiled attention on vdpbf16ps", "the CPU has no AVX512_BF16");
}

int main(void) {
    test_tiled(true, 7, 4, 0);
    test_tiled(false, 7, 4, 0);
    test_tiled(true, 300, 4, 0);
    test_tiled(false, 300, 4, 0);
    test_tiled(true, 300, 4, 7);
    test_tiled(false, 300, 4, 7);
    test_tiled(true, 300, 4, 150);
    test_tiled(false, 300, 4, 150);
    test_tiled_equals_dense(true);
    test_tiled_equals_dense(false);
    test_tile_gemm();
    test_tile_bf16();
    return test_summary("test_tiles");
}
