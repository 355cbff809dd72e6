/* Numeric arguments of the C tools in tools/ (bench_attention, bench_gemm,
 * fma_peak, net_probe), read whole: atoi and atof took "2x" for 2 and "x"
 * for 0, and bench_gemm put 7 rounds in place of any it did not like, so a
 * typo ran a benchmark other than the one asked for. Header-only, because
 * net_probe links MPI alone, outside momfmm_core. */
#ifndef MOMFMM_TOOL_ARGS_H
#define MOMFMM_TOOL_ARGS_H
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* s as a whole decimal integer in [lo, hi] ("1e9", "12x", "" and "nan" are
 * not). */
static inline bool tool_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* s as a whole finite number in [lo, hi]. */
static inline bool tool_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}
#endif
