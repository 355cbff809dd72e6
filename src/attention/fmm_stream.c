/* Streaming FMM attention (docs/model.md §1.3, causal) for generation and
 * `eval --stream`: the near field looks back over the band in the key cache;
 * the far field is the recurrent form of linear attention, a running
 * [dh, dh] state and [dh] normaliser per kernel. */
#include <math.h>
#include <string.h>

#include "attention/fmm.h"

size_t fmm_stream_state_floats(const fmm_settings *s, int dh) { return (size_t)s->n_kernels * ((size_t)dh * dh + dh); }

size_t fmm_stream_scratch_floats(const fmm_settings *s, int dh) {
    return (size_t)(s->bandwidth > 0 ? s->bandwidth : 1) + 3 * (size_t)dh;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Softmax over keys (i - k, i] of q_i k_j / sqrt(dh), times v: into out. */
static void near_row(const float *qi, const float *k_all, const float *v_all, int i, int bandwidth, float *out,
                     float *scores, int dh) {
    int first = i - bandwidth + 1 > 0 ? i - bandwidth + 1 : 0;
    float scale = 1.0f / sqrtf((float)dh), max = -INFINITY, sum = 0;
    for (int j = first; j <= i; j++) {
        float dot = 0;
        for (int c = 0; c < dh; c++) dot += qi[c] * k_all[(size_t)j * dh + c];
        scores[j - first] = dot * scale;
        if (scores[j - first] > max) max = scores[j - first];
    }
    for (int j = first; j <= i; j++) sum += scores[j - first] = expf(scores[j - first] - max);
    memset(out, 0, sizeof(float) * dh);
    for (int j = first; j <= i; j++)
        for (int c = 0; c < dh; c++) out[c] += scores[j - first] / sum * v_all[(size_t)j * dh + c];
}

/* Adds key/value j to a kernel's state, then reads the far field of q_i. */
static void far_row(fmm_feature_map map, float eps, const float *qi, const float *kj, const float *vj, float *state,
                    float *out, float *phi, int dh) {
    float *numerator = state, *normaliser = state + (size_t)dh * dh;
    for (int a = 0; a < dh; a++) phi[a] = fmm_feature(map, kj[a]);
    for (int a = 0; a < dh; a++) {
        normaliser[a] += phi[a];
        for (int c = 0; c < dh; c++) numerator[(size_t)a * dh + c] += phi[a] * vj[c];
    }
    for (int a = 0; a < dh; a++) phi[a] = fmm_feature(map, qi[a]);
    float denominator = eps;
    for (int a = 0; a < dh; a++) denominator += phi[a] * normaliser[a];
    for (int c = 0; c < dh; c++) {
        float value = 0;
        for (int a = 0; a < dh; a++) value += phi[a] * numerator[(size_t)a * dh + c];
        out[c] = value / denominator;
    }
}

void fmm_head_stream(const fmm_settings *s, const float *q, const float *k_all, const float *v_all, int pos, int n,
                     float blend_near, float blend_far, float *far_state, float *out, float *scratch, int dh) {
    float *scores = scratch, *phi = scratch + (s->bandwidth > 0 ? s->bandwidth : 1), *part = phi + dh;
    float *far_sum = part + dh;
    float w_near = sigmoid(blend_near), w_far = sigmoid(blend_far);
    size_t per_kernel = (size_t)dh * dh + dh;
    for (int r = 0; r < n; r++) {
        int i = pos + r;
        const float *qi = q + (size_t)r * dh;
        float *yi = out + (size_t)r * dh;
        memset(yi, 0, sizeof(float) * dh);
        if (s->bandwidth > 0) {
            near_row(qi, k_all, v_all, i, s->bandwidth, part, scores, dh);
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
