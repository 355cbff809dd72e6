/* The commands that read a checkpoint (docs/cli.md §5): inspect, eval and generate.
 * They need only a checkpoint's root attributes, /model and /buffers (plus
 * /metrics for inspect's history): a model for inference, and for eval a
 * data shard and the evaluation module (docs/design.md §8.5), never a
 * trainer. A failed status becomes an exit here (§8.7). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/checkpoint.h"
#include "momfmm/commands.h"
#include "momfmm/common.h"
#include "momfmm/eval.h"
#include "momfmm/readouts.h"
#include "momfmm/rng.h"
#include "momfmm/stream.h"

/* A model for inference holding the checkpoint's weights and buffers, and
 * with `train`/`eval` its metric history; a bad file exits 3. */
static void load_checkpoint(const char *ckpt, model *m, checkpoint_info *info, metric_table *train,
                            metric_table *eval) {
    config cfg;
    status err;
    if (checkpoint_read_config(ckpt, &cfg, info, &err) != 0) fail(err.code, "%s", err.message);
    if (model_create_for_inference(m, &cfg, &err) != 0) fail_all(err.code, "%s", err.message);
    if (train) metric_tables_standard(train, eval, cfg.n_layers, cfg.n_heads);
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
        if (col->width == 1) printf(" %s %.6g", col->name, row[offset]);
        else if (col->inner <= 1) {
            printf(" %s [", col->name);
            for (int j = 0; j < col->width; j++) printf("%s%.4g", j ? " " : "", row[offset + j]);
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
        print_filter_gains(&m);
        printf("config:\n%s", ini);
        free(ini);
    }
    metric_table_free(&train);
    metric_table_free(&eval);
    model_free(&m);
    return 0;
}

static void print_eval(const char *how, const eval_metrics *e) {
    log_rank0("%s | loss %.6f | L_new %.6f | L_rep %.6f | delta_12 %.6f | acc %.6f | exact %.6f\n", how, e->loss,
              e->L_new, e->L_rep, e->delta_12, e->acc, e->exact_match);
}

int command_eval(const char *ckpt, bool stream, int segment) {
    model m;
    checkpoint_info info;
    load_checkpoint(ckpt, &m, &info, NULL, NULL);
    /* a segment longer than a sequence streams nothing more, and would size buffers by it */
    if (stream && segment > m.cfg.seq_len)
        fail_all(EXIT_USAGE, "--segment %d exceeds the checkpoint's data.seq_len = %d", segment, m.cfg.seq_len);
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
    print_eval("eval", &r.metrics);
    log_rank0("gain_R");
    for (int l = 0; l < m.L; l++) log_rank0(" %.4f", r.gain_R[l]);
    log_rank0("\n");
    if (r.streamed) {
        char how[64];
        snprintf(how, sizeof how, "eval --stream (segments of %d)", segment);
        print_eval(how, &r.stream_metrics);
        log_rank0("stream max |logit difference| vs full forward: %.3e\n", r.stream_max_diff);
    }
    eval_result_free(&r);
    rank_shard_close(&shard);
    model_free(&m);
    return 0;
}

static int parse_prompt(const char *text, int vocab, int32_t **out) {
    int n = 0, cap = 16;
    int32_t *tokens = xcalloc((size_t)cap, sizeof(int32_t));
    for (const char *p = text; *p;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab)
            fail_all(EXIT_USAGE, "--prompt: '%.20s' is not a token in [0, %d)", p, vocab);
        if (n == cap) tokens = realloc(tokens, sizeof(int32_t) * (size_t)(cap *= 2));
        tokens[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) fail_all(EXIT_USAGE, "--prompt: no tokens");
    *out = tokens;
    return n;
}

static int32_t pick_token(const float *logits, int V, double temperature, uint64_t key, uint64_t counter) {
    int best = 0;
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (temperature <= 0) return best;
    double total = 0, *weights = xcalloc((size_t)V, sizeof(double));
    for (int v = 0; v < V; v++) total += weights[v] = exp((logits[v] - logits[best]) / temperature);
    double u = rng_uniform(key, counter) * total;
    int chosen = V - 1;
    for (int v = 0; v < V; v++) {
        if (u < weights[v]) {
            chosen = v;
            break;
        }
        u -= weights[v];
    }
    free(weights);
    return chosen;
}

int command_generate(const char *ckpt, const char *prompt, int n_tokens, double temperature, long long seed) {
    model m;
    status err;
    if (checkpoint_load_model(ckpt, &m, false, &err) != 0) fail(err.code, "%s", err.message);
    int32_t *tokens;
    int n_prompt = parse_prompt(prompt, m.V, &tokens);
    stream_state st;
    if (stream_create(&st, &m, 1, n_prompt + n_tokens, n_prompt, &err)) fail_all(err.code, "%s", err.message);
    float *logits = xcalloc((size_t)n_prompt * m.V, sizeof(float));
    if (stream_forward(&m, &st, tokens, n_prompt, logits, &err)) fail(err.code, "%s", err.message);
    const float *last = logits + (size_t)(n_prompt - 1) * m.V;
    uint64_t key = rng_key((uint64_t)seed, 0x6E4, 0, 0);
    log_rank0("prompt:");
    for (int i = 0; i < n_prompt; i++) log_rank0(" %d", tokens[i]);
    log_rank0("\ngenerated:");
    for (int i = 0; i < n_tokens; i++) {
        int32_t next = pick_token(last, m.V, temperature, key, (uint64_t)i);
        log_rank0(" %d", next);
        if (i + 1 < n_tokens) {
            if (stream_forward(&m, &st, &next, 1, logits, &err)) fail(err.code, "%s", err.message);
            last = logits;
        }
    }
    log_rank0("\n");
    free(logits), free(tokens);
    stream_free(&st);
    model_free(&m);
    return 0;
}
