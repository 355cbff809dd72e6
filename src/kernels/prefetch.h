/* kernel_prefetch_ahead, in a header of its own so that every kernel
 * (kernels.h's and gemm_avx512.c, which kernels.c reaches through gemm.h)
 * can include it without a circle. Prefixes: kernel_ */
#ifndef MOMFMM_KERNELS_PREFETCH_H
#define MOMFMM_KERNELS_PREFETCH_H
#include <stddef.h>

/* Loops that walk n columns of rows far apart (RoPE out of the qkv rows
 * and back, the heads' gathers and scatters, our own product's row-wise
 * packing in gemm_avx512.c) ask for the row KERNEL_ROWS_AHEAD ahead
 * before they touch row t: each row's span lies on another page, and left
 * to the hardware its cache misses came one row after another
 * (bench_d768, bf16: the forward's RoPE and gathers 17-19 -> 12-14 ms a
 * step; docs/design.md §8.10). A span's every cache line is asked for,
 * the last float's too, wherever the span starts. Rows about to be
 * written are asked for alike: a hint to write (prefetchw) needs a build
 * for a newer ISA than ours, and GCC emits the same prefetcht0. */
#define KERNEL_ROWS_AHEAD 8
static inline void kernel_prefetch_ahead(const float *rows, size_t stride, int t, int T, int n) {
    if (t + KERNEL_ROWS_AHEAD >= T || n <= 0) return;
    const float *span = rows + (size_t)(t + KERNEL_ROWS_AHEAD) * stride;
    for (int c = 0; c < n; c += 16) __builtin_prefetch(span + c);
    __builtin_prefetch(span + n - 1);
}

#endif
