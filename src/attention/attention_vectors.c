/* The q and k vectors of one head (attention_vectors.h): RoPE at the rows'
 * positions and the momentum shear with its carries (docs/model.md
 * §1.1-1.2), forward and adjoint. */
#include <string.h>

#include "attention/momentum.h"
#include "kernels/kernels.h"

#include "attention_vectors.h"

bool attention_is_sheared(const attention_layer *a, int which) {
    return a->momentum && (which == VECTOR_Q || a->cfg->apply_to == APPLY_QK);
}

momentum_coeffs attention_head_coeffs(const attention_layer *a, int h) {
    momentum_coeffs c = {a->gamma ? a->gamma[h] : (float)a->cfg->gamma, (float)a->cfg->beta, (float)a->cfg->gamma2};
    return c;
}

size_t attention_head_buffer(const attention_layer *a, int which, int h) { return ((size_t)which * a->H + h) * a->dh; }

size_t attention_head_offset(const attention_layer *a, int b, int h, int T) {
    return ((size_t)b * a->H + h) * (size_t)T * a->dh;
}

void attention_shear_frame(const attention_layer *a, float *raw, int T, int pos0) {
    if (a->cfg->placement == PLACEMENT_POST_ROPE) rope_forward(raw, raw, a->rope_cos, a->rope_sin, T, a->dh, pos0);
}

void attention_shear(const attention_layer *a, int h, int which, const float *x, float *dst, float *p, int T,
                     const attention_span *span) {
    const float *prev =
        span->first ? (a->cfg->anchor ? NULL : a->buffers + attention_head_buffer(a, which, h)) : span->prev;
    momentum_shear_forward(x, prev, span->first ? NULL : span->p_prev, dst, p, attention_head_coeffs(a, h), T, a->dh);
    if (a->cfg->placement != PLACEMENT_POST_ROPE)
        rope_forward(dst, dst, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
}

void attention_prepare(const attention_layer *a, int h, int which, float *raw, float *dst, float *p, int T,
                       const attention_span *span) {
    if (!attention_is_sheared(a, which)) {
        rope_forward(dst, raw, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
        return;
    }
    attention_shear_frame(a, raw, T, span->pos0);
    if (a->buffer_sums && span->holds_last)
        attention_add_last_position(a->buffer_sums + attention_head_buffer(a, which, h), raw, T, a->dh);
    attention_shear(a, h, which, raw, dst, p, T, span);
}

void attention_prepare_rows(const attention_layer *a, int h, int which, const float *rows, int row_stride, float *raw,
                            float *dst, float *p, int T, const attention_span *span) {
    const float *src = rows + (size_t)which * a->d + (size_t)h * a->dh;
    if (!attention_is_sheared(a, which)) {
        rope_forward_rows(dst, a->dh, src, row_stride, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
        return;
    }
    attention_gather_head(raw, rows, row_stride, which * a->d + h * a->dh, T, a->dh);
    attention_prepare(a, h, which, raw, dst, p, T, span);
}

void attention_shear_gradient_frame(const attention_layer *a, float *d_hat, int T, int pos0) {
    if (a->cfg->placement != PLACEMENT_POST_ROPE) rope_backward(d_hat, d_hat, a->rope_cos, a->rope_sin, T, a->dh, pos0);
}

void attention_unprepare(const attention_layer *a, int h, int which, float *d_hat, float *d_raw, const float *p, int T,
                         const attention_span *span) {
    if (!attention_is_sheared(a, which)) {
        rope_backward(d_raw, d_hat, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
        return;
    }
    attention_shear_gradient_frame(a, d_hat, T, span->pos0);
    memset(d_raw, 0, sizeof(float) * T * a->dh);
    float *d_gamma = a->d_gamma ? a->d_gamma + h : NULL;
    float scratch[a->dh];
    momentum_shear_backward(d_hat, p, d_raw, d_gamma, attention_head_coeffs(a, h), span->first && a->cfg->anchor,
                            span->g_next, span->u_next, scratch, T, a->dh);
    if (a->cfg->placement == PLACEMENT_POST_ROPE)
        rope_backward(d_raw, d_raw, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
}

void attention_unprepare_rows(const attention_layer *a, int h, int which, float *d_hat, float *rows, int row_stride,
                              float *d_raw, const float *p, int T, const attention_span *span) {
    float *dst = rows + (size_t)which * a->d + (size_t)h * a->dh;
    if (!attention_is_sheared(a, which)) {
        rope_backward_rows(dst, row_stride, d_hat, a->dh, a->rope_cos, a->rope_sin, T, a->dh, span->pos0);
        return;
    }
    attention_unprepare(a, h, which, d_hat, d_raw, p, T, span);
    attention_scatter_head(rows, d_raw, row_stride, which * a->d + h * a->dh, T, a->dh);
}
