/* Layer kernels of docs/model.md §1, each forward beside its backward. Row-major
 * float32; `rows` is B*T. Backward functions say whether they overwrite (=)
 * or accumulate (+=) into each gradient. Every matrix product goes through
 * gemm_product (gemm.h): cblas_sgemm in fp32, oneDNN when docs/scale.md §7 asks.
 * Each kernel family is named for the layer it computes, as llm.c names them
 * (docs/design.md §8.1, prefixes):
 * Prefixes: matmul_ layernorm_ gelu_ residual_ embedding_ rope_ softmax_attention_ cross_entropy_ */
#ifndef MOMFMM_KERNELS_H
#define MOMFMM_KERNELS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/prefetch.h"

/* Test hook: kernels of at least this many floats run on OpenMP's threads
 * (0: the default, 16384), so that small test models take the parallel paths. */
void kernel_set_parallel_min(size_t floats);

/* Linear layer, PyTorch convention (docs/model.md §1, forward pass): out = inp W^T + b, W [out_dim, in_dim]. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int rows, int in_dim,
                    int out_dim);
/* The sums over rows (a bias or LayerNorm gradient) add fixed blocks of
 * rows (docs/design.md §8.10); `partials` is the caller's space for the
 * blocks' partial sums, kernel_sum_partials_floats(dim) floats for sums
 * over rows of up to dim columns. */
size_t kernel_sum_partials_floats(int max_dim);

/* matmul_forward and matmul_backward for an input made in bf16 alone (dense rows of in_dim), only where the
 * product engine reads bf16 (gemm_reads_bf16, gemm.h): the GELU output and LN1's and LN2's, which only the next
 * product reads (docs/design.md §8.10). As there, dinp is written last and may be inp's memory. */
void matmul_forward_bf16(float *out, const uint16_t *inp, const float *weight, const float *bias, int rows, int in_dim,
                         int out_dim);
void matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const uint16_t *inp,
                          const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials);

/* dinp = dout W (skipped if NULL); dweight += dout^T inp; dbias += column
 * sums (skipped if NULL; partials may be NULL then); without `accumulate`
 * dweight and dbias are written (=) instead, the GEMM with beta = 0. dinp
 * is written last and may be inp's memory. */
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials);

/* LayerNorm with eps 1e-5 (docs/model.md §1); saves mean and 1/std per row. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias,
                       int rows, int dim);
/* The residual add before a LayerNorm, fused into it (docs/design.md §8.10): x = x + product_bias + residual
 * (x is the product's output, made without its bias; it becomes the residual stream), then out = LayerNorm(x)
 * as layernorm_forward would give it. */
void layernorm_residual_forward(float *out, float *mean, float *rstd, float *x, const float *product_bias,
                                const float *residual, const float *weight, const float *bias, int rows, int dim);
/* Both with the output in bf16 alone, rounded as cpu_f32_to_bf16 rounds (cpu.h), where only a product that reads
 * bf16 reads it (LN1's and LN2's outputs): the bits the product engine would make of the fp32 output, without
 * writing it and converting it at each of its two products (docs/design.md §8.10). */
void layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int rows, int dim);
void layernorm_residual_forward_bf16(uint16_t *out, float *mean, float *rstd, float *x, const float *product_bias,
                                     const float *residual, const float *weight, const float *bias, int rows, int dim);
/* dinp += ...; dweight, dbias += ... (= without `accumulate`) */
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int rows, int dim, bool accumulate,
                        float *partials);

/* GELU, tanh approximation (docs/model.md §1), with the bias of the product before it fused into its pass
 * (docs/design.md §8.10): out = gelu(x) for x = pre + bias (pre: rows of dim, the product's output made without its
 * bias); out may alias pre. slope, unless NULL, keeps gelu'(x) for the backward, which then reads it and dout alone,
 * with no transcendental function and no remade output (docs/design.md §8.10). Where the CPU has AVX2 and FMA it runs
 * on 8 or 16 lanes with fused steps (the same bits at either width; the portable loop, elsewhere, differs in the last
 * place); the slope is the same bits at any width. */
void gelu_bias_forward(float *out, float *slope, const float *pre, const float *bias, int rows, int dim);
/* The same with the output in bf16 alone, rounded as cpu_f32_to_bf16 rounds (cpu.h): the bits the bf16 product engine
 * would make of the fp32 output, without writing it and reading it back (docs/design.md §8.10). */
void gelu_bias_forward_bf16(uint16_t *out, float *slope, const float *pre, const float *bias, int rows, int dim);
/* dpre = dout * slope (dpre may alias dout), and in the same pass the bias gradient, dbias += column sums of dpre (=
 * without `accumulate`): the floats matmul_backward's dbias would be. */
void gelu_bias_backward(float *dpre, float *dbias, const float *slope, const float *dout, int rows, int dim,
                        bool accumulate, float *partials);

/* x = x + product_bias + residual: a residual add with the bias of the product that made x (made without it),
 * where no LayerNorm follows to fuse it into (layernorm_residual_forward). */
void residual_add(float *x, const float *product_bias, const float *residual, int rows, int dim);

/* out[r] = table[tokens[r]]. */
void embedding_forward(float *out, const int32_t *tokens, const float *table, int rows, int dim);
/* dtable[tokens[r]] += dout[r]. */
void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int rows, int dim);

/* RoPE (docs/model.md §1.1) of one head's [T, dh] vectors at positions
 * pos0..pos0+T-1, from src into dst (dst may be src: in place; a copy and
 * a rotation in one pass otherwise); tables are [max_positions, dh/2] of
 * cos and sin of t*theta_j. */
void rope_tables(float *cos_table, float *sin_table, int max_positions, int dh, double base);
/* Rows first..first+count-1 of rope_tables, in rows 0..count-1 (the same
 * values): RoPE at absolute positions of an unbounded stream. */
void rope_tables_from(float *cos_table, float *sin_table, long long first, int count, int dh, double base);
void rope_forward(float *dst, const float *src, const float *cos_table, const float *sin_table, int T, int dh,
                  int pos0);
/* The inverse rotation, which is also the adjoint: applied to a gradient. */
void rope_backward(float *dst, const float *src, const float *cos_table, const float *sin_table, int T, int dh,
                   int pos0);
/* The same between rows of any stride: dst's rows dst_ld floats apart,
 * src's src_ld (a head's dh columns of the qkv rows), with the rows ahead
 * prefetched (kernel_prefetch_ahead). */
void rope_forward_rows(float *dst, int dst_ld, const float *src, int src_ld, const float *cos_table,
                       const float *sin_table, int T, int dh, int pos0);
void rope_backward_rows(float *dst, int dst_ld, const float *src, int src_ld, const float *cos_table,
                        const float *sin_table, int T, int dh, int pos0);

/* Softmax attention of one head (docs/model.md §1.3 `softmax`): q [Tq, dh] at positions
 * q_pos0.., k, v [Tk, dh] at positions 0..Tk-1; probs [Tq, Tk] saved. Causal
 * masks j > q_pos0 + i. */
void softmax_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int Tq, int Tk,
                               int dh, int q_pos0, bool causal);
/* dq, dk, dv overwritten; scratch holds Tq*Tk floats. */
void softmax_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                                const float *k, const float *v, float *scratch, int Tq, int Tk, int dh, bool causal);

/* Softmax cross-entropy: turns logits into probabilities in place, writes the
 * loss of each row (0 for target -1) and the argmax prediction. */
void cross_entropy_forward(float *probs, float *losses, int32_t *predictions, const int32_t *targets, int rows,
                           int n_classes);
/* In place: probs becomes dlogits = scale * (p - onehot), 0 for target -1. */
void cross_entropy_backward(float *probs, const int32_t *targets, int rows, int n_classes, float scale);
/* Training's pair in one visit of each row (docs/design.md §8.10): cross_entropy_forward, then
 * cross_entropy_backward with `scale`; the same losses, predictions and dlogits, bit for bit. */
void cross_entropy_forward_backward(float *logits, float *losses, int32_t *predictions, const int32_t *targets,
                                    int rows, int n_classes, float scale);
#endif
