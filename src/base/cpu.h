/* What this processor can do (docs/scale.md §7): bf16 dot products, and the
 * conversion of fp32 to bf16 that the bf16 GEMM engine and its weight copy
 * use. */
#ifndef MOMFMM_CPU_H
#define MOMFMM_CPU_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* AVX-512F as momfmm takes it: the CPU's, unless MOMFMM_FAKE_NO_AVX512=1
 * plays a CPU without it (docs/design.md §8.10, an AVX2 core played): the
 * fp32 engines, the tile kernels, the bf16 paths and the peak probe then
 * take their AVX2 paths. cpu_no_avx512f_reason: NULL when it has it, else
 * why not; cpu_avx512f_played_away: the CPU has it and the switch hides it. */
const char *cpu_no_avx512f_reason(void);
bool cpu_has_avx512f(void);
bool cpu_avx512f_played_away(void);

bool cpu_has_bf16(void);
/* AVX512_BF16 (vdpbf16ps) with AVX-512BW and VL, and the OS saving the
 * AVX-512 state: what the bf16 tile kernel (kernels/tile_gemm.h) runs on. */
bool cpu_has_avx512_bf16(void);
/* AVX512F, BW, VL and DQ (oneDNN's avx512_core): what oneDNN needs to
 * emulate bf16 products on a CPU without native bf16. */
bool cpu_has_avx512_core(void);

/* fp32 -> bf16 with round-to-nearest-even, as vcvtne2ps2bf16 does it: NaN
 * stays a quiet NaN, subnormal inputs become signed zero (the instruction
 * treats them as zero, so both paths give the same bits). Uses AVX512_BF16
 * when the CPU has it, else cpu_f32_to_bf16_portable. */
void cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void cpu_f32_to_bf16_portable(uint16_t *dst, const float *src, size_t n);

/* Peak throughput of one core, measured with register-only loops for about
 * `seconds` (the best of rounds of ~20 ms; docs/design.md §8.10): fp32 FMAs
 * at the widest width the CPU has (cpu_fma_isa: "avx512", "avx2+fma" or
 * "none"), and bf16 dot products (vdpbf16ps; 0 without AVX512_BF16). In
 * GFLOP/s, an FMA counting 2. The caller runs one probe per core to be
 * measured, concurrently, for a multi-core peak. */
const char *cpu_fma_isa(void);
double cpu_fma_peak_gflops(double seconds);

/* The peaks of `threads` cores at once (the probes run concurrently, as a
 * multi-core load may lower the clock): totals over the threads. */
#define CPU_PEAK_MAX_THREADS 256
typedef struct {
    double fp32_gflops, bf16_gflops; /* bf16: 0 without AVX512_BF16 */
    const char *isa;
    int threads;
} cpu_peak;
cpu_peak cpu_measure_peak(int threads, double seconds);

static inline float cpu_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
#endif
