/* inspect, eval and generate (SPEC 5): everything here needs only a
 * checkpoint's root attributes, /model and /buffers (plus /metrics for
 * inspect's history). */
#include "momfmm/inference.h"

#include <ctype.h>
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/checkpoint.h"
#include "momfmm/common.h"
#include "momfmm/kernels.h"
#include "momfmm/readouts.h"
#include "momfmm/rng.h"
#include "momfmm/stream.h"
#include "momfmm/train.h"

/* A trainer whose state is the checkpoint's (config, weights, buffers). */
static void load_trainer(const char *ckpt, trainer *t, checkpoint_info *info, bool with_history) {
    config cfg;
    checkpoint_read_config(ckpt, &cfg, info);
    trainer_create(t, &cfg);
    checkpoint_read_state(ckpt, &t->model, false, with_history ? &t->train_log : NULL,
                          with_history ? &t->eval_log : NULL);
    t->step = info->step;
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

/* SPEC 1.2 read-out: the shear as a high-pass filter, per layer and head. */
static void print_filter_gains(const model *m) {
    if (!m->momentum) {
        printf("momentum: off\n");
        return;
    }
    double *gammas = xcalloc((size_t)m->L * m->H, sizeof(double));
    momentum_gammas(m, gammas);
    printf("momentum filter |H| per head (DC, Nyquist) with beta %g, gamma2 %g, %s gamma:\n", m->cfg.beta,
           m->cfg.gamma2, m->cfg.learn_gamma ? "learned" : "fixed");
    for (int l = 0; l < m->L; l++) {
        printf("  block %d:", l);
        for (int h = 0; h < m->H; h++) {
            double g = gammas[l * m->H + h];
            printf("  h%d gamma %.4f |H(0)| %.4f |H(pi)| %.4f", h, g, momentum_filter_gain(0, g, m->cfg.beta, m->cfg.gamma2),
                   momentum_filter_gain(M_PI, g, m->cfg.beta, m->cfg.gamma2));
        }
        printf("\n");
    }
    free(gammas);
}

int command_inspect(const char *ckpt) {
    trainer t;
    checkpoint_info info;
    load_trainer(ckpt, &t, &info, true);
    if (process_rank() == 0) {
        char *ini = config_to_ini(&t.cfg);
        printf("checkpoint %s\nstep %lld | tokens_seen %lld | written by %d rank%s\n", ckpt, info.step,
               info.tokens_seen, info.world_size, info.world_size == 1 ? "" : "s");
        print_parameter_groups(&t.model);
        print_last_row("train metrics", &t.train_log);
        print_last_row("eval metrics", &t.eval_log);
        print_filter_gains(&t.model);
        printf("config:\n%s", ini);
        free(ini);
    }
    trainer_free(&t);
    return 0;
}

/* Streams this rank's eval rows in segments; returns the largest logit
 * difference from the full forward and fills losses/predictions from the
 * streamed logits. */
static double stream_batch(model *m, const batch *b, int segment, const float *full_logits, float *losses,
                           int32_t *predictions) {
    int T = b->T, S = b->B, V = m->V;
    stream_state st;
    status err;
    if (stream_create(&st, m, S, T, segment, &err)) fail_all(err.code, "%s", err.message);
    float *seg_logits = xcalloc((size_t)S * segment * V, sizeof(float));
    int32_t *tokens = xcalloc((size_t)S * segment, sizeof(int32_t));
    float *probs = xcalloc((size_t)V, sizeof(float));
    double max_diff = 0;
    for (int pos = 0; pos < T; pos += segment) {
        int n = T - pos < segment ? T - pos : segment;
        for (int s = 0; s < S; s++) memcpy(tokens + (size_t)s * n, b->inputs + (size_t)s * T + pos, sizeof(int32_t) * n);
        if (stream_forward(m, &st, tokens, n, seg_logits, &err)) fail(err.code, "%s", err.message);
        for (int s = 0; s < S; s++)
            for (int r = 0; r < n; r++) {
                size_t at = (size_t)s * T + pos + r;
                const float *mine = seg_logits + ((size_t)s * n + r) * V, *full = full_logits + at * V;
                for (int v = 0; v < V; v++) max_diff = fmax(max_diff, fabs((double)mine[v] - full[v]));
                memcpy(probs, mine, sizeof(float) * V);
                cross_entropy_forward(probs, losses + at, predictions + at, b->targets + at, 1, V);
            }
    }
    free(seg_logits), free(tokens), free(probs);
    stream_free(&st);
    return max_diff;
}

static void print_eval(const char *how, const eval_metrics *e) {
    log_rank0("%s | loss %.6f | L_new %.6f | L_rep %.6f | delta_12 %.6f | acc %.6f | exact %.6f\n", how, e->loss,
              e->L_new, e->L_rep, e->delta_12, e->acc, e->exact_match);
}

int command_eval(const char *ckpt, bool stream, int segment) {
    trainer t;
    checkpoint_info info;
    load_trainer(ckpt, &t, &info, false);
    eval_metrics e;
    trainer_log_eval(&t, &e);
    print_eval("eval", &e);
    const double *gain_R = t.eval_log.values + 7 + OCCURRENCE_BINS;
    log_rank0("gain_R");
    for (int l = 0; l < t.model.L; l++) log_rank0(" %.4f", gain_R[l]);
    log_rank0("\n");
    if (stream) {
        model *m = &t.model;
        batch *b = &t.batch;
        size_t rows = (size_t)b->B * b->T;
        float *full = xcalloc(rows * m->V, sizeof(float)), *losses = xcalloc(rows, sizeof(float));
        int32_t *predictions = xcalloc(rows, sizeof(int32_t));
        metric_sums sums;
        memset(&sums, 0, sizeof sums);
        double max_diff = 0;
        for (int i = 0; i < t.cfg.eval_batches; i++) {
            data_fill(t.data, b, SPLIT_EVAL, i, t.shard_first);
            model_forward(m, b->inputs, b->targets, b->labels, b->B, b->T, false);
            /* model_forward leaves probabilities; logits are recomputed for the comparison */
            matmul_forward(full, m->acts.ln_f, m->w.head_weight, NULL, (int)rows, m->d, m->V);
            max_diff = fmax(max_diff, stream_batch(m, b, segment, full, losses, predictions));
            metrics_accumulate(&sums, b, losses, predictions, false, m->V);
        }
        dist_sum_doubles((double *)&sums, (int)METRIC_SUMS_DOUBLES);
        metrics_finish(&sums, &e);
        double global_diff = max_diff;
        MPI_Allreduce(&max_diff, &global_diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        char how[64];
        snprintf(how, sizeof how, "eval --stream (segments of %d)", segment);
        print_eval(how, &e);
        log_rank0("stream max |logit difference| vs full forward: %.3e\n", global_diff);
        free(full), free(losses), free(predictions);
    }
    trainer_free(&t);
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
    checkpoint_load_model(ckpt, &m);
    int32_t *tokens;
    int n_prompt = parse_prompt(prompt, m.V, &tokens);
    stream_state st;
    status err;
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
