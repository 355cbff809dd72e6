/* The commands that read a checkpoint (docs/cli.md §5): inspect, eval and generate.
 * They need only a checkpoint's root attributes, /model and /buffers (plus
 * /metrics for inspect's history): a model for inference, and for eval a
 * data shard and the evaluation module (docs/design.md §8.5), never a
 * trainer; generate is in cmd_generate.c. A failed status becomes an exit here (§8.7). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/checkpoint.h"
#include "momfmm/commands.h"
#include "momfmm/common.h"
#include "momfmm/eval.h"
#include "momfmm/readouts.h"

/* A model for inference holding the checkpoint's weights and buffers, and
 * with `train`/`eval` its metric history; a bad file exits 3. */
static void load_checkpoint(const char *ckpt, model *m, checkpoint_info *info, metric_table *train,
                            metric_table *eval) {
    config cfg;
    status err;
    if (checkpoint_read_config(ckpt, &cfg, info, &err) != 0) fail(err.code, "%s", err.message);
    if (model_create_for_inference(m, &cfg, &err) != 0) fail_all(err.code, "%s", err.message);
    if (train) metric_tables_standard(train, eval, cfg.n_layers, cfg.n_heads);
    if (train) metric_tables_add_task_columns(train, eval, cfg.task);
    if (checkpoint_read_state(ckpt, m, false, train, eval, &err) != 0) fail(err.code, "%s", err.message);
}

static void print_parameter_groups(const model *m) {
    static const char *groups[] = {"tok_emb", "ln", "attn/qkv", "attn/proj", "momentum_gamma", "fmm_blend",
                                   "mlp/fc", "mlp/proj", "head", "cls"};
    size_t n_groups = sizeof groups / sizeof groups[0];
    printf("parameters: %zu\n", m->n_params);
    for (size_t g = 0; g < n_groups; g++) {
        size_t count = 0;
        for (int i = 0; i < m->n_entries; i++)
            if (strstr(m->entries[i].name, groups[g])) count += m->entries[i].numel;
        if (count) printf("  %-16s %12zu  (%.1f%%)\n", groups[g], count, 100.0 * count / m->n_params);
    }
}

/* A table value as text: "—" for an empty bin (NaN), never nan (docs/metrics.md §3). */
static const char *shown_value(double v, const char *format, char *buf, size_t len) {
    if (isnan(v)) return metric_text(v, 0, buf, len);
    snprintf(buf, len, format, v);
    return buf;
}

static void print_last_row(const char *title, const metric_table *t) {
    if (t->n_rows == 0) {
        printf("%s: none\n", title);
        return;
    }
    const double *row = t->values + (t->n_rows - 1) * t->row_width;
    printf("%s (%lld rows), last:", title, t->n_rows);
    int offset = 0;
    for (int c = 0; c < t->n_columns; c++) {
        const metric_column *col = &t->columns[c];
        char value[32];
        if (col->width == 1) printf(" %s %s", col->name, shown_value(row[offset], "%.6g", value, sizeof value));
        else if (col->inner <= 1) {
            printf(" %s [", col->name);
            for (int j = 0; j < col->width; j++)
                printf("%s%s", j ? " " : "", shown_value(row[offset + j], "%.4g", value, sizeof value));
            printf("]");
        }
        offset += col->width;
    }
    printf("\n");
}

/* docs/model.md §1.2 read-out: the shear as a high-pass filter, per layer and head. */
static void print_filter_gains(const model *m) {
    if (!m->momentum) {
        printf("momentum: off\n");
        return;
    }
    eval_result r;
    eval_result_init(&r, m);
    eval_readouts(m, &r);
    printf("momentum filter |H| per head (DC, Nyquist) with beta %g, gamma2 %g, %s gamma:\n", m->cfg.beta,
           m->cfg.gamma2, m->cfg.learn_gamma ? "learned" : "fixed");
    for (int l = 0; l < m->L; l++) {
        printf("  block %d:", l);
        for (int h = 0; h < m->H; h++) {
            double g = r.gamma[l * m->H + h];
            printf("  h%d gamma %.4f |H(0)| %.4f |H(pi)| %.4f", h, g, momentum_filter_gain(0, g, m->cfg.beta, m->cfg.gamma2),
                   momentum_filter_gain(M_PI, g, m->cfg.beta, m->cfg.gamma2));
        }
        printf("\n");
    }
    eval_result_free(&r);
}

/* The last eval row in the metrics the task is read by (docs/metrics.md §3). */
static void print_task_metrics(const config *cfg, const metric_table *eval) {
    if (eval->n_rows == 0) return;
    static const char *task_names[] = {"chain", "copy", "listops", "text"};
    eval_metrics e;
    char shown[256];
    eval_metrics_from_row(eval, eval->n_rows - 1, &e);
    eval_metrics_format(&e, cfg->task, 4, shown, sizeof shown);
    printf("last eval (%s, step %.0f): %s\n", task_names[cfg->task], eval->values[(eval->n_rows - 1) * eval->row_width],
           shown);
}

int command_inspect(const char *ckpt) {
    model m;
    checkpoint_info info;
    metric_table train, eval;
    load_checkpoint(ckpt, &m, &info, &train, &eval);
    if (process_rank() == 0) {
        char *ini = config_to_ini(&m.cfg);
        printf("checkpoint %s\nstep %lld | tokens_seen %lld | written by %d rank%s\n", ckpt, info.step,
               info.tokens_seen, info.world_size, info.world_size == 1 ? "" : "s");
        print_parameter_groups(&m);
        print_last_row("train metrics", &train);
        print_last_row("eval metrics", &eval);
        print_task_metrics(&m.cfg, &eval);
        print_filter_gains(&m);
        printf("config:\n%s", ini);
        free(ini);
    }
    metric_table_free(&train);
    metric_table_free(&eval);
    model_free(&m);
    return 0;
}

static void print_eval(const char *how, const eval_metrics *e, int task) {
    char shown[256];
    eval_metrics_format(e, task, 6, shown, sizeof shown);
    log_rank0("%s | %s\n", how, shown);
}

int command_eval(const char *ckpt, bool stream, int segment) {
    model m;
    checkpoint_info info;
    load_checkpoint(ckpt, &m, &info, NULL, NULL);
    rank_shard shard;
    eval_result r;
    status err;
    if (rank_shard_open(&shard, &m.cfg, &err) != 0) fail_all(err.code, "%s", err.message);
    eval_result_init(&r, &m);
    if (evaluate(&m, &shard, stream ? segment : 0, &r, &err) != 0) {
        /* a model that cannot stream is refused alike on every rank, before any work */
        if (err.code == EXIT_USAGE) fail_all(err.code, "%s", err.message);
        fail(err.code, "%s", err.message);
    }
    print_eval("eval", &r.metrics, m.cfg.task);
    log_rank0("gain_R");
    for (int l = 0; l < m.L; l++) log_rank0(" %.4f", r.gain_R[l]);
    log_rank0("\n");
    if (r.streamed) {
        char how[64];
        snprintf(how, sizeof how, "eval --stream (segments of %d)", segment);
        print_eval(how, &r.stream_metrics, m.cfg.task);
        log_rank0("stream max |logit difference| vs full forward: %.3e\n", r.stream_max_diff);
    }
    eval_result_free(&r);
    rank_shard_close(&shard);
    model_free(&m);
    return 0;
}
