/* Private to the kernels: a 16 x 16 transpose of 32-bit elements in
 * sixteen zmm registers, for the packing loops of our own fp32 product
 * (gemm_avx512.c: floats), the fp32 attention tiles' transposes
 * (tile_gemm.c) and the bf16 tile products (tile_gemm_bf16.c: bf16 pairs,
 * one 32-bit element each). Inlined into each caller's AVX-512 target. */
#ifndef MOMFMM_TRANSPOSE16_H
#define MOMFMM_TRANSPOSE16_H
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stddef.h>

/* The 16 x 16 block r (row i in r[i]) transposed in place: unpacks pair
 * rows, shuffles gather four rows' columns within each 128-bit lane, and
 * lane shuffles gather the four groups of rows. */
__attribute__((target("avx512f"), always_inline)) static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + j], lane L: column 4L + j of rows 4g .. 4g + 3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44),
               v3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + j] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* Sixteen columns of `rows` <= 16 rows transposed: dst[q * ld_dst + i] =
 * src[i * ld_src + q] for q < 16, with zeros for rows <= i < 16 (each of
 * dst's sixteen rows of 16 floats is stored whole). */
__attribute__((target("avx512f"), always_inline)) static inline void
transpose16_columns(float *dst, ptrdiff_t ld_dst, const float *src, ptrdiff_t ld_src, int rows) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = i < rows ? _mm512_loadu_ps(src + i * ld_src) : _mm512_setzero_ps();
    transpose16(r);
    for (int q = 0; q < 16; q++) _mm512_storeu_ps(dst + q * ld_dst, r[q]);
}
#endif
#endif
