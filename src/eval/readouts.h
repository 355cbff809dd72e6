/* Read-outs of the momentum seed computed at every eval (docs/metrics.md §3, docs/model.md §1.2):
 * the per-block gain R, the per-head gamma, and the shear's filter gains. */
#ifndef MOMFMM_READOUTS_H
#define MOMFMM_READOUTS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* The read-outs' working memory for B rows of T, made once by their caller
 * (the evaluator: docs/design.md §8.5, an evaluation allocates nothing):
 * copies of readouts_scratch_floats, B delta_norms and V + T tokens. */
typedef struct {
    float *copies;       /* readouts_block_gains: a block's input, output and mid (and fp32 ones) */
    double *delta_norms; /* [B] */
    int *tokens;         /* [V + T]: readouts_attention_scores' occurrences */
} readouts_scratch;

/* The floats of copies, 0 without the gains (gains: train.eval_readouts). */
size_t readouts_scratch_floats(const model *m, int B, int T, bool gains);

/* gain_R of docs/metrics.md §3 for every block on the activations of the last forward
 * (B rows of T, global sample indices first_row ... first_row + B - 1):
 * ||F(x + delta) - F(x)|| / ||delta|| per row, delta random with ||delta|| =
 * 1e-3 ||x||, keyed by (seed, block, global sample index) so that it does not
 * depend on the rank count. Adds each row's ratio into ratio_sums[layer] (the
 * caller sums over ranks, then divides by the global number of rows).
 * With attn_ratio_sums (may be NULL), the same delta also gives gain_R_attn of
 * docs/metrics.md §3: ||A(LN1(x + delta)) - A(LN1(x))|| / ||delta||, the attention
 * sublayer's output before its residual add, summed per layer the same way.
 * Leaves the forward's outputs as they were. */
void readouts_block_gains(model *m, int B, int T, uint64_t seed, long long first_row, double *ratio_sums,
                          double *attn_ratio_sums, const readouts_scratch *scratch);

/* The attention read-out of docs/metrics.md §3 on the last forward (B rows
 * of T, the inputs and targets it ran on): for every counted query i whose
 * input token occurred before (latest at j) and whose two keys differ, the
 * weight of the positional key i - (period - 1) and of the induction key
 * j + 1, per layer and head. Adds them into sums[0 .. LH) and [LH .. 2 LH)
 * (index layer * H + h) and the number of such queries into sums[2 LH].
 * Run it before readouts_block_gains, whose perturbed forwards replace the
 * saved attention state. */
void readouts_attention_scores(model *m, const int32_t *inputs, const int32_t *targets, int B, int T, int period,
                               double *sums, const readouts_scratch *scratch);

/* gamma_h of every layer and head, learned or fixed: out[layer * H + h]. */
void readouts_gammas(const model *m, double *out);

/* |H(e^{jw})| of the shear x -> x + gamma p + gamma2 a (docs/model.md §1.2), whose
 * transfer function is H(z) = 1 + (gamma + gamma2 (1 - z^-1)) (1 - z^-1) /
 * (1 - beta z^-1): 1 at DC, 1 + 2 (gamma + 2 gamma2) / (1 + beta) at Nyquist
 * (the seed's high-pass view: 1 + 2 gamma for beta = gamma2 = 0). */
double readouts_filter_gain(double omega, double gamma, double beta, double gamma2);
#endif
