/* The transformer of docs/model.md §1: parameter layout, initialisation, forward and
 * backward. Attention lives in attention.c, the kernels in kernels.c. */
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

#define TOP(field) offsetof(model_tensors, field)
#define BLOCK(field) offsetof(model_block_tensors, field)

/* Counts the entry and its floats; fills it when m->entries is allocated
 * (build_layout runs twice: to count, then to fill). */
static void add_entry(model *m, const char *name, int rows, int cols, bool decay, int layer, size_t slot) {
    size_t numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    if (!m->entries) {
        m->n_entries++;
        m->n_params += numel;
        return;
    }
    model_param *e = &m->entries[m->n_entries++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = cols > 0 ? 2 : 1;
    e->shape[0] = rows;
    e->shape[1] = cols > 0 ? cols : 1;
    e->numel = (size_t)rows * (size_t)e->shape[1];
    e->offset = m->n_params;
    e->decay = decay;
    e->layer = layer;
    e->slot = slot;
    m->n_params += e->numel;
}

/* docs/files.md §4 names and PyTorch shapes, in forward order: counted
 * into n_entries and n_params while m->entries is NULL, else filled. */
static void add_entries(model *m) {
    const config *c = &m->cfg;
    add_entry(m, "tok_emb", m->V, m->d, true, -1, TOP(tok_emb));
    for (int i = 0; i < m->L; i++) {
        char name[PARAM_NAME_MAX];
#define BLOCK_ENTRY(suffix, rows, cols, decay, field)       \
    snprintf(name, sizeof name, "blocks/%d/%s", i, suffix); \
    add_entry(m, name, rows, cols, decay, i, BLOCK(field))
        BLOCK_ENTRY("ln1/weight", m->d, 0, false, ln1_weight);
        BLOCK_ENTRY("ln1/bias", m->d, 0, false, ln1_bias);
        BLOCK_ENTRY("attn/qkv/weight", 3 * m->d, m->d, true, qkv_weight);
        BLOCK_ENTRY("attn/qkv/bias", 3 * m->d, 0, false, qkv_bias);
        BLOCK_ENTRY("attn/proj/weight", m->d, m->d, true, proj_weight);
        BLOCK_ENTRY("attn/proj/bias", m->d, 0, false, proj_bias);
        if (c->learn_gamma) { BLOCK_ENTRY("attn/momentum_gamma", m->H, 0, false, momentum_gamma); }
        if (c->attention == ATTENTION_FMM) { BLOCK_ENTRY("attn/fmm_blend", 2, m->H, false, fmm_blend); }
        BLOCK_ENTRY("ln2/weight", m->d, 0, false, ln2_weight);
        BLOCK_ENTRY("ln2/bias", m->d, 0, false, ln2_bias);
        BLOCK_ENTRY("mlp/fc/weight", m->d_ff, m->d, true, fc_weight);
        BLOCK_ENTRY("mlp/fc/bias", m->d_ff, 0, false, fc_bias);
        BLOCK_ENTRY("mlp/proj/weight", m->d, m->d_ff, true, mlp_proj_weight);
        BLOCK_ENTRY("mlp/proj/bias", m->d, 0, false, mlp_proj_bias);
#undef BLOCK_ENTRY
    }
    add_entry(m, "ln_f/weight", m->d, 0, false, -1, TOP(ln_f_weight));
    add_entry(m, "ln_f/bias", m->d, 0, false, -1, TOP(ln_f_bias));
    if (c->head == HEAD_LM) {
        add_entry(m, "head/weight", m->V, m->d, true, -1, TOP(head_weight));
    } else {
        add_entry(m, "cls/weight", c->n_classes, m->d, true, -1, TOP(cls_weight));
        add_entry(m, "cls/bias", c->n_classes, 0, false, -1, TOP(cls_bias));
    }
}

static void set_dimensions(model *m, const config *cfg) {
    m->cfg = *cfg;
    m->d = cfg->d_model;
    m->H = cfg->n_heads;
    m->dh = cfg->d_model / cfg->n_heads;
    m->L = cfg->n_layers;
    m->V = cfg->vocab_size;
    m->d_ff = cfg->d_ff;
    m->n_out = cfg->head == HEAD_LM ? cfg->vocab_size : cfg->n_classes;
}

static void build_layout(model *m) {
    model counted;
    memset(&counted, 0, sizeof counted);
    set_dimensions(&counted, &m->cfg);
    add_entries(&counted);
    m->entries = sys_calloc((size_t)counted.n_entries, sizeof(model_param));
    m->n_entries = 0;
    m->n_params = 0;
    add_entries(m);
}

size_t model_param_count(const config *cfg) {
    model counted;
    memset(&counted, 0, sizeof counted);
    set_dimensions(&counted, cfg);
    add_entries(&counted);
    return counted.n_params;
}

/* Points every named tensor of `view` into `base` (params or grads). */
static void bind_tensors(const model *m, float *base, model_tensors *view) {
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        char *owner = e->layer < 0 ? (char *)view : (char *)&view->blocks[e->layer];
        *(float **)(owner + e->slot) = base + e->offset;
    }
}

void model_shard_moments(model *m, size_t first, size_t count) {
    free(m->adam_m);
    m->moment_first = first;
    m->moment_count = count;
    m->adam_m = sys_calloc_huge(2 * m->moment_count + 1, sizeof(float));
    m->adam_v = m->adam_m + m->moment_count;
}

/* training: params and grads in one allocation, adam_m and adam_v in
 * another (model_shard_moments replaces it); else params. */
_Static_assert(FMM_MAX_KERNELS >= CONFIG_LIST_MAX, "fmm_settings holds every fmm.kernels name");

static int model_build(model *m, const config *cfg, bool training, status *err) {
    memset(m, 0, sizeof *m);
    /* a config that skipped the command layer's checks (tests, library
     * callers) must not size the model: d_model % n_heads, odd head sizes */
    int rc = config_check_model(cfg, "model", err);
    if (rc != 0) return rc;
    set_dimensions(m, cfg);
    m->momentum = config_momentum_enabled(cfg);
    /* config.c parsed fmm.kernels into indices of CONFIG_FMM_KERNELS, the
     * order of fmm_feature_map */
    m->fmm.n_kernels = cfg->fmm_kernels.n;
    for (int i = 0; i < cfg->fmm_kernels.n; i++) m->fmm.kernels[i] = (fmm_feature_map)cfg->fmm_kernels.items[i];
    m->fmm.bandwidth = cfg->fmm_bandwidth;
    m->fmm.causal = cfg->causal;
    m->fmm.eps = (float)cfg->fmm_eps;
    m->fmm.chunk = cfg->fmm_chunk;
    m->fmm.band_tiles = cfg->attention_impl == ATTENTION_TILED;
    build_layout(m);
    m->moment_first = 0;
    m->moment_count = m->n_params;
    float *all = sys_calloc_huge((training ? 2 : 1) * m->n_params, sizeof(float));
    m->params = all;
    m->w.blocks = sys_calloc((size_t)m->L, sizeof(model_block_tensors));
    m->g.blocks = sys_calloc((size_t)m->L, sizeof(model_block_tensors));
    bind_tensors(m, m->params, &m->w);
    if (training) {
        m->grads = all + m->n_params;
        m->adam_m = sys_calloc_huge(2 * m->n_params, sizeof(float));
        m->adam_v = m->adam_m + m->n_params;
        bind_tensors(m, m->grads, &m->g);
    }
    m->n_buffer = (size_t)m->L * 2 * m->H * m->dh;
    m->buffers = sys_calloc(2 * m->n_buffer, sizeof(float));
    m->buffer_sums = m->buffers + m->n_buffer;
    m->rope_positions = cfg->max_seq_len > cfg->seq_len ? cfg->max_seq_len : cfg->seq_len;
    m->rope_cos = sys_calloc((size_t)m->rope_positions * m->dh, sizeof(float));
    m->rope_sin = m->rope_cos + (size_t)m->rope_positions * m->dh / 2;
    rope_tables(m->rope_cos, m->rope_sin, m->rope_positions, m->dh, cfg->rope_base);
    /* the bf16 engine keeps a bf16 copy of the whole parameter buffer
     * (docs/scale.md §7); a no-op for fp32 */
    gemm_register_weights(gemm_default(), m->params, m->n_params);
    return 0;
}

int model_create(model *m, const config *cfg, status *err) { return model_build(m, cfg, true, err); }

int model_create_for_inference(model *m, const config *cfg, status *err) { return model_build(m, cfg, false, err); }

static void activations_free(model_activations *a) {
    free(a->mem);
    free(a->predictions);
    memset(a, 0, sizeof *a);
}

void model_free(model *m) {
    gemm_unregister_weights(gemm_default(), m->params);
    activations_free(&m->acts);
    free(m->params);
    free(m->adam_m);
    free(m->w.blocks);
    free(m->g.blocks);
    free(m->buffers);
    free(m->rope_cos);
    free(m->entries);
    memset(m, 0, sizeof *m);
}

/* GPT-2 style: N(0, 0.02) weights, residual projections scaled by
 * 1/sqrt(2 L), zero biases, unit LayerNorm gains; gamma from the config,
 * blend logits 0 (docs/model.md §1.3). Each tensor draws from its own counter stream. */
void model_init_parameters(model *m) {
    uint64_t seed = (uint64_t)m->cfg.seed;
    float residual_scale = 1.0f / sqrtf(2.0f * (float)m->L);
    memset(m->params, 0, sizeof(float) * m->n_params);
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        float *p = m->params + e->offset;
        const char *leaf = strrchr(e->name, '/');
        leaf = leaf ? leaf + 1 : e->name;
        if (e->ndim == 1 && strcmp(leaf, "weight") == 0) { /* LayerNorm gains */
            for (size_t j = 0; j < e->numel; j++) p[j] = 1.0f;
        } else if (strcmp(leaf, "momentum_gamma") == 0) {
            for (size_t j = 0; j < e->numel; j++) p[j] = (float)m->cfg.gamma;
        } else if (e->decay) {
            float scale = 0.02f;
            if (strstr(e->name, "/proj/weight")) scale *= residual_scale;
            uint64_t key = rng_key(seed, 0x1417, (uint64_t)i, 0);
            for (size_t j = 0; j < e->numel; j++) p[j] = scale * (float)rng_normal(key, j);
        }
    }
    memset(m->buffers, 0, sizeof(float) * m->n_buffer);
    model_params_changed(m);
}

void model_params_changed(const model *m) { gemm_refresh_weights(gemm_default(), m->params); }

typedef struct {
    float **slot;
    size_t count;
} carve;

#define ACTIVATION_SLOTS 40

/* The activation buffer's layout for B rows of T: one entry per array. */
static size_t activation_plan(const model *m, model_activations *a, int B, int T, carve *plan) {
    size_t L = (size_t)m->L, bt = (size_t)B * T, d = (size_t)m->d, ff = (size_t)m->d_ff;
    bool lm = m->cfg.head == HEAD_LM, keep_p = m->cfg.learn_gamma;
    carve all[] = {
        {&a->residual, (L + 1) * bt * d},
        {&a->mid, L * bt * d},
        {&a->ln1, L * bt * d},
        {&a->ln1_mean, L * bt},
        {&a->ln1_rstd, L * bt},
        {&a->q_hat, L * bt * d},
        {&a->k_hat, L * bt * d},
        {&a->v_heads, L * bt * d},
        {&a->p_q, keep_p ? L * bt * d : 0},
        {&a->p_k, keep_p ? L * bt * d : 0},
        {&a->att_saved, L * B * m->H * attention_saved_per_head(&m->cfg, &m->fmm, T)},
        {&a->att_out, L * bt * d},
        {&a->ln2, L * bt * d},
        {&a->ln2_mean, L * bt},
        {&a->ln2_rstd, L * bt},
        {&a->fc_pre, L * bt * ff},
        {&a->fc_act, bt * ff},
        {&a->fc_tanh, L * bt * ff},
        {&a->ln_f, bt * d},
        {&a->ln_f_mean, bt},
        {&a->ln_f_rstd, bt},
        {&a->logits, lm ? bt * m->V : (size_t)B * m->n_out},
        {&a->pooled, lm ? 0 : (size_t)B * d},
        {&a->losses, bt},
        {&a->qkv, bt * 3 * d},
        {&a->d_residual, bt * d},
        {&a->d_model_rows, bt * d},
        {&a->d_ff, bt * ff},
        {&a->d_pooled, lm ? 0 : (size_t)B * d},
        {&a->head_scratch, attention_scratch_per_head(&m->cfg, &m->fmm, T) * (size_t)attention_threads()},
        {&a->probs, !m->keep_logits ? 0
                    : lm            ? bt * m->V
                                    : (size_t)B * m->n_out},
    };
    size_t n = sizeof all / sizeof all[0];
    memcpy(plan, all, sizeof all);
    return n;
}

size_t model_activation_bytes(const model *m, int B, int T) {
    model_activations probe;
    carve plan[ACTIVATION_SLOTS];
    size_t n = activation_plan(m, &probe, B, T, plan), total = 0;
    for (size_t i = 0; i < n; i++) total += plan[i].count;
    return total * sizeof(float) + (size_t)B * T * sizeof(int32_t);
}

static void activations_reserve(model *m, int B, int T) {
    model_activations *a = &m->acts;
    if (a->mem && B <= a->B && T <= a->T && a->kept_logits == m->keep_logits && attention_threads() <= a->threads)
        return;
    activations_free(a);
    a->B = B;
    a->T = T;
    a->threads = attention_threads();
    a->kept_logits = m->keep_logits;
    carve plan[ACTIVATION_SLOTS];
    size_t total = 0, n = activation_plan(m, a, B, T, plan);
    for (size_t i = 0; i < n; i++) total += plan[i].count;
    a->mem = sys_calloc_huge(total, sizeof(float));
    float *cursor = a->mem;
    for (size_t i = 0; i < n; i++) {
        *plan[i].slot = plan[i].count ? cursor : NULL;
        cursor += plan[i].count;
    }
    if (!a->probs) a->probs = a->logits; /* the softmax works in place */
    a->predictions = sys_calloc((size_t)B * T, sizeof(int32_t));
}

/* The residual adds, elementwise on OpenMP's threads. */
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

/* docs/model.md §1 item 4, cls: mean of x over the valid positions (targets != -1). */
static void pool_valid_positions(float *pooled, const float *x, const int32_t *mask, int B, int T, int d) {
    for (int b = 0; b < B; b++) {
        float *out = pooled + (size_t)b * d;
        memset(out, 0, sizeof(float) * d);
        int count = 0;
        for (int t = 0; t < T; t++) {
            if (mask[b * T + t] < 0) continue;
            add_into(out, x + ((size_t)b * T + t) * d, (size_t)d);
            count++;
        }
        for (int i = 0; i < d && count; i++) out[i] /= (float)count;
    }
}

static void unpool_valid_positions(float *dx, const float *d_pooled, const int32_t *mask, int B, int T, int d) {
    for (int b = 0; b < B; b++) {
        int count = 0;
        for (int t = 0; t < T; t++) count += mask[b * T + t] >= 0;
        for (int t = 0; t < T; t++) {
            float *row = dx + ((size_t)b * T + t) * d;
            for (int i = 0; i < d; i++)
                row[i] = mask[b * T + t] >= 0 ? d_pooled[(size_t)b * d + i] / (float)count : 0.0f;
        }
    }
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
    };
    return a;
}

/* Block l's slice of the saved attention state (a view for attention.c,
 * which knows nothing of `activations`, docs/design.md §8.1). */
attention_saved model_attention_saved(const model *m, int l, int B, int T) {
    const model_activations *a = &m->acts;
    size_t heads = (size_t)l * B * T * m->d;
    size_t saved = (size_t)l * B * m->H * attention_saved_per_head(&m->cfg, &m->fmm, T);
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
    };
    return s;
}

void model_block_forward(model *m, int l, int B, int T, bool collect_buffers) {
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T, d = (size_t)m->d, ff = (size_t)m->d_ff;
    int rows = (int)bt;
    const model_block_tensors *w = &m->w.blocks[l];
    float *x = a->residual + l * bt * d, *mid = a->mid + l * bt * d;
    float *ln1 = a->ln1 + l * bt * d, *ln2 = a->ln2 + l * bt * d, *att = a->att_out + l * bt * d;
    float *fc_pre = a->fc_pre + l * bt * ff, *fc_act = a->fc_act, *fc_tanh = a->fc_tanh + l * bt * ff;
    PROF_TIMED(PROF_FORWARD_NORM, layernorm_forward(ln1, a->ln1_mean + l * bt, a->ln1_rstd + l * bt, x, w->ln1_weight,
                                                    w->ln1_bias, rows, m->d));
    PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(a->qkv, ln1, w->qkv_weight, w->qkv_bias, rows, m->d, 3 * m->d));
    attention_layer view = model_attention_layer(m, l, collect_buffers);
    attention_saved saved = model_attention_saved(m, l, B, T);
    PROF_TIMED(PROF_FORWARD_ATTENTION, attention_forward(&view, &saved, a->qkv, att, B, T));
    PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(mid, att, w->proj_weight, w->proj_bias, rows, m->d, m->d));
    PROF_TIMED(PROF_FORWARD_ACTIVATION, add_into(mid, x, bt * d));
    PROF_TIMED(PROF_FORWARD_NORM, layernorm_forward(ln2, a->ln2_mean + l * bt, a->ln2_rstd + l * bt, mid, w->ln2_weight,
                                                    w->ln2_bias, rows, m->d));
    PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(fc_pre, ln2, w->fc_weight, w->fc_bias, rows, m->d, m->d_ff));
    PROF_TIMED(PROF_FORWARD_ACTIVATION, gelu_forward(fc_act, fc_tanh, fc_pre, bt * ff));
    float *out = a->residual + (l + 1) * bt * d;
    PROF_TIMED(PROF_FORWARD_LINEAR,
               matmul_forward(out, fc_act, w->mlp_proj_weight, w->mlp_proj_bias, rows, m->d_ff, m->d));
    PROF_TIMED(PROF_FORWARD_ACTIVATION, add_into(out, mid, bt * d));
}

/* The softmax runs on a copy when the model keeps its logits: the same
 * kernel on the same values, so probabilities and losses are unchanged. */
static void copy_logits_to_probs(model_activations *a, size_t n) {
    if (a->probs != a->logits) memcpy(a->probs, a->logits, sizeof(float) * n);
}

void model_forward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                   bool collect_buffers) {
    activations_reserve(m, B, T);
    model_activations *a = &m->acts;
    size_t bt = (size_t)B * T, d = (size_t)m->d;
    int rows = (int)bt;
    if (collect_buffers) memset(m->buffer_sums, 0, sizeof(float) * m->n_buffer);
    PROF_TIMED(PROF_FORWARD_LOSS, embedding_forward(a->residual, inputs, m->w.tok_emb, rows, m->d));
    for (int l = 0; l < m->L; l++) model_block_forward(m, l, B, T, collect_buffers);
    PROF_TIMED(PROF_FORWARD_NORM, layernorm_forward(a->ln_f, a->ln_f_mean, a->ln_f_rstd, a->residual + m->L * bt * d,
                                                    m->w.ln_f_weight, m->w.ln_f_bias, rows, m->d));
    if (m->cfg.head == HEAD_LM) {
        PROF_TIMED(PROF_FORWARD_LINEAR, matmul_forward(a->logits, a->ln_f, m->w.head_weight, NULL, rows, m->d, m->V));
        PROF_TIMED(PROF_FORWARD_LOSS, copy_logits_to_probs(a, bt * m->V));
        PROF_TIMED(PROF_FORWARD_LOSS, cross_entropy_forward(a->probs, a->losses, a->predictions, targets, rows, m->V));
    } else {
        PROF_TIMED(PROF_FORWARD_LOSS, pool_valid_positions(a->pooled, a->ln_f, targets, B, T, m->d));
        PROF_TIMED(PROF_FORWARD_LINEAR,
                   matmul_forward(a->logits, a->pooled, m->w.cls_weight, m->w.cls_bias, B, m->d, m->n_out));
        PROF_TIMED(PROF_FORWARD_LOSS, copy_logits_to_probs(a, (size_t)B * m->n_out));
        PROF_TIMED(PROF_FORWARD_LOSS, cross_entropy_forward(a->probs, a->losses, a->predictions, labels, B, m->n_out));
    }
}

double model_loss_sum(const model *m, const int32_t *targets, int B, int T, long long *count) {
    double sum = 0;
    long long n = 0;
    if (m->cfg.head == HEAD_CLS) {
        for (int b = 0; b < B; b++) sum += m->acts.losses[b];
        *count = B;
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
    if (m->cfg.head == HEAD_CLS) return B;
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

static void head_backward(model *m, const int32_t *targets, const int32_t *labels, int B, int T, float scale,
                          bool accumulate) {
    model_activations *a = &m->acts;
    int rows = B * T;
    if (m->cfg.head == HEAD_LM) {
        PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_backward(a->probs, targets, rows, m->V, scale));
        PROF_TIMED(PROF_BACKWARD_LINEAR, matmul_backward(a->d_model_rows, m->g.head_weight, NULL, a->probs, a->ln_f,
                                                         m->w.head_weight, rows, m->d, m->V, accumulate));
    } else {
        float *d_pooled = a->d_pooled;
        PROF_TIMED(PROF_BACKWARD_LOSS, cross_entropy_backward(a->probs, labels, B, m->n_out, scale));
        PROF_TIMED(PROF_BACKWARD_LINEAR, matmul_backward(d_pooled, m->g.cls_weight, m->g.cls_bias, a->probs, a->pooled,
                                                         m->w.cls_weight, B, m->d, m->n_out, accumulate));
        PROF_TIMED(PROF_BACKWARD_LOSS, unpool_valid_positions(a->d_model_rows, d_pooled, targets, B, T, m->d));
    }
    PROF_TIMED(PROF_BACKWARD_LOSS, memset(a->d_residual, 0, sizeof(float) * rows * m->d));
    PROF_TIMED(PROF_BACKWARD_NORM, layernorm_backward(a->d_residual, m->g.ln_f_weight, m->g.ln_f_bias, a->d_model_rows,
                                                      a->residual + (size_t)m->L * rows * m->d, m->w.ln_f_weight,
                                                      a->ln_f_mean, a->ln_f_rstd, rows, m->d, accumulate));
}

static void progress(const model_backward_hooks *hooks) {
    if (hooks && hooks->progress) hooks->progress(hooks->ctx);
}

static void block_backward(model *m, int l, int B, int T, const model_backward_hooks *hooks, bool accumulate) {
    model_activations *a = &m->acts;
    const model_block_tensors *w = &m->w.blocks[l];
    model_block_tensors *g = &m->g.blocks[l];
    size_t bt = (size_t)B * T, d = (size_t)m->d, ff = (size_t)m->d_ff;
    int rows = (int)bt;
    float *x = a->residual + l * bt * d, *mid = a->mid + l * bt * d;
    float *fc_pre = a->fc_pre + l * bt * ff;
    /* d_residual holds dL/d(block output); the residual paths pass it through
     * unchanged and each LayerNorm backward adds its branch into it. */
    /* the GELU output is not kept per layer: it follows from the saved
     * pre-activation and tanh term, the same floats as forward made */
    PROF_TIMED(PROF_BACKWARD_ACTIVATION, gelu_from_tanh(a->fc_act, fc_pre, a->fc_tanh + l * bt * ff, bt * ff));
    PROF_TIMED(PROF_BACKWARD_LINEAR, matmul_backward(a->d_ff, g->mlp_proj_weight, g->mlp_proj_bias, a->d_residual,
                                                     a->fc_act, w->mlp_proj_weight, rows, m->d_ff, m->d, accumulate));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_ACTIVATION, gelu_backward(a->d_ff, fc_pre, a->fc_tanh + l * bt * ff, a->d_ff, bt * ff));
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               matmul_backward(a->d_model_rows, g->fc_weight, g->fc_bias, a->d_ff, a->ln2 + l * bt * d, w->fc_weight,
                               rows, m->d, m->d_ff, accumulate));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_NORM,
               layernorm_backward(a->d_residual, g->ln2_weight, g->ln2_bias, a->d_model_rows, mid, w->ln2_weight,
                                  a->ln2_mean + l * bt, a->ln2_rstd + l * bt, rows, m->d, accumulate));
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               matmul_backward(a->d_model_rows, g->proj_weight, g->proj_bias, a->d_residual, a->att_out + l * bt * d,
                               w->proj_weight, rows, m->d, m->d, accumulate));
    progress(hooks);
    attention_layer view = model_attention_layer(m, l, false);
    attention_saved saved = model_attention_saved(m, l, B, T);
    PROF_TIMED(PROF_BACKWARD_ATTENTION, attention_backward(&view, &saved, a->d_model_rows, a->qkv, B, T));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_LINEAR,
               matmul_backward(a->d_model_rows, g->qkv_weight, g->qkv_bias, a->qkv, a->ln1 + l * bt * d, w->qkv_weight,
                               rows, m->d, 3 * m->d, accumulate));
    progress(hooks);
    PROF_TIMED(PROF_BACKWARD_NORM,
               layernorm_backward(a->d_residual, g->ln1_weight, g->ln1_bias, a->d_model_rows, x, w->ln1_weight,
                                  a->ln1_mean + l * bt, a->ln1_rstd + l * bt, rows, m->d, accumulate));
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

/* 6 FLOPs per weight per token (forward 2, backward 4) for every matmul,
 * plus attention: softmax counts full T x T products (QK^T and PV: 4 T d
 * forward, 8 T d backward), causal or not, as nanoGPT and bench_torch.py
 * do (docs/cli.md, `bench`); FMM counts its band, chunks and dh x dh states. */
double model_flops_per_token(const model *m, int T) {
    double d = m->d, ff = m->d_ff, dh = m->dh;
    double per_block = 6.0 * (3 * d * d + d * d + 2 * d * ff);
    double attention;
    if (m->cfg.attention == ATTENTION_FMM) {
        double near = 4.0 * m->fmm.bandwidth * d;
        double far = m->fmm.n_kernels * (4.0 * m->fmm.chunk * d + 6.0 * dh * d);
        attention = 3.0 * (near + far);
    } else {
        attention = 12.0 * T * d;
    }
    return m->L * (per_block + attention) + 6.0 * d * m->n_out;
}

int model_gemm_shapes(const model *m, int rows, gemm_shape *out) {
    const struct {
        int in, out;
    } linear[] = {{m->d, 3 * m->d}, {m->d, m->d}, {m->d, m->d_ff}, {m->d_ff, m->d}, {m->d, m->n_out}};
    int n = 0, layers = m->cfg.head == HEAD_LM ? 5 : 4; /* the cls head's product is tiny */
    for (int i = 0; i < layers; i++) {
        int in = linear[i].in, o = linear[i].out, count = i < 4 ? m->L : 1;
        out[n++] = (gemm_shape){GEMM_CLASS_FORWARD, rows, o, in, 1.0f, count};
        out[n++] = (gemm_shape){GEMM_CLASS_BACKWARD_DATA, rows, in, o, 0.0f, count};
        out[n++] = (gemm_shape){GEMM_CLASS_BACKWARD_WEIGHT, o, in, rows, 0.0f, count};
    }
    return n;
}
