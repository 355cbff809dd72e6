/* What the two halves of the model share (docs/design.md §8.2): params.c
 * carves the activation buffer that model.c's forward and backward use.
 * Private to src/model/. */
#ifndef MOMFMM_MODEL_INTERNAL_H
#define MOMFMM_MODEL_INTERNAL_H
#include "model/model.h"

/* Carves m->acts for B rows of T by the activation plan, unless the buffer
 * already holds them (the largest batch and length seen: nothing is
 * allocated per step). */
void model_reserve_activations(model *m, int B, int T);
/* Which copy of the per-block arrays of m->acts holds block `layer`'s
 * forward state, of the MLP's arrays (ln2 ... fc_slope) or the others (mid
 * ... att_out): its own, or the one copy all blocks share when
 * train.recompute remakes that part (docs/scale.md §7). */
size_t model_activation_slot(const model *m, int layer, bool mlp);
/* Rows of one pass of the LM head over `rows` rows: all of them, or
 * m->head_rows when the logits are not kept (model.h). */
int model_head_pass_rows(const model *m, int rows);
/* The logits of one pass: at most this many floats (16 MiB) unless the
 * head's vocabulary needs 256 rows of more. */
#define HEAD_PASS_FLOATS (1 << 22)
#endif
