/* Whole-model finite-difference test: the gradient of every tensor of a
 * tiny model (several attention/momentum/head variants) against central
 * differences of the loss, on a few sampled entries per tensor. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "kernels/gemm.h"
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

/* Block 0's attention state as a run on batch row b alone sees it. */
static attention_saved row_of(const model *m, attention_saved s, int b) {
    attention_layer_sizes z = {&m->cfg, &m->fmm, NULL, T};
    size_t heads = (size_t)b * m->H * T * m->dh;
    s.q_hat += heads, s.k_hat += heads, s.v_heads += heads;
    if (s.p_q) s.p_q += heads, s.p_k += heads;
    s.saved += (size_t)b * m->H * attention_saved_per_head(&z);
    s.out += (size_t)b * T * m->d;
    return s;
}

/* Attention runs its (batch row, head) pairs on the threads and adds each
 * row's share of what a head sums over the batch (the momentum buffers'
 * last positions; gamma's and blend's gradients) after them, row by row
 * (docs/design.md §8.10): the same floats, on 1 and 3 threads, as running
 * the rows one at a time, each adding its share as it goes, and the same
 * outputs and input gradients. */
static void check_attention_rows(case_ctx *c, const char *tag) {
    model *m = c->m;
    size_t d = (size_t)m->d, n_sums = (size_t)2 * m->H * m->dh;
    float *qkv = malloc(sizeof(float) * B * T * 3 * d), *d_out = malloc(sizeof(float) * B * T * d);
    float *out = malloc(sizeof(float) * B * T * d), *d_qkv = malloc(sizeof(float) * B * T * 3 * d);
    float *out_first = malloc(sizeof(float) * B * T * d), *d_qkv_first = malloc(sizeof(float) * B * T * 3 * d);
    int before = omp_get_max_threads();
    size_t n_kept = n_sums + 3 * (size_t)m->H; /* buffer sums, d_gamma, d_blend */
    float *first = calloc(n_kept, sizeof(float)), *row_by_row = calloc(n_kept, sizeof(float));
    uint64_t state = 11;
    for (size_t i = 0; i < (size_t)B * T * 3 * d; i++) qkv[i] = fd_uniform(&state);
    for (size_t i = 0; i < (size_t)B * T * d; i++) d_out[i] = fd_uniform(&state);
    loss_of(c); /* the activations carved for B rows of T */
    attention_layer a = model_attention_layer(m, 0, true);
    attention_saved s = model_attention_saved(m, 0, B, T);
    bool same = true;
    for (int run = 0; same && run < 3; run++) {
        omp_set_num_threads(run == 1 ? 3 : 1);
        float *sums = run == 0 ? first : row_by_row;
        /* sums that hold something already (micro-batches add into them), and large beside what is added, so
         * that each add rounds and the order of the adds shows in the last bits */
        uint64_t start = 5;
        for (size_t i = 0; i < n_sums; i++) a.buffer_sums[i] = 64 * fd_uniform(&start);
        for (int h = 0; a.d_gamma && h < m->H; h++) a.d_gamma[h] = 64 * fd_uniform(&start);
        for (int h = 0; a.d_blend && h < 2 * m->H; h++) a.d_blend[h] = 64 * fd_uniform(&start);
        for (int b = 0; b < (run < 2 ? 1 : B); b++) {
            int rows = run < 2 ? B : 1;
            attention_saved view = run < 2 ? s : row_of(m, s, b);
            attention_forward(&a, &view, qkv + (size_t)b * T * 3 * d, out + (size_t)b * T * d, rows, T);
            attention_backward(&a, &view, d_out + (size_t)b * T * d, d_qkv + (size_t)b * T * 3 * d, rows, T);
        }
        memcpy(sums, a.buffer_sums, sizeof(float) * n_sums);
        if (a.d_gamma) memcpy(sums + n_sums, a.d_gamma, sizeof(float) * m->H);
        if (a.d_blend) memcpy(sums + n_sums + m->H, a.d_blend, sizeof(float) * 2 * m->H);
        if (run == 0) memcpy(out_first, out, sizeof(float) * B * T * d);
        if (run == 0) memcpy(d_qkv_first, d_qkv, sizeof(float) * B * T * 3 * d);
        /* run 1: 3 threads against 1; run 2: row by row against the batch */
        same = run == 0 || (memcmp(first, row_by_row, sizeof(float) * n_kept) == 0 &&
                            memcmp(out_first, out, sizeof(float) * B * T * d) == 0 &&
                            memcmp(d_qkv_first, d_qkv, sizeof(float) * B * T * 3 * d) == 0);
    }
    omp_set_num_threads(before);
    char name[160];
    snprintf(name, sizeof name,
             "%s: attention's outputs and sums over the batch = its rows' one by one, on 1 and 3 threads", tag);
    test_check(same, name, NULL);
    free(qkv), free(d_out), free(out), free(d_qkv), free(out_first), free(d_qkv_first), free(first), free(row_by_row);
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
    model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale, false);
    bool same_losses = !memcmp(losses, m->acts.losses, sizeof(float) * n_losses);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
    char name[160];
    snprintf(name, sizeof name, "%s: forward_train = forward, backward (bits)", tag);
    test_check(same_losses && !memcmp(two, m->grads, bytes), name, NULL);
    /* a second micro-batch adds to the gradients (accumulate), the LM
     * head's in model_forward_train's products */
    loss_of(c);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, true);
    memcpy(two, m->grads, bytes);
    model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale, false);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
    model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale, true);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, true);
    snprintf(name, sizeof name, "%s: forward_train = forward, backward, accumulating (bits)", tag);
    test_check(!memcmp(two, m->grads, bytes), name, NULL);
    free(two);
}

/* The LM head on passes of 5 rows (a long shard's, model.h head_rows):
 * the losses and every gradient of the head in one pass, within float
 * rounding (the head's weight gradient sums the passes), after
 * model_forward_train and after model_forward; fails when a pass's
 * logits or rows are misplaced. */
static void check_head_passes(case_ctx *c, long long count, const char *tag) {
    model *m = c->m;
    if (m->cfg.head != HEAD_LM) return;
    size_t bytes = sizeof(float) * m->n_params;
    float *whole = malloc(bytes), losses[B * T];
    float scale = (float)(1.0 / count);
    model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale, false);
    memcpy(losses, m->acts.losses, sizeof losses);
    model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
    memcpy(whole, m->grads, bytes);
    int rows_before = m->head_rows;
    m->head_rows = 5;
    for (int train = 0; train < 2; train++) {
        if (train) model_forward_train(m, c->inputs, c->targets, c->labels, B, T, false, scale, false);
        else loss_of(c);
        double loss_err = 0, grad_err = 0, grad_max = 0;
        for (int i = 0; i < B * T; i++) loss_err = fmax(loss_err, fabs(m->acts.losses[i] - losses[i]));
        model_backward(m, c->inputs, c->targets, c->labels, B, T, scale, NULL, false);
        for (size_t i = 0; i < m->n_params; i++) {
            grad_err = fmax(grad_err, fabs(m->grads[i] - whole[i]));
            grad_max = fmax(grad_max, fabs(whole[i]));
        }
        char name[160];
        snprintf(name, sizeof name, "%s: the LM head on passes of 5 rows = one pass (%s)", tag,
                 train ? "forward_train" : "forward");
        test_check(loss_err <= 1e-5 && grad_err <= 1e-5 * grad_max && grad_max > 0, name,
                   "loss err %.2e, grad err %.2e of %.2e", loss_err, grad_err, grad_max);
    }
    m->head_rows = rows_before;
    free(whole);
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
    check_attention_rows(&c, tag);
    check_forward_train(&c, count, tag);
    check_head_passes(&c, count, tag);
    model_free(&m);
}

/* A rank's share of the initial weights (model_init_parameter_range): any
 * cut of the flat parameters into ranges, each drawn on 1 or 3 threads,
 * puts together model_init_parameters' bits, and a range writes nothing
 * outside itself (the trainer's shares, docs/design.md §8.3). The cuts fall
 * inside tensors, and one range is empty. */
static void check_init_ranges(void) {
    config cfg;
    config_defaults(&cfg);
    cfg.vocab_size = 512, cfg.d_model = 128, cfg.n_heads = 2, cfg.n_layers = 2, cfg.d_ff = 256;
    cfg.gamma = 0.25, cfg.learn_gamma = true; /* a momentum_gamma tensor too */
    model m;
    if (!test_check(model_create(&m, &cfg, NULL) == 0, "init ranges: model_create", NULL)) return;
    size_t n = m.n_params, bytes = sizeof(float) * n;
    float *whole = malloc(bytes), *joined = malloc(bytes);
    model_init_parameters(&m);
    memcpy(whole, m.params, bytes);
    const size_t cuts[] = {0, 1, n / 3 + 7, n / 3 + 7, n - 5, n};
    bool inside = true;
    for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof cuts[0]); k++) {
        omp_set_num_threads(k % 2 ? 3 : 1);
        model_init_parameter_range(&m, cuts[k], cuts[k + 1] - cuts[k]);
        for (size_t i = 0; i < n; i++) {
            if (i >= cuts[k] && i < cuts[k + 1]) joined[i] = m.params[i];
            else inside &= m.params[i] == 0.0f;
        }
    }
    omp_set_num_threads(1);
    test_check(memcmp(whole, joined, bytes) == 0, "init ranges: the ranges put together are the whole draw, bitwise",
               "%zu parameters", n);
    test_check(inside, "init ranges: a range leaves every parameter outside it zero", NULL);
    free(whole), free(joined);
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

/* ---- train.recompute = mlp | block (docs/scale.md §7) ----------------- */

/* models of a case: recompute none (the reference), mlp and block */
enum { RC_ROWS = 3, RC_MICRO = 2, RC_STEPS = 3, RC_LAYERS = 3, RC_HOOKS = 16, RC_MODELS = 3 };

/* block_done's layers in call order, and the progress calls. */
typedef struct {
    int done[RC_HOOKS], n_done;
    long progress;
} hook_log;

static void log_block_done(void *ctx, int layer) {
    hook_log *h = ctx;
    if (h->n_done < RC_HOOKS) h->done[h->n_done++] = layer;
}

static void log_progress(void *ctx) { ((hook_log *)ctx)->progress++; }

/* Floats of one block's MLP state (ln2, its mean and rstd, fc_act, fc_slope)
 * and of all its forward state (mid ... fc_slope) for B rows of T, counted
 * here from model.h's array list, apart from params.c's plan. */
static size_t mlp_state_floats(const model *m, int rows, int length) {
    return (size_t)rows * length * (m->d + 2 + 2 * (size_t)m->d_ff);
}

static size_t block_state_floats(const model *m, int rows, int length) {
    size_t bt = (size_t)rows * length, d = (size_t)m->d;
    size_t per_row = 6 * d + 2 + (m->cfg.learn_gamma ? 2 * d : 0); /* mid ln1 q k v att, ln1's stats, p_q p_k */
    attention_layer_sizes z = {&m->cfg, &m->fmm, NULL, length};
    return bt * per_row + (size_t)rows * m->H * attention_saved_per_head(&z) + mlp_state_floats(m, rows, length);
}

typedef struct {
    int length;
    int32_t *inputs, *targets, labels[RC_ROWS];
    /* per model, against model 0: */
    bool losses[RC_MODELS], buffer_sums[RC_MODELS], grads[RC_MODELS], hooks[RC_MODELS];
} recompute_case;

/* One micro-batch (rows [first, first + rows)) forward and backward on
 * every model, comparing what the forward and backward leave with model 0's. */
static void micro_all(model m[RC_MODELS], recompute_case *c, int first, int rows, float scale, bool last) {
    size_t at = (size_t)first * c->length;
    const int32_t *in = c->inputs + at, *tg = c->targets + at, *lb = c->labels + first;
    hook_log logs[RC_MODELS];
    memset(logs, 0, sizeof logs);
    for (int k = 0; k < RC_MODELS; k++) {
        model_forward(&m[k], in, tg, lb, rows, c->length, m[k].momentum);
        model_backward_hooks hooks = {log_block_done, log_progress, &logs[k]};
        model_backward(&m[k], in, tg, lb, rows, c->length, scale, last ? &hooks : NULL, first > 0);
    }
    size_t n_loss = m[0].cfg.head == HEAD_LM ? (size_t)rows * c->length : (size_t)rows;
    for (int k = 1; k < RC_MODELS; k++) {
        c->losses[k] &= memcmp(m[0].acts.losses, m[k].acts.losses, sizeof(float) * n_loss) == 0;
        /* compared after backward: a recomputation that collected again would double them */
        c->buffer_sums[k] &= memcmp(m[0].buffer_sums, m[k].buffer_sums, sizeof(float) * m[0].n_buffer) == 0;
        bool order = logs[k].n_done == (last ? m[k].L + 1 : 0);
        for (int i = 0; i < logs[k].n_done; i++) order &= logs[k].done[i] == m[k].L - 1 - i;
        c->hooks[k] &= order && logs[0].n_done == logs[k].n_done && logs[k].progress >= logs[0].progress;
    }
}

/* The buffers set to the batch mean of their sums, then AdamW, as the
 * trainer does after a step's micro-batches. */
static void step_all(model m[RC_MODELS], const double *sums, int step) {
    optimizer_settings opt = {1e-2, 0.9, 0.95, 1e-8, 0.1, 1.0f};
    for (int k = 0; k < RC_MODELS; k++) {
        for (size_t i = 0; m[k].momentum && i < m[k].n_buffer; i++) m[k].buffers[i] = (float)(sums[i] / RC_ROWS);
        optimizer_step_model(&m[k], step, &opt);
        model_params_changed(&m[k]);
    }
}

/* Step `step`'s batch: tokens, padding (cls: each row's last position) and labels. */
static void fill_batch(recompute_case *c, const config *cfg, int step) {
    int length = c->length;
    for (int i = 0; i < RC_ROWS * length; i++) {
        c->inputs[i] = (int32_t)((i * 7 + 3 * step) % cfg->vocab_size);
        bool pad = cfg->head == HEAD_CLS ? i % length == length - 1 : (i + step) % 5 == 2;
        c->targets[i] = pad ? -1 : (int32_t)((i * 5 + step) % cfg->vocab_size);
    }
    for (int r = 0; r < RC_ROWS; r++) c->labels[r] = (int32_t)((r * 3 + step) % 10);
}

static void report_recompute(const char *tag, model m[RC_MODELS], const recompute_case *c) {
    const char *modes[RC_MODELS] = {"none", "mlp", "block"};
    char name[200];
    for (int k = 1; k < RC_MODELS; k++) {
        const char *checks[] = {"losses", "momentum buffer sums (collected once)", "gradients", "backward hooks"};
        bool ok[] = {c->losses[k], c->buffer_sums[k], c->grads[k], c->hooks[k]};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "recompute %s %s: %s = none, bitwise", modes[k], tag, checks[i]);
            test_check(ok[i], name, NULL);
        }
        snprintf(name, sizeof name, "recompute %s %s: weights after %d steps = none, bitwise", modes[k], tag, RC_STEPS);
        test_check(memcmp(m[0].params, m[k].params, sizeof(float) * m[0].n_params) == 0, name, NULL);
        size_t none = model_activation_bytes(&m[0], RC_MICRO, c->length);
        size_t got = model_activation_bytes(&m[k], RC_MICRO, c->length);
        size_t state =
            k == 1 ? mlp_state_floats(&m[0], RC_MICRO, c->length) : block_state_floats(&m[0], RC_MICRO, c->length);
        size_t expected = (RC_LAYERS - 1) * state * sizeof(float);
        snprintf(name, sizeof name, "recompute %s %s: activation bytes, %d %s states fewer", modes[k], tag,
                 RC_LAYERS - 1, k == 1 ? "MLP" : "block");
        test_check(none - got == expected && got < none, name, "none %zu, %s %zu, expected difference %zu", none,
                   modes[k], got, expected);
    }
}

/* RC_STEPS trainer-like steps (micro-batches of 2 and 1 rows) of `cfg` with
 * recompute none, mlp and block side by side: losses, buffer sums,
 * gradients, the hooks' calls and the final weights bit for bit; and the
 * activation estimate smaller by L - 1 copies of the state recomputed. */
static void check_recompute(const char *tag, config cfg, int length) {
    cfg.vocab_size = 11, cfg.d_model = 16, cfg.n_heads = 2, cfg.n_layers = RC_LAYERS, cfg.d_ff = 24;
    cfg.seq_len = length, cfg.chain_len = 3;
    recompute_case c = {.length = length};
    for (int k = 0; k < RC_MODELS; k++) c.losses[k] = c.buffer_sums[k] = c.grads[k] = c.hooks[k] = true;
    c.inputs = malloc(sizeof(int32_t) * RC_ROWS * length), c.targets = malloc(sizeof(int32_t) * RC_ROWS * length);
    const int modes[RC_MODELS] = {RECOMPUTE_NONE, RECOMPUTE_MLP, RECOMPUTE_BLOCK};
    model m[RC_MODELS];
    for (int k = 0; k < RC_MODELS; k++) {
        cfg.recompute = modes[k];
        char name[200];
        snprintf(name, sizeof name, "recompute %s: model_create", tag);
        if (!test_check(model_create(&m[k], &cfg, NULL) == 0, name, NULL)) return;
        model_init_parameters(&m[k]);
        uint64_t state = 5;
        for (size_t i = 0; i < m[k].n_params; i++) m[k].params[i] += 0.3f * fd_uniform(&state);
        for (size_t i = 0; i < m[k].n_buffer; i++) m[k].buffers[i] = 0.5f * fd_uniform(&state);
        model_params_changed(&m[k]);
    }
    double *sums = calloc(m[0].n_buffer, sizeof(double));
    for (int step = 1; step <= RC_STEPS; step++) {
        fill_batch(&c, &cfg, step);
        long long count = model_target_count(&m[0], c.targets, RC_ROWS, length);
        memset(sums, 0, sizeof(double) * m[0].n_buffer);
        for (int first = 0; first < RC_ROWS; first += RC_MICRO) {
            int rows = RC_ROWS - first < RC_MICRO ? RC_ROWS - first : RC_MICRO;
            micro_all(m, &c, first, rows, (float)(1.0 / count), first + rows >= RC_ROWS);
            for (size_t i = 0; i < m[0].n_buffer; i++) sums[i] += m[0].buffer_sums[i];
        }
        for (int k = 1; k < RC_MODELS; k++)
            c.grads[k] &= memcmp(m[0].grads, m[k].grads, sizeof(float) * m[0].n_params) == 0;
        step_all(m, sums, step);
    }
    report_recompute(tag, m, &c);
    for (int k = 0; k < RC_MODELS; k++) model_free(&m[k]);
    free(sums), free(c.inputs), free(c.targets);
}

static void check_recompute_variants(void) {
    config base, c;
    config_defaults(&base);
    base.gamma = 0.3, base.anchor = false; /* the buffers enter the loss */
    c = base, c.attention_impl = ATTENTION_DENSE;
    check_recompute("softmax dense", c, 9);
    c = base; /* tiled: the log-sum-exp kept, not the probabilities; 300 keys: four key tiles */
    check_recompute("softmax tiled T 300", c, 300);
    c = base, c.learn_gamma = true, c.beta = 0.5, c.gamma2 = 0.1; /* p_q, p_k kept */
    check_recompute("momentum learned gamma", c, 9);
    c = base, c.attention = ATTENTION_FMM, c.fmm_bandwidth = 3, c.fmm_chunk = 4;
    c.fmm_kernels = (config_list){2, {FEATURE_ELU, FEATURE_ELU_FLIP}};
    check_recompute("fmm band on rows", c, 40);
    c.fmm_bandwidth = 48, c.fmm_chunk = 16; /* attention.impl = tiled: the band on tiles */
    check_recompute("fmm band on tiles", c, 120);
    c = base, c.head = HEAD_CLS, c.n_classes = 10, c.task = TASK_LISTOPS, c.causal = false;
    check_recompute("cls head", c, 9);
    const char *why = gemm_unavailable_reason(GEMM_ONEDNN_BF16);
    if (why) {
        test_skip("recompute bf16", why);
        return;
    }
    gemm_ctx *bf16 = gemm_create(GEMM_ONEDNN_BF16, 1);
    gemm_set_default(bf16); /* before the models exist: they register their weights with it */
    c = base, c.attention_impl = ATTENTION_DENSE, c.learn_gamma = true, c.precision = PRECISION_BF16;
    check_recompute("bf16 softmax dense learned gamma", c, 9);
    c = base, c.attention = ATTENTION_FMM, c.fmm_bandwidth = 3, c.fmm_chunk = 4, c.precision = PRECISION_BF16;
    check_recompute("bf16 fmm", c, 40);
    gemm_set_default(NULL);
    gemm_destroy(bf16);
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
    check_init_ranges();
    check_tiled_equals_dense();
    check_recompute_variants();
    int rc = test_summary("test_model");
    dist_finalize();
    return rc;
}
