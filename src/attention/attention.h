/* The attention sublayer (docs/model.md §1.1-1.3): split q, k, v into heads, rotate
 * (RoPE) and shear (momentum) q and k, run softmax or FMM attention per head,
 * merge the heads. In the layers of docs/design.md §8.1 it sits below the
 * model and above the kernels: it sees one block through attention_layer,
 * which model.c and stream.c fill, and never includes model.h. */
#ifndef MOMFMM_ATTENTION_H
#define MOMFMM_ATTENTION_H
#include <stdbool.h>
#include <stddef.h>

#include "attention/attention_types.h"

/* Floats per (row, head) kept between forward and backward, and the
 * per-head scratch (dh = d_model / n_heads). */
size_t attention_saved_per_head(const attention_layer_sizes *z);
size_t attention_scratch_per_head(const attention_layer_sizes *z);
/* Floats of the exchange buffer for B rows (0 for whole sequences). */
size_t attention_exchange_floats(const attention_layer_sizes *z, int B);
/* The (batch row, head) pairs run on this many threads at once (OpenMP's),
 * each with its own scratch of attention_scratch_per_head floats. */
int attention_threads(void);
/* Floats of the rows' shares of the sums over the batch for B rows
 * (attention_saved's row_sums). */
size_t attention_row_sums_floats(const attention_layer_sizes *z, int B);
/* Scratch of attention_stream_forward for segments of up to n_max. */
size_t attention_stream_scratch_floats(const config *cfg, const fmm_settings *fmm, int n_max, int dh);
/* The attention weights of a segment, [n_max][capacity]: only dense softmax
 * stores them. */
size_t attention_stream_probs_floats(const config *cfg, int n_max, int capacity);

/* qkv [B*T*3d] -> merged heads out [B*T*d]. */
void attention_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B, int T);
/* d_out [B*T*d] -> d_qkv [B*T*3d] (overwritten); adds into d_gamma, d_blend. */
void attention_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv, int B,
                        int T);
/* The weight of value j in output i of head h, batch row b, after a
 * forward on rows of T (the attention read-out of docs/metrics.md §3):
 * softmax's p_ij, FMM's near and far coefficients together (fmm_head_weight);
 * 0 for a masked key. O(dh) from the saved state: never a T x T pass. */
float attention_weight(const attention_layer *a, const attention_saved *s, int b, int h, int T, int i, int j);
/* The same sublayer on a streamed segment: qkv [S*n*3d] -> out [S*n*d];
 * appends to the caches and updates the carries (st->pos is not advanced). */
void attention_stream_forward(const attention_layer *a, const attention_stream_layer *st, const float *qkv, float *out,
                              int n);
#endif
