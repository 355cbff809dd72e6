/* Branch-free, inline math for the elementwise hot loops, so that they
 * vectorise (libm's expf/tanhf are calls, and they took a fifth of the step
 * time in perf). Shared by the kernels (the tiled softmax, GELU, the
 * loss), attention's FMM and momentum, the model and the optimizer. */
#ifndef MOMFMM_FASTMATH_H
#define MOMFMM_FASTMATH_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Elementwise loops get AVX2 and AVX-512 clones picked at load time (GCC
 * function multiversioning): the default x86-64 target has only SSE2. In
 * strict C11 mode GCC contracts no a*b+c into FMA and reorders no sums, so
 * every clone computes bit-identical results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define VECTOR_CLONES
#endif

/* e^x for x <= 0 to 3.2e-6 instead of 2.5e-7, for probabilities that are
 * rounded to bf16 next (tiled softmax in train.precision = bf16,
 * docs/design.md §8.10): bf16's rounding moves a value by up to 2^-8 =
 * 3.9e-3 (its unit roundoff), so fast_exp_nonpositive's last two terms
 * bought digits the product throws away. e^r as 1 + c1 r + .. + c4 r^4,
 * the c's fitted for the least largest relative error over |r| <= ln 2 / 2
 * with e^0 = 1 kept (a row's maximum still weighs exactly 1): 2.8e-6 for
 * e^r, at most 3.2e-6 over [-87, 0] with the reduction's rounding
 * (measured: 2.9e-6 here, 3.1e-6 on the vector forms, whose reduction
 * takes ln 2 as one float). The same clamps and NaN as
 * fast_exp_nonpositive: fast_exp_coarse below, and its eight- and
 * sixteen-lane forms. */
#define FAST_EXP_COARSE_C1 0.99996686f
#define FAST_EXP_COARSE_C2 0.50003016f
#define FAST_EXP_COARSE_C3 0.16787457f
#define FAST_EXP_COARSE_C4 0.041513696f

/* e^x for x <= 0: 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2, degree-6
 * Taylor polynomial for e^r; max relative error 2.5e-7 (2 ulp) over
 * [-87, 0]; x < -87 (-inf included) is clamped (e^-87 is still a normal
 * float). Every other input is well defined too, so that a NaN logit shows
 * up as a NaN loss rather than as undefined behaviour: x > 88 (+inf
 * included) is clamped to 88 (e^88 is near FLT_MAX), and NaN gives NaN. The
 * clamps and the NaN pass-through are integer minima and masks on the bit
 * pattern: float comparisons and selects here stop GCC vectorising the
 * callers' loops (under -ftrapping-math).
 *
 * `coarse` swaps the polynomial for a degree-4 one (fast_exp_coarse). */
static inline float fast_exp_nonpositive_steps(float x, bool coarse) {
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: x + it rounds to int */
    uint32_t input;
    memcpy(&input, &x, sizeof input);
    /* As unsigned, negative floats grow with |x| (0xC2AE0000 = -87.0f); as
     * signed, positive floats grow with x (0x42B00000 = 88.0f). NaNs are
     * clamped as well (and restored below), so n is an integer in
     * [-126, 127] and the exponent bits below are a normal float's. */
    uint32_t u = input < 0xC2AE0000u ? input : 0xC2AE0000u;
    int32_t clamped = (int32_t)u < 0x42B00000 ? (int32_t)u : 0x42B00000;
    memcpy(&x, &clamped, sizeof x);
    float n = (x * 1.44269504f + round_magic) - round_magic;
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln 2 = hi + lo */
    float p =
        coarse
            ? 1.0f + r * (FAST_EXP_COARSE_C1 +
                          r * (FAST_EXP_COARSE_C2 + r * (FAST_EXP_COARSE_C3 + r * FAST_EXP_COARSE_C4)))
            : 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n */
    float scale, result;
    memcpy(&scale, &bits, sizeof scale);
    result = p * scale;
    /* all ones when |input| is above +inf's bit pattern, i.e. a NaN */
    uint32_t nan_mask = (uint32_t)((int32_t)(0x7F800000u - (input & 0x7FFFFFFFu)) >> 31), out;
    memcpy(&out, &result, sizeof out);
    out = (out & ~nan_mask) | (input & nan_mask);
    memcpy(&result, &out, sizeof result);
    return result;
}

static inline float fast_exp_nonpositive(float x) { return fast_exp_nonpositive_steps(x, false); }

static inline float fast_exp_coarse(float x) { return fast_exp_nonpositive_steps(x, true); }

/* fast_exp_nonpositive on eight lanes with FMA, for the callers that have
 * checked the CPU (tiled_softmax.c behind tile_gemm_available()): the
 * target_clones above get no FMA, and there the polynomial's separate
 * multiplies and adds made exp a fifth of tiled attention's time. The same
 * steps and coefficients, fused; the error stays within 2 ulp over
 * [-87, 0]. Clamps as above: vmaxps/vminps return their second operand
 * when either is NaN, so a NaN passes through to the result. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FAST_EXP8_AVAILABLE 1
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 fast_exp8_steps(__m256 x, bool coarse) {
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r, p;
    if (coarse) {
        /* one fused step: n ln 2 is exact inside it, and ln 2's float (off
         * by 1.9e-9) moves r by at most 2.4e-7 at |n| = 126 */
        r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147182f), x);
        p = _mm256_fmadd_ps(_mm256_set1_ps(FAST_EXP_COARSE_C4), r, _mm256_set1_ps(FAST_EXP_COARSE_C3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAST_EXP_COARSE_C2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAST_EXP_COARSE_C1));
    } else {
        r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
        r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
        p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 720), r, _mm256_set1_ps(1.0f / 120));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    }
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 fast_exp8_nonpositive(__m256 x) {
    return fast_exp8_steps(x, false);
}
/* fast_exp_coarse's polynomial on eight lanes (its reduction fused). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 fast_exp8_coarse(__m256 x) {
    return fast_exp8_steps(x, true);
}
/* The same on sixteen lanes with AVX-512F, for callers that have checked
 * the CPU (tiled_softmax.c): the same steps, hence the same bits as
 * fast_exp8_steps lane by lane. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 fast_exp16_steps(__m512 x, bool coarse) {
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r, p;
    if (coarse) {
        r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147182f), x);
        p = _mm512_fmadd_ps(_mm512_set1_ps(FAST_EXP_COARSE_C4), r, _mm512_set1_ps(FAST_EXP_COARSE_C3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAST_EXP_COARSE_C2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAST_EXP_COARSE_C1));
    } else {
        r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
        r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
        p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 720), r, _mm512_set1_ps(1.0f / 120));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    }
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    /* p 2^n in one vscalefps where fast_exp8_steps builds 2^n's bits and
     * multiplies (four instructions): n is an integer in [-126, 127] (the
     * clamps), 2^n a normal float, so both multiply p by the same power of
     * two and round alike; a NaN stays NaN */
    return _mm512_scalef_ps(p, n);
}
__attribute__((target("avx512f"), always_inline)) static inline __m512 fast_exp16_nonpositive(__m512 x) {
    return fast_exp16_steps(x, false);
}
__attribute__((target("avx512f"), always_inline)) static inline __m512 fast_exp16_coarse(__m512 x) {
    return fast_exp16_steps(x, true);
}

/* tanh on eight and sixteen lanes, fast_tanh's steps on fast_exp8 and
 * fast_exp16 (so the two give the same bits lane by lane): sign(x) (1 - t)
 * / (1 + t) with t = e^{-2|x|}, the sign copied from x's bit. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 fast_tanh8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 t = fast_exp8_nonpositive(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    __m256 magnitude = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
    return _mm256_or_ps(magnitude, _mm256_and_ps(sign, x));
}
__attribute__((target("avx512f"), always_inline)) static inline __m512 fast_tanh16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i bits = _mm512_castps_si512(x);
    __m512 t = fast_exp16_nonpositive(
        _mm512_mul_ps(_mm512_set1_ps(-2.0f), _mm512_castsi512_ps(_mm512_andnot_si512(sign, bits))));
    __m512 magnitude = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), _mm512_and_si512(sign, bits)));
}
#else
#define FAST_EXP8_AVAILABLE 0
#endif

/* Sums and maxima in 16 independent lanes: the compiler vectorises these
 * (a sequential float reduction it may not reorder), and the fixed lane
 * order keeps results identical on every machine and clone. */
#define REDUCTION_LANES 16

static inline float fast_sum_lanes(const float *x, int n) {
    float acc[REDUCTION_LANES] = {0};
    int j = 0;
    for (; j + REDUCTION_LANES <= n; j += REDUCTION_LANES)
        for (int l = 0; l < REDUCTION_LANES; l++) acc[l] += x[j + l];
    float total = 0;
    for (int l = 0; l < REDUCTION_LANES; l++) total += acc[l];
    for (; j < n; j++) total += x[j];
    return total;
}

/* sum x[j] y[j] in the same lanes and order as fast_sum_lanes. */
static inline float fast_dot_lanes(const float *x, const float *y, int n) {
    float acc[REDUCTION_LANES] = {0};
    int j = 0;
    for (; j + REDUCTION_LANES <= n; j += REDUCTION_LANES)
        for (int l = 0; l < REDUCTION_LANES; l++) acc[l] += x[j + l] * y[j + l];
    float total = 0;
    for (int l = 0; l < REDUCTION_LANES; l++) total += acc[l];
    for (; j < n; j++) total += x[j] * y[j];
    return total;
}

/* The same in double, for long sums (a head's T x dh products). */
static inline double fast_dot_lanes_double(const float *x, const float *y, size_t n) {
    double acc[REDUCTION_LANES] = {0};
    size_t j = 0;
    for (; j + REDUCTION_LANES <= n; j += REDUCTION_LANES)
        for (int l = 0; l < REDUCTION_LANES; l++) acc[l] += (double)x[j + l] * y[j + l];
    double total = 0;
    for (int l = 0; l < REDUCTION_LANES; l++) total += acc[l];
    for (; j < n; j++) total += (double)x[j] * y[j];
    return total;
}

static inline float fast_max_lanes(const float *x, int n) {
    float acc[REDUCTION_LANES];
    for (int l = 0; l < REDUCTION_LANES; l++) acc[l] = -3.402823466e38f;
    int j = 0;
    for (; j + REDUCTION_LANES <= n; j += REDUCTION_LANES)
        for (int l = 0; l < REDUCTION_LANES; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
    float best = acc[0];
    for (int l = 1; l < REDUCTION_LANES; l++) best = acc[l] > best ? acc[l] : best;
    for (; j < n; j++) best = x[j] > best ? x[j] : best;
    return best;
}

/* tanh(x) = sign(x) (1 - t) / (1 + t) with t = e^{-2|x|} <= 1: no overflow. */
static inline float fast_tanh(float x) {
    float t = fast_exp_nonpositive(-2.0f * fabsf(x));
    float magnitude = (1.0f - t) / (1.0f + t);
    return x < 0.0f ? -magnitude : magnitude;
}
#endif
