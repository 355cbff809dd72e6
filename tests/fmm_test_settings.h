/* The FMM settings the kernel tests build (test_fmm.c, test_shards.c): the
 * far-field kernels named as in a config (`fmm.kernels`, parsed by the
 * config's own parser, so the tests name them as users do); "" for none. */
#ifndef MOMFMM_FMM_TEST_SETTINGS_H
#define MOMFMM_FMM_TEST_SETTINGS_H
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/fmm.h"
#include "base/status.h"
#include "config/config.h"

static inline fmm_settings fmm_test_settings(int bandwidth, bool causal, const char *kernels, int chunk) {
    fmm_settings s;
    memset(&s, 0, sizeof s);
    s.bandwidth = bandwidth;
    s.causal = causal;
    s.eps = 1e-6f;
    s.chunk = chunk;
    if (!kernels[0]) return s; /* no far field */
    config c;
    config_defaults(&c);
    char assignment[128];
    snprintf(assignment, sizeof assignment, "fmm.kernels=%s", kernels);
    status st;
    if (config_apply_override(&c, assignment, &st) != 0) {
        fprintf(stderr, "bad kernel list in test: %s\n", st.message);
        exit(2);
    }
    s.n_kernels = c.fmm_kernels.n;
    for (int i = 0; i < c.fmm_kernels.n; i++) s.kernels[i] = (fmm_feature_map)c.fmm_kernels.items[i];
    return s;
}
#endif
