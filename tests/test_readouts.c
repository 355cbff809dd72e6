/* gain_R and gain_R_attn of docs/metrics.md §3 on a tiny model, without finite
 * differences: the attention sublayer's ratio is exactly 0 when its output
 * projection is zero, scales with that projection (it excludes the residual
 * path), and bounds the whole block's ratio when the MLP is silenced. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "momfmm/cmd_common.h"
#include "momfmm/dist.h"
#include "momfmm/model.h"
#include "momfmm/readouts.h"
#include "momfmm/status.h"
#include "momfmm/sys.h"
#include "test_util.h"

#define B 3
#define T 12
#define LAYERS 2

typedef struct {
    double block[LAYERS], attn[LAYERS];
} ratios;

static bool make_model(model *m, double gamma) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 13, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = LAYERS, cfg.d_ff = 24;
    cfg.seq_len = T, cfg.chain_len = 3, cfg.gamma = gamma;
    status st;
    int rc = model_create(m, &cfg, &st);
    if (!test_check(rc == 0, "model_create", rc ? "%s" : NULL, st.message)) return false;
    model_init_parameters(m);
    uint64_t state = 11;
    for (size_t i = 0; i < m->n_params; i++) m->params[i] += 0.3f * fd_uniform(&state);
    return true;
}

static ratios measure(model *m) {
    int32_t inputs[B * T], targets[B * T], labels[B] = {0};
    for (int i = 0; i < B * T; i++) inputs[i] = (int32_t)((i * 7 + 2) % m->V), targets[i] = (int32_t)((i * 3) % m->V);
    model_forward(m, inputs, targets, labels, B, T, false);
    ratios r;
    memset(&r, 0, sizeof r);
    readouts_block_gains(m, B, T, 5, 0, r.block, r.attn);
    for (int l = 0; l < LAYERS; l++) r.block[l] /= B, r.attn[l] /= B;
    return r;
}

static void zero(float *x, size_t n) { memset(x, 0, sizeof(float) * n); }

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
    int rc = test_summary("test_readouts");
    dist_finalize();
    return rc;
}
