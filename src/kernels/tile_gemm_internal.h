/* Private to the tile products (tile_gemm.h): the build switches and the
 * contraction attribute that the fp32 tiles (tile_gemm.c) and the bf16
 * tiles (tile_gemm_bf16.c) share. */
#ifndef MOMFMM_TILE_GEMM_INTERNAL_H
#define MOMFMM_TILE_GEMM_INTERNAL_H
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TILE_GEMM_AVX2 1
#else
#define TILE_GEMM_AVX2 0
#endif
/* The AVX-512 kernel is GCC's generic vectors, compiled for two targets. */
#if TILE_GEMM_AVX2 && !defined(__clang__)
#define TILE_GEMM_WIDE 1
#else
#define TILE_GEMM_WIDE 0
#endif

/* The generic-vector kernels' c += x * b fused (strict C11 would not). */
#if defined(__clang__)
#define WIDE_CONTRACT
#else
#define WIDE_CONTRACT optimize("O2", "fp-contract=fast")
#endif
#endif
