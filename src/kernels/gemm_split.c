/* Products cut between OpenMP's threads (gemm_split.h): OpenBLAS's and our
 * own kernel's, by rows or columns of C, or in two halves of K; see
 * docs/design.md §8.10 for why. */
#include "gemm_split.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "base/sys.h"
#include "gemm_avx512.h"

struct gemm_spaces {
    /* Our own kernel's packing space per OpenMP thread, made at the
     * thread's first product (a fixed size, then reused). */
    gemm_avx512_space *kernel[GEMM_TEAM_MAX];
    /* The second K half's sums of a product summed in halves, per calling
     * thread as the packing space: grown to the largest C met (during the
     * first step, at most K_HALVES_MAX_C floats), then reused. */
    float *half_sums[GEMM_TEAM_MAX];
    size_t half_capacity[GEMM_TEAM_MAX];
};

gemm_spaces *gemm_spaces_create(void) { return sys_calloc(1, sizeof(gemm_spaces)); }

void gemm_spaces_destroy(gemm_spaces *spaces) {
    if (!spaces) return;
    for (int t = 0; t < GEMM_TEAM_MAX; t++) {
        gemm_avx512_space_destroy(spaces->kernel[t]);
        free(spaces->half_sums[t]);
    }
    free(spaces);
}

/* Products below this many multiply-adds stay on one thread. */
#define SPLIT_MIN_MACS (1 << 21)

static void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}

/* Parts start on multiples of this many rows or columns (the kernels'
 * register blocks divide it). */
#define SPLIT_ALIGN 32

int gemm_cut_threads(double work, double least) {
    return omp_in_parallel() || work < least ? 1 : omp_get_max_threads();
}

int gemm_cut_step(int extent, int parts, int align) {
    int step = (extent + parts - 1) / parts;
    return (step + align - 1) / align * align;
}

/* One part of a product on the calling thread: cblas_sgemm, or our own
 * kernel on the thread's packing space (made at its first product). Past
 * GEMM_TEAM_MAX threads, one shared space, one call at a time. */
static void part_product(gemm_spaces *spaces, bool own, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!own) {
        sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int t = omp_get_thread_num();
    if (t < GEMM_TEAM_MAX - 1) {
        if (!spaces->kernel[t]) spaces->kernel[t] = gemm_avx512_space_create();
        gemm_avx512_run(spaces->kernel[t], trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp critical(gemm_avx512_shared)
    {
        gemm_avx512_space **shared = &spaces->kernel[GEMM_TEAM_MAX - 1];
        if (!*shared) *shared = gemm_avx512_space_create();
        gemm_avx512_run(*shared, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

/* Rows (by_rows) or columns [lo, lo + n) of C = beta C + alpha op(A) op(B)
 * on the calling thread: one thread's part of a product cut between them. */
static void cut_part(gemm_spaces *spaces, bool own, bool by_rows, int lo, int n, bool trans_a, bool trans_b, int M,
                     int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc) {
    if (by_rows)
        part_product(spaces, own, trans_a, trans_b, n, N, K, alpha, trans_a ? A + lo : A + (size_t)lo * lda, lda, B,
                     ldb, beta, C + (size_t)lo * ldc, ldc);
    else
        part_product(spaces, own, trans_a, trans_b, M, n, K, alpha, A, lda, trans_b ? B + (size_t)lo * ldb : B + lo,
                     ldb, beta, C + lo, ldc);
}

/* Our own kernel sums a product in two halves of K where K is at least
 * this long and twice C's longer side (the weight gradients dY^T X of a
 * batch long beside the model's width), and C at most K_HALVES_MAX_C
 * floats. */
#define K_HALVES_MIN 2048
#define K_HALVES_MAX_C (1 << 18)

/* Whether our own kernel sums a product in two halves of K, the second half
 * into a scratch added last (docs/design.md §8.10). Cut by rows of C, each
 * of two threads packed all of B (K x N) for half the multiply-adds, and
 * bench_d256's weight gradients ran 1.74-1.81x on two threads; cut along K
 * each thread packs half of everything. C is bounded to 1 MB (a core's L2
 * on the Zen 5 measured): bench_d768's products that meet the K rule with
 * a C of 2.4-3 MB gained nothing on two threads and cost one thread about
 * 1% of them in the scratch's pass. The rule reads the shape alone, never
 * the thread count: the sums are the same on any number of threads. */
static bool sums_in_k_halves(bool own, int M, int N, int K) {
    int longer = M > N ? M : N;
    return own && K >= K_HALVES_MIN && K >= 2 * longer && (size_t)M * N <= K_HALVES_MAX_C;
}

/* The calling thread's scratch for the second half's sums, M x N. */
static float *half_sums(gemm_spaces *spaces, int slot, size_t n) {
    if (n > spaces->half_capacity[slot]) {
        free(spaces->half_sums[slot]);
        spaces->half_sums[slot] = sys_calloc_huge(n, sizeof(float));
        spaces->half_capacity[slot] = n;
    }
    return spaces->half_sums[slot];
}

/* op(A) and op(B) from inner index k on. */
static const float *a_from_k(bool trans_a, const float *A, int lda, int k) {
    return trans_a ? A + (size_t)k * lda : A + k;
}
static const float *b_from_k(bool trans_b, const float *B, int ldb, int k) {
    return trans_b ? B + k : B + (size_t)k * ldb;
}

/* Rows [lo, hi) of C += S (S's rows N apart). */
static void add_half_rows(float *C, int ldc, const float *S, int N, int lo, int hi) {
    for (int i = lo; i < hi; i++) {
        float *c = C + (size_t)i * ldc;
        const float *s = S + (size_t)i * N;
        for (int j = 0; j < N; j++) c[j] += s[j];
    }
}

/* Rows or columns [lo, lo + n) of one half: the first (K [0, k1)) into C
 * with beta, the second (K [k1, K)) into S from zero. */
static void half_part(gemm_spaces *spaces, int half, bool by_rows, int lo, int n, bool trans_a, bool trans_b, int M,
                      int N, int K, int k1, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc, float *S) {
    int k0 = half ? k1 : 0, k = half ? K - k1 : k1;
    const float *a = a_from_k(trans_a, A, lda, k0), *b = b_from_k(trans_b, B, ldb, k0);
    float *c = half ? S : C;
    int ld = half ? N : ldc;
    cut_part(spaces, true, by_rows, lo, n, trans_a, trans_b, M, N, k, alpha, a, lda, b, ldb, half ? 0.0f : beta, c, ld);
}

/* Both halves on the calling thread, then C += S. */
static void halves_on_one_thread(gemm_spaces *spaces, bool trans_a, bool trans_b, int M, int N, int K, int k1,
                                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                                 int ldc, float *S) {
    for (int half = 0; half < 2; half++)
        half_part(spaces, half, true, 0, M, trans_a, trans_b, M, N, K, k1, alpha, A, lda, B, ldb, beta, C, ldc, S);
    add_half_rows(C, ldc, S, N, 0, M);
}

/* A product summed in two halves of K (sums_in_k_halves). On two threads
 * one half each; on more, each half's C cut again between threads/2 of
 * them (our kernel's sums do not depend on that cut); then C += S, cut by
 * rows. Inside a parallel region, on the calling thread with its own S. */
static void k_halves_product(gemm_spaces *spaces, int threads, bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                             int ldc) {
    int k1 = gemm_cut_step(K, 2, SPLIT_ALIGN), slot = omp_get_thread_num();
    if (threads <= 1 && slot >= GEMM_TEAM_MAX - 1) {
#pragma omp critical(gemm_halves_shared)
        halves_on_one_thread(spaces, trans_a, trans_b, M, N, K, k1, alpha, A, lda, B, ldb, beta, C, ldc,
                             half_sums(spaces, GEMM_TEAM_MAX - 1, (size_t)M * N));
        return;
    }
    float *S = half_sums(spaces, slot, (size_t)M * N);
    if (threads <= 1) {
        halves_on_one_thread(spaces, trans_a, trans_b, M, N, K, k1, alpha, A, lda, B, ldb, beta, C, ldc, S);
        return;
    }
    int parts = threads / 2;
    bool by_rows = M >= N;
    int extent = by_rows ? M : N, step = gemm_cut_step(extent, parts, SPLIT_ALIGN);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static, 1)
        for (int item = 0; item < 2 * parts; item++) {
            int lo = item % parts * step, n = extent - lo < step ? extent - lo : step;
            if (n > 0)
                half_part(spaces, item / parts, by_rows, lo, n, trans_a, trans_b, M, N, K, k1, alpha, A, lda, B, ldb,
                          beta, C, ldc, S);
        }
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) add_half_rows(C, ldc, S, N, i, i + 1);
    }
}

/* OpenBLAS, and our own kernel, on OpenMP's threads (docs/design.md
 * §8.10): OpenBLAS itself runs single-threaded, and a large product is cut
 * into one block of rows (or of columns, when there are fewer rows) of C
 * per thread, each a product of its own. So one pool of threads (OpenMP's)
 * runs every kernel: OpenBLAS's own pool beside it, both spinning for two
 * cores, slowed a 2-thread run threefold. As with OpenBLAS's own threading,
 * the last bits of an OpenBLAS product depend on how it is cut (its kernels
 * round edge blocks differently), hence on the thread count; our own
 * kernel sums every element in the same order however it is cut. Inside a
 * parallel region (attention's heads) the product runs on the calling
 * thread. spaces may be NULL for OpenBLAS. */
void gemm_split_product(gemm_spaces *spaces, bool own, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int threads = gemm_cut_threads((double)M * N * K, SPLIT_MIN_MACS);
    if (spaces && sums_in_k_halves(own, M, N, K)) {
        k_halves_product(spaces, threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (threads <= 1) {
        part_product(spaces, own, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    bool by_rows = M >= N;
    int extent = by_rows ? M : N, parts = threads;
    int step = gemm_cut_step(extent, parts, SPLIT_ALIGN);
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (int p = 0; p < parts; p++) {
        int lo = p * step, n = extent - lo < step ? extent - lo : step;
        if (n > 0)
            cut_part(spaces, own, by_rows, lo, n, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}
