/* Counter-based random numbers (docs/tasks.md §2): every draw is a pure function of a
 * key and a counter, so samples and initial weights need no hidden state and
 * are the same on every rank and after a resume. */
#ifndef MOMFMM_RNG_H
#define MOMFMM_RNG_H
#include <math.h>
#include <stdint.h>

static inline uint64_t rng_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Key of a stream, e.g. rng_key(seed, split, step, global_index). */
static inline uint64_t rng_key(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return rng_mix(rng_mix(rng_mix(rng_mix(a) ^ b) ^ c) ^ d);
}

static inline uint64_t rng_u64(uint64_t key, uint64_t counter) {
    return rng_mix(key ^ rng_mix(counter + 0x632BE59BD9B4E019ULL));
}

/* Uniform in [0, 1), 53 bits. */
static inline double rng_uniform(uint64_t key, uint64_t counter) {
    return (double)(rng_u64(key, counter) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n). */
static inline uint32_t rng_below(uint64_t key, uint64_t counter, uint32_t n) {
    return (uint32_t)(((rng_u64(key, counter) >> 32) * (uint64_t)n) >> 32);
}

/* Standard normal by Box-Muller on two counters. */
static inline double rng_normal(uint64_t key, uint64_t counter) {
    double u1 = rng_uniform(key, 2 * counter), u2 = rng_uniform(key, 2 * counter + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
#endif
