/* The project's own fp32 product for AVX-512 cores (gemm_avx512.h): the
 * blocking of Goto and van de Geijn ("Anatomy of high-performance matrix
 * multiplication", 2008), as BLIS and OpenBLAS do it, sized for the model's
 * linear products (docs/design.md §8.10).
 *
 * Why our own: at the model's shapes oneDNN 2.6's f32 matmul leaves 10-40%
 * of the FMA peak unused (its backward-to-the-input products ran at 62-91%,
 * this kernel's at 84-89%; docs/performance.md §9.9), and Debian's OpenBLAS
 * runs its AVX2 kernels where OPENBLAS_CORETYPE pins them. `train.gemm = auto` times this kernel
 * beside the other two and takes it per product class only where it wins.
 *
 * The loops, outermost first: columns of C in blocks of NC, the inner
 * dimension in blocks of KC (B's block of KC x NC packed once), rows
 * in blocks of MC (A's block packed), then micro-tiles of MR x NR: one
 * packed A panel (MR x KC, in L1) against each B panel in turn. The
 * micro-kernel keeps MR x 2 zmm accumulators (28 of the 32 registers), so
 * that each step of k loads two B vectors and broadcasts MR elements of A
 * for 2 MR fused multiply-adds; 28 independent sums cover the FMA latency
 * (4 cycles) on both of Zen 5's 512-bit pipes. Edges are packed with zeros
 * and stored through a small tile, so the kernel itself has one shape. */
#include "gemm_avx512.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/sys.h"
#include "kernels/prefetch.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_AVX512_BUILT 1
#include <immintrin.h>

#include "transpose16.h"
#else
#define GEMM_AVX512_BUILT 0
#endif

/* Sizes measured on a Zen 5 core at bench_d768's products (alternatives
 * within 2-5% of each other, all slower: KC 128-320, MC 84-336, NC
 * 384-3072, micro-tiles of 12 x 32, 8 x 48, 7 x 64 and 6 x 64, the
 * BLIS order of the two inner loops, software prefetch of B, the loop
 * over k unrolled twice). */
enum {
    MR = 14,      /* rows of a micro-tile */
    NV = 2,       /* its zmm per row: MR x NV = 28 accumulators */
    NR = 16 * NV, /* its columns */
    KC = 384,     /* inner block: an A panel of 21 KB stays in L1 */
    MC = 168,     /* rows of the packed A block (12 panels) */
    NC = 768,     /* columns of the packed B block (1.2 MB with KC) */
    MS = 8 * MC,  /* rows whose packed A is kept across B's blocks (2 MB with KC) */
};

struct gemm_avx512_space {
    float *a; /* MS x KC, blocks of MC rows, panels of MR rows */
    float *b; /* KC x NC, panels of NR columns, in the same allocation */
};

const char *gemm_avx512_unavailable_reason(void) {
#if GEMM_AVX512_BUILT
    return cpu_no_avx512f_reason(); /* played away too: tests reach the refusal and the fallbacks */
#else
    return "momfmm was built without GCC for x86-64";
#endif
}

gemm_avx512_space *gemm_avx512_space_create(void) {
    gemm_avx512_space *s = sys_calloc(1, sizeof *s);
    /* 16 floats of slack after each block: pack_transposed's last store */
    s->a = sys_calloc_huge((size_t)MS * KC + (size_t)KC * NC + 32, sizeof(float));
    s->b = s->a + (size_t)MS * KC + 16;
    return s;
}

void gemm_avx512_space_destroy(gemm_avx512_space *space) {
    if (!space) return;
    free(space->a);
    free(space);
}

#if GEMM_AVX512_BUILT
/* dst[p * width + i] = src[i * ld + p] for i < rows (zeros for rows <= i <
 * width), p < k: `rows` rows along k into columns of `width` floats, in
 * blocks of 16 x 16. A block's 16-float columns are stored whole in
 * ascending p; when width is 14 each store runs 2 floats into the next
 * column, which the next store overwrites (and the last into the slack
 * after the buffer, or a panel packed later). */
__attribute__((target("avx512f"))) static void pack_transposed(float *dst, int width, const float *src, int ld,
                                                               int rows, int k) {
    for (int i0 = 0; i0 < width; i0 += 16) {
        int n = rows - i0 < 16 ? rows - i0 : 16;
        int p = 0;
        for (; n > 0 && p + 16 <= k; p += 16) {
            /* n rows read at once, each a stream of its own: each row's
             * line two blocks ahead asked for now (with pack_rows' own,
             * about 1% on the products; docs/performance.md §9.9) */
            if (p + 32 < k)
                for (int i = 0; i < n; i++)
                    _mm_prefetch((const char *)(src + (size_t)(i0 + i) * ld + p + 32), _MM_HINT_T0);
            transpose16_columns(dst + (size_t)p * width + i0, width, src + (size_t)i0 * ld + p, ld, n);
        }
        int top = i0 + 16 < width ? i0 + 16 : width;
        for (; p < k; p++)
            for (int i = i0; i < top; i++) dst[(size_t)p * width + i] = i < rows ? src[(size_t)i * ld + p] : 0.0f;
    }
}

/* Panels of `width` columns from rows already along them: panel q gets
 * dst[q * width * k + p * width + i] = src[p * ld + q * width + i] for
 * q * width + i < n (zeros past n), p < k. Row by row of the source, so
 * that it is read in order, each row into every panel. */
__attribute__((target("avx512f"))) static void pack_rows(float *dst, int width, const float *src, int ld, int n,
                                                         int k) {
    size_t panel = (size_t)width * k;
    const float *first = src;
    for (int p = 0; p < k; p++, src += ld) {
        /* rows far apart, as attention's gathers read them: the row
         * KERNEL_ROWS_AHEAD down asked for now (docs/performance.md §9.9) */
        kernel_prefetch_ahead(first, (size_t)ld, p, k, n);
        for (int j0 = 0, q = 0; j0 < n; j0 += width, q++)
            for (int i0 = 0; i0 < width; i0 += 16) {
                int cols = n - j0 - i0 < 16 ? n - j0 - i0 : 16;
                __mmask16 mask = cols <= 0 ? 0 : (__mmask16)((1u << cols) - 1);
                float *d = dst + q * panel + (size_t)p * width + i0;
                __m512 v = cols == 16 ? _mm512_loadu_ps(src + j0 + i0) : _mm512_maskz_loadu_ps(mask, src + j0 + i0);
                if (i0 + 16 <= width) _mm512_storeu_ps(d, v);
                else _mm512_mask_storeu_ps(d, (__mmask16)((1u << (width - i0)) - 1), v);
            }
    }
}

/* op(A)'s rows [0, m) and columns [0, k) into panels of MR rows, each
 * column of a panel MR consecutive floats; rows past m are zeros. */
static void pack_a(float *dst, bool trans, const float *A, int lda, int m, int k) {
    if (trans) {
        pack_rows(dst, MR, A, lda, m, k);
        return;
    }
    for (int i0 = 0; i0 < m; i0 += MR, dst += (size_t)MR * k)
        pack_transposed(dst, MR, A + (size_t)i0 * lda, lda, m - i0 < MR ? m - i0 : MR, k);
}

/* op(B)'s rows [0, k) and columns [0, n) into panels of NR columns, each
 * row of a panel NR consecutive floats; columns past n are zeros. */
static void pack_b(float *dst, bool trans, const float *B, int ldb, int k, int n) {
    if (!trans) {
        pack_rows(dst, NR, B, ldb, n, k);
        return;
    }
    for (int j0 = 0; j0 < n; j0 += NR, dst += (size_t)NR * k)
        pack_transposed(dst, NR, B + (size_t)j0 * ldb, ldb, n - j0 < NR ? n - j0 : NR, k);
}

/* acc[MR][2] = sum over p < k of a[p][r] * b[p][0..31], then
 * C = alpha acc + beta C (beta 0: C is not read). */
__attribute__((target("avx512f"))) static void micro_tile(int k, const float *restrict a, const float *restrict b,
                                                          float alpha, float beta, float *c, ptrdiff_t ldc) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    /* C's tile is read (beta != 0) and written at the end: asking for its
     * lines now hides their misses behind the loop (2-5% on the weight
     * gradients, which add into C) */
    for (int r = 0; r < MR; r++) {
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
    }
    for (int p = 0; p < k; p++, a += MR, b += NR) {
        __m512 bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512 x = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        float *row = c + r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m512 y = _mm512_mul_ps(va, acc[r][v]);
            if (beta != 0.0f) y = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16 * v), y);
            _mm512_storeu_ps(row + 16 * v, y);
        }
    }
}

/* A micro-tile at C's edge: computed whole into a tile of its own, then
 * the m x n that lie inside C are stored. */
static void edge_tile(int k, const float *a, const float *b, float alpha, float beta, float *c, int ldc, int m, int n) {
    _Alignas(64) float tile[MR * NR] = {0};
    for (int r = 0; r < m; r++) memcpy(tile + r * NR, c + (size_t)r * ldc, sizeof(float) * (size_t)n);
    micro_tile(k, a, b, alpha, beta, tile, NR);
    for (int r = 0; r < m; r++) memcpy(c + (size_t)r * ldc, tile + r * NR, sizeof(float) * (size_t)n);
}

static void block_product(const float *packed_a, const float *packed_b, int m, int n, int k, float alpha, float beta,
                          float *C, int ldc) {
    for (int i0 = 0; i0 < m; i0 += MR) {
        const float *a = packed_a + (size_t)i0 * k;
        int rows = m - i0 < MR ? m - i0 : MR;
        for (int j0 = 0; j0 < n; j0 += NR) {
            const float *b = packed_b + (size_t)j0 * k;
            int cols = n - j0 < NR ? n - j0 : NR;
            float *c = C + (size_t)i0 * ldc + j0;
            if (rows == MR && cols == NR) micro_tile(k, a, b, alpha, beta, c, ldc);
            else edge_tile(k, a, b, alpha, beta, c, ldc, rows, cols);
        }
    }
}

/* C's rows [0, M): for each block of k, B's column blocks in turn and A's
 * row blocks under each. Where B has more than one column block (then
 * M <= MS) A's blocks are packed while the first runs and kept for the
 * others (docs/design.md §8.10): packed again per column block, A was read
 * from memory each time (the LM head's forward, 8192 columns, packed it 11
 * times); with one, each is packed into one place. Each element of C sums
 * its k blocks in order either way, so the floats are those of any other
 * cut. */
static void row_block(gemm_avx512_space *s, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    bool keep_a = N > NC;
    for (int p0 = 0; p0 < K; p0 += KC) {
        int k = K - p0 < KC ? K - p0 : KC;
        float block_beta = p0 == 0 ? beta : 1.0f;
        for (int j0 = 0; j0 < N; j0 += NC) {
            int n = N - j0 < NC ? N - j0 : NC;
            const float *b = trans_b ? B + (size_t)j0 * ldb + p0 : B + (size_t)p0 * ldb + j0;
            pack_b(s->b, trans_b, b, ldb, k, n);
            for (int i0 = 0; i0 < M; i0 += MC) {
                int m = M - i0 < MC ? M - i0 : MC;
                float *packed_a = keep_a ? s->a + (size_t)i0 * KC : s->a;
                if (j0 == 0)
                    pack_a(packed_a, trans_a, trans_a ? A + (size_t)p0 * lda + i0 : A + (size_t)i0 * lda + p0, lda, m,
                           k);
                block_product(packed_a, s->b, m, n, k, alpha, block_beta, C + (size_t)i0 * ldc + j0, ldc);
            }
        }
    }
}

/* One column block: all rows at once (B packed once per block of k).
 * More: at most MS rows at a time, A kept (B packed once per MS rows). */
void gemm_avx512_run(gemm_avx512_space *s, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int span = N > NC ? MS : M;
    for (int i1 = 0; i1 < M; i1 += span) {
        int m = M - i1 < span ? M - i1 : span;
        row_block(s, trans_a, trans_b, m, N, K, alpha, trans_a ? A + i1 : A + (size_t)i1 * lda, lda, B, ldb, beta,
                  C + (size_t)i1 * ldc, ldc);
    }
}
#else
void gemm_avx512_run(gemm_avx512_space *s, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)s, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc; /* unreachable: gemm_avx512_unavailable_reason refuses */
}
#endif
