/* FMM attention on a shard of each sequence (docs/design.md §8.12): the
 * band's k - 1 keys from the neighbouring shards (halos, and their
 * gradients sent back), the far field's state from the shards before
 * (causal: a scan over the context group) or all others (non-causal: a
 * sum), and in backward the reverse scan of the far field's gradient
 * state. */
#include <string.h>

#include "attention/fmm.h"
#include "parallel/context.h"

#include "attention_shard.h"
#include "attention_vectors.h"
#include "shard_internal.h"

/* The halo rows of (b, h): [2][halo][dh], k then v. */
static size_t halo_at(const attention_layer *a, int b, int h, int halo) {
    return ((size_t)b * a->H + h) * 2 * (size_t)halo * a->dh;
}

/* Packs this shard's first and last `halo` rows of k-hat and v for its neighbours. */
static void pack_halos(const attention_layer *a, const attention_saved *s, const shard_exchange *x, int B, int T,
                       int halo) {
    size_t bytes = sizeof(float) * (size_t)halo * a->dh;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++) {
            size_t off = attention_head_offset(a, b, h, T), at = halo_at(a, b, h, halo);
            const float *k = s->k_hat + off, *v = s->v_heads + off;
            size_t last = (size_t)(T - halo) * a->dh;
            memcpy(x->halo_send[0] + at, k + last, bytes), memcpy(x->halo_send[0] + at + halo * a->dh, v + last, bytes);
            memcpy(x->halo_send[1] + at, k, bytes), memcpy(x->halo_send[1] + at + halo * a->dh, v, bytes);
        }
}

/* A head's saved shard state: far_in, then the halo rows k, v (left, right). */
static float *shard_saved(const attention_layer *a, const attention_saved *s, int b, int h, int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    size_t per_head = attention_shard_saved_per_head(&z);
    return s->saved + ((size_t)b * a->H + h) * per_head + (per_head - shard_state_floats(&z));
}

/* Keeps (b, h)'s far_in and the halo rows it received for the backward. */
static void keep_shard_state(const attention_layer *a, const attention_saved *s, const shard_exchange *x, int b, int h,
                             int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    int dh = a->dh, halo = shard_halo_rows(&z), left = shard_halo_left(&z), right = shard_halo_right(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), at = halo_at(a, b, h, halo);
    float *kept = shard_saved(a, s, b, h, T);
    memcpy(kept, x->totals + ((size_t)b * a->H + h) * state, sizeof(float) * state);
    float *rows = kept + state;
    for (int kv = 0; kv < 2;
         kv++) { /* k, v: left halo rows (the last of the previous shard), right (the next's first) */
        memcpy(rows, x->halo_recv[0] + at + (size_t)kv * halo * dh + (size_t)(halo - left) * dh,
               sizeof(float) * left * dh);
        memcpy(rows + (size_t)left * dh, x->halo_recv[1] + at + (size_t)kv * halo * dh, sizeof(float) * right * dh);
        rows += (size_t)(left + right) * dh;
    }
}

/* The head's keys and values with their halos, into k_ext, v_ext. */
static fmm_shard shard_of(const attention_layer *a, const attention_saved *s, int b, int h, int T, float *k_ext,
                          float *v_ext, const float *far_grad_in) {
    attention_layer_sizes z = shard_sizes(a, T);
    int dh = a->dh, left = shard_halo_left(&z), right = shard_halo_right(&z);
    size_t off = attention_head_offset(a, b, h, T), state = fmm_far_state_floats(a->fmm, dh);
    const float *kept = shard_saved(a, s, b, h, T), *rows = kept + state;
    const float *own[2] = {s->k_hat + off, s->v_heads + off};
    float *ext[2] = {k_ext, v_ext};
    for (int kv = 0; kv < 2; kv++) {
        const float *halo = rows + (size_t)kv * (left + right) * dh;
        memcpy(ext[kv], halo, sizeof(float) * left * dh);
        memcpy(ext[kv] + (size_t)left * dh, own[kv], sizeof(float) * T * dh);
        memcpy(ext[kv] + (size_t)(left + T) * dh, halo + (size_t)left * dh, sizeof(float) * right * dh);
    }
    fmm_shard shard = {a->cut->T_seq, left, right, k_ext, v_ext, kept, far_grad_in};
    return shard;
}

static void fmm_forward_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *out,
                             int B, int T, int h, float *scratch) {
    attention_layer_sizes z = shard_sizes(a, T);
    int d = a->d, dh = a->dh, Tk = shard_halo_left(&z) + T + shard_halo_right(&z);
    float *k_ext = scratch + fmm_head_scratch_floats(a->fmm, T, dh), *v_ext = k_ext + (size_t)Tk * dh;
    float *head_out = shard_tail_scratch(a, scratch, T);
    for (int b = 0; b < B; b++) {
        keep_shard_state(a, s, x, b, h, T);
        size_t off = attention_head_offset(a, b, h, T);
        fmm_shard shard = shard_of(a, s, b, h, T, k_ext, v_ext, NULL);
        float *saved = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        fmm_head_forward(a->fmm, &shard, s->q_hat + off, s->k_hat + off, s->v_heads + off, a->blend[h],
                         a->blend[a->H + h], head_out, saved, scratch, T, dh);
        attention_scatter_head(out + (size_t)b * T * d, head_out, d, h * dh, T, dh);
    }
}

/* The far-field totals of every (b, h), then out = the state from the
 * other shards: the shards before (causal, a scan) or all others (the
 * group's sum less this shard's). */
static void far_field_exchange(const attention_layer *a, float *totals, float *scratch_out, size_t n, bool reverse,
                               const char *what) {
    if (a->cfg->causal) {
        context_scan(totals, scratch_out, n, reverse, what);
        memcpy(totals, scratch_out, sizeof(float) * n);
        return;
    }
    memcpy(scratch_out, totals, sizeof(float) * n);
    context_sum(scratch_out, n, what);
    for (size_t i = 0; i < n; i++) totals[i] = scratch_out[i] - totals[i];
}

void shard_fmm_forward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, float *out, int B,
                       int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    int dh = a->dh, halo = shard_halo_rows(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), halo_n = (size_t)B * a->H * 2 * halo * dh;
    if (halo > 0) {
        pack_halos(a, s, x, B, T, halo);
        context_shift(x->halo_send[0], halo_n, x->halo_recv[0], halo_n, false, "context halo send");
        if (!a->cfg->causal)
            context_shift(x->halo_send[1], halo_n, x->halo_recv[1], halo_n, true, "context halo send back");
    }
    if (state > 0) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++)
            for (int b = 0; b < B; b++) {
                size_t off = attention_head_offset(a, b, h, T);
                fmm_head_far_totals(a->fmm, s->k_hat + off, s->v_heads + off,
                                    x->totals + ((size_t)b * a->H + h) * state, shard_thread_scratch(a, s, T), T, dh);
            }
        far_field_exchange(a, x->totals, x->grad_in, (size_t)B * a->H * state, false, "far-field state scan");
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++) fmm_forward_head(a, s, x, out, B, T, h, shard_thread_scratch(a, s, T));
}

/* Per head: the far-field gradient totals (grad = false) or the backward
 * itself, dq, dk, dv into d_qkv's columns and the halo keys' into the send
 * buffers. */
static void fmm_backward_head(const attention_layer *a, const attention_saved *s, const shard_exchange *x,
                              const float *d_out, float *d_qkv, int B, int T, int h, bool totals, float *scratch) {
    attention_layer_sizes z = shard_sizes(a, T);
    int d = a->d, dh = a->dh, halo = shard_halo_rows(&z), left = shard_halo_left(&z), right = shard_halo_right(&z);
    int Tk = left + T + right;
    size_t state = fmm_far_state_floats(a->fmm, dh);
    float *k_ext = scratch + fmm_head_scratch_floats(a->fmm, T, dh), *v_ext = k_ext + (size_t)Tk * dh;
    float *dk_ext = v_ext + (size_t)Tk * dh, *dv_ext = dk_ext + (size_t)Tk * dh;
    float *d_head_out = shard_tail_scratch(a, scratch, T), *dq = d_head_out + (size_t)T * dh;
    for (int b = 0; b < B; b++) {
        size_t off = attention_head_offset(a, b, h, T), at = halo_at(a, b, h, halo);
        const float *saved = s->saved + ((size_t)b * a->H + h) * attention_shard_saved_per_head(&z);
        float *grad_in = x->grad_in + ((size_t)b * a->H + h) * state;
        fmm_shard shard = shard_of(a, s, b, h, T, k_ext, v_ext, state ? grad_in : NULL);
        attention_gather_head(d_head_out, d_out + (size_t)b * T * d, d, h * dh, T, dh);
        if (totals) {
            fmm_head_far_grad_totals(a->fmm, &shard, s->q_hat + off, a->blend[a->H + h], saved, d_head_out, grad_in,
                                     scratch, T, dh);
            continue;
        }
        fmm_head_backward(a->fmm, &shard, s->q_hat + off, s->k_hat + off, s->v_heads + off, a->blend[h],
                          a->blend[a->H + h], saved, d_head_out, dq, dk_ext, dv_ext, &a->d_blend[h],
                          &a->d_blend[a->H + h], scratch, T, dh);
        float *rows = d_qkv + (size_t)b * T * 3 * d;
        attention_scatter_head(rows, dq, 3 * d, h * dh, T, dh);
        attention_scatter_head(rows, dk_ext + (size_t)left * dh, 3 * d, d + h * dh, T, dh);
        attention_scatter_head(rows, dv_ext + (size_t)left * dh, 3 * d, 2 * d + h * dh, T, dh);
        for (int kv = 0; kv < 2; kv++) { /* the halo keys' gradients, for the shards that own them */
            const float *g = kv == 0 ? dk_ext : dv_ext;
            memset(x->halo_send[1] + at + (size_t)kv * halo * dh, 0, sizeof(float) * halo * dh);
            memcpy(x->halo_send[1] + at + (size_t)kv * halo * dh + (size_t)(halo - left) * dh, g,
                   sizeof(float) * left * dh);
            memcpy(x->halo_send[0] + at + (size_t)kv * halo * dh, g + (size_t)(left + T) * dh,
                   sizeof(float) * right * dh);
        }
    }
}

/* Adds the halo gradients received into the shard's first and last rows. */
static void add_halo_gradients(const attention_layer *a, const shard_exchange *x, float *d_qkv, int B, int T,
                               int halo) {
    int d = a->d, dh = a->dh, n = halo < T ? halo : T;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->H; h++)
            for (int kv = 0; kv < 2; kv++) {
                size_t at = halo_at(a, b, h, halo) + (size_t)kv * halo * dh;
                float *rows = d_qkv + (size_t)b * T * 3 * d + (size_t)(kv + 1) * d + h * dh;
                for (int t = 0; t < n; t++) { /* from the next shard: its left halo is my last rows */
                    const float *g = x->halo_recv[1] + at + (size_t)(halo - n + t) * dh;
                    float *row = rows + (size_t)(T - n + t) * 3 * d;
                    for (int c = 0; c < dh; c++) row[c] += g[c];
                }
                for (int t = 0; t < n && !a->cfg->causal; t++) { /* from the previous: its right halo, my first rows */
                    const float *g = x->halo_recv[0] + at + (size_t)t * dh;
                    float *row = rows + (size_t)t * 3 * d;
                    for (int c = 0; c < dh; c++) row[c] += g[c];
                }
            }
}

void shard_fmm_backward(const attention_layer *a, const attention_saved *s, const shard_exchange *x, const float *d_out,
                        float *d_qkv, int B, int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    int dh = a->dh, halo = shard_halo_rows(&z);
    size_t state = fmm_far_state_floats(a->fmm, dh), halo_n = (size_t)B * a->H * 2 * halo * dh;
    if (state > 0) {
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
        for (int h = 0; h < a->H; h++)
            fmm_backward_head(a, s, x, d_out, d_qkv, B, T, h, true, shard_thread_scratch(a, s, T));
        far_field_exchange(a, x->grad_in, x->totals, (size_t)B * a->H * state, true, "far-field gradient scan");
    }
#pragma omp parallel for schedule(static, 1) num_threads(s->threads)
    for (int h = 0; h < a->H; h++)
        fmm_backward_head(a, s, x, d_out, d_qkv, B, T, h, false, shard_thread_scratch(a, s, T));
    if (halo > 0) {
        context_shift(x->halo_send[1], halo_n, x->halo_recv[1], halo_n, true, "context halo gradient send");
        if (!a->cfg->causal)
            context_shift(x->halo_send[0], halo_n, x->halo_recv[0], halo_n, false, "context halo gradient send on");
        add_halo_gradients(a, x, d_qkv, B, T, halo);
    }
}
