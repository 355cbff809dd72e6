/* The attention kernels of kernels.h (docs/model.md §1.1, §1.3): RoPE,
 * and dense softmax attention of one head on the GEMM engine, in blocks of
 * query rows against the keys they see. Tiled softmax in linear memory is
 * tiled_softmax.c's. Split from kernels.c, whose other layers do not read
 * these. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#include "base/fast_math.h"
#include "kernels/gemm.h"

void rope_tables(float *cos_table, float *sin_table, int max_positions, int dh, double base) {
    rope_tables_from(cos_table, sin_table, 0, max_positions, dh, base);
}

void rope_tables_from(float *cos_table, float *sin_table, long long first, int count, int dh, double base) {
    int half = dh / 2;
    for (int t = 0; t < count; t++)
        for (int j = 0; j < half; j++) {
            double angle = (double)(first + t) * pow(base, -2.0 * j / dh);
            cos_table[(size_t)t * half + j] = (float)cos(angle);
            sin_table[(size_t)t * half + j] = (float)sin(angle);
        }
}

/* One row: w = u rotated pair by pair by angle direction * theta; w may
 * be u (each pair is read before it is written). */
VECTOR_CLONES static void rope_rotate_row(float *w, const float *u, const float *c, const float *s, int half,
                                          float direction) {
    for (int j = 0; j < half; j++) {
        float a = u[2 * j], b = u[2 * j + 1], sn = direction * s[j];
        w[2 * j] = a * c[j] - b * sn;
        w[2 * j + 1] = a * sn + b * c[j];
    }
}

/* Rows of dst (stride dst_ld) = rows of src (stride src_ld) rotated:
 * attention rotates a head's q and k straight out of the qkv rows, and its
 * gradients straight into theirs, without a gather or a scatter
 * (docs/design.md §8.10). */
static void rope_rotate(float *dst, int dst_ld, const float *src, int src_ld, const float *cos_table,
                        const float *sin_table, int T, int dh, int pos0, float direction) {
    int half = dh / 2;
    for (int t = 0; t < T; t++) {
        size_t at = (size_t)(pos0 + t) * half;
        if (src_ld > dh) kernel_prefetch_ahead(src, (size_t)src_ld, t, T, dh);
        if (dst_ld > dh) kernel_prefetch_ahead(dst, (size_t)dst_ld, t, T, dh);
        rope_rotate_row(dst + (size_t)t * dst_ld, src + (size_t)t * src_ld, cos_table + at, sin_table + at, half,
                        direction);
    }
}

void rope_forward(float *dst, const float *src, const float *cos_table, const float *sin_table, int T, int dh,
                  int pos0) {
    rope_rotate(dst, dh, src, dh, cos_table, sin_table, T, dh, pos0, 1.0f);
}

void rope_backward(float *dst, const float *src, const float *cos_table, const float *sin_table, int T, int dh,
                   int pos0) {
    rope_rotate(dst, dh, src, dh, cos_table, sin_table, T, dh, pos0, -1.0f);
}

void rope_forward_rows(float *dst, int dst_ld, const float *src, int src_ld, const float *cos_table,
                       const float *sin_table, int T, int dh, int pos0) {
    rope_rotate(dst, dst_ld, src, src_ld, cos_table, sin_table, T, dh, pos0, 1.0f);
}

void rope_backward_rows(float *dst, int dst_ld, const float *src, int src_ld, const float *cos_table,
                        const float *sin_table, int T, int dh, int pos0) {
    rope_rotate(dst, dst_ld, src, src_ld, cos_table, sin_table, T, dh, pos0, -1.0f);
}

/* Causal attention is computed in blocks of query rows, each against only the
 * keys it may see, so the masked upper triangle costs no FLOPs (about half
 * of QK^T and PV at T = 256). */
#define ATTENTION_BLOCK 64

static int visible_keys(int first_query, int n_rows, int Tk, int q_pos0, bool causal) {
    if (!causal) return Tk;
    int keys = q_pos0 + first_query + n_rows;
    return keys < Tk ? keys : Tk;
}

VECTOR_CLONES static void softmax_rows(float *probs, int i0, int rows, int Tk, int q_pos0, bool causal) {
    for (int r = 0; r < rows; r++) {
        float *row = probs + (size_t)r * Tk;
        int n_keys = visible_keys(i0 + r, 1, Tk, q_pos0, causal);
        float max = fast_max_lanes(row, n_keys);
        for (int j = 0; j < n_keys; j++) row[j] = fast_exp_nonpositive(row[j] - max);
        float inv = 1.0f / fast_sum_lanes(row, n_keys);
        for (int j = 0; j < n_keys; j++) row[j] *= inv;
        for (int j = n_keys; j < Tk; j++) row[j] = 0.0f;
    }
}

void softmax_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int Tq, int Tk,
                               int dh, int q_pos0, bool causal) {
    float scale = 1.0f / sqrtf((float)dh);
    for (int i0 = 0; i0 < Tq; i0 += ATTENTION_BLOCK) {
        int rows = Tq - i0 < ATTENTION_BLOCK ? Tq - i0 : ATTENTION_BLOCK;
        int keys = visible_keys(i0, rows, Tk, q_pos0, causal);
        float *p = probs + (size_t)i0 * Tk;
        gemm_product(false, true, rows, keys, dh, scale, q + (size_t)i0 * dh, dh, k, dh, 0.0f, p, Tk);
        softmax_rows(p, i0, rows, Tk, q_pos0, causal);
        gemm_product(false, false, rows, dh, keys, 1.0f, p, Tk, v, dh, 0.0f, out + (size_t)i0 * dh, dh);
    }
}

/* dS = P * (dP - rowsum(dP * P)) over the visible keys, the row sum in
 * fixed lanes: summed in order, one add per add latency, it took as long
 * as a block's products (bench_d768, fp32). */
VECTOR_CLONES static void softmax_rows_backward(float *dscores, const float *probs, int rows, int keys, int Tk) {
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * Tk;
        float *ds = dscores + (size_t)r * Tk;
        float dot = fast_dot_lanes(ds, p, keys);
        for (int j = 0; j < keys; j++) ds[j] = p[j] * (ds[j] - dot);
    }
}

void softmax_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                                const float *k, const float *v, float *scratch, int Tq, int Tk, int dh, bool causal) {
    float scale = 1.0f / sqrtf((float)dh);
    memset(dk, 0, sizeof(float) * (size_t)Tk * dh);
    memset(dv, 0, sizeof(float) * (size_t)Tk * dh);
    /* q positions start at 0 here: the backward runs on training sequences */
    for (int i0 = 0; i0 < Tq; i0 += ATTENTION_BLOCK) {
        int rows = Tq - i0 < ATTENTION_BLOCK ? Tq - i0 : ATTENTION_BLOCK;
        int keys = visible_keys(i0, rows, Tk, 0, causal);
        const float *p = probs + (size_t)i0 * Tk, *dout_rows = dout + (size_t)i0 * dh;
        float *ds = scratch + (size_t)i0 * Tk;
        gemm_product(false, true, rows, keys, dh, 1.0f, dout_rows, dh, v, dh, 0.0f, ds, Tk);
        gemm_product(true, false, keys, dh, rows, 1.0f, p, Tk, dout_rows, dh, 1.0f, dv, dh);
        softmax_rows_backward(ds, p, rows, keys, Tk);
        gemm_product(false, false, rows, dh, keys, scale, ds, Tk, k, dh, 0.0f, dq + (size_t)i0 * dh, dh);
        gemm_product(true, false, keys, dh, rows, scale, ds, Tk, q + (size_t)i0 * dh, dh, 1.0f, dk, dh);
    }
}
