/* CPU features and bf16 conversion (cpu.h): what the GEMM engines and the
 * bf16 weight copy need to know of the processor, in one place below them. */
#include "base/cpu.h"

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"

/* AMX-BF16 is CPUID leaf 7, subleaf 0, EDX bit 22; gcc 12's
 * __builtin_cpu_supports does not know it. (AMX also needs the kernel's
 * permission for the tile state, which oneDNN requests itself.) */
static bool cpu_has_amx_bf16(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && ((edx >> 22) & 1u);
}

/* AVX-512F as momfmm takes it, decided once (the CPU and the switch do not
 * change), so that the kernels that ask per call (tile_gemm_wide) pay a
 * load: 0 it has it; 1 the CPU lacks it; 2 MOMFMM_FAKE_NO_AVX512=1 hides
 * it, playing an AVX2 core (docs/design.md §8.10). */
static int avx512f_state(void) {
    static int state = -1;
    if (state < 0) {
        const char *fake = getenv("MOMFMM_FAKE_NO_AVX512");
        __builtin_cpu_init();
        /* __builtin_cpu_supports also checks that the OS saves the AVX-512 state */
        state = fake && strcmp(fake, "1") == 0 ? 2 : __builtin_cpu_supports("avx512f") ? 0 : 1;
    }
    return state;
}

const char *cpu_no_avx512f_reason(void) {
    static const char *const reasons[] = {NULL, "the CPU has no AVX-512F",
                                          "the CPU has no AVX-512F (MOMFMM_FAKE_NO_AVX512=1)"};
    return reasons[avx512f_state()];
}

bool cpu_has_avx512f(void) { return avx512f_state() == 0; }

bool cpu_avx512f_played_away(void) { return avx512f_state() == 2 && __builtin_cpu_supports("avx512f"); }

bool cpu_has_avx512_bf16(void) {
    return cpu_has_avx512f() && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/* AMX needs AVX-512 beside it: a CPU played without AVX-512F has none */
bool cpu_has_bf16(void) { return cpu_has_avx512_bf16() || (cpu_has_avx512f() && cpu_has_amx_bf16()); }

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
    return cpu_has_avx512f() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

/* ---- Peak throughput probes (docs/design.md §8.10) ---------------------
 * Twelve independent accumulators cover the FMA latency (4 cycles) on two
 * pipes with room to spare; everything stays in registers, so the loop
 * measures the execution units, not memory. Each round is timed on its own
 * and the best round counts: a neighbour's burst on a shared machine lowers
 * some rounds, never raises one. */

#define PROBE_ACCUMULATORS 12

typedef long (*probe_loop)(long iterations);

__attribute__((target("avx2,fma"))) static long fma_loop_avx2(long iterations) {
    __m256 acc[PROBE_ACCUMULATORS];
    for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm256_set1_ps(1.0f + 0.01f * (float)i);
    const __m256 scale = _mm256_set1_ps(0.9999999f), shift = _mm256_set1_ps(1e-7f);
    for (long n = 0; n < iterations; n++)
        for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm256_fmadd_ps(acc[i], scale, shift);
    __m256 sum = acc[0];
    for (int i = 1; i < PROBE_ACCUMULATORS; i++) sum = _mm256_add_ps(sum, acc[i]);
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    return lanes[0] > 1e30f ? 1 : 0; /* keeps the loop observable */
}

__attribute__((target("avx512f"))) static long fma_loop_avx512(long iterations) {
    __m512 acc[PROBE_ACCUMULATORS];
    for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm512_set1_ps(1.0f + 0.01f * (float)i);
    const __m512 scale = _mm512_set1_ps(0.9999999f), shift = _mm512_set1_ps(1e-7f);
    for (long n = 0; n < iterations; n++)
        for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm512_fmadd_ps(acc[i], scale, shift);
    __m512 sum = acc[0];
    for (int i = 1; i < PROBE_ACCUMULATORS; i++) sum = _mm512_add_ps(sum, acc[i]);
    return _mm512_reduce_add_ps(sum) > 1e30f ? 1 : 0;
}

/* vdpbf16ps: 16 lanes, each two bf16 products added into fp32 = 64 FLOPs. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static long bf16_loop_avx512(long iterations) {
    __m512 acc[PROBE_ACCUMULATORS];
    for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm512_set1_ps(0.0f);
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (long n = 0; n < iterations; n++)
        for (int i = 0; i < PROBE_ACCUMULATORS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 sum = acc[0];
    for (int i = 1; i < PROBE_ACCUMULATORS; i++) sum = _mm512_add_ps(sum, acc[i]);
    return _mm512_reduce_add_ps(sum) > 1e30f ? 1 : 0;
}

/* Best GFLOP/s of `loop` over rounds of about 20 ms within `seconds`. */
static double probe(probe_loop loop, double flops_per_iteration, double seconds) {
    long iterations = 1 << 16;
    double best = 0, spent = 0;
    volatile long sink = 0;
    while (spent < seconds) {
        double start = sys_seconds();
        sink += loop(iterations);
        double took = sys_seconds() - start;
        spent += took;
        if (took < 0.01) {
            iterations *= 2; /* too short to time well: longer rounds */
            continue;
        }
        double rate = flops_per_iteration * (double)iterations / took / 1e9;
        if (rate > best) best = rate;
    }
    (void)sink;
    return best;
}

const char *cpu_fma_isa(void) {
    __builtin_cpu_init();
    if (cpu_has_avx512f()) return "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2+fma";
    return "none";
}

double cpu_fma_peak_gflops(double seconds) {
    __builtin_cpu_init();
    if (cpu_has_avx512f()) return probe(fma_loop_avx512, 2.0 * 16 * PROBE_ACCUMULATORS, seconds);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return probe(fma_loop_avx2, 2.0 * 8 * PROBE_ACCUMULATORS, seconds);
    return 0;
}

static double cpu_bf16_peak_gflops(double seconds) {
    if (!cpu_has_avx512_bf16()) return 0;
    return probe(bf16_loop_avx512, 4.0 * 16 * PROBE_ACCUMULATORS, seconds);
}

typedef struct {
    double seconds, fp32, bf16;
    bool want_bf16;
} probe_job;

static void *run_probe(void *arg) {
    probe_job *job = arg;
    job->fp32 = cpu_fma_peak_gflops(job->seconds);
    if (job->want_bf16) job->bf16 = cpu_bf16_peak_gflops(job->seconds);
    return NULL;
}

cpu_peak cpu_measure_peak(int threads, double seconds) {
    cpu_peak peak = {0, 0, cpu_fma_isa(), threads > 0 ? threads : 1};
    probe_job jobs[CPU_PEAK_MAX_THREADS];
    pthread_t ids[CPU_PEAK_MAX_THREADS];
    if (peak.threads > CPU_PEAK_MAX_THREADS) peak.threads = CPU_PEAK_MAX_THREADS;
    bool bf16 = cpu_has_avx512_bf16();
    int started = 0;
    for (int t = 0; t < peak.threads; t++) {
        jobs[t] = (probe_job){seconds, 0, 0, bf16};
        if (t == 0 || pthread_create(&ids[t], NULL, run_probe, &jobs[t]) == 0) started++;
        else break;
    }
    run_probe(&jobs[0]); /* the calling thread is one of them */
    for (int t = 1; t < started; t++) pthread_join(ids[t], NULL);
    for (int t = 0; t < started; t++) peak.fp32_gflops += jobs[t].fp32, peak.bf16_gflops += jobs[t].bf16;
    peak.threads = started;
    return peak;
}
