/* gain_R and gain_R_attn of docs/metrics.md §3 on a tiny model, without finite
 * differences: the attention sublayer's ratio is exactly 0 when its output
 * projection is zero, scales with that projection (it excludes the residual
 * path), and bounds the whole block's ratio when the MLP is silenced.
 * The attention read-out: the weights attention_weight reads back from the
 * saved state reproduce every head's output (out_i = sum_j w_ij v_j) for
 * dense and tiled softmax (probabilities kept, and log-sum-exp only past
 * T = 256) and FMM, causal and not, with momentum; and the scores count the
 * queries the definition names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "eval/readouts.h"
#include "model/model.h"
#include "parallel/dist.h"
#include "test_util.h"

#define B 3
#define T 12
#define LAYERS 2

typedef struct {
    double block[LAYERS], attn[LAYERS];
} ratios;

static bool make_model_with(model *m, double gamma, config_attention_impl impl) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 13, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = LAYERS, cfg.d_ff = 24;
    cfg.seq_len = T, cfg.chain_len = 3, cfg.gamma = gamma, cfg.attention_impl = impl;
    status st;
    int rc = model_create(m, &cfg, &st);
    if (!test_check(rc == 0, "model_create", rc ? "%s" : NULL, st.message)) return false;
    model_init_parameters(m);
    uint64_t state = 11;
    for (size_t i = 0; i < m->n_params; i++) m->params[i] += 0.3f * fd_uniform(&state);
    return true;
}

static bool make_model(model *m, double gamma) { return make_model_with(m, gamma, ATTENTION_TILED); }

/* The read-outs' working memory for B rows of T, as the evaluator makes it. */
static readouts_scratch scratch_make(const model *m) {
    return (readouts_scratch){calloc(readouts_scratch_floats(m, B, T, true), sizeof(float)), calloc(B, sizeof(double)),
                              calloc((size_t)m->V + T, sizeof(int))};
}

static void scratch_free(readouts_scratch *s) { free(s->copies), free(s->delta_norms), free(s->tokens); }

static ratios measure(model *m) {
    int32_t inputs[B * T], targets[B * T], labels[B] = {0};
    for (int i = 0; i < B * T; i++) inputs[i] = (int32_t)((i * 7 + 2) % m->V), targets[i] = (int32_t)((i * 3) % m->V);
    model_forward(m, inputs, targets, labels, B, T, false);
    ratios r;
    memset(&r, 0, sizeof r);
    readouts_scratch scratch = scratch_make(m);
    readouts_block_gains(m, B, T, 5, 0, r.block, r.attn, &scratch);
    scratch_free(&scratch);
    for (int l = 0; l < LAYERS; l++) r.block[l] /= B, r.attn[l] /= B;
    return r;
}

static void zero(float *x, size_t n) { memset(x, 0, sizeof(float) * n); }

/* The largest |out_i - sum_j w_ij v_j| over the heads and queries of layer l,
 * relative to the largest |out|, after a forward of b_rows rows of t. */
static double weights_error(model *m, int l, int b_rows, int t) {
    attention_layer view = model_attention_layer(m, l, false);
    attention_saved saved = model_attention_saved(m, l, b_rows, t);
    const float *out = m->acts.att_out + (size_t)l * b_rows * t * m->d;
    double worst = 0, scale = 0;
    for (int b = 0; b < b_rows; b++)
        for (int h = 0; h < m->H; h++) {
            const float *v = saved.v_heads + ((size_t)b * m->H + h) * t * m->dh;
            for (int i = 0; i < t; i += (t > 64 ? 7 : 1))
                for (int c = 0; c < m->dh; c++) {
                    double sum = 0, o = out[((size_t)b * t + i) * m->d + h * m->dh + c];
                    for (int j = 0; j < t; j++)
                        sum += attention_weight(&view, &saved, b, h, t, i, j) * v[j * m->dh + c];
                    worst = fmax(worst, fabs(sum - o));
                    scale = fmax(scale, fabs(o));
                }
        }
    return worst / (scale > 0 ? scale : 1);
}

static void test_attention_weights(void) {
    const struct {
        const char *name;
        int kind, impl, t;
        bool causal;
    } cases[] = {{"dense softmax", ATTENTION_SOFTMAX, ATTENTION_DENSE, 20, true},
                 {"tiled softmax, probabilities kept", ATTENTION_SOFTMAX, ATTENTION_TILED, 20, true},
                 {"tiled softmax, log-sum-exp (T 300)", ATTENTION_SOFTMAX, ATTENTION_TILED, 300, true},
                 {"FMM band 3, elu + elu_flip", ATTENTION_FMM, ATTENTION_TILED, 40, true},
                 {"FMM non-causal", ATTENTION_FMM, ATTENTION_TILED, 24, false}};
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        config cfg;
        config_defaults(&cfg);
        cfg.vocab_size = 13, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 24;
        cfg.seq_len = cases[n].t, cfg.gamma = 0.2, cfg.attention = cases[n].kind, cfg.attention_impl = cases[n].impl;
        cfg.causal = cases[n].causal, cfg.fmm_bandwidth = 3, cfg.fmm_kernels = (config_list){2, {0, 1}};
        model m;
        status st;
        if (!test_check(model_create(&m, &cfg, &st) == 0, "attention weights: model", "%s", st.message)) continue;
        model_init_parameters(&m);
        uint64_t state = 5;
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.5f * fd_uniform(&state);
        int t = cases[n].t;
        int32_t *tokens = sys_calloc(2 * (size_t)t, sizeof(int32_t));
        for (int i = 0; i < 2 * t; i++) tokens[i] = (int32_t)((i * 5 + 1) % 13);
        model_forward(&m, tokens, tokens, NULL, 2, t, false);
        char name[96];
        snprintf(name, sizeof name, "attention weights give the output: %s", cases[n].name);
        for (int l = 0; l < 2; l++) test_within(name, weights_error(&m, l, 2, t), 2e-5);
        free(tokens);
        model_free(&m);
    }
}

/* Period 3 without fillers: the positional key i - 2 is the induction key,
 * so no query counts; a filler (-1 target before it) shifts them apart. */
static void test_attention_scores(void) {
    model m;
    if (!make_model(&m, 0.0)) return;
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) x[i] = (int32_t)(i % T % 3), y[i] = (int32_t)((i % T + 1) % 3);
    model_forward(&m, x, y, NULL, B, T, false);
    double sums[2 * 2 * LAYERS + 1] = {0};
    readouts_scratch scratch = scratch_make(&m);
    readouts_attention_scores(&m, x, y, B, T, 3, sums, &scratch);
    test_check(sums[2 * 2 * LAYERS] == 0, "attention scores: no query where the two keys coincide", "%g",
               sums[2 * 2 * LAYERS]);
    /* row 0: 0 1 2 9 0 1 2 0 1 2 0 1: from t = 4 the induction key is one past the positional one */
    int32_t row[T] = {0, 1, 2, 9, 0, 1, 2, 0, 1, 2, 0, 1};
    memcpy(x, row, sizeof row);
    model_forward(&m, x, y, NULL, B, T, false);
    memset(sums, 0, sizeof sums);
    readouts_attention_scores(&m, x, y, B, T, 3, sums, &scratch);
    /* queries t = 4, 5, 6 (previous occurrence before the 9) differ; t >= 7 coincide again */
    test_check(sums[2 * 2 * LAYERS] == 3, "attention scores: the queries whose keys differ count", "%g",
               sums[2 * 2 * LAYERS]);
    bool in_range = true;
    for (int i = 0; i < 2 * 2 * LAYERS; i++) in_range &= sums[i] >= 0 && sums[i] <= 3;
    test_check(in_range, "attention scores: summed weights within [0, queries]", NULL);
    scratch_free(&scratch);
    model_free(&m);
}

/* Head h of layer l attends by the pattern `kind` on every query of row b:
 * 0 one-hot on the induction key, 1 one-hot on the positional key, 2 a
 * quarter on the induction and three quarters on the positional key, 3
 * uniform over the causal keys. keys[i] = {positional, induction}, or -1. */
static void set_pattern(model *m, int l, int b, int h, int kind, const int (*keys)[2]) {
    attention_layer view = model_attention_layer(m, l, false);
    attention_saved saved = model_attention_saved(m, l, B, T);
    attention_layer_sizes z = {view.cfg, view.fmm, NULL, T};
    float *p = saved.saved + ((size_t)b * m->H + h) * attention_saved_per_head(&z);
    for (int i = 0; i < T; i++) {
        for (int j = 0; j < T; j++) p[i * T + j] = j <= i ? 1.0f / (float)(i + 1) : 0.0f;
        if (kind == 3 || keys[i][0] < 0) continue;
        for (int j = 0; j <= i; j++) p[i * T + j] = 0.0f;
        if (kind == 0) p[i * T + keys[i][1]] = 1.0f;
        if (kind == 1) p[i * T + keys[i][0]] = 1.0f;
        if (kind == 2) p[i * T + keys[i][1]] = 0.25f, p[i * T + keys[i][0]] = 0.75f;
    }
}

/* The scores on a constructed attention pattern, where the answer is known
 * (docs/metrics.md §3): the saved probabilities of dense softmax replaced
 * after the forward by one-hot, mixed and uniform weights. Row 0 is period
 * 3 with a token 9 inserted, so queries 4, 5, 6 have positional keys 2, 3, 4
 * and induction keys 1, 2, 3; rows 1 and 2 have none. */
static void test_attention_constructed(void) {
    model m;
    if (!make_model_with(&m, 0.0, ATTENTION_DENSE)) return;
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) x[i] = (int32_t)(i % T % 3), y[i] = (int32_t)((i % T + 1) % 3);
    const int32_t row[T] = {0, 1, 2, 9, 0, 1, 2, 0, 1, 2, 0, 1};
    memcpy(x, row, sizeof row);
    model_forward(&m, x, y, NULL, B, T, false);
    int keys[T][2];
    for (int i = 0; i < T; i++) keys[i][0] = keys[i][1] = -1;
    for (int i = 4; i <= 6; i++) keys[i][0] = i - 2, keys[i][1] = i - 3;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 4; k++) set_pattern(&m, k / 2, b, k % 2, k, (const int(*)[2])keys);
    double sums[2 * 2 * LAYERS + 1] = {0};
    readouts_scratch scratch = scratch_make(&m);
    readouts_attention_scores(&m, x, y, B, T, 3, sums, &scratch);
    scratch_free(&scratch);
    int LH = 2 * LAYERS;
    double uniform = 1.0 / 5 + 1.0 / 6 + 1.0 / 7;
    /* [layer][head]: positional, induction sums over the 3 counted queries */
    const double want[4][2] = {{0, 3}, {3, 0}, {2.25, 0.75}, {uniform, uniform}};
    double worst = fabs(sums[LH] - 3);
    for (int k = 0; k < 4; k++) worst = fmax(worst, fmax(fabs(sums[k] - want[k][0]), fabs(sums[LH + k] - want[k][1])));
    test_within("attention scores on a constructed pattern: induction, positional, mixed, uniform heads", worst, 1e-6);
    model_free(&m);
}

int main(int argc, char **argv) {
    cmd_dist_init(&argc, &argv);
    size_t dd = 16 * 16;
    for (int variant = 0; variant < 2; variant++) {
        double gamma = variant ? 0.2 : 0.0;
        model m;
        if (!make_model(&m, gamma)) continue;
        ratios base = measure(&m);
        for (int l = 0; l < LAYERS; l++)
            test_check(base.attn[l] > 0 && base.block[l] > 0, "both ratios positive", "gamma %.1f layer %d: %.6f %.6f",
                       gamma, l, base.block[l], base.attn[l]);
        /* halving one layer's output projection (bias zero) halves that layer's A, so its
         * R_attn halves: a ratio that kept the residual path would not. Only that layer's
         * own ratio is compared, as the layers above see a changed input. */
        for (int l = 0; l < LAYERS; l++) zero(m.w.blocks[l].proj_bias, 16);
        ratios full = measure(&m);
        for (int l = 0; l < LAYERS; l++) {
            float *w = m.w.blocks[l].proj_weight;
            for (size_t i = 0; i < dd; i++) w[i] *= 0.5f;
            ratios half = measure(&m);
            for (size_t i = 0; i < dd; i++) w[i] *= 2.0f; /* exact: a power of two */
            test_check(fabs(full.attn[l] - 2 * half.attn[l]) <= 1e-3 * full.attn[l], "R_attn linear in W_proj",
                       "gamma %.1f layer %d: %.6f %.6f", gamma, l, full.attn[l], 2 * half.attn[l]);
        }
        /* MLP silenced: F(x) = x + A(LN1(x)), so |gain_R - 1| <= R_attn <= gain_R + 1 */
        for (int l = 0; l < LAYERS; l++) {
            zero(m.w.blocks[l].mlp_proj_weight, (size_t)m.d_ff * 16);
            zero(m.w.blocks[l].mlp_proj_bias, 16);
        }
        ratios no_mlp = measure(&m);
        for (int l = 0; l < LAYERS; l++) {
            double g = no_mlp.block[l], a = no_mlp.attn[l];
            test_check(fabs(g - 1) <= a + 1e-4 && a <= g + 1 + 1e-4, "|gain_R - 1| <= R_attn <= gain_R + 1",
                       "gamma %.1f layer %d: %.6f %.6f", gamma, l, g, a);
        }
        /* output projection zero: the attention sublayer's output never moves */
        for (int l = 0; l < LAYERS; l++) zero(m.w.blocks[l].proj_weight, dd);
        ratios silent = measure(&m);
        for (int l = 0; l < LAYERS; l++) {
            test_check(silent.attn[l] == 0, "R_attn = 0 with W_proj = 0, b_proj = 0", "gamma %.1f layer %d: %.6f",
                       gamma, l, silent.attn[l]);
            /* and the block is the identity plus a silenced MLP: gain_R = 1 */
            test_check(fabs(silent.block[l] - 1) <= 1e-4, "gain_R = 1 then (identity block)",
                       "gamma %.1f layer %d: %.6f", gamma, l, silent.block[l]);
        }
        model_free(&m);
    }
    test_attention_weights();
    test_attention_scores();
    test_attention_constructed();
    int rc = test_summary("test_readouts");
    dist_finalize();
    return rc;
}
