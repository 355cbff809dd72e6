/* The commands that write or read a checkpoint without training (docs/cli.md
 * §5): init (the step-0 checkpoint), loss (a token file's loss and
 * gradients), inspect and eval. The readers need only a checkpoint's root attributes, /model and /buffers (plus
 * /metrics for inspect's history): a model for inference, and for eval a
 * data shard and the evaluation module (docs/design.md §8.5), never a
 * trainer; generate is in cmd_generate.c. inspect and eval also take a run
 * directory (its newest checkpoint that loads, chosen by the store,
 * docs/design.md §8.4), and inspect a run's live metrics.h5. A failed status
 * becomes an exit here (§8.7). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "data/chain.h"
#include "eval/eval.h"
#include "eval/readouts.h"
#include "hdf5/h5kind.h"
#include "parallel/dist.h"
#include "store/checkpoint.h"
#include "store/store.h"
#include "store/token_input.h"
#include "training/train.h"

/* What inspect and eval read: a model for inference holding a checkpoint's
 * weights and buffers, and with `history` its metric tables. */
typedef struct {
    bool history;
    model m;
    checkpoint_info info;
    metric_table train, eval;
    char path[STORE_PATH_MAX]; /* the checkpoint read */
} loaded_checkpoint;

static void unload(loaded_checkpoint *c) {
    if (c->history) {
        metric_table_free(&c->train);
        metric_table_free(&c->eval);
    }
    model_free(&c->m);
}

/* A store_loader: STORE_SKIP with the reason when `path` does not load as a
 * checkpoint, another code (every rank alike) when its model cannot be made. */
static int try_load(const char *path, void *ctx, status *err) {
    loaded_checkpoint *c = ctx;
    config cfg;
    if (checkpoint_read_config(path, &cfg, &c->info, err) != 0) return STORE_SKIP;
    if (model_create_for_inference(&c->m, &cfg, err) != 0) return err->code;
    if (c->history) {
        metric_tables_standard(&c->train, &c->eval, cfg.n_layers, cfg.n_heads);
        metric_tables_add_task_columns(&c->train, &c->eval, &cfg);
    }
    if (checkpoint_read_state(path, &c->m, false, c->history ? &c->train : NULL, c->history ? &c->eval : NULL, err) ==
        0) {
        snprintf(c->path, sizeof c->path, "%s", path);
        return 0;
    }
    unload(c);
    return STORE_SKIP;
}

/* Every rank loads the file, but a run directory's rank 0, which loaded it
 * choosing it (`mine` false); a file that does not load on any rank ends
 * every rank in one line. */
static void load_file(const char *path, loaded_checkpoint *c, bool mine) {
    status err;
    int rc = mine ? try_load(path, c, &err) : 0;
    cmd_fail_if_any(rc == STORE_SKIP ? EXIT_BAD_FILE : rc, &err);
}

/* "; ..." naming dir/metrics.h5 when there is one, else "". */
static const char *metrics_file_hint(const char *dir) {
    static char hint[STORE_PATH_MAX + 64];
    char path[STORE_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/metrics.h5", dir);
    hint[0] = '\0';
    if (access(path, R_OK) == 0) snprintf(hint, sizeof hint, "; its metrics so far: momfmm inspect %s", path);
    return hint;
}

/* A run directory stands for its newest checkpoint that loads (docs/cli.md
 * §5, the store's choice as for --resume auto, docs/design.md §8.4). Rank 0
 * chooses and tells the others, so that every rank reads the same file even
 * while a run is writing newer ones. */
static void load_run_directory(const char *dir, loaded_checkpoint *c) {
    struct {
        int code;
        char path[STORE_PATH_MAX];
        status err;
    } choice = {0};
    if (dist_rank() == 0) {
        choice.code = store_load_newest(dir, try_load, c, choice.path, sizeof choice.path, &choice.err);
        if (choice.code == STORE_SKIP) {
            store_listing l;
            store_list(dir, &l);
            status_fail(&choice.err, EXIT_BAD_FILE, "%s: %s%s", dir,
                        l.n ? "no checkpoint in this run directory loads (see the warnings above)"
                            : "no checkpoint (ckpt_<step>.h5) in this directory",
                        metrics_file_hint(dir));
            store_listing_free(&l);
        }
    }
    dist_broadcast_bytes(&choice, sizeof choice);
    if (choice.code != 0) cmd_fail_all(choice.err.code, "%s", choice.err.message);
    load_file(choice.path, c, dist_rank() != 0);
}

/* A checkpoint file, or a run directory's newest checkpoint that loads. */
static void load_checkpoint(const char *path_or_dir, loaded_checkpoint *c) {
    if (store_is_directory(path_or_dir)) load_run_directory(path_or_dir, c);
    else load_file(path_or_dir, c, true);
}

void command_load_run_checkpoint(const char *path_or_dir, model *m, char *path, size_t len, checkpoint_info *info) {
    loaded_checkpoint c = {.history = false};
    load_checkpoint(path_or_dir, &c);
    if (store_is_directory(path_or_dir)) log_rank0("checkpoint: %s\n", c.path);
    snprintf(path, len, "%s", c.path);
    *m = c.m;
    if (info) *info = c.info;
}

static void print_parameter_groups(const model *m) {
    static const char *groups[] = {"tok_emb",   "ln",     "attn/qkv", "attn/proj", "momentum_gamma",
                                   "fmm_blend", "mlp/fc", "mlp/proj", "head",      "cls"};
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

/* docs/metrics.md §3: the occurrence metrics mean something on the chain
 * task only (a token's k-th occurrence in a sequence of distinct tokens). */
static bool column_shown(const char *name, int task) {
    static const char *chain_only[] = {"L_new", "L_rep", "delta_12", "loss_by_k"};
    for (size_t i = 0; i < sizeof chain_only / sizeof chain_only[0]; i++)
        if (!strcmp(name, chain_only[i])) return task == TASK_CHAIN;
    return true;
}

static void print_row(const metric_table *t, long long i, int task) {
    const double *row = t->values + i * t->row_width;
    int offset = 0;
    for (int c = 0; c < t->n_columns; c++) {
        const metric_column *col = &t->columns[c];
        char value[32];
        if (!column_shown(col->name, task)) {
            offset += col->width;
            continue;
        }
        if (col->integer) printf(" %s %lld", col->name, (long long)row[offset]);
        else if (col->width == 1 && !col->vector)
            printf(" %s %s", col->name, shown_value(row[offset], "%.6g", value, sizeof value));
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

/* The newest `count` rows of a table, oldest first. */
static void print_last_rows(const char *title, const metric_table *t, long long count, int task) {
    if (t->n_rows == 0) {
        printf("%s: none\n", title);
        return;
    }
    long long first = t->n_rows > count ? t->n_rows - count : 0;
    const char *rows = t->n_rows == 1 ? "row" : "rows";
    if (count == 1) printf("%s (%lld %s), last:", title, t->n_rows, rows);
    else printf("%s (%lld %s), last %lld:\n", title, t->n_rows, rows, t->n_rows - first);
    for (long long i = first; i < t->n_rows; i++) {
        if (count != 1) printf(" ");
        print_row(t, i, task);
    }
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
    char beta[32], gamma2[32];
    printf("momentum filter |H| per head (DC, Nyquist) with beta %s, gamma2 %s, %s gamma:\n",
           config_format_double(m->cfg.beta, beta, sizeof beta),
           config_format_double(m->cfg.gamma2, gamma2, sizeof gamma2), m->cfg.learn_gamma ? "learned" : "fixed");
    for (int l = 0; l < m->L; l++) {
        printf("  block %d:", l);
        for (int h = 0; h < m->H; h++) {
            double g = r.gamma[l * m->H + h];
            printf("  h%d gamma %.4f |H(0)| %.4f |H(pi)| %.4f", h, g,
                   readouts_filter_gain(0, g, m->cfg.beta, m->cfg.gamma2),
                   readouts_filter_gain(M_PI, g, m->cfg.beta, m->cfg.gamma2));
        }
        printf("\n");
    }
    eval_result_free(&r);
}

/* The last eval row in the metrics the task is read by (docs/metrics.md §3). */
static void print_task_metrics(const config *cfg, const metric_table *eval) {
    if (eval->n_rows == 0) return;
    static const char *task_names[] = {"chain", "copy", "listops", "text"};
    metric_values e;
    char shown[256];
    metric_values_from_row(eval, eval->n_rows - 1, &e);
    metric_values_format(&e, cfg->task, 4, shown, sizeof shown);
    printf("last eval (%s, step %.0f): %s\n", task_names[cfg->task], eval->values[(eval->n_rows - 1) * eval->row_width],
           shown);
}

/* The attention read-out of docs/metrics.md §3, per layer and head: the
 * positional and induction scores as "pos/ind", from [2][L*H] (NaN: "—"). */
static void print_attention_scores(const char *title, const double *scores, int L, int H) {
    bool any = false;
    for (int i = 0; i < 2 * L * H; i++) any |= !isnan(scores[i]);
    if (!any) {
        printf("%s: — (no query whose positional and induction keys differ)\n", title);
        return;
    }
    printf("%s, positional/induction per head:\n", title);
    for (int l = 0; l < L; l++) {
        printf("  block %d:", l);
        for (int h = 0; h < H; h++) {
            char pos[32], ind[32];
            printf("  h%d %s/%s", h, metric_text(scores[l * H + h], 3, pos, sizeof pos),
                   metric_text(scores[L * H + l * H + h], 3, ind, sizeof ind));
        }
        printf("\n");
    }
}

/* inspect: the chain task's length eval and attention read-out of the last
 * eval row (docs/metrics.md §3), from their columns. */
static void print_chain_readouts(const config *cfg, const metric_table *eval) {
    if (cfg->task != TASK_CHAIN || eval->n_rows == 0) return;
    const double *row = eval->values + (eval->n_rows - 1) * eval->row_width;
    int L = cfg->n_layers, H = cfg->n_heads, at = metric_table_column_offset(eval, "lengen_loss");
    if (at >= 0 && !isnan(row[at])) {
        char loss[32], rep[32];
        int rep_at = metric_table_column_offset(eval, "lengen_L_rep");
        printf("last length eval (periods %d..%d): loss %s | L_rep %s\n", cfg->eval_chain_len,
               cfg->eval_chain_len_max > cfg->eval_chain_len ? cfg->eval_chain_len_max : cfg->eval_chain_len,
               metric_text(row[at], 4, loss, sizeof loss), metric_text(row[rep_at], 4, rep, sizeof rep));
    }
    const char *names[][3] = {{"attn_positional", "attn_induction", "attention read-out (last eval)"},
                              {"lengen_attn_positional", "lengen_attn_induction", "attention read-out (length eval)"}};
    double *scores = sys_calloc(2 * (size_t)L * H, sizeof(double));
    for (int n = 0; n < 2; n++) {
        int pos = metric_table_column_offset(eval, names[n][0]), ind = metric_table_column_offset(eval, names[n][1]);
        if (pos < 0 || ind < 0) continue;
        memcpy(scores, row + pos, sizeof(double) * L * H);
        memcpy(scores + L * H, row + ind, sizeof(double) * L * H);
        print_attention_scores(names[n][2], scores, L, H);
    }
    free(scores);
}

/* inspect of a metrics.h5 (live_metrics.h): a run may be writing it. */
static void inspect_metrics_file(const char *path) {
    config cfg;
    metric_table train, eval;
    status err;
    int rc = checkpoint_read_metrics_file(path, &cfg, &train, &eval, &err);
    if (rc != 0) {
        metric_table_free(&train);
        metric_table_free(&eval);
    }
    cmd_fail_if_any(rc, &err);
    if (dist_rank() == 0) {
        char *ini = config_to_ini(&cfg);
        printf("metrics file: %s (the live metrics of run directory %s; a run may still be appending)\n", path,
               cfg.out_dir);
        print_last_rows("train metrics", &train, 5, cfg.task);
        print_last_rows("eval metrics", &eval, 3, cfg.task);
        print_chain_readouts(&cfg, &eval);
        printf("config:\n%s", ini);
        free(ini);
    }
    metric_table_free(&train);
    metric_table_free(&eval);
}

/* The kind of the file given to inspect (docs/files.md §4, another of
 * momfmm's files), as rank 0 finds it, so that every rank takes the same
 * way; the file is opened as a live metrics file, which a run may be
 * appending to. Ends every rank when it is neither a checkpoint nor a
 * metrics file. */
static h5kind inspected_kind(const char *path) {
    struct {
        h5kind kind;
        status err; /* code 0: the kind is one inspect reads */
    } found = {.kind = H5KIND_OTHER};
    unsigned live = H5F_ACC_RDONLY | H5F_ACC_SWMR_READ;
    if (dist_rank() == 0 && h5kind_of_path(path, "checkpoint or metrics file", live, &found.kind, &found.err) == 0) {
        if (found.kind == H5KIND_OTHER)
            status_fail(&found.err, EXIT_BAD_FILE,
                        "%s: neither a checkpoint (no root attribute 'format') nor a metrics file (no root "
                        "attribute 'config_ini' and no /metrics group)",
                        path);
        else if (found.kind != H5KIND_CHECKPOINT && found.kind != H5KIND_METRICS)
            status_fail(&found.err, EXIT_BAD_FILE, "%s: %s, neither a checkpoint nor a metrics file", path,
                        h5kind_name(found.kind));
    }
    dist_broadcast_bytes(&found, sizeof found);
    cmd_fail_if_any(found.err.code, &found.err);
    return found.kind;
}

int command_inspect(const char *ckpt) {
    loaded_checkpoint c = {.history = true};
    if (!store_is_directory(ckpt)) {
        if (inspected_kind(ckpt) == H5KIND_METRICS) {
            inspect_metrics_file(ckpt);
            return 0;
        }
        load_file(ckpt, &c, true);
    } else {
        load_run_directory(ckpt, &c);
    }
    if (dist_rank() == 0) {
        char *ini = config_to_ini(&c.m.cfg);
        printf("checkpoint: %s\nstep %lld | tokens_seen %lld | written by %d rank%s%s%s\n", c.path, c.info.step,
               c.info.tokens_seen, c.info.world_size, c.info.world_size == 1 ? "" : "s",
               c.info.written_by[0] ? " of " : "", c.info.written_by);
        print_parameter_groups(&c.m);
        print_last_rows("train metrics", &c.train, 1, c.m.cfg.task);
        print_last_rows("eval metrics", &c.eval, 1, c.m.cfg.task);
        print_task_metrics(&c.m.cfg, &c.eval);
        print_chain_readouts(&c.m.cfg, &c.eval);
        print_filter_gains(&c.m);
        printf("config:\n%s", ini);
        free(ini);
    }
    unload(&c);
    return 0;
}

static void print_eval(const char *how, const metric_values *e, int task) {
    char shown[256];
    metric_values_format(e, task, 6, shown, sizeof shown);
    log_rank0("%s | %s\n", how, shown);
}

/* eval --set (docs/cli.md §5): what is evaluated and how much of it may
 * change, never the model: data keys but data.task and data.seq_len (the
 * model's buffers are sized by it), train.eval_batches, train.eval_readouts.
 * A new data.path or data.eval_path is resolved against the current directory. */
static void apply_eval_overrides(config *c, int n, char *const *overrides) {
    static const char *allowed[] = {"train.eval_batches", "train.eval_readouts"};
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(overrides[i], "="), overrides[i]);
        for (char *end = key + strlen(key); end > key && end[-1] == ' '; *--end = '\0') {}
        bool ok = !strncmp(key, "data.", 5) && strcmp(key, "data.task") && strcmp(key, "data.seq_len") &&
                  strncmp(key, "data.resolved", 13);
        for (size_t j = 0; j < sizeof allowed / sizeof allowed[0]; j++) ok |= !strcmp(key, allowed[j]);
        if (!ok)
            cmd_fail_all(EXIT_USAGE,
                         "eval --set %s: eval changes data keys (not data.task, data.seq_len), train.eval_batches "
                         "and train.eval_readouts; the model is the checkpoint's",
                         overrides[i]);
        status st;
        if (config_apply_override(c, overrides[i], &st) != 0) cmd_fail_all(st.code, "%s", st.message);
        if (!strcmp(key, "data.path")) c->data_resolved[0] = '\0';
        if (!strcmp(key, "data.eval_path")) c->eval_resolved[0] = '\0';
        if (!strcmp(key, "data.tokenizer")) c->tokenizer_checksum[0] = '\0';
    }
    status st;
    if (n > 0 && (config_check(c, "eval --set", &st) != 0 || config_resolve_data_path(c, true, &st) != 0))
        cmd_fail_all(st.code, "%s", st.message);
}

/* --batches: N, or (-1) every window of the text eval split once. */
static void choose_eval_batches(model *m, data_shard *shard, int batches) {
    if (batches > 0) m->cfg.eval_batches = batches;
    if (batches >= 0) return;
    long long windows = data_eval_windows(shard->data);
    if (windows <= 0) cmd_fail_all(EXIT_USAGE, "eval --batches all: only for data.task = text");
    data_eval_in_order(shard->data);
    long long n = (windows + m->cfg.batch_size - 1) / m->cfg.batch_size;
    if (n > (1 << 30)) cmd_fail_all(EXIT_USAGE, "eval --batches all: %lld batches is too many", n);
    m->cfg.eval_batches = (int)n;
    log_rank0("eval: all %lld windows of %d tokens in %d batches of %d\n", windows, m->cfg.seq_len, (int)n,
              m->cfg.batch_size);
}

int command_eval(const char *ckpt, bool stream, int segment, int n_overrides, char *const *overrides, int batches) {
    loaded_checkpoint c = {.history = false};
    load_checkpoint(ckpt, &c);
    log_rank0("checkpoint: %s\n", c.path);
    model m = c.m;
    apply_eval_overrides(&m.cfg, n_overrides, overrides);
    /* a segment longer than a sequence streams nothing more, and would size buffers by it */
    if (stream && segment > m.cfg.seq_len)
        cmd_fail_all(EXIT_USAGE, "--segment %d exceeds the checkpoint's data.seq_len = %d", segment, m.cfg.seq_len);
    data_shard shard;
    status err;
    cmd_fail_if_any(data_shard_open(&shard, &m.cfg, &err), &err); /* a node-local data file may fail on one rank */
    choose_eval_batches(&m, &shard, batches);
    evaluator *ev = evaluator_create(&m, &shard, stream ? segment : 0, &err);
    /* a model that cannot stream is refused alike on every rank, before any work */
    if (!ev) cmd_fail_all(err.code, "%s", err.message);
    if (evaluate(ev, &m, &shard, &err) != 0) cmd_fail(err.code, "%s", err.message);
    const eval_result *r = evaluator_result(ev);
    print_eval("eval", &r->metrics, m.cfg.task);
    if (r->length_eval) {
        char how[96];
        chain_periods p = chain_periods_of(&m.cfg, true);
        snprintf(how, sizeof how, "eval, length generalisation (periods %d..%d)", p.lo, p.hi);
        print_eval(how, &r->length_metrics, m.cfg.task);
    }
    if (r->gains_measured) {
        log_rank0("gain_R");
        for (int l = 0; l < m.L; l++) log_rank0(" %.4f", r->gain_R[l]);
        log_rank0("\n");
    }
    if (dist_rank() == 0 && m.cfg.task == TASK_CHAIN) {
        print_attention_scores("attention read-out", r->attn, m.L, m.H);
        if (r->length_eval) print_attention_scores("attention read-out (length eval)", r->length_attn, m.L, m.H);
    }
    if (r->streamed) {
        char how[64];
        snprintf(how, sizeof how, "eval --stream (segments of %d)", segment);
        print_eval(how, &r->stream_metrics, m.cfg.task);
        log_rank0("stream max |logit difference| vs full forward: %.3e\n", r->stream_max_diff);
    }
    evaluator_free(ev);
    data_shard_close(&shard);
    model_free(&m);
    return 0;
}

int command_init(const char *config_path, int n_overrides, char *const *overrides, const char *out, bool force) {
    const char *inputs[] = {config_path};
    cmd_check_output("--out", out, inputs, 1, force);
    config c = cmd_load_config(config_path, n_overrides, overrides);
    model m;
    status err;
    if (model_create(&m, &c, &err) != 0) cmd_fail_all(err.code, "%s", err.message);
    trainer_draw_weights(&m); /* under mpirun, a share each */
    checkpoint_info info = {.world_size = dist_size()};
    int rc = dist_rank() == 0 ? store_write_checkpoint(out, &m, &info, NULL, NULL, H5WRITER_ALONE, &err) : 0;
    cmd_fail_if_any(rc, &err);
    log_rank0("wrote %s: %zu parameters\n", out, m.n_params);
    model_free(&m);
    return 0;
}

int command_loss(const char *ckpt, const char *tokens, const char *grads, bool force) {
    const char *inputs[] = {ckpt, tokens};
    if (grads) cmd_check_output("--grads", grads, inputs, 2, force);
    model m;
    data_batch b;
    status err;
    int rc = checkpoint_load_model(ckpt, &m, true, &err);
    if (rc == 0) rc = token_input_read_batch(tokens, &m, &b, &err);
    cmd_fail_if_any(rc, &err);
    model_forward(&m, b.inputs, b.targets, b.labels, b.B, b.T, false);
    long long count;
    double sum = model_loss_sum(&m, b.targets, b.B, b.T, &count);
    double loss = count > 0 ? sum / count : 0.0;
    log_rank0("loss %.9g\n", loss);
    if (grads) {
        model_backward(&m, b.inputs, b.targets, b.labels, b.B, b.T, count > 0 ? (float)(1.0 / count) : 0.0f, NULL,
                       false);
        rc = dist_rank() == 0 ? store_write_grads(grads, &m, loss, &err) : 0;
        cmd_fail_if_any(rc, &err);
    }
    data_batch_free(&b);
    model_free(&m);
    return 0;
}
