/* The trainer (docs/model.md §1.4, docs/tasks.md §2, docs/metrics.md §3): data-parallel steps, evaluation into the
 * metric tables, resume and save through the store (docs/design.md §8.4,
 * §8.5). Returns statuses; the commands are in cmd_train.c. */
#include "training/train.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/blas_core.h"
#include "base/log.h"
#include "base/prof.h"
#include "base/status.h"
#include "base/sys.h"
#include "kernels/gemm.h"
#include "parallel/context.h"
#include "store/checkpoint.h"
#include "store/store.h"
#include "training/optimizer.h"

/* Bytes per parameter of a run of n parameters, this rank's (the ZeRO-1
 * slice: elements [first, first + count)), before any allocation. */
static train_memory_use memory_per_param(const config *cfg, double n, double slice_count) {
    double slice = slice_count / (n > 0 ? n : 1);
    /* train.precision = bf16: the GEMM engine's bf16 copy of the weights */
    double copy = cfg->precision == PRECISION_BF16 ? 2.0 : 0.0;
    return (train_memory_use){sizeof(float) + copy, sizeof(float), 2 * sizeof(float) * slice, 0, 0};
}

train_memory_use trainer_memory(const trainer *t) {
    const model *m = &t->model;
    const data_batch *b = &t->shard.batch;
    train_memory_use u = memory_per_param(&t->cfg, (double)m->n_params, (double)m->moment_count);
    u.activation_bytes = (double)model_activation_bytes(m, config_micro_rows(&t->cfg, b->B), b->T);
    u.eval_bytes = config_evaluates(&t->cfg) ? (double)evaluator_bytes(m, &t->shard) : 0;
    return u;
}

/* Whether `need` bytes per rank fit on the fullest node; the verdict is
 * the same on every rank (collective). *fill: the fullest node's share. */
static bool fits(double need, double *fill, double *available) {
    *available = sys_memory_available();
    double mine = *available > 0 ? need * dist_node_ranks() / *available : 0;
    *fill = dist_max_double(mine);
    return *fill <= 1.0;
}

/* Before the model allocates anything (exit 2, docs/cli.md §5): its
 * parameters, gradients, moments and bf16 copy, from the layout counted
 * without allocating, and its RoPE table (positions x head dimension
 * floats: model.max_seq_len = 2^24 alone is gigabytes). A model too large
 * for the node would otherwise end in an allocation failure or the OOM
 * killer. */
static int check_parameter_memory(const config *cfg, status *err) {
    double n = (double)model_param_count(cfg), slice = n;
    if (cfg->zero && dist_size() > 1) slice = ceil(n / dist_size());
    train_memory_use u = memory_per_param(cfg, n, slice);
    double positions = cfg->max_seq_len > cfg->seq_len ? cfg->max_seq_len : cfg->seq_len;
    double per_param = u.param_bytes + u.grad_bytes + u.moment_bytes, fill, available;
    double need = per_param * n + sizeof(float) * positions * config_head_dim(cfg);
    if (fits(need, &fill, &available)) return 0;
    return status_fail(err, EXIT_USAGE,
                       "memory: this model needs %.2f GB per rank before activations (%.0f parameters x %.2f bytes: "
                       "parameters %.2f, gradients %.2f, moments %.2f; a RoPE table of %.0f positions), %.0f%% of "
                       "the memory available on the fullest node (%d rank%s on it, %.2f GB available%s): reduce "
                       "model.d_model, model.n_layers, model.d_ff, model.vocab_size or model.max_seq_len, or "
                       "spread the moments with dist.zero = 1 over more ranks",
                       need / 1e9, n, per_param, u.param_bytes, u.grad_bytes, u.moment_bytes, positions, 100 * fill,
                       dist_node_ranks(), dist_node_ranks() == 1 ? "" : "s", available / 1e9,
                       sys_address_space_left() >= 0 ? " under this process's ulimit -v / -d" : "");
}

/* "1.2 GB" or "11.6 MB": a small run's figures are not all "0.0 GB". */
static const char *size_text(double bytes, char text[32]) {
    snprintf(text, 32, bytes >= 1e9 ? "%.2f GB" : "%.1f MB", bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6);
    return text;
}

/* After the model's buffers, before its activations (allocated at the
 * first forward): refuses (exit 2) a run whose activations do not fit in
 * what is left, rather than being killed mid-step. Prints the estimate. */
static int check_memory(const trainer *t, status *err) {
    const model *m = &t->model;
    const data_batch *b = &t->shard.batch;
    int rows = config_micro_rows(&t->cfg, b->B);
    train_memory_use u = trainer_memory(t);
    double work = u.activation_bytes + u.eval_bytes; /* allocated after this check */
    double need = work + (u.param_bytes + u.grad_bytes + u.moment_bytes) * m->n_params;
    log_rank0("memory: %.2f GB per rank | activations %.1f MB for %d x %d | eval %.1f MB | bytes per parameter: "
              "parameters %.2f, gradients %.2f, moments %.2f\n",
              need / 1e9, u.activation_bytes / 1e6, rows, b->T, u.eval_bytes / 1e6, u.param_bytes, u.grad_bytes,
              u.moment_bytes);
    double fill, available; /* what is left once the buffers are allocated */
    if (fits(work, &fill, &available)) return 0;
    char total[32], acts[32], evals[32], left[32];
    return status_fail(err, EXIT_USAGE,
                       "memory: this run needs %s per rank (%s of activations for %d x %d and %s for evaluations on "
                       "top of the model's buffers), and those alone are %.0f%% of the memory left on the fullest "
                       "node (%d rank%s on it, %s left): reduce train.batch_size (or set train.micro_batch), "
                       "data.seq_len or the model (attention.impl = dense stores T x T per head)",
                       size_text(need, total), size_text(u.activation_bytes, acts), rows, b->T,
                       size_text(u.eval_bytes, evals), 100 * fill, dist_node_ranks(), dist_node_ranks() == 1 ? "" : "s",
                       size_text(available, left));
}

/* The block after whose backward a tensor's gradient is final: its own block;
 * ln_f and the head finish before every block (n_layers - 1); the embedding
 * only at the very end (-1). */
static int tensor_ready_after(const model *m, const model_param *e) {
    if (e->layer >= 0) return e->layer;
    return e->offset == 0 ? -1 : m->L - 1;
}

/* The model as the reducer sees it (docs/design.md §8.3): the gradient
 * buffer and one span per tensor, with the block after which it is final. */
static dist_reducer *create_reducer(const model *m, const config *cfg) {
    dist_span *spans = sys_calloc((size_t)m->n_entries, sizeof *spans);
    for (int i = 0; i < m->n_entries; i++)
        spans[i] = (dist_span){m->entries[i].offset, m->entries[i].numel, tensor_ready_after(m, &m->entries[i])};
    dist_reducer *r = dist_reducer_create(m->grads, m->n_params, spans, m->n_entries, cfg->bucket_mb, cfg->overlap);
    free(spans);
    if (cfg->zero) dist_reducer_shard(r);
    return r;
}

/* model_backward's hooks (model.h) driving the reducer. */
static void hook_block_done(void *reducer, int layer) { dist_reducer_block_done(reducer, layer); }
static void hook_progress(void *reducer) { dist_reducer_progress(reducer); }

/* The products to time: rank 0's rows (its shard of each sequence under
 * dist.context, docs/design.md §8.12, not the whole length), sent to every
 * rank, since a shard of an uneven batch is a row shorter on some ranks and
 * the ranks must share out one list. */
static int shapes_to_time(const trainer *t, gemm_shape shapes[MODEL_GEMM_SHAPES]) {
    int n = model_gemm_shapes(&t->model, config_micro_rows(&t->cfg, t->shard.batch.B) * t->model.cut.total, shapes);
    dist_broadcast_bytes(&n, sizeof n);
    dist_broadcast_bytes(shapes, sizeof(gemm_shape) * MODEL_GEMM_SHAPES);
    return n;
}

/* How many ranks share the timing out (docs/design.md §8.10): all where
 * each has CPUs of its own on every node; where ranks outnumber them (8 on
 * 2 cores), timings made side by side would measure the sharing, so rank
 * 0 alone. */
static int timing_parts(void) {
    return dist_any(dist_node_ranks() * blas_core_threads() > dist_node_cpus()) ? 1 : dist_size();
}

/* train.gemm = auto (docs/design.md §8.10): the ranks time the engines on
 * this model's linear products, each its part, and every rank takes rank
 * 0's choice, so that all ranks compute alike. A resumed run takes the
 * choice its checkpoint recorded instead (trainer_resume), which keeps
 * resume bit-exact. */
static void choose_gemm_engines(trainer *t) {
    gemm_ctx *ctx = gemm_default();
    t->gemm_engines[0] = '\0';
    if (!ctx || gemm_ctx_engine(ctx) != GEMM_AUTO) return;
    gemm_shape shapes[MODEL_GEMM_SHAPES] = {0};
    int n = shapes_to_time(t, shapes), parts = timing_parts();
    gemm_engine chosen[GEMM_CLASSES];
    double start = sys_seconds();
    gemm_timings timings;
    gemm_tune_part(ctx, shapes, n, dist_rank(), parts, &timings);
    dist_sum_doubles(&timings.seconds[0][0], sizeof timings / sizeof(double));
    gemm_tune_pick(&timings, chosen);
    /* seconds of the start-up (4-5 at bench_d768 on one rank): said, since
     * a run that loads a checkpoint's choice skips them (trainer_start) */
    if (timings.shapes > 0)
        log_rank0("gemm auto: the engines timed on %d of this model's %d product shapes in %.1f s%s\n",
                  (int)timings.shapes, n, sys_seconds() - start, parts > 1 ? ", shared by the ranks" : "");
    dist_broadcast_bytes(chosen, sizeof chosen); /* rank 0's pick: the sums' last bits may differ */
    gemm_set_class_engines(ctx, chosen);
    gemm_class_engines_format(chosen, t->gemm_engines, sizeof t->gemm_engines);
}

/* The draws are pure functions of their counters, so every rank starts
 * from the bits one process drawing them all makes, in a ranks x threads-th
 * of the time (GPT-2 small's 124 M draws took 4.5 s of one core, and every
 * rank drew them all). */
void trainer_draw_weights(model *m) {
    size_t first, count;
    dist_partition(m->n_params, dist_rank(), dist_size(), &first, &count);
    model_init_parameter_range(m, first, count);
    dist_share_partitions(m->params, m->n_params);
    model_params_changed(m);
}

int trainer_create(trainer *t, const config *cfg, trainer_start start, status *err) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    if (context_data_size() > cfg->batch_size)
        return status_fail(err, EXIT_USAGE,
                           "train.batch_size = %d is smaller than the number of data-parallel groups (%d ranks / "
                           "dist.context = %d): every group needs a sample",
                           cfg->batch_size, context_data_size(), context_size());
    if (check_parameter_memory(cfg, err) != 0 || model_create(&t->model, cfg, err) != 0) return err->code;
    model_cut_sequences(&t->model, cfg->seq_len); /* this rank's positions (docs/design.md §8.12) */
    if (cfg->zero) {
        size_t first, count;
        dist_partition(t->model.n_params, dist_rank(), dist_size(), &first, &count);
        model_shard_moments(&t->model, first, count);
    }
    if (start == TRAINER_FRESH) trainer_draw_weights(&t->model);
    /* a data file may fail on one rank alone (a node-local path): all agree
     * before check_memory's collective */
    if (dist_agree_status(data_shard_open(&t->shard, cfg, err), err) != 0 || check_memory(t, err) != 0)
        return err->code;
    if (start == TRAINER_FRESH) choose_gemm_engines(t);
    t->reducer = create_reducer(&t->model, cfg);
    metric_tables_standard(&t->train_log, &t->eval_log, cfg->n_layers, cfg->n_heads);
    metric_tables_add_task_columns(&t->train_log, &t->eval_log, cfg);
    t->reduce_scratch = sys_calloc(2 + t->model.n_buffer, sizeof(double));
    if (config_evaluates(cfg)) {
        t->evaluator = evaluator_create(&t->model, &t->shard, 0, err); /* no streaming: cannot fail */
        t->eval_row = sys_calloc((size_t)t->eval_log.row_width, sizeof(double));
    }
    return 0;
}

void trainer_free(trainer *t) {
    dist_reducer_free(t->reducer);
    data_shard_close(&t->shard);
    metric_table_free(&t->train_log);
    metric_table_free(&t->eval_log);
    free(t->reduce_scratch);
    evaluator_free(t->evaluator);
    free(t->eval_row);
    model_free(&t->model);
}

/* The global count of targets, known from the data alone: backward scales
 * every micro-batch's loss by its inverse, so the count precedes the first
 * forward and the gradient reduction stays a plain sum (docs/design.md §8.3).
 * The bytes those targets decode to (NaN where there are none to count,
 * docs/metrics.md §3) ride on the same reduction, for the step's bpb. */
static double global_target_count(trainer *t, double *bytes) {
    const data_batch *b = &t->shard.batch;
    double totals[2] = {(double)model_target_count(&t->model, b->targets, b->B, b->T),
                        data_target_bytes(t->shard.data, b->targets, (size_t)b->B * b->T)};
    dist_sum_doubles(totals, 2);
    *bytes = totals[1];
    return totals[0];
}

/* One reduction carries the loss sum and the momentum buffer sums accumulated
 * over the micro-batches (docs/model.md §1.2: buffers are the global-batch
 * mean; the forward reads them, and so does backward's recomputation of a
 * block with train.recompute = block, so they change after backward). */
static double reduce_forward_results(trainer *t, double global_count, bool *abandon) {
    model *m = &t->model;
    double *r = t->reduce_scratch;
    bool buffers = m->momentum;
    /* the votes to drop the step ride on the same reduction, last */
    size_t n = 1 + (buffers ? m->n_buffer : 0);
    r[n] = *abandon ? 1.0 : 0.0;
    dist_sum_doubles(r, n + 1);
    *abandon = r[n] > 0;
    if (*abandon) return NAN; /* nothing of the step is kept: buffers, parameters, step */
    /* a non-finite sum would poison every later step: such a step keeps the
     * old buffers, and its NaN loss makes it a skipped step */
    bool finite = isfinite(r[0]);
    for (size_t i = 0; buffers && i < m->n_buffer; i++) finite = finite && isfinite(r[1 + i]);
    for (size_t i = 0; finite && buffers && i < m->n_buffer; i++) m->buffers[i] = (float)(r[1 + i] / t->cfg.batch_size);
    if (!finite) return NAN;
    return global_count > 0 ? r[0] / global_count : 0.0;
}

/* Forward and backward of rows [first, first + rows) of the shard, adding
 * the loss sum and buffer sums to reduce_scratch and the gradients to
 * m->grads; hooks (the reducer's, last micro-batch only) or NULL. */
static void micro_step(trainer *t, int first, int rows, float scale, const model_backward_hooks *hooks) {
    model *m = &t->model;
    const data_batch *b = &t->shard.batch;
    size_t offset = (size_t)first * b->T;
    const int32_t *inputs = b->inputs + offset, *targets = b->targets + offset;
    const int32_t *labels = b->labels ? b->labels + first : NULL;
    model_forward_train(m, inputs, targets, labels, rows, b->T, m->momentum, scale, first > 0);
    long long count;
    double *r = t->reduce_scratch;
    r[0] += model_loss_sum(m, targets, rows, b->T, &count);
    for (size_t i = 0; m->momentum && i < m->n_buffer; i++) r[1 + i] += m->buffer_sums[i];
    model_backward(m, inputs, targets, labels, rows, b->T, scale, hooks, first > 0);
}

typedef struct {
    model *m;
    const float *grads; /* the slice's reduced gradients, element 0 = moment_first */
    long long step;
    optimizer_settings s;
} slice_step;

static void update_slice(void *ctx, size_t lo, size_t hi) {
    slice_step *c = ctx;
    optimizer_step_range(c->m, lo, hi, c->grads + (lo - c->m->moment_first), c->step, &c->s);
}

/* ZeRO-1 (docs/scale.md §7): the exact global norm from the slices' sums of
 * squares. */
static double sharded_grad_norm(trainer *t) {
    double squares = optimizer_sum_squares(dist_reducer_slice(t->reducer), t->model.moment_count);
    dist_sum_doubles(&squares, 1);
    return sqrt(squares);
}

/* ZeRO-1: clipping and AdamW on this rank's slice, then the parameters
 * all-gathered bucket by bucket. */
static void sharded_update(trainer *t, long long step, train_step_result *res) {
    model *m = &t->model;
    float *grads = dist_reducer_slice(t->reducer);
    slice_step c = {m,
                    grads,
                    step,
                    {res->lr, t->cfg.beta1, t->cfg.beta2, t->cfg.adam_eps, t->cfg.weight_decay,
                     optimizer_clip_factor(res->grad_norm, t->cfg.grad_clip)}};
    res->allreduce_wait_s += dist_reducer_gather(t->reducer, m->params, update_slice, &c);
}

/* The gradient norm, then, unless the loss or the norm is not finite,
 * clipping and AdamW (docs/model.md §1.4) and the bf16 weight copy. */
static void update_parameters(trainer *t, long long step, train_step_result *res) {
    model *m = &t->model;
    res->grad_norm = t->cfg.zero ? sharded_grad_norm(t) : optimizer_global_norm(m->grads, m->n_params);
    /* the loss and the norm are global after the reductions: every rank
     * takes the same branch (docs/design.md §8.7, divergence guard) */
    res->nonfinite = !isfinite(res->loss) || !isfinite(res->grad_norm);
    if (res->nonfinite) {
        t->skipped_steps++;
        return;
    }
    if (!t->cfg.zero) {
        optimizer_settings s = {
            res->lr,         t->cfg.beta1,        t->cfg.beta2,
            t->cfg.adam_eps, t->cfg.weight_decay, optimizer_clip_factor(res->grad_norm, t->cfg.grad_clip)};
        optimizer_step_model(m, step, &s); /* and the bf16 copy, in its pass (docs/design.md §8.10) */
        return;
    }
    sharded_update(t, step, res);
    model_params_changed(m); /* the all-gathered weights' once-per-step bf16 refresh, docs/scale.md §7 */
}

/* Test hook (docs/cli.md §5, signals): MOMFMM_TEST_STEP_SLEEP_MS=N makes
 * every step N ms longer, at its end, so that the tests can stop slow steps
 * under mpirun without a model that takes seconds per step. */
static void test_step_delay(void) {
    static long ms = -1;
    if (ms < 0) {
        const char *v = getenv("MOMFMM_TEST_STEP_SLEEP_MS");
        ms = v ? atol(v) : 0;
        if (ms < 0) ms = 0;
    }
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
}

int trainer_step(trainer *t, train_step_result *result, status *err) {
    model *m = &t->model;
    data_batch *b = &t->shard.batch;
    train_step_result res = {0};
    long long step = t->step + 1;
    if (data_shard_fill(&t->shard, SPLIT_TRAIN, step, false, err) != 0) return err->code;
    double target_bytes;
    double global_count = global_target_count(t, &target_bytes);
    float scale = global_count > 0 ? (float)(1.0 / global_count) : 0.0f;
    memset(t->reduce_scratch, 0, sizeof(double) * (2 + m->n_buffer));
    /* the reduction overlaps only the last micro-batch's backward: earlier
     * ones add into the same gradients */
    model_backward_hooks hooks = {hook_block_done, hook_progress, t->reducer};
    int rows = config_micro_rows(&t->cfg, b->B);
    const trainer_step_hooks *h = &t->hooks;
    if (h->compute_begin) h->compute_begin(h->ctx);
    for (int first = 0; first < b->B; first += rows) {
        bool last = first + rows >= b->B;
        micro_step(t, first, last ? b->B - first : rows, scale, last ? &hooks : NULL);
    }
    PROF_TIMED(PROF_REDUCE_WAIT, res.allreduce_wait_s = dist_reducer_finish(t->reducer));
    test_step_delay();
    if (h->compute_end) h->compute_end(h->ctx);
    bool abandon = h->abandon && h->abandon(h->ctx);
    res.loss = reduce_forward_results(t, global_count, &abandon);
    res.bpb = target_bytes > 0 ? res.loss * global_count / (M_LN2 * target_bytes) : NAN;
    if (abandon) {
        res.abandoned = true;
        *result = res;
        return 0;
    }
    res.lr = optimizer_learning_rate(&t->cfg, step);
    PROF_TIMED(PROF_OPTIMIZER, update_parameters(t, step, &res));
    t->step = step;
    /* a counter resumed near 2^63 stays at its ceiling rather than wrapping (docs/files.md §4) */
    if (__builtin_add_overflow(t->tokens_seen, (long long)t->cfg.batch_size * t->cfg.seq_len, &t->tokens_seen))
        t->tokens_seen = LLONG_MAX;
    *result = res;
    return 0;
}

int trainer_log_eval(trainer *t, const eval_result **r, status *err) {
    if (!t->evaluator)
        return status_fail(err, EXIT_USAGE, "train.eval_interval = 0 and train.eval_at_start = false: no evaluation");
    if (evaluate(t->evaluator, &t->model, &t->shard, err) != 0) return err->code;
    *r = evaluator_result(t->evaluator);
    eval_result_row(*r, t->step, &t->eval_log, t->eval_row);
    metric_table_append(&t->eval_log, t->eval_row);
    return 0;
}

/* After a checkpoint that did not load: no state of it left. The
 * parameters are zeros, not drawn: another checkpoint replaces them, or
 * trainer_resume, finding none, draws them in shares (trainer_draw_weights). */
static void trainer_reset(trainer *t) {
    model *m = &t->model;
    memset(m->params, 0, sizeof(float) * m->n_params);
    memset(m->buffers, 0, sizeof(float) * m->n_buffer);
    memset(m->adam_m, 0, sizeof(float) * 2 * m->moment_count);
    t->train_log.n_rows = t->eval_log.n_rows = 0;
    t->step = t->tokens_seen = t->skipped_steps = 0;
}

/* train.gemm = auto on resume: the engines the checkpoint was computed with. */
static void use_recorded_gemm_engines(trainer *t, const checkpoint_info *info, const char *path) {
    gemm_ctx *ctx = gemm_default();
    gemm_engine engines[GEMM_CLASSES];
    if (!ctx || gemm_ctx_engine(ctx) != GEMM_AUTO || !gemm_class_engines_parse(info->gemm_engines, engines)) return;
    gemm_set_class_engines(ctx, engines); /* an engine recorded where it ran, not here, becomes OpenBLAS */
    gemm_class_engines(ctx, engines);
    gemm_class_engines_format(engines, t->gemm_engines, sizeof t->gemm_engines);
    log_rank0("gemm auto: %s, as %s recorded\n", t->gemm_engines, path);
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
    t->skipped_steps = info.skipped_steps;
    use_recorded_gemm_engines(t, &info, path);
    if (info.world_size != dist_size())
        log_rank0("note: checkpoint written by %d ranks, resuming on %d (same math up to float summation order)\n",
                  info.world_size, dist_size());
    log_rank0("resumed from %s at step %lld\n", path, t->step);
    return 0;
}

static int check_consistency(const trainer *t, status *err) {
    return dist_check_consistency(t->model.params, t->model.n_params * sizeof(float), t->step, err);
}

int trainer_resume(trainer *t, const char *how, status *err) {
    int rc;
    bool resumed = true;
    if (strcmp(how, "auto") != 0) {
        rc = try_resume(how, t, err);
        if (rc == STORE_SKIP) rc = EXIT_BAD_FILE;
    } else {
        rc = store_resume_newest(t->cfg.out_dir, try_resume, t, &resumed, err);
    }
    /* every rank read the file itself: a read that failed on one rank
     * alone (a node-local path) fails every rank before the collective
     * comparison, which that rank would never reach */
    if (dist_agree_status(rc, err) != 0) return err->code;
    /* collective from here: every rank takes the same branch */
    bool some_fresh = dist_any(!resumed);
    if (some_fresh && dist_any(resumed))
        return status_fail(err, EXIT_BAD_FILE,
                           "--resume auto: some ranks found no checkpoint in %s while others resumed from one (is "
                           "train.out_dir on a disk every node sees?)",
                           t->cfg.out_dir);
    if (some_fresh) {
        log_rank0("no checkpoint to resume in %s: starting at step 0\n", t->cfg.out_dir);
        trainer_draw_weights(&t->model);
    }
    /* engines the checkpoint did not record (or no checkpoint): timed now */
    if (dist_any(t->gemm_engines[0] == '\0')) choose_gemm_engines(t);
    return check_consistency(t, err);
}

int trainer_check_init_source(const config *cfg, const char *path, checkpoint_info *info, status *err) {
    config saved;
    int rc = checkpoint_read_config(path, &saved, info, err);
    if (rc != 0) {
        char why[sizeof err->message];
        snprintf(why, sizeof why, "%s", err->message);
        return status_fail(err, rc, "--init %s", why);
    }
    char diff[4096];
    if (config_compare_architecture(&saved, cfg, diff, sizeof diff) > 0)
        return status_fail(err, EXIT_BAD_FILE, "--init %s: the model differs from the config's (checkpoint vs now): %s",
                           path, diff);
    return 0;
}

int trainer_init_from(trainer *t, const char *path, status *err) {
    checkpoint_info info;
    int rc = trainer_check_init_source(&t->cfg, path, &info, err);
    if (rc == 0) rc = checkpoint_read_state(path, &t->model, false, NULL, NULL, err);
    /* as in trainer_resume: every rank read the file itself */
    if (dist_agree_status(rc, err) != 0) return err->code;
    choose_gemm_engines(t); /* a new run: its engines are timed, not the source's */
    /* an absolute name, so that the record stays meaningful from anywhere */
    char *absolute = realpath(path, NULL);
    snprintf(t->init_from, sizeof t->init_from, "%s", absolute ? absolute : path);
    free(absolute);
    log_rank0("initialised from %s (step %lld): fresh optimizer, step 0\n", path, info.step);
    return check_consistency(t, err);
}

h5writer_mode trainer_writers(const trainer *t) {
    if (!t->cfg.zero || dist_size() == 1) return H5WRITER_ALONE;
    return t->cfg.collective_io ? H5WRITER_COLLECTIVE : H5WRITER_TOGETHER;
}

static checkpoint_info info_of(const trainer *t) {
    checkpoint_info info = {
        .step = t->step, .tokens_seen = t->tokens_seen, .world_size = dist_size(), .skipped_steps = t->skipped_steps};
    snprintf(info.init_from, sizeof info.init_from, "%s", t->init_from);
    snprintf(info.gemm_engines, sizeof info.gemm_engines, "%s", t->gemm_engines);
    const tokenizer *tok = data_tokenizer(t->shard.data);
    if (tok) info.tokenizer_model = tok->model, info.tokenizer_size = tok->model_size;
    return info;
}

int trainer_save(const trainer *t, char *path, size_t len, status *err) {
    h5writer_mode writers = trainer_writers(t);
    if (dist_rank() != 0 && writers == H5WRITER_ALONE) return 0;
    checkpoint_info info = info_of(t);
    return store_save(t->cfg.out_dir, t->cfg.keep, &t->model, &info, &t->train_log, &t->eval_log, writers, path, len,
                      err);
}

int trainer_save_best(const trainer *t, status *err) {
    h5writer_mode writers = trainer_writers(t);
    if (dist_rank() != 0 && writers == H5WRITER_ALONE) return 0;
    char path[STORE_PATH_MAX];
    store_best_path(t->cfg.out_dir, path, sizeof path);
    checkpoint_info info = info_of(t);
    return store_write_checkpoint(path, &t->model, &info, &t->train_log, &t->eval_log, writers, err);
}

bool trainer_weights_finite(const trainer *t) {
    const model *m = &t->model;
    for (size_t i = 0; i < m->n_params; i++)
        if (!isfinite(m->params[i])) return false;
    return true;
}
