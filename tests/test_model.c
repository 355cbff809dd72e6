/* Whole-model finite-difference test: the gradient of every tensor of a
 * tiny model (several attention/momentum/head variants) against central
 * differences of the loss, on a few sampled entries per tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/cmd_common.h"
#include "momfmm/dist.h"
#include "momfmm/model.h"
#include "momfmm/status.h"
#include "momfmm/sys.h"
#include "test_util.h"

#define B 2
#define T 9

typedef struct {
    model *m;
    int32_t inputs[B * T], targets[B * T], labels[B];
} case_ctx;

static double loss_of(case_ctx *c) {
    model_forward(c->m, c->inputs, c->targets, c->labels, B, T, false);
    long long count;
    double sum = model_loss_sum(c->m, c->targets, B, T, &count);
    return sum / (double)count;
}

/* Central differences of about 12 evenly spaced entries of one tensor, one
 * check per tensor, against 3e-2 of the tensor's largest gradient (at least
 * 1e-4): sampling keeps the 8 variants' hundreds of tensors fast. */
static void fd_tensor(case_ctx *c, const model_param *e, const char *tag) {
    model *m = c->m;
    size_t stride = e->numel > 12 ? e->numel / 12 : 1;
    double max_err = 0, max_grad = 0;
    for (size_t i = 0; i < e->numel; i++) {
        double g = fabs(m->grads[e->offset + i]);
        if (g > max_grad) max_grad = g;
    }
    for (size_t i = 0; i < e->numel; i += stride) {
        float *p = m->params + e->offset + i, saved = *p;
        const float eps = 1e-2f;
        *p = saved + eps;
        double plus = loss_of(c);
        *p = saved - eps;
        double minus = loss_of(c);
        *p = saved;
        double err = fabs((plus - minus) / (2 * eps) - m->grads[e->offset + i]);
        if (!(err <= max_err)) max_err = err; /* a NaN gradient or loss fails */
    }
    double bound = 3e-2 * (max_grad > 1e-4 ? max_grad : 1e-4);
    char name[160];
    snprintf(name, sizeof name, "%s: %s", tag, e->name);
    test_check(max_err <= bound, name, "max_err %.3e  max|grad| %.3e  bound %.3e", max_err, max_grad, bound);
}

static void run_case(const char *tag, void (*adjust)(config *)) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 11, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 24;
    cfg.seq_len = T, cfg.chain_len = 3, cfg.fmm_chunk = 4, cfg.fmm_bandwidth = 3;
    adjust(&cfg);
    model m;
    status st;
    char name[160];
    snprintf(name, sizeof name, "%s: model_create", tag);
    int rc = model_create(&m, &cfg, &st);
    if (!test_check(rc == 0, name, rc ? "%s" : NULL, st.message)) return;
    model_init_parameters(&m);
    uint64_t state = 7;
    /* larger weights than the 0.02 init make every path carry gradient */
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.3f * fd_uniform(&state);
    for (size_t i = 0; i < m.n_buffer; i++) m.buffers[i] = 0.5f * fd_uniform(&state);
    case_ctx c = {.m = &m};
    for (int i = 0; i < B * T; i++) {
        c.inputs[i] = (int32_t)((i * 7 + 3) % cfg.vocab_size);
        c.targets[i] = i % 5 == 2 ? -1 : (int32_t)((i * 5 + 1) % cfg.vocab_size);
    }
    c.labels[0] = 3, c.labels[1] = 7;
    if (cfg.head == HEAD_CLS) c.targets[B * T - 1] = -1;
    loss_of(&c);
    long long count;
    double sum = model_loss_sum(&m, c.targets, B, T, &count);
    (void)sum;
    model_zero_grads(&m);
    model_backward(&m, c.inputs, c.targets, c.labels, B, T, (float)(1.0 / count), NULL);
    for (int i = 0; i < m.n_entries; i++) fd_tensor(&c, &m.entries[i], tag);
    model_free(&m);
}

static void softmax_causal(config *c) { (void)c; }
static void softmax_full(config *c) { c->causal = false; }
static void momentum_post(config *c) { c->gamma = 0.3; }
static void momentum_all(config *c) {
    c->learn_gamma = true, c->gamma = 0.2, c->beta = 0.5, c->gamma2 = 0.1, c->anchor = false;
}
static void momentum_pre_q(config *c) {
    c->gamma = 0.3, c->placement = PLACEMENT_PRE_ROPE, c->apply_to = APPLY_Q, c->anchor = false;
}
static void fmm_two_kernels(config *c) {
    c->attention = ATTENTION_FMM;
    c->fmm_kernels = (config_list){2, {FEATURE_ELU, FEATURE_ELU_FLIP}};
}
static void fmm_momentum_full(config *c) {
    c->attention = ATTENTION_FMM, c->causal = false, c->learn_gamma = true, c->gamma = 0.2;
    c->fmm_kernels = (config_list){1, {FEATURE_TANH}};
}
static void cls_head(config *c) { c->head = HEAD_CLS, c->n_classes = 10, c->task = TASK_LISTOPS, c->causal = false; }

int main(int argc, char **argv) {
    cmd_dist_init(&argc, &argv);
    run_case("model softmax causal", softmax_causal);
    run_case("model softmax non-causal", softmax_full);
    run_case("model momentum post_rope", momentum_post);
    run_case("model momentum learned beta gamma2 unanchored", momentum_all);
    run_case("model momentum pre_rope q unanchored", momentum_pre_q);
    run_case("model fmm elu,elu_flip", fmm_two_kernels);
    run_case("model fmm tanh non-causal learned gamma", fmm_momentum_full);
    run_case("model cls head", cls_head);
    int rc = test_summary("test_model");
    dist_finalize();
    return rc;
}
