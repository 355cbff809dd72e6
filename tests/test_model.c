/* Whole-model finite-difference test: the gradient of every tensor of a
 * tiny model (several attention/momentum/head variants) against central
 * differences of the loss, on a few sampled entries per tensor. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "parallel/dist.h"
#include "test_util.h"
#include "training/optimizer.h"

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

/* Without `accumulate` every gradient is written, none left from before:
 * backward over NaN gradients equals backward added to zeros, bit for bit. */
static void check_overwrite(case_ctx *c, long long count, const char *tag) {
    model *m = c->m;
    size_t bytes = sizeof(float) * m->n_params;
    float *added = malloc(bytes);
    memset(m->grads, 0, bytes);
    loss_of(c); /* backward consumes the forward's probabilities */
    model_backward(m, c->inputs, c->targets, c->labels, B, T, (float)(1.0 / count), NULL, true);
    memcpy(added, m->grads, bytes);
    for (size_t i = 0; i < m->n_params; i++) m->grads[i] = NAN;
    loss_of(c);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, (float)(1.0 / count), NULL, false);
    char name[160];
    snprintf(name, sizeof name, "%s: backward overwrites every gradient", tag);
    test_check(memcmp(added, m->grads, bytes) == 0, name, NULL);
    free(added);
}

/* The kernels other than GEMMs give the same floats on 1 and 3 OpenMP
 * threads (docs/design.md §8.10); the products stay on one thread here
 * (OpenBLAS's results depend on how a product is cut, gemm.c), as they do
 * when called inside the parallel heads. */
static void check_threads(case_ctx *c, long long count, const char *tag) {
    model *m = c->m;
    size_t bytes = sizeof(float) * m->n_params;
    float *one = malloc(bytes);
    int before = omp_get_max_threads();
    kernel_set_parallel_min(1); /* this model's kernels are far below the threshold */
    omp_set_num_threads(1);
    loss_of(c);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, (float)(1.0 / count), NULL, false);
    memcpy(one, m->grads, bytes);
    omp_set_num_threads(3);
    loss_of(c);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, (float)(1.0 / count), NULL, false);
    omp_set_num_threads(before);
    kernel_set_parallel_min(0);
    char name[160];
    snprintf(name, sizeof name, "%s: the same gradients on 1 and 3 threads", tag);
    test_check(memcmp(one, m->grads, bytes) == 0, name, NULL);
    free(one);
}

/* Training's forward leaves the loss's gradient in the softmax's pass
 * (model_forward_train): the same losses and gradients, bit for bit, as
 * the forward and the backward's own cross-entropy pass. */
static void check_forward_train(case_ctx *c, long long count, const char *tag) {
    model *m = c->m;
    size_t bytes = sizeof(float) * m->n_params, n_losses = m->cfg.head == HEAD_CLS ? B : B * T;
    float *two = malloc(bytes), losses[B * T];
    float scale = (float)(1.0 / count);
    loss_of(c);
    memcpy(losses, m->acts.losses, sizeof(float) * n_losses);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
    memcpy(two, m->grads, bytes);
    model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale);
    bool same_losses = !memcmp(losses, m->acts.losses, sizeof(float) * n_losses);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
    char name[160];
    snprintf(name, sizeof name, "%s: forward_train = forward, backward (bits)", tag);
    test_check(same_losses && !memcmp(two, m->grads, bytes), name, NULL);
    free(two);
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
    model_backward(&m, c.inputs, c.targets, c.labels, B, T, (float)(1.0 / count), NULL, false);
    for (int i = 0; i < m.n_entries; i++) fd_tensor(&c, &m.entries[i], tag);
    check_overwrite(&c, count, tag);
    check_threads(&c, count, tag);
    check_forward_train(&c, count, tag);
    model_free(&m);
}

/* AdamW and the gradient norm run in chunks on OpenMP's threads: the same
 * floats on 1 and 3 threads (a model large enough for several chunks). */
static void check_optimizer_threads(void) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 512, cfg.d_model = 128, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 256;
    model m;
    if (!test_check(model_create(&m, &cfg, NULL) == 0, "optimizer threads: model_create", NULL)) return;
    model_init_parameters(&m);
    uint64_t state = 11;
    fd_fill(m.grads, m.n_params, 1.0f, &state);
    size_t bytes = sizeof(float) * m.n_params;
    float *start = malloc(bytes), *one = malloc(bytes);
    memcpy(start, m.params, bytes);
    optimizer_settings s = {1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5f};
    double norm[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        memcpy(m.params, start, bytes);
        memset(m.adam_m, 0, 2 * bytes);
        norm[run] = optimizer_global_norm(m.grads, m.n_params);
        optimizer_step_model(&m, 1, &s);
        if (!run) memcpy(one, m.params, bytes);
    }
    omp_set_num_threads(1);
    test_check(norm[0] == norm[1], "optimizer: the same gradient norm on 1 and 3 threads", "%.17g vs %.17g", norm[0],
               norm[1]);
    test_check(memcmp(one, m.params, bytes) == 0, "optimizer: the same AdamW update on 1 and 3 threads", NULL);
    free(start);
    free(one);
    model_free(&m);
}

/* attention.impl = tiled equals dense within 1e-5 relative at T = 1000: the
 * loss and every gradient (largest difference over the largest magnitude of
 * each tensor), for a causal lm model with momentum. */
static void check_tiled_equals_dense(void) {
    enum { TT = 1000, BB = 2 };
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 29, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 32, cfg.seq_len = TT;
    cfg.gamma = 0.2;
    int32_t *inputs = malloc(sizeof(int32_t) * BB * TT), *targets = malloc(sizeof(int32_t) * BB * TT);
    for (int i = 0; i < BB * TT; i++) {
        inputs[i] = (int32_t)((i * 7 + 3) % 29);
        targets[i] = i % 9 == 4 ? -1 : (int32_t)((i * 5 + 1) % 29);
    }
    float *grads[2] = {NULL, NULL};
    double loss[2];
    model m[2];
    for (int impl = 0; impl < 2; impl++) {
        cfg.attention_impl = impl ? ATTENTION_DENSE : ATTENTION_TILED;
        if (!test_check(model_create(&m[impl], &cfg, NULL) == 0, "tiled vs dense: model_create", NULL)) return;
        model_init_parameters(&m[impl]);
        model_forward(&m[impl], inputs, targets, NULL, BB, TT, false);
        long long count;
        loss[impl] = model_loss_sum(&m[impl], targets, BB, TT, &count) / (double)count;
        model_backward(&m[impl], inputs, targets, NULL, BB, TT, (float)(1.0 / count), NULL, false);
        grads[impl] = m[impl].grads;
    }
    double worst = 0;
    for (int e = 0; e < m[0].n_entries; e++) {
        const model_param *p = &m[0].entries[e];
        double diff = 0, scale = 0;
        for (size_t i = 0; i < p->numel; i++) {
            diff = fmax(diff, fabs(grads[0][p->offset + i] - grads[1][p->offset + i]));
            scale = fmax(scale, fabs(grads[1][p->offset + i]));
        }
        worst = fmax(worst, scale > 0 ? diff / scale : diff);
    }
    double rel = fabs(loss[0] - loss[1]) / fabs(loss[1]);
    test_check(rel <= 1e-5 && worst <= 1e-5, "tiled = dense at T = 1000: loss and every gradient",
               "loss rel %.3g, gradients %.3g", rel, worst);
    model_free(&m[0]);
    model_free(&m[1]);
    free(inputs);
    free(targets);
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
    check_optimizer_threads();
    check_tiled_equals_dense();
    int rc = test_summary("test_model");
    dist_finalize();
    return rc;
}
