/* Exact softmax attention of one head in linear memory (docs/model.md §1.3
 * `softmax`, attention.impl = tiled): queries and keys in tiles, an online
 * softmax per query row, and a backward that recomputes the probabilities
 * from the saved log-sum-exp instead of reading a stored T x T matrix (as
 * FlashAttention does). Row-major [T, dh] arrays of one (batch row, head). */
#ifndef MOMFMM_TILED_SOFTMAX_H
#define MOMFMM_TILED_SOFTMAX_H
#include <stdbool.h>
#include <stddef.h>

/* Floats of scratch either direction needs for sequences of up to T
 * (either precision). */
size_t tiled_softmax_scratch_floats(int T, int dh);

/* bf16 (train.precision = bf16, docs/design.md §8.10): the tiles'
 * products on bf16 operands with fp32 sums (tile_gemm_bf16), each operand
 * packed once per tile; the online softmax, the log-sum-exp, the
 * normalisers and every output stay fp32. */

/* out [Tq, dh] = softmax(q k^T / sqrt(dh)) v for queries at positions
 * q_pos0.. and keys at 0..Tk-1 (causal: key j visible to query i when
 * j <= q_pos0 + i); lse [Tq] receives each row's log-sum-exp of the scaled
 * scores, all that backward needs besides q, k, v and out. */
void tiled_softmax_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                           int dh, int q_pos0, bool causal, bool bf16, float *scratch);
/* The backward of a training forward (Tq = Tk = T, q_pos0 = 0): dq, dk, dv
 * overwritten, from dout, the forward's out and lse. */
void tiled_softmax_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int T, int dh, bool causal, bool bf16,
                            float *scratch);

/* p_ij = exp(q_i . k_j / sqrt(dh) - lse_i), query i's weight of key j,
 * from q, k [T, dh] and the forward's lse (the attention read-outs,
 * docs/metrics.md §3); the caller checks that j is visible to i. */
float tiled_softmax_weight(const float *q, const float *k, const float *lse, int dh, int i, int j);

/* The same restricted to a band (FMM's near field, docs/model.md §1.3):
 * query i sees key j only when |q_pos0 + i - j| < half, and causal rows
 * none ahead; half = 0 is no band (the two functions above). Tiles with
 * no key in the band are skipped. */
void tiled_softmax_band_forward(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                                int dh, int q_pos0, bool causal, int half, bool bf16, float *scratch);
/* Its backward, for the same Tq, Tk and q_pos0: dq [Tq, dh], dk, dv
 * [Tk, dh] from dout, and the out and lse of the whole forward (after
 * tiled_softmax_merge when keys came in blocks: ring attention,
 * docs/design.md §8.12); overwritten, or added into with `accumulate`. */
void tiled_softmax_band_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                                 const float *q, const float *k, const float *v, int Tq, int Tk, int dh, int q_pos0,
                                 bool causal, int half, bool accumulate, bool bf16, float *scratch);
/* Merges the forward over one more block of keys (block_out, block_lse)
 * into (out, lse), [Tq, dh] and [Tq]: the softmax over the union of the
 * keys, by the log-sum-exp. A row whose lse is -inf has seen no key yet
 * (initialise lse to -inf and out to 0). */
void tiled_softmax_merge(float *out, float *lse, const float *block_out, const float *block_lse, int Tq, int dh);
#endif
