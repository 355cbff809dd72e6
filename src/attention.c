/* The attention sublayer (SPEC 1.1-1.3): split the fused qkv into heads,
 * rotate (RoPE) and shear (momentum) q and k, run softmax or FMM attention
 * per head, merge the heads. Per-head vectors are stored head-major
 * [B, H, T, dh] so every kernel sees contiguous [T, dh] matrices. */
#include <string.h>

#include "momfmm/kernels.h"
#include "momfmm/model.h"
#include "momfmm/momentum.h"

enum { VECTOR_Q = 0, VECTOR_K = 1 };

size_t attention_saved_per_head(const model *m, int T) {
    if (m->cfg.attention == ATTENTION_FMM) return fmm_head_saved_floats(&m->fmm, T, m->dh);
    return (size_t)T * T;
}

/* Kernel scratch plus five [T, dh] temporaries for gathering and the
 * gradients of q, k, v. */
size_t attention_scratch_per_head(const model *m, int T) {
    size_t kernel = m->cfg.attention == ATTENTION_FMM ? fmm_head_scratch_floats(&m->fmm, T, m->dh)
                                                      : (size_t)T * T;
    return kernel + 5 * (size_t)T * m->dh;
}

static bool is_sheared(const model *m, int which) {
    return m->momentum && (which == VECTOR_Q || m->cfg.apply_to == APPLY_QK);
}

static momentum_coeffs head_coeffs(const model *m, int layer, int h) {
    const float *learned = m->w.blocks[layer].momentum_gamma;
    momentum_coeffs c = {learned ? learned[h] : (float)m->cfg.gamma, (float)m->cfg.beta,
                         (float)m->cfg.gamma2};
    return c;
}

/* The momentum buffer of (layer, q|k, head): [dh] floats. */
static float *head_buffer(float *base, const model *m, int layer, int which, int h) {
    return base + ((size_t)(layer * 2 + which) * m->H + h) * m->dh;
}

static void gather_head(float *dst, const float *rows, int row_stride, int col, int T, int dh) {
    for (int t = 0; t < T; t++) memcpy(dst + (size_t)t * dh, rows + (size_t)t * row_stride + col, sizeof(float) * dh);
}

static void scatter_head(float *rows, const float *src, int row_stride, int col, int T, int dh) {
    for (int t = 0; t < T; t++) memcpy(rows + (size_t)t * row_stride + col, src + (size_t)t * dh, sizeof(float) * dh);
}

static void add_last_position(float *sum, const float *x, int T, int dh) {
    const float *last = x + (size_t)(T - 1) * dh;
    for (int i = 0; i < dh; i++) sum[i] += last[i];
}

/* raw (unrotated q or k of one head) -> dst = q-hat or k-hat (SPEC 1.2):
 * post_rope shears the rotated vectors, pre_rope rotates the sheared ones. */
static void prepare_vector(model *m, int layer, int h, int which, float *raw, float *dst, float *p,
                           int T, bool collect_buffers) {
    if (!is_sheared(m, which)) {
        memcpy(dst, raw, sizeof(float) * T * m->dh);
        rope_forward(dst, m->rope_cos, m->rope_sin, T, m->dh, 0);
        return;
    }
    bool post = m->cfg.placement == PLACEMENT_POST_ROPE;
    if (post) rope_forward(raw, m->rope_cos, m->rope_sin, T, m->dh, 0);
    if (collect_buffers) add_last_position(head_buffer(m->buffer_sums, m, layer, which, h), raw, T, m->dh);
    const float *prev = m->cfg.anchor ? NULL : head_buffer(m->buffers, m, layer, which, h);
    momentum_shear_forward(raw, prev, NULL, dst, p, head_coeffs(m, layer, h), T, m->dh);
    if (!post) rope_forward(dst, m->rope_cos, m->rope_sin, T, m->dh, 0);
}

/* The adjoint of prepare_vector: d_hat (destroyed) -> d_raw (overwritten). */
static void unprepare_gradient(model *m, int layer, int h, int which, float *d_hat, float *d_raw,
                               const float *p, int T) {
    if (!is_sheared(m, which)) {
        rope_backward(d_hat, m->rope_cos, m->rope_sin, T, m->dh, 0);
        memcpy(d_raw, d_hat, sizeof(float) * T * m->dh);
        return;
    }
    bool post = m->cfg.placement == PLACEMENT_POST_ROPE;
    if (!post) rope_backward(d_hat, m->rope_cos, m->rope_sin, T, m->dh, 0);
    memset(d_raw, 0, sizeof(float) * T * m->dh);
    float *d_gamma = m->g.blocks[layer].momentum_gamma ? m->g.blocks[layer].momentum_gamma + h : NULL;
    float scratch[m->dh];
    momentum_shear_backward(d_hat, p, d_raw, d_gamma, head_coeffs(m, layer, h), m->cfg.anchor, scratch, T,
                            m->dh);
    if (post) rope_backward(d_raw, m->rope_cos, m->rope_sin, T, m->dh, 0);
}

/* Offset of head (b, h) of layer `layer` in a [L][B*H*T*dh] array. */
static size_t head_offset(const model *m, int layer, int b, int h, int B, int T) {
    return (((size_t)layer * B + b) * m->H + h) * (size_t)T * m->dh;
}

void attention_forward(model *m, int layer, const float *qkv, float *out, int B, int T,
                       bool collect_buffers) {
    activations *a = &m->acts;
    int d = m->d, dh = m->dh;
    size_t saved_per_head = attention_saved_per_head(m, T);
    float *raw = a->head_scratch + attention_scratch_per_head(m, T) - 5 * (size_t)T * dh;
    float *head_out = raw + (size_t)T * dh;
    bool keep_p = m->g.blocks[layer].momentum_gamma != NULL;
    for (int b = 0; b < B; b++) {
        const float *rows = qkv + (size_t)b * T * 3 * d;
        for (int h = 0; h < m->H; h++) {
            size_t off = head_offset(m, layer, b, h, B, T);
            float *q = a->q_hat + off, *k = a->k_hat + off, *v = a->v_heads + off;
            gather_head(raw, rows, 3 * d, h * dh, T, dh);
            prepare_vector(m, layer, h, VECTOR_Q, raw, q, keep_p ? a->p_q + off : NULL, T, collect_buffers);
            gather_head(raw, rows, 3 * d, d + h * dh, T, dh);
            prepare_vector(m, layer, h, VECTOR_K, raw, k, keep_p ? a->p_k + off : NULL, T, collect_buffers);
            gather_head(v, rows, 3 * d, 2 * d + h * dh, T, dh);
            float *saved = a->att_saved + (((size_t)layer * B + b) * m->H + h) * saved_per_head;
            if (m->cfg.attention == ATTENTION_FMM) {
                const float *blend = m->w.blocks[layer].fmm_blend;
                fmm_head_forward(&m->fmm, q, k, v, blend[h], blend[m->H + h], head_out, saved,
                                 a->head_scratch, T, dh);
            } else {
                softmax_attention_forward(head_out, saved, q, k, v, T, T, dh, 0, m->cfg.causal);
            }
            scatter_head(out + (size_t)b * T * d, head_out, d, h * dh, T, dh);
        }
    }
}

void attention_backward(model *m, int layer, const float *d_out, float *d_qkv, int B, int T) {
    activations *a = &m->acts;
    int d = m->d, dh = m->dh;
    size_t saved_per_head = attention_saved_per_head(m, T), tdh = (size_t)T * dh;
    float *d_head_out = a->head_scratch + attention_scratch_per_head(m, T) - 5 * tdh;
    float *dq = d_head_out + tdh, *dk = dq + tdh, *dv = dk + tdh, *d_raw = dv + tdh;
    bool keep_p = m->g.blocks[layer].momentum_gamma != NULL;
    for (int b = 0; b < B; b++) {
        float *d_rows = d_qkv + (size_t)b * T * 3 * d;
        for (int h = 0; h < m->H; h++) {
            size_t off = head_offset(m, layer, b, h, B, T);
            const float *q = a->q_hat + off, *k = a->k_hat + off, *v = a->v_heads + off;
            const float *saved = a->att_saved + (((size_t)layer * B + b) * m->H + h) * saved_per_head;
            gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
            if (m->cfg.attention == ATTENTION_FMM) {
                const float *blend = m->w.blocks[layer].fmm_blend;
                float *d_blend = m->g.blocks[layer].fmm_blend;
                fmm_head_backward(&m->fmm, q, k, v, blend[h], blend[m->H + h], saved, d_head_out, dq, dk, dv,
                                  &d_blend[h], &d_blend[m->H + h], a->head_scratch, T, dh);
            } else {
                softmax_attention_backward(dq, dk, dv, d_head_out, saved, q, k, v, a->head_scratch, T, T, dh,
                                           m->cfg.causal);
            }
            unprepare_gradient(m, layer, h, VECTOR_Q, dq, d_raw, keep_p ? a->p_q + off : NULL, T);
            scatter_head(d_rows, d_raw, 3 * d, h * dh, T, dh);
            unprepare_gradient(m, layer, h, VECTOR_K, dk, d_raw, keep_p ? a->p_k + off : NULL, T);
            scatter_head(d_rows, d_raw, 3 * d, d + h * dh, T, dh);
            scatter_head(d_rows, dv, 3 * d, 2 * d + h * dh, T, dh);
        }
    }
}

/* ---- streaming (SPEC 1.2: carry each sequence's previous vectors) ------- */

static size_t stream_index(const stream_state *st, const model *m, int layer, int s, int h) {
    return ((size_t)layer * st->S + s) * m->H + h;
}

/* prepare_vector for positions pos..pos+n-1 of one stream: at pos 0 the
 * shear starts as in training (anchor or buffer); later it continues from
 * the carried x_{t-1} and p_{t-1}, which it then updates. */
static void prepare_stream_vector(model *m, stream_state *st, int layer, int s, int h, int which, float *raw,
                                  float *dst, float *p, int n) {
    int dh = m->dh, pos = st->pos;
    if (!is_sheared(m, which)) {
        memcpy(dst, raw, sizeof(float) * n * dh);
        rope_forward(dst, m->rope_cos, m->rope_sin, n, dh, pos);
        return;
    }
    size_t carry = ((((size_t)layer * 2 + which) * st->S + s) * m->H + h) * dh;
    float *carry_x = st->carry_x + carry, *carry_p = st->carry_p + carry;
    const float *prev = pos > 0 ? carry_x : m->cfg.anchor ? NULL : head_buffer(m->buffers, m, layer, which, h);
    bool post = m->cfg.placement == PLACEMENT_POST_ROPE;
    if (post) rope_forward(raw, m->rope_cos, m->rope_sin, n, dh, pos);
    momentum_shear_forward(raw, prev, pos > 0 ? carry_p : NULL, dst, p, head_coeffs(m, layer, h), n, dh);
    memcpy(carry_x, raw + (size_t)(n - 1) * dh, sizeof(float) * dh);
    memcpy(carry_p, p + (size_t)(n - 1) * dh, sizeof(float) * dh);
    if (!post) rope_forward(dst, m->rope_cos, m->rope_sin, n, dh, pos);
}

void attention_stream_forward(model *m, stream_state *st, int layer, const float *qkv, float *out, int n) {
    int d = m->d, dh = m->dh, pos = st->pos;
    size_t ndh = (size_t)n * dh, cache = (size_t)st->capacity * dh;
    float *raw = st->head_scratch, *q = raw + ndh, *p = q + ndh, *head_out = p + ndh, *kernel = head_out + ndh;
    size_t far_floats = fmm_stream_state_floats(&m->fmm, dh);
    for (int s = 0; s < st->S; s++) {
        const float *rows = qkv + (size_t)s * n * 3 * d;
        for (int h = 0; h < m->H; h++) {
            size_t index = stream_index(st, m, layer, s, h);
            float *k_cache = st->k_cache + index * cache, *v_cache = st->v_cache + index * cache;
            gather_head(raw, rows, 3 * d, h * dh, n, dh);
            prepare_stream_vector(m, st, layer, s, h, VECTOR_Q, raw, q, p, n);
            gather_head(raw, rows, 3 * d, d + h * dh, n, dh);
            prepare_stream_vector(m, st, layer, s, h, VECTOR_K, raw, k_cache + (size_t)pos * dh, p, n);
            gather_head(v_cache + (size_t)pos * dh, rows, 3 * d, 2 * d + h * dh, n, dh);
            if (m->cfg.attention == ATTENTION_FMM) {
                const float *blend = m->w.blocks[layer].fmm_blend;
                fmm_head_stream(&m->fmm, q, k_cache, v_cache, pos, n, blend[h], blend[m->H + h],
                                st->far_state + index * far_floats, head_out, kernel, dh);
            } else {
                softmax_attention_forward(head_out, st->probs, q, k_cache, v_cache, n, pos + n, dh, pos, true);
            }
            scatter_head(out + (size_t)s * n * d, head_out, d, h * dh, n, dh);
        }
    }
}
