/* The training loop, evaluation and the throughput benchmark. */
#ifndef MOMFMM_TRAIN_H
#define MOMFMM_TRAIN_H
#include "momfmm/config.h"
#include "momfmm/data.h"
#include "momfmm/dist.h"
#include "momfmm/live_metrics.h"
#include "momfmm/metrics.h"
#include "momfmm/model.h"

typedef struct {
    config cfg;
    model model;
    data_source *data;
    batch batch;          /* this rank's shard of the global batch */
    int shard_first;      /* first global sample index of this rank */
    grad_reducer *reducer;
    metric_table train_log, eval_log;
    long long step, tokens_seen;
    double *reduce_scratch; /* [2 + n_buffer]: loss sum, count, buffer sums */
    live_metrics *live;     /* rank 0's metrics.h5 while training, else NULL */
} trainer;

typedef struct {
    double loss, grad_norm, lr, allreduce_wait_s;
} step_result;

void trainer_create(trainer *t, const config *cfg);
void trainer_free(trainer *t);
/* One optimisation step at t->step + 1 (forward, backward, all-reduce,
 * clipping, AdamW); advances t->step. */
step_result trainer_step(trainer *t);
/* Eval metrics on train.eval_batches batches of the eval split; also the
 * per-block gain_R [n_layers] (SPEC 3), when gain_R is not NULL. */
void trainer_evaluate(trainer *t, eval_metrics *out, double *gain_R);
/* Appends an eval row (SPEC 3 metrics, gain_R, gamma) to t->eval_log. */
void trainer_log_eval(trainer *t, eval_metrics *out);

int command_train(const char *config_path, int n_overrides, char **overrides, const char *resume);
int command_bench(const char *config_path, int n_overrides, char **overrides, int steps);
#endif
