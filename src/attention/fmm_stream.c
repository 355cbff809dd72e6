/* Streaming FMM attention (docs/model.md §1.3, causal) for generation and
 * `eval --stream`: the near field looks back over the band in the key cache,
 * by the same band row as the full forward (fmm_near.c); the far field is
 * the recurrent form of linear attention, a running [dh, dh] state and [dh]
 * normaliser per kernel, through the same feature maps (fmm_far.c). */
#include <string.h>

#include "attention/fmm.h"

#include "fmm_internal.h"

size_t fmm_stream_state_floats(const fmm_settings *s, int dh) { return (size_t)s->n_kernels * ((size_t)dh * dh + dh); }

size_t fmm_stream_scratch_floats(const fmm_settings *s, int dh) {
    return (size_t)(s->bandwidth > 0 ? s->bandwidth : 1) + 3 * (size_t)dh;
}

/* Softmax over keys (i - k, i] of q_i k_j / sqrt(dh), times v: into out.
 * Row i of a causal band over the i + 1 keys so far is the full forward's
 * row i (fmm_band_row; p holds at most `bandwidth` probabilities). */
static void near_row(const fmm_settings *s, const float *qi, const float *k_all, const float *v_all, int i, float *out,
                     float *p, int dh) {
    fmm_band g = fmm_band_of(s, i + 1);
    int lo, hi, base = fmm_band_limits(&g, i, &lo, &hi);
    fmm_band_row(&g, qi, k_all, p, i, dh);
    memset(out, 0, sizeof(float) * dh);
    for (int j = lo; j <= hi; j++) fmm_add_scaled(out, p[j - base], v_all + (size_t)j * dh, dh);
}

/* Adds key/value j to a kernel's state, then reads the far field of q_i. */
static void far_row(fmm_feature_map map, float eps, const float *qi, const float *kj, const float *vj, float *state,
                    float *out, float *phi, int dh) {
    float *numerator = state, *normaliser = state + (size_t)dh * dh;
    fmm_apply_feature_map(map, kj, phi, (size_t)dh);
    for (int a = 0; a < dh; a++) {
        normaliser[a] += phi[a];
        fmm_add_scaled(numerator + (size_t)a * dh, phi[a], vj, dh);
    }
    fmm_apply_feature_map(map, qi, phi, (size_t)dh);
    float denominator = eps + fmm_dot(phi, normaliser, dh);
    for (int c = 0; c < dh; c++) {
        float value = 0;
        for (int a = 0; a < dh; a++) value += phi[a] * numerator[(size_t)a * dh + c];
        out[c] = value / denominator;
    }
}

void fmm_head_stream(const fmm_settings *s, const float *q, const float *k_all, const float *v_all, int pos, int n,
                     float blend_near, float blend_far, float *far_state, float *out, float *scratch, int dh) {
    fmm_settings causal = *s;
    causal.causal = true;
    float *scores = scratch, *phi = scratch + (s->bandwidth > 0 ? s->bandwidth : 1), *part = phi + dh;
    float *far_sum = part + dh;
    float w_near = fmm_sigmoid(blend_near), w_far = fmm_sigmoid(blend_far);
    size_t per_kernel = (size_t)dh * dh + dh;
    for (int r = 0; r < n; r++) {
        int i = pos + r;
        const float *qi = q + (size_t)r * dh;
        float *yi = out + (size_t)r * dh;
        memset(yi, 0, sizeof(float) * dh);
        if (s->bandwidth > 0) {
            near_row(&causal, qi, k_all, v_all, i, part, scores, dh);
            for (int c = 0; c < dh; c++) yi[c] += w_near * part[c];
        }
        if (s->n_kernels == 0) continue;
        memset(far_sum, 0, sizeof(float) * dh);
        for (int l = 0; l < s->n_kernels; l++) {
            far_row(s->kernels[l], s->eps, qi, k_all + (size_t)i * dh, v_all + (size_t)i * dh,
                    far_state + l * per_kernel, part, phi, dh);
            for (int c = 0; c < dh; c++) far_sum[c] += part[c];
        }
        for (int c = 0; c < dh; c++) yi[c] += w_far * far_sum[c] / (float)s->n_kernels;
    }
}
