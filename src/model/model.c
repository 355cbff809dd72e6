/* The transformer of docs/model.md §1: forward and backward of the whole
 * model. The parameter table, initialisation and the activation plan are
 * params.c's (docs/design.md §8.2); attention lives in attention.c, the
 * kernels in kernels.c and gelu.c. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "base/fast_math.h"
#include "base/prof.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/sys.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "parallel/context.h"

#include "model_internal.h"

/* Elementwise adds on OpenMP's threads (the cls head's pooling). */
VECTOR_CLONES static void add_chunk(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

#define ADD_CHUNK 16384

static void add_into(float *dst, const float *src, size_t n) {
    size_t chunks = (n + ADD_CHUNK - 1) / ADD_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t at = c * ADD_CHUNK;
        add_chunk(dst + at, src + at, n - at < ADD_CHUNK ? n - at : ADD_CHUNK);
    }
}

/* docs/model.md §1 item 4, cls: mean of x over the valid positions
 * (targets != -1). A sequence cut across a context group sums its shards'
 * rows and counts over the group (docs/design.md §8.12). */
static void pool_valid_positions(const model *m, float *pooled, float *counts, const float *x, const int32_t *mask,
                                 int B, int T, int d) {
    for (int b = 0; b < B; b++) {
        float *out = pooled + (size_t)b * d;
        memset(out, 0, sizeof(float) * d);
        int count = 0;
        for (int t = 0; t < T; t++) {
            if (mask[b * T + t] < 0) continue;
            add_into(out, x + ((size_t)b * T + t) * d, (size_t)d);
            count++;
        }
        counts[b] = (float)count;
    }
    if (m->cut.chunks > 1) {
        context_sum(pooled, (size_t)B * d, "cls mean pool sum");
        context_sum(counts, (size_t)B, "cls mean pool count");
    }
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d && counts[b] > 0; i++) pooled[(size_t)b * d + i] /= counts[b];
}

static void unpool_valid_positions(float *dx, const float *d_pooled, const float *counts, const int32_t *mask, int B,
                                   int T, int d) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *row = dx + ((size_t)b * T + t) * d;
            for (int i = 0; i < d; i++) row[i] = mask[b * T + t] >= 0 ? d_pooled[(size_t)b * d + i] / counts[b] : 0.0f;
        }
}

/* The cls head's loss and weights belong to one rank of a context group:
 * every rank of the group holds the same pooled rows (docs/design.md §8.12). */
static bool owns_sequence_head(const model *m) { return m->cfg.head != HEAD_CLS || context_rank() == 0; }

void model_cut_sequences(model *m, int T_seq) {
    m->cut = context_cut_of(T_seq, context_size(), context_rank(), config_context_zigzag(&m->cfg));
}

attention_layer model_attention_layer(model *m, int l, bool collect_buffers) {
    const model_block_tensors *w = &m->w.blocks[l], *g = &m->g.blocks[l];
    size_t buffers = (size_t)l * 2 * m->H * m->dh;
    attention_layer a = {
        .cfg = &m->cfg,
        .fmm = &m->fmm,
        .d = m->d,
        .H = m->H,
        .dh = m->dh,
        .momentum = m->momentum,
        .rope_cos = m->rope_cos,
        .rope_sin = m->rope_sin,
        .gamma = w->momentum_gamma,
        .blend = w->fmm_blend,
        .d_gamma = g->momentum_gamma,
        .d_blend = g->fmm_blend,
        .buffers = m->buffers + buffers,
        .buffer_sums = collect_buffers ? m->buffer_sums + buffers : NULL,
        .cut = m->cut.chunks > 1 ? &m->cut : NULL,
    };
    return a;
}

/* Block l's slice of the saved attention state (a view for attention.c,
 * which knows nothing of `activations`, docs/design.md §8.1). */
attention_saved model_attention_saved(const model *m, int l, int B, int T) {
    const model_activations *a = &m->acts;
    size_t slot = model_activation_slot(m, l, false), heads = slot * B * T * m->d;
    attention_layer_sizes z = {&m->cfg, &m->fmm, m->cut.chunks > 1 ? &m->cut : NULL, T};
    size_t saved = slot * B * m->H * attention_saved_per_head(&z);
    attention_saved s = {
        .q_hat = a->q_hat + heads,
        .k_hat = a->k_hat + heads,
        .v_heads = a->v_heads + heads,
        .p_q = a->p_q ? a->p_q + heads : NULL,
        .p_k = a->p_k ? a->p_k + heads : NULL,
        .saved = a->att_saved + saved,
        .out = a->att_out + heads,
        .scratch = a->head_scratch,
        .threads = a->threads,
        .exchange = a->exchange,
        .row_sums = a->att_row_sums,
    };
    return s;
}

static void progress(const model_backward_hooks *hooks) {
    if (hooks && hooks->progress) hooks->progress(hooks->ctx);
}

/* A LayerNorm of the model: where its output and statistics go, and its
 * parameters. */
typedef struct {
    float *out, *mean, *rstd;
    const float *weight, *bias;
    bool bf16; /* out made in bf16 alone (gemm_reads_bf16) */
} block_norm;

/* LN1's and LN2's outputs and the GELU's are read by the next product
 * alone: where the products read bf16 (gemm_reads_bf16) they are made in
 * bf16 alone, in their fp32 buffers' memory, rounded as the engine would
 * round them (docs/design.md §8.10). Their fp32 floats were written and
 * read back only to be converted, and LN's twice: for the forward's
 * product and for the weight gradient's. ln_f stays fp32: the pooling of
 * a classifier reads it too. */

static void norm_forward(const block_norm *n, const float *inp, int rows, int dim) {
    if (n->bf16) layernorm_forward_bf16((uint16_t *)n->out, n->mean, n->rstd, inp, n->weight, n->bias, rows, dim);
    else layernorm_forward(n->out, n->mean, n->rstd, inp, n->weight, n->bias, rows, dim);
}

/* x = x + product_bias + residual, then n of it (layernorm_residual_forward). */
static void norm_residual_forward(const block_norm *n, float *x, const float *product_bias, const float *residual,
                                  int rows, int dim) {
    if (n->bf16)
        layernorm_residual_forward_bf16((uint16_t *)n->out, n->mean, n->rstd, x, product_bias, residual, n->weight,
                                        n->bias, rows, dim);
    else layernorm_residual_forward(n->out, n->mean, n->rstd, x, product_bias, residual, n->weight, n->bias, rows, dim);
}

/* A product whose input is one of those activations, however it is kept. */
static void product_forward(float *out, const float *inp, const float *weight, const float *bias, int rows, int in_dim,
                            int out_dim) {
    if (gemm_reads_bf16()) matmul_forward_bf16(out, (const uint16_t *)inp, weight, bias, rows, in_dim, out_dim);
    else matmul_forward(out, inp, weight, bias, rows, in_dim, out_dim);
}

static void product_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials) {
    if (gemm_reads_bf16())
        matmul_backward_bf16(dinp, dweight, dbias, dout, (const uint16_t *)inp, weight, rows, in_dim, out_dim,
                             accumulate, partials);
    else matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_dim, out_dim, accumulate, partials);
}

/* Block l's LN1 (its slot) or LN2 (`second`). */
static block_norm block_norm_of(model *m, int l, bool second, size_t bt) {
    model_activations *a = &m->acts;
    const model_block_tensors *w = &m->w.blocks[l];
    size_t at = model_activation_slot(m, l, second) * bt;
    bool bf16 = gemm_reads_bf16();
    if (second)
        return (block_norm){a->ln2 + at * m->d, a->ln2_mean + at, a->ln2_rstd + at, w->ln2_weight, w->ln2_bias, bf16};
    return (block_norm){a->ln1 + at * m->d, a->ln1_mean + at, a->ln1_rstd + at, w->ln1_weight, w->ln1_bias, bf16};
}

/* The LayerNorm that follows block l: the next block's LN1 (in its slot,
 * which block l no longer reads once its qkv product is made), or ln_f
 * after the last block. */
static block_norm norm_after_block(model *m, int l, size_t bt) {
    model_activations *a = &m->acts;
    if (l + 1 == m->L)
        return (block_norm){a->ln_f, a->ln_f_mean, a->ln_f_rstd, m->w.ln_f_weight, m->w.ln_f_bias, false};
    return block_norm_of(m, l + 1, false, bt);
}

/* LN1 of block l's input on its own: the first block's, a block run alone
 * and a recomputed one; otherwise it runs in the pass of the previous
 * block's last residual add. */
static void block_ln1(model *m, int l, size_t bt) {
    block_norm ln1 = block_norm_of(m, l, false, bt);
    PROF_TIMED(PROF_FORWARD_NORM, norm_forward(&ln1, m->acts.residual + l * bt * m->d, (int)bt, m->d));
}

/* Block l's forward from its LN1 on up to mid = x + attention(LN1(x)) and
 * LN2 of mid, the first half of what its backward reads. The residual add
 * and the projection's bias run in LN2's pass (docs/design.md §8.10).
 * Backward's recomputation runs this same code (train.recompute = block;
 * mlp_state's too with mlp; docs/scale.md §7), so the state it remakes is
 * the forward's bit for bit; `hooks`: the progress calls backward makes
 * between kernels, NULL in a forward. */
static void attention_state(model *m, int l, int B, int T, bool collect_buffers, const model_backward_hooks *hooks) {
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T, d = (size_t)m->d, s = model_activation_slot(m, l, false);
    int rows = (int)bt;
    const model_block_tensors *w = &m->w.blocks[l];
    float *x = a->residual + l * bt * d, *mid = a->mid + s * bt * d;
    float *ln1 = a->ln1 + s * bt * d, *att = a->att_out + s * bt * d;
    PROF_TIMED(PROF_FORWARD_LINEAR, product_forward(a->qkv, ln1, w->qkv_weight, w->qkv_bias, rows, m->d, 3 * m->d));
    attention_layer view = model_attention_layer(m, l, collect_buffers);
    attention_saved saved = model_attention_saved(m, l, B, T);
    PROF_TIMED(PROF_FORWARD_ATTENTION, attention_forward(&view, &saved, a->qkv, att, B, T));
    progress(hooks);
    PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(mid, att, w->proj_weight, NULL, rows, m->d, m->d));
    block_norm ln2 = block_norm_of(m, l, true, bt);
    PROF_TIMED(PROF_FORWARD_NORM, norm_residual_forward(&ln2, mid, w->proj_bias, x, rows, m->d));
}

/* Block l's slot of a per-block MLP array of d_ff columns (fc_act,
 * fc_slope). fc_act holds the GELU output in bf16 alone where the products
 * read bf16 (gemm_reads_bf16: product_forward and product_backward read it
 * so), else in fp32. */
static float *mlp_rows(const model *m, float *array, int l, size_t bt) {
    return array + model_activation_slot(m, l, true) * bt * m->d_ff;
}

/* The second half, LN2's output -> the MLP's GELU (fc_act) and its slope,
 * the fc bias in GELU's pass; recomputed alone with train.recompute = mlp,
 * after LN2 of the kept mid (`ln2_again`: the same floats as the fused pass
 * made). */
static void mlp_state(model *m, int l, int B, int T, bool ln2_again, const model_backward_hooks *hooks) {
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T, d = (size_t)m->d, s = model_activation_slot(m, l, true);
    int rows = (int)bt;
    const model_block_tensors *w = &m->w.blocks[l];
    float *ln2 = a->ln2 + s * bt * d, *act = mlp_rows(m, a->fc_act, l, bt), *slope = mlp_rows(m, a->fc_slope, l, bt);
    block_norm norm = block_norm_of(m, l, true, bt);
    if (ln2_again) PROF_TIMED(PROF_FORWARD_NORM, norm_forward(&norm, model_block_mid(m, l, B, T), rows, m->d));
    PROF_TIMED(PROF_FORWARD_LINEAR, product_forward(a->fc_pre, ln2, w->fc_weight, NULL, rows, m->d, m->d_ff));
    progress(hooks);
    if (gemm_reads_bf16())
        PROF_TIMED(PROF_FORWARD_ACTIVATION,
                   gelu_bias_forward_bf16((uint16_t *)act, slope, a->fc_pre, w->fc_bias, rows, m->d_ff));
    else PROF_TIMED(PROF_FORWARD_ACTIVATION, gelu_bias_forward(act, slope, a->fc_pre, w->fc_bias, rows, m->d_ff));
    a->state_of = l;
}

/* Block l from its LN1's output on. The last residual add runs in the pass
 * of the LayerNorm after it, with the bias of the product before it
 * (docs/design.md §8.10): none of these costs a pass of its own. `next` is
 * the LayerNorm after the block; NULL (a block run alone) adds without it. */
static void block_forward(model *m, int l, int B, int T, bool collect_buffers, const block_norm *next) {
    attention_state(m, l, B, T, collect_buffers, NULL);
    mlp_state(m, l, B, T, false, NULL);
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T, d = (size_t)m->d;
    int rows = (int)bt;
    const model_block_tensors *w = &m->w.blocks[l];
    float *out = a->residual + (l + 1) * bt * d, *mid = model_block_mid(m, l, B, T);
    PROF_TIMED(PROF_FORWARD_LINEAR,
               product_forward(out, mlp_rows(m, a->fc_act, l, bt), w->mlp_proj_weight, NULL, rows, m->d_ff, m->d));
    if (next) PROF_TIMED(PROF_FORWARD_NORM, norm_residual_forward(next, out, w->mlp_proj_bias, mid, rows, m->d));
    else PROF_TIMED(PROF_FORWARD_ACTIVATION, residual_add(out, w->mlp_proj_bias, mid, rows, m->d));
}

void model_block_forward(model *m, int l, int B, int T, bool collect_buffers) {
    block_ln1(m, l, (size_t)B * T);
    block_forward(m, l, B, T, collect_buffers, NULL);
}

/* With train.recompute the one copy of the MLP's state (mlp) or of the
 * whole block's (block) may hold another block's: block l's is remade
 * from what the block keeps, mid or its input (docs/scale.md §7). The time
 * counts as recompute, not twice as forward; the momentum buffer sums are
 * not collected again (the forward did, and a second sum would double
 * them); the block's output, which the forward wrote and backward never
 * reads, is not remade. */
static void restore_state(model *m, int l, int B, int T, const model_backward_hooks *hooks) {
    if (m->cfg.recompute == RECOMPUTE_NONE || m->acts.state_of == l) return;
    prof_divert(PROF_RECOMPUTE);
    bool whole = m->cfg.recompute == RECOMPUTE_BLOCK;
    if (whole) {
        block_ln1(m, l, (size_t)B * T);
        attention_state(m, l, B, T, false, hooks);
    }
    mlp_state(m, l, B, T, !whole, hooks);
    prof_divert(PROF_PHASES);
}

void model_block_restore(model *m, int layer, int B, int T) { restore_state(m, layer, B, T, NULL); }

float *model_block_mid(const model *m, int layer, int B, int T) {
    return m->acts.mid + model_activation_slot(m, layer, false) * B * T * m->d;
}

/* The softmax runs on a copy when the model keeps its logits: the same
 * kernel on the same values, so probabilities and losses are unchanged. */
static void copy_logits_to_probs(model_activations *a, size_t n) {
    if (a->probs != a->logits) memcpy(a->probs, a->logits, sizeof(float) * n);
}

/* The head's softmax cross-entropy; for training (`grads`) it leaves the
 * loss's gradient where the probabilities would be, in the same pass. */
static void head_loss(model *m, const int32_t *classes, int rows, bool grads, float loss_scale) {
    model_activations *a = &m->acts;
    if (grads)
        PROF_TIMED(PROF_FORWARD_LOSS, cross_entropy_forward_backward(a->probs, a->losses, a->predictions, classes, rows,
                                                                     m->n_out, loss_scale));
    else
        PROF_TIMED(PROF_FORWARD_LOSS,
                   cross_entropy_forward(a->probs, a->losses, a->predictions, classes, rows, m->n_out));
    a->dlogits = grads;
}

/* The LM head on passes of model_head_pass_rows rows: each pass's logits,
 * then its losses and predictions; backward remakes the logits of all but
 * the last pass (lm_head_backward_passes), so that no B*T*V buffer
 * exists. */
static void lm_head_passes(model *m, const int32_t *targets, int rows) {
    model_activations *a = &m->acts;
    int pass = model_head_pass_rows(m, rows);
    for (int r = 0; r < rows; r += pass) {
        int n = rows - r < pass ? rows - r : pass;
        PROF_TIMED(PROF_FORWARD_LINEAR,
                   matmul_forward(a->logits, a->ln_f + (size_t)r * m->d, m->w.head_weight, NULL, n, m->d, m->V));
        PROF_TIMED(PROF_FORWARD_LOSS,
                   cross_entropy_forward(a->probs, a->losses + r, a->predictions + r, targets + r, n, m->V));
    }
    a->dlogits = false;
}

/* Training's LM head, on the passes of lm_head_passes (one when they fit):
 * each pass's logits, its losses with the loss's gradient in the softmax's
 * pass, then at once the head's backward products for that pass, the
 * weight gradient summed over the passes in order. Backward then starts
 * at ln_f and remakes no pass (docs/scale.md §7): remaking all but the
 * last took 1% of a bench_d768 step. Whole, the products are the ones
 * model_backward would run, bit for bit. */
static void lm_head_train(model *m, const int32_t *targets, int rows, float scale, bool accumulate) {
    model_activations *a = &m->acts;
    int pass = model_head_pass_rows(m, rows);
    for (int r = 0; r < rows; r += pass) {
        int n = rows - r < pass ? rows - r : pass;
        const float *ln_f = a->ln_f + (size_t)r * m->d;
        PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(a->logits, ln_f, m->w.head_weight, NULL, n, m->d, m->V));
        PROF_TIMED(PROF_FORWARD_LOSS, copy_logits_to_probs(a, (size_t)n * m->V));
        PROF_TIMED(PROF_FORWARD_LOSS, cross_entropy_forward_backward(a->probs, a->losses + r, a->predictions + r,
                                                                     targets + r, n, m->V, scale));
        PROF_TIMED(PROF_BACKWARD_LINEAR,
                   matmul_backward(a->d_model_rows + (size_t)r * m->d, m->g.head_weight, NULL, a->probs, ln_f,
                                   m->w.head_weight, n, m->d, m->V, accumulate || r > 0, NULL));
    }
    a->dlogits = true;
    a->head_done = true;
}

static void forward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                    bool collect_buffers, bool grads, float loss_scale, bool accumulate) {
    model_reserve_activations(m, B, T);
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T;
    int rows = (int)bt;
    if (collect_buffers) memset(m->buffer_sums, 0, sizeof(float) * m->n_buffer);
    PROF_TIMED(PROF_FORWARD_LOSS, embedding_forward(a->residual, inputs, m->w.tok_emb, rows, m->d));
    block_ln1(m, 0, bt);
    for (int l = 0; l < m->L; l++) {
        block_norm next = norm_after_block(m, l, bt); /* ln_f after the last block */
        block_forward(m, l, B, T, collect_buffers, &next);
    }
    a->head_done = false;
    if (m->cfg.head == HEAD_LM && grads) {
        lm_head_train(m, targets, rows, loss_scale, accumulate);
    } else if (m->cfg.head == HEAD_LM && model_head_pass_rows(m, rows) < rows) {
        lm_head_passes(m, targets, rows);
    } else if (m->cfg.head == HEAD_LM) {
        PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(a->logits, a->ln_f, m->w.head_weight, NULL, rows, m->d, m->V));
        PROF_TIMED(PROF_FORWARD_LOSS, copy_logits_to_probs(a, bt * m->V));
        head_loss(m, targets, rows, grads, loss_scale);
    } else {
        PROF_TIMED(PROF_FORWARD_LOSS, pool_valid_positions(m, a->pooled, a->pool_counts, a->ln_f, targets, B, T, m->d));
        PROF_TIMED(PROF_FORWARD_LINEAR,
                   matmul_forward(a->logits, a->pooled, m->w.cls_weight, m->w.cls_bias, B, m->d, m->n_out));
        PROF_TIMED(PROF_FORWARD_LOSS, copy_logits_to_probs(a, (size_t)B * m->n_out));
        head_loss(m, labels, B, grads, loss_scale);
    }
}

void model_forward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                   bool collect_buffers) {
    forward(m, inputs, targets, labels, B, T, collect_buffers, false, 0.0f, false);
}

void model_forward_train(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                         bool collect_buffers, float loss_scale, bool accumulate) {
    forward(m, inputs, targets, labels, B, T, collect_buffers, true, loss_scale, accumulate);
}

double model_loss_sum(const model *m, const int32_t *targets, int B, int T, long long *count) {
    double sum = 0;
    long long n = 0;
    if (m->cfg.head == HEAD_CLS) {
        bool mine = owns_sequence_head(m);
        for (int b = 0; b < B && mine; b++) sum += m->acts.losses[b];
        *count = mine ? B : 0;
        return sum;
    }
    for (int i = 0; i < B * T; i++)
        if (targets[i] >= 0) {
            sum += m->acts.losses[i];
            n++;
        }
    *count = n;
    return sum;
}

long long model_target_count(const model *m, const int32_t *targets, int B, int T) {
    if (m->cfg.head == HEAD_CLS) return owns_sequence_head(m) ? B : 0;
    long long n = 0;
    for (int i = 0; i < B * T; i++) n += targets[i] >= 0;
    return n;
}

/* The gradients no kernel overwrites: the embedding's (a scatter-add over
 * the tokens), the learned gamma's and the blend logits' (sums over the
 * batch). */
static void zero_accumulated_grads(model *m) {
    memset(m->g.tok_emb, 0, sizeof(float) * (size_t)m->V * m->d);
    for (int l = 0; l < m->L; l++) {
        if (m->g.blocks[l].momentum_gamma) memset(m->g.blocks[l].momentum_gamma, 0, sizeof(float) * m->H);
        if (m->g.blocks[l].fmm_blend) memset(m->g.blocks[l].fmm_blend, 0, sizeof(float) * 2 * m->H);
    }
}

/* The passes in backward: the last one first, from the probabilities its
 * forward left in the buffer (cross_entropy_backward gives the bits
 * cross_entropy_forward_backward would), then each other pass's logits
 * remade (counted as recompute) with the loss's gradient in the softmax's
 * pass; each pass's products follow, the weight gradient summed over the
 * passes. Remaking the last pass too cost 1% of a bench_d768 step (two
 * passes; docs/scale.md §7). */
static void lm_head_backward_passes(model *m, const int32_t *targets, int rows, float scale, bool accumulate) {
    model_activations *a = &m->acts;
    int pass = model_head_pass_rows(m, rows), passes = (rows + pass - 1) / pass;
    for (int i = 0; i < passes; i++) {
        bool first = i == 0; /* the last pass, its probabilities kept */
        int r = (first ? passes - 1 : i - 1) * pass;
        int n = rows - r < pass ? rows - r : pass;
        const float *ln_f = a->ln_f + (size_t)r * m->d;
        if (first) {
            PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_backward(a->probs, targets + r, n, m->V, scale));
        } else {
            PROF_TIMED(PROF_RECOMPUTE, matmul_forward(a->logits, ln_f, m->w.head_weight, NULL, n, m->d, m->V));
            PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_forward_backward(a->probs, a->losses + r, a->predictions + r,
                                                                          targets + r, n, m->V, scale));
        }
        PROF_TIMED(PROF_BACKWARD_LINEAR,
                   matmul_backward(a->d_model_rows + (size_t)r * m->d, m->g.head_weight, NULL, a->probs, ln_f,
                                   m->w.head_weight, n, m->d, m->V, accumulate || !first, NULL));
    }
}

static void head_backward(model *m, const int32_t *targets, const int32_t *labels, int B, int T, float scale,
                          bool accumulate) {
    model_activations *a = &m->acts;
    int rows = B * T;
    if (m->cfg.head == HEAD_LM && a->head_done) {
        /* model_forward_train ran the head's backward (lm_head_train) */
    } else if (m->cfg.head == HEAD_LM && model_head_pass_rows(m, rows) < rows) {
        lm_head_backward_passes(m, targets, rows, scale, accumulate);
    } else if (m->cfg.head == HEAD_LM) {
        if (!a->dlogits) PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_backward(a->probs, targets, rows, m->V, scale));
        PROF_TIMED(PROF_BACKWARD_LINEAR, matmul_backward(a->d_model_rows, m->g.head_weight, NULL, a->probs, a->ln_f,
                                                         m->w.head_weight, rows, m->d, m->V, accumulate, NULL));
    } else {
        float *d_pooled = a->d_pooled;
        bool mine = owns_sequence_head(m); /* the others' head gradients would count the sequence again */
        float *g_weight = mine ? m->g.cls_weight : a->cls_grads,
              *g_bias = mine ? m->g.cls_bias : a->cls_grads + m->n_out * m->d;
        if (!a->dlogits) PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_backward(a->probs, labels, B, m->n_out, scale));
        PROF_TIMED(PROF_BACKWARD_LINEAR,
                   matmul_backward(d_pooled, g_weight, g_bias, a->probs, a->pooled, m->w.cls_weight, B, m->d, m->n_out,
                                   accumulate && mine, a->sum_partials));
        if (!mine && !accumulate) { /* the reduced sums of the last step are still there: this rank adds none */
            memset(m->g.cls_weight, 0, sizeof(float) * m->n_out * m->d);
            memset(m->g.cls_bias, 0, sizeof(float) * m->n_out);
        }
        PROF_TIMED(PROF_BACKWARD_LOSS,
                   unpool_valid_positions(a->d_model_rows, d_pooled, a->pool_counts, targets, B, T, m->d));
    }
    PROF_TIMED(PROF_BACKWARD_LOSS, memset(a->d_residual, 0, sizeof(float) * rows * m->d));
    PROF_TIMED(PROF_BACKWARD_NORM,
               layernorm_backward(a->d_residual, m->g.ln_f_weight, m->g.ln_f_bias, a->d_model_rows,
                                  a->residual + (size_t)m->L * rows * m->d, m->w.ln_f_weight, a->ln_f_mean,
                                  a->ln_f_rstd, rows, m->d, accumulate, a->sum_partials));
}

/* The MLP's backward, from dL/d(block output) in d_residual to its input's
 * gradient in d_model_rows (LN2's backward follows). */
static void mlp_backward(model *m, int l, int B, int T, const model_backward_hooks *hooks, bool accumulate) {
    model_activations *a = &m->acts;
    const model_block_tensors *w = &m->w.blocks[l];
    model_block_tensors *g = &m->g.blocks[l];
    size_t bt = (size_t)B * T, d = (size_t)m->d, sm = model_activation_slot(m, l, true);
    int rows = (int)bt;
    /* the weight's and bias's gradients, and d_ff, the GELU output's, written
     * over the output (matmul_backward writes dinp after the weight's
     * gradient has read inp): the lines the product has just read, and the
     * block's slot is not read again */
    float *act = mlp_rows(m, a->fc_act, l, bt), *d_ff = act;
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               product_backward(d_ff, g->mlp_proj_weight, g->mlp_proj_bias, a->d_residual, act, w->mlp_proj_weight,
                                rows, m->d_ff, m->d, accumulate, a->sum_partials));
    progress(hooks);
    /* the fc bias gradient in GELU's pass (docs/design.md §8.10) */
    PROF_TIMED(PROF_BACKWARD_ACTIVATION, gelu_bias_backward(d_ff, g->fc_bias, mlp_rows(m, a->fc_slope, l, bt), d_ff,
                                                            rows, m->d_ff, accumulate, a->sum_partials));
    PROF_TIMED(PROF_BACKWARD_LINEAR, product_backward(a->d_model_rows, g->fc_weight, NULL, d_ff, a->ln2 + sm * bt * d,
                                                      w->fc_weight, rows, m->d, m->d_ff, accumulate, NULL));
}

static void block_backward(model *m, int l, int B, int T, const model_backward_hooks *hooks, bool accumulate) {
    model_activations *a = &m->acts;
    const model_block_tensors *w = &m->w.blocks[l];
    model_block_tensors *g = &m->g.blocks[l];
    restore_state(m, l, B, T, hooks);
    size_t bt = (size_t)B * T, d = (size_t)m->d;
    size_t s = model_activation_slot(m, l, false), sm = model_activation_slot(m, l, true);
    int rows = (int)bt;
    float *x = a->residual + l * bt * d, *mid = a->mid + s * bt * d;
    /* d_residual holds dL/d(block output); the residual paths pass it through
     * unchanged and each LayerNorm backward adds its branch into it. */
    mlp_backward(m, l, B, T, hooks, accumulate);
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_NORM, layernorm_backward(a->d_residual, g->ln2_weight, g->ln2_bias, a->d_model_rows, mid,
                                                      w->ln2_weight, a->ln2_mean + sm * bt, a->ln2_rstd + sm * bt, rows,
                                                      m->d, accumulate, a->sum_partials));
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               matmul_backward(a->d_model_rows, g->proj_weight, g->proj_bias, a->d_residual, a->att_out + s * bt * d,
                               w->proj_weight, rows, m->d, m->d, accumulate, a->sum_partials));
    progress(hooks);
    attention_layer view = model_attention_layer(m, l, false);
    attention_saved saved = model_attention_saved(m, l, B, T);
    PROF_TIMED(PROF_BACKWARD_ATTENTION, attention_backward(&view, &saved, a->d_model_rows, a->qkv, B, T));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               product_backward(a->d_model_rows, g->qkv_weight, g->qkv_bias, a->qkv, a->ln1 + s * bt * d, w->qkv_weight,
                                rows, m->d, 3 * m->d, accumulate, a->sum_partials));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_NORM,
               layernorm_backward(a->d_residual, g->ln1_weight, g->ln1_bias, a->d_model_rows, x, w->ln1_weight,
                                  a->ln1_mean + s * bt, a->ln1_rstd + s * bt, rows, m->d, accumulate, a->sum_partials));
}

void model_backward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                    float loss_scale, const model_backward_hooks *hooks, bool accumulate) {
    if (!accumulate) zero_accumulated_grads(m);
    head_backward(m, targets, labels, B, T, loss_scale, accumulate);
    for (int l = m->L - 1; l >= 0; l--) {
        block_backward(m, l, B, T, hooks, accumulate);
        if (hooks && hooks->block_done) hooks->block_done(hooks->ctx, l);
    }
    PROF_TIMED(PROF_BACKWARD_LOSS, embedding_backward(m->g.tok_emb, inputs, m->acts.d_residual, B * T, m->d));
    if (hooks && hooks->block_done) hooks->block_done(hooks->ctx, -1);
}
