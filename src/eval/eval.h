/* Evaluation (docs/metrics.md §3; docs/design.md §8.5): the eval metrics of a model on
 * the eval split, with the momentum read-outs (gain_R per block, gamma per
 * head) and optionally the streaming comparison. One module for training's
 * periodic eval, `eval` and `inspect`; it needs a model and a data shard,
 * never a trainer (no optimizer moments, no gradient reducer). */
#ifndef MOMFMM_EVAL_H
#define MOMFMM_EVAL_H
#include <stdbool.h>

#include "base/status.h"
#include "config/config.h"
#include "data/data.h"
#include "data/metrics.h"
#include "model/model.h"

typedef struct {
    metric_values metrics; /* docs/metrics.md §3 over train.eval_batches batches */
    double *gain_R;        /* [n_layers] */
    double *gain_R_attn;   /* [n_layers]: attention sublayer without its residual */
    double *gamma;         /* [n_layers * n_heads]: learned or fixed, 0 without momentum */
    int heads;             /* n_layers * n_heads */
    /* the attention read-out of docs/metrics.md §3 (chain; NaN otherwise):
     * [2][heads], the positional then the induction score of every head */
    double *attn;
    bool length_eval;             /* the length-generalisation eval ran (chain, data.eval_chain_len > 0) */
    metric_values length_metrics; /* its loss metrics (NaN when it did not run) */
    double *length_attn;          /* [2][heads]: the read-out on its batches */
    int n_periods;                /* chain_len_max - chain_len + 1 (1 for one fixed period) */
    double *L_rep_by_period;      /* [n_periods]: L_rep of the eval samples of each period (chain; NaN: none) */
    bool gains_measured;          /* train.eval_readouts: else gain_R and gain_R_attn are NaN */
    bool streamed;                /* the fields below are filled */
    metric_values stream_metrics; /* the same batches through the streaming path */
    double stream_max_diff;       /* largest |logit difference| streaming vs full forward */
} eval_result;

void eval_result_init(eval_result *r, const model *m);
void eval_result_free(eval_result *r);

/* The read-outs that need no data: gamma per head. */
void eval_readouts(const model *m, eval_result *r);

/* An evaluation's working memory and its result, made once for a model and
 * its data shard, so that the evaluations of a training run allocate nothing
 * (docs/design.md §8.10). */
typedef struct evaluator evaluator;

/* stream_segment > 0 also feeds each batch through the streaming path in
 * segments of that many tokens (`eval --stream`; each batch then makes its
 * stream). Returns NULL with EXIT_USAGE in err when the model cannot stream. */
evaluator *evaluator_create(model *m, const data_shard *shard, int stream_segment, status *err);
void evaluator_free(evaluator *ev);
/* The bytes evaluator_create allocates for m and shard (a memory estimate
 * made before it). */
size_t evaluator_bytes(const model *m, const data_shard *shard);
/* The last evaluate's result. */
const eval_result *evaluator_result(const evaluator *ev);

/* Evaluates on the eval split (batches 0 .. train.eval_batches - 1, this
 * rank's shard, summed over ranks), and for a chain run with
 * data.eval_chain_len on as many batches of the length-generalisation eval
 * (docs/tasks.md §2), into evaluator_result(ev). m and shard are those ev
 * was made for. Collective: every rank calls it. Returns 0, or the
 * streaming path's failure in err. */
int evaluate(evaluator *ev, model *m, data_shard *shard, status *err);

/* One row of the eval table of metric_tables_standard (docs/metrics.md §3, docs/files.md §4). */
void eval_result_row(const eval_result *r, long long step, const metric_table *eval_log, double *row);
#endif
