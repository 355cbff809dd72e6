/* CPU features and bf16 conversion (cpu.h): what the GEMM engines and the
 * bf16 weight copy need to know of the processor, in one place below them. */
#include "momfmm/cpu.h"

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

/* AMX-BF16 is CPUID leaf 7, subleaf 0, EDX bit 22; gcc 12's
 * __builtin_cpu_supports does not know it. (AMX also needs the kernel's
 * permission for the tile state, which oneDNN requests itself.) */
bool cpu_has_amx_bf16(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && ((edx >> 22) & 1u);
}

/* __builtin_cpu_supports also checks that the OS saves the AVX-512 state. */
bool cpu_has_avx512_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

bool cpu_has_bf16(void) { return cpu_has_avx512_bf16() || cpu_has_amx_bf16(); }

/* Round-to-nearest-even on the upper 16 bits, with the instruction's
 * treatment of NaN (quietened) and of subnormal inputs (signed zero). */
static uint16_t f32_to_bf16_one(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void cpu_f32_to_bf16_portable(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16_one(src[i]);
}

/* vcvtne2ps2bf16 converts 32 floats per instruction; the tail goes through
 * the 16-wide form with masked loads and stores. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
f32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 low = _mm512_loadu_ps(src + i), high = _mm512_loadu_ps(src + i + 16);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)_mm512_cvtne2ps_pbh(high, low));
    }
    for (; i < n; i += 16) {
        size_t left = n - i < 16 ? n - i : 16;
        __mmask16 mask = (__mmask16)((1u << left) - 1u);
        __m256bh packed = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + i));
        _mm256_mask_storeu_epi16((void *)(dst + i), mask, (__m256i)packed);
    }
}

void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    static int native = -1; /* decided once: the CPU does not change */
    if (native < 0) native = cpu_has_avx512_bf16();
    if (native) f32_to_bf16_avx512(dst, src, n);
    else cpu_f32_to_bf16_portable(dst, src, n);
}

bool cpu_has_avx512_core(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
