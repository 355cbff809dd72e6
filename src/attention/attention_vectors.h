/* The q and k vectors of one head (attention_vectors.c): heads gathered
 * from and scattered to rows, RoPE at the rows' positions and the momentum
 * shear with its carries (docs/model.md §1.1-1.2), forward and adjoint;
 * shared by attention.c (whole sequences, streaming) and attention_shard.c
 * (a shard of each sequence, docs/design.md §8.12). Private to
 * src/attention/. */
#ifndef MOMFMM_ATTENTION_VECTORS_H
#define MOMFMM_ATTENTION_VECTORS_H
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "attention/attention_types.h"
#include "attention/momentum.h"
#include "kernels/kernels.h"

enum { VECTOR_Q = 0, VECTOR_K = 1 };

/* One contiguous range of a head's rows in its sequence: where it starts
 * (RoPE's positions) and the momentum recurrences' carries across its ends
 * (docs/model.md §1.2). A whole sequence is {0, true, NULL, NULL, NULL,
 * NULL, true}. */
typedef struct {
    int pos0;                     /* the global position of its first row */
    bool first;                   /* it starts the sequence: anchor, or the buffer */
    const float *prev, *p_prev;   /* forward: x and p of the row before it (not first) */
    const float *g_next, *u_next; /* backward: g and u of the row after it, or NULL at the end */
    bool holds_last;              /* it holds the sequence's last position (momentum buffers) */
} attention_span;

bool attention_is_sheared(const attention_layer *a, int which);
momentum_coeffs attention_head_coeffs(const attention_layer *a, int h);
/* The momentum buffer of (q|k, head) in a [2][H][dh] array. */
size_t attention_head_buffer(const attention_layer *a, int which, int h);
/* Offset of head (b, h) in a [B][H][T][dh] array. */
size_t attention_head_offset(const attention_layer *a, int b, int h, int T);

/* One head's dh columns of rows (stride row_stride floats) to and from
 * [T, dh], the rows ahead prefetched (kernel_prefetch_ahead). */
static inline void attention_gather_head(float *dst, const float *rows, int row_stride, int col, int T, int dh) {
    for (int t = 0; t < T; t++) {
        kernel_prefetch_ahead(rows + col, (size_t)row_stride, t, T, dh);
        memcpy(dst + (size_t)t * dh, rows + (size_t)t * row_stride + col, sizeof(float) * dh);
    }
}

static inline void attention_scatter_head(float *rows, const float *src, int row_stride, int col, int T, int dh) {
    for (int t = 0; t < T; t++) {
        kernel_prefetch_ahead(rows + col, (size_t)row_stride, t, T, dh);
        memcpy(rows + (size_t)t * row_stride + col, src + (size_t)t * dh, sizeof(float) * dh);
    }
}

/* The vector the shear reads: raw rotated in place for post_rope, as it is
 * for pre_rope (docs/model.md §1.2, frame). */
void attention_shear_frame(const attention_layer *a, float *raw, int T, int pos0);
/* raw (unrotated q or k of one head's span; destroyed) -> dst = q-hat or
 * k-hat (docs/model.md §1.2): post_rope shears the rotated vectors, pre_rope
 * rotates the sheared ones; adds the span's last x to the momentum buffer
 * sums when it holds the sequence's last position. */
void attention_prepare(const attention_layer *a, int h, int which, float *raw, float *dst, float *p, int T,
                       const attention_span *span);
/* attention_prepare of head h's q or k (which) straight from the qkv rows
 * (stride row_stride): unsheared vectors are rotated out of the rows
 * without a gather (raw unused), sheared ones gathered into raw first. */
void attention_prepare_rows(const attention_layer *a, int h, int which, const float *rows, int row_stride, float *raw,
                            float *dst, float *p, int T, const attention_span *span);
/* x (in the shear's frame) -> dst = q-hat or k-hat: the shear with the
 * span's carries, then for pre_rope the rotation; p the shear's p (or NULL). */
void attention_shear(const attention_layer *a, int h, int which, const float *x, float *dst, float *p, int T,
                     const attention_span *span);
/* sum += x's last row [dh] (the momentum buffers, docs/model.md §1.2). */
static inline void attention_add_last_position(float *sum, const float *x, int T, int dh) {
    const float *last = x + (size_t)(T - 1) * dh;
    for (int i = 0; i < dh; i++) sum[i] += last[i];
}
/* The adjoint: d_hat (destroyed) -> d_raw (overwritten). */
void attention_unprepare(const attention_layer *a, int h, int which, float *d_hat, float *d_raw, const float *p, int T,
                         const attention_span *span);
/* attention_unprepare into head h's q or k (which) columns of the gradient
 * rows (stride row_stride): unsheared, rotated straight into them (d_raw
 * unused); sheared, through d_raw and a scatter. */
void attention_unprepare_rows(const attention_layer *a, int h, int which, float *d_hat, float *rows, int row_stride,
                              float *d_raw, const float *p, int T, const attention_span *span);
/* The shear's gradient input g from d_hat (in place): d_hat rotated back
 * for pre_rope (the shear ran before the rotation), as it is for post_rope. */
void attention_shear_gradient_frame(const attention_layer *a, float *d_hat, int T, int pos0);
#endif
