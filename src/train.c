/* The trainer (docs/model.md §1.4, 2, 3): data-parallel steps, evaluation into the
 * metric tables, resume and save through the store (docs/design.md §8.4,
 * §8.5). Returns statuses; the commands are in cmd_train.c. */
#include "momfmm/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/checkpoint.h"
#include "momfmm/common.h"
#include "momfmm/optimizer.h"
#include "momfmm/store.h"

/* MemAvailable of /proc/meminfo in bytes, or 0 when unknown. */
static double available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024.0;
}

/* Refuses up front (exit 2) a run whose buffers cannot fit in this node's
 * memory, rather than being killed mid-allocation. */
static int check_memory(const trainer *t, status *err) {
    const model *m = &t->model;
    const batch *b = &t->shard.batch;
    double need = (double)model_activation_bytes(m, b->B, b->T) + 4.0 * sizeof(float) * m->n_params;
    int local_ranks = dist_node_ranks();
    double available = available_memory();
    /* shards and nodes differ: decide on the fullest node, everywhere alike */
    double fill = available > 0 ? need * local_ranks / available : 0, worst_fill = dist_max_double(fill);
    log_rank0("memory: %.2f GB per rank (activations for %d x %d, parameters, gradients, moments)\n", need / 1e9,
              b->B, b->T);
    if (worst_fill > 1.0)
        return status_fail(err, EXIT_USAGE,
                           "this run needs %.0f%% of the available memory on the fullest node (here %.1f GB per rank "
                           "x %d ranks, %.1f GB available): reduce train.batch_size, data.seq_len or the model "
                           "(attention.kind = softmax stores T x T per head)",
                           100 * worst_fill, need / 1e9, local_ranks, available / 1e9);
    return 0;
}

int trainer_create(trainer *t, const config *cfg, status *err) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    if (process_count() > cfg->batch_size)
        return status_fail(err, EXIT_USAGE,
                           "train.batch_size = %d is smaller than the number of ranks (%d): every rank needs a sample",
                           cfg->batch_size, process_count());
    if (model_create(&t->model, cfg, err) != 0) return err->code;
    model_init_parameters(&t->model);
    /* Every rank initialises from the same seed; the broadcast makes the
     * identical start explicit rather than assumed. */
    dist_broadcast_floats(t->model.params, t->model.n_params);
    if (rank_shard_open(&t->shard, cfg, err) != 0 || check_memory(t, err) != 0) return err->code;
    t->reducer = grad_reducer_create(&t->model, cfg->bucket_mb, cfg->overlap);
    metric_tables_standard(&t->train_log, &t->eval_log, cfg->n_layers, cfg->n_heads);
    metric_tables_add_task_columns(&t->train_log, &t->eval_log, cfg->task);
    t->reduce_scratch = xcalloc(2 + t->model.n_buffer, sizeof(double));
    return 0;
}

void trainer_free(trainer *t) {
    grad_reducer_free(t->reducer);
    rank_shard_close(&t->shard);
    metric_table_free(&t->train_log);
    metric_table_free(&t->eval_log);
    free(t->reduce_scratch);
    model_free(&t->model);
}

/* One reduction carries the loss sum, the target count and the momentum
 * buffer sums (docs/model.md §1.2: buffers are the global-batch mean). */
static double reduce_forward_results(trainer *t, double *global_count) {
    model *m = &t->model;
    const batch *b = &t->shard.batch;
    long long count;
    double *r = t->reduce_scratch;
    r[0] = model_loss_sum(m, b->targets, b->B, b->T, &count);
    r[1] = (double)count;
    bool buffers = m->momentum;
    for (size_t i = 0; buffers && i < m->n_buffer; i++) r[2 + i] = m->buffer_sums[i];
    dist_sum_doubles(r, 2 + (buffers ? (int)m->n_buffer : 0));
    for (size_t i = 0; buffers && i < m->n_buffer; i++) m->buffers[i] = (float)(r[2 + i] / t->cfg.batch_size);
    *global_count = r[1];
    return r[1] > 0 ? r[0] / r[1] : 0.0;
}

step_result trainer_step(trainer *t) {
    model *m = &t->model;
    batch *b = &t->shard.batch;
    step_result res = {0};
    long long step = t->step + 1;
    data_fill(t->shard.data, b, SPLIT_TRAIN, step, t->shard.first);
    model_forward(m, b->inputs, b->targets, b->labels, b->B, b->T, m->momentum);
    double global_count;
    res.loss = reduce_forward_results(t, &global_count);
    model_zero_grads(m);
    float scale = global_count > 0 ? (float)(1.0 / global_count) : 0.0f;
    backward_hooks hooks = grad_reducer_hooks(t->reducer);
    model_backward(m, b->inputs, b->targets, b->labels, b->B, b->T, scale, &hooks);
    res.allreduce_wait_s = grad_reducer_finish(t->reducer);
    res.grad_norm = grad_global_norm(m->grads, m->n_params);
    clip_gradients(m->grads, m->n_params, res.grad_norm, t->cfg.grad_clip);
    res.lr = learning_rate(&t->cfg, step);
    adamw_settings s = {res.lr, t->cfg.beta1, t->cfg.beta2, t->cfg.adam_eps, t->cfg.weight_decay};
    adamw_step_model(m, step, &s);
    t->step = step;
    t->tokens_seen += (long long)t->cfg.batch_size * t->cfg.seq_len;
    return res;
}

int trainer_log_eval(trainer *t, eval_result *r, status *err) {
    if (evaluate(&t->model, &t->shard, 0, r, err) != 0) return err->code;
    double *row = xcalloc((size_t)t->eval_log.row_width, sizeof(double));
    eval_result_row(r, t->step, &t->eval_log, row);
    metric_table_append(&t->eval_log, row);
    free(row);
    return 0;
}

/* Fresh parameters, moments, buffers and history: the state of step 0. */
static void trainer_reset(trainer *t) {
    model *m = &t->model;
    model_init_parameters(m);
    memset(m->adam_m, 0, sizeof(float) * 2 * m->n_params);
    t->train_log.n_rows = t->eval_log.n_rows = 0;
    t->step = t->tokens_seen = 0;
}

/* Loads `path` into the trainer (a store_loader). A file that does not load
 * is STORE_SKIP with the reason (the trainer is then reset); a config that
 * changes the model or the data is EXIT_BAD_FILE listing every differing
 * key (docs/files.md §4, resume). */
static int try_resume(const char *path, void *ctx, status *err) {
    trainer *t = ctx;
    config saved;
    checkpoint_info info;
    if (checkpoint_read_config(path, &saved, &info, err) != 0) return STORE_SKIP;
    char diff[4096];
    if (config_compare_keys(&saved, &t->cfg, true, diff, sizeof diff) > 0)
        return status_fail(err, EXIT_BAD_FILE,
                           "%s: the config differs in keys that change the model or the data (checkpoint vs now): %s",
                           path, diff);
    if (checkpoint_read_state(path, &t->model, true, &t->train_log, &t->eval_log, err) != 0) {
        trainer_reset(t);
        return STORE_SKIP;
    }
    if (config_compare_keys(&saved, &t->cfg, false, diff, sizeof diff) > 0)
        log_rank0("warning: schedule keys changed since the checkpoint (checkpoint vs now): %s\n", diff);
    t->step = info.step;
    t->tokens_seen = info.tokens_seen;
    snprintf(t->init_from, sizeof t->init_from, "%s", info.init_from);
    if (info.world_size != process_count())
        log_rank0("note: checkpoint written by %d ranks, resuming on %d (same math up to float summation order)\n",
                  info.world_size, process_count());
    log_rank0("resumed from %s at step %lld\n", path, t->step);
    return 0;
}

int trainer_resume(trainer *t, const char *how, status *err) {
    if (strcmp(how, "auto") != 0) {
        int rc = try_resume(how, t, err);
        if (rc != 0) return rc == STORE_SKIP ? EXIT_BAD_FILE : rc;
    } else {
        bool resumed;
        int rc = store_resume_newest(t->cfg.out_dir, try_resume, t, &resumed, err);
        if (rc != 0) return rc;
        if (!resumed) log_rank0("no checkpoint to resume in %s: starting at step 0\n", t->cfg.out_dir);
    }
    /* every rank read the file itself: make sure they agree */
    return dist_try_check_consistency(&t->model, t->step, err);
}

int trainer_init_from(trainer *t, const char *path, status *err) {
    config saved;
    checkpoint_info info;
    if (checkpoint_read_config(path, &saved, &info, err) != 0) return err->code;
    char diff[4096];
    if (config_compare_architecture(&saved, &t->cfg, diff, sizeof diff) > 0)
        return status_fail(err, EXIT_BAD_FILE,
                           "--init %s: the model differs from the config's (checkpoint vs now): %s", path, diff);
    if (checkpoint_read_state(path, &t->model, false, NULL, NULL, err) != 0) return err->code;
    /* an absolute name, so that the record stays meaningful from anywhere */
    char *absolute = realpath(path, NULL);
    snprintf(t->init_from, sizeof t->init_from, "%s", absolute ? absolute : path);
    free(absolute);
    log_rank0("initialised from %s (step %lld): fresh optimizer, step 0\n", path, info.step);
    return dist_try_check_consistency(&t->model, t->step, err);
}

int trainer_save(const trainer *t, char *path, size_t len, status *err) {
    if (process_rank() != 0) return 0;
    checkpoint_info info = {.step = t->step, .tokens_seen = t->tokens_seen, .world_size = process_count()};
    snprintf(info.init_from, sizeof info.init_from, "%s", t->init_from);
    return store_save(t->cfg.out_dir, t->cfg.keep, &t->model, &info, &t->train_log, &t->eval_log, path, len, err);
}
