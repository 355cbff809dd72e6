/* The model's memory (docs/design.md §8.2): the parameter name table and
 * the four flat buffers it carves (parameters, gradients, AdamW moments),
 * initialisation, and the activation plan that carves one buffer for the
 * largest batch and length seen and gives the memory estimate; with them
 * the model's sizes (FLOPs per token, GEMM shapes). Forward and backward
 * are model.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/sys.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "parallel/context.h"

#include "model_internal.h"

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
    m->dh = config_head_dim(cfg);
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
    /* attention's products in the precision of the model's others: the
     * engine the command chose from train.precision or --precision
     * (cmd_use_precision), which a checkpoint's config may not say */
    gemm_ctx *engine = gemm_default();
    m->fmm.bf16 = engine && gemm_ctx_engine(engine) == GEMM_ONEDNN_BF16;
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
    m->cut = context_cut_of(cfg->seq_len, 1, 0, false); /* whole sequences until model_cut_sequences */
    m->head_rows = HEAD_PASS_FLOATS / m->V > 256 ? HEAD_PASS_FLOATS / m->V : 256;
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

#define NORMAL_CHUNK 16384

/* p[j] = scale * N(0, 1) drawn at counter `first` + j, for j < n, on
 * OpenMP's threads: each draw is a pure function of its counter (rng.h), so
 * the bits do not depend on the threads (docs/design.md §8.3). */
static void draw_normals(float *p, size_t n, uint64_t key, size_t first, float scale) {
    size_t chunks = (n + NORMAL_CHUNK - 1) / NORMAL_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t end = (c + 1) * NORMAL_CHUNK < n ? (c + 1) * NORMAL_CHUNK : n;
        for (size_t j = c * NORMAL_CHUNK; j < end; j++) p[j] = scale * (float)rng_normal(key, first + j);
    }
}

/* GPT-2 style: N(0, 0.02) weights, residual projections scaled by
 * 1/sqrt(2 L), zero biases, unit LayerNorm gains; gamma from the config,
 * blend logits 0 (docs/model.md §1.3). Each tensor draws from its own counter stream. */
void model_init_parameter_range(model *m, size_t first, size_t count) {
    uint64_t seed = (uint64_t)m->cfg.seed;
    float residual_scale = 1.0f / sqrtf(2.0f * (float)m->L);
    memset(m->params, 0, sizeof(float) * m->n_params);
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        if (first + count <= e->offset || first >= e->offset + e->numel) continue;
        /* the tensor's elements [lo, hi) that lie in the range */
        size_t lo = first > e->offset ? first - e->offset : 0, end = first + count - e->offset;
        size_t hi = end < e->numel ? end : e->numel;
        float *p = m->params + e->offset;
        const char *leaf = strrchr(e->name, '/');
        leaf = leaf ? leaf + 1 : e->name;
        if (e->ndim == 1 && strcmp(leaf, "weight") == 0) { /* LayerNorm gains */
            for (size_t j = lo; j < hi; j++) p[j] = 1.0f;
        } else if (strcmp(leaf, "momentum_gamma") == 0) {
            for (size_t j = lo; j < hi; j++) p[j] = (float)m->cfg.gamma;
        } else if (e->decay) {
            float scale = 0.02f;
            if (strstr(e->name, "/proj/weight")) scale *= residual_scale;
            draw_normals(p + lo, hi - lo, rng_key(seed, 0x1417, (uint64_t)i, 0), lo, scale);
        }
    }
    memset(m->buffers, 0, sizeof(float) * m->n_buffer);
}

void model_init_parameters(model *m) {
    model_init_parameter_range(m, 0, m->n_params);
    model_params_changed(m);
}

void model_params_changed(const model *m) { gemm_refresh_weights(gemm_default(), m->params); }

typedef struct {
    float **slot;
    size_t count;
} carve;

#define ACTIVATION_SLOTS 40

/* Copies of a part of the per-block forward state (the MLP's: ln2 ...
 * fc_slope; or the attention sublayer's: mid ... att_out): one per block,
 * or one that every block's forward overwrites and backward remakes from
 * what the block keeps (docs/scale.md §7): train.recompute = mlp remakes
 * the MLP's from mid, block both from the block's input, which the
 * residual stream keeps for every block. */
static size_t state_copies(const model *m, bool mlp) {
    int r = m->cfg.recompute;
    return r == RECOMPUTE_BLOCK || (mlp && r == RECOMPUTE_MLP) ? 1 : (size_t)m->L;
}

int model_head_pass_rows(const model *m, int rows) {
    return m->keep_logits || rows <= m->head_rows ? rows : m->head_rows;
}

size_t model_activation_slot(const model *m, int layer, bool mlp) {
    return state_copies(m, mlp) == 1 ? 0 : (size_t)layer;
}

/* One buffer holds, each in its turn, a block's qkv product (read by
 * attention's forward, which saves what backward needs in q_hat ...), the
 * fc product fc_pre (read by GELU's forward, which saves the output and
 * its slope per block) and the qkv gradient. None of the three is read
 * after the next is written, so one buffer of the largest holds them: 4 KB
 * a token at d 256 and d_ff 1,024, where three would take 10 KB
 * (docs/scale.md §7). */
static size_t work_floats(const model *m, size_t bt) {
    size_t ff = (size_t)m->d_ff, qkv = 3 * (size_t)m->d;
    return bt * (ff > qkv ? ff : qkv);
}

/* The widest sum over rows backward makes: the qkv or fc bias, or the
 * classifier's (the LM head has no bias). */
static int widest_sum(const model *m) {
    int widest = 3 * m->d > m->d_ff ? 3 * m->d : m->d_ff;
    return m->cfg.head != HEAD_LM && m->n_out > widest ? m->n_out : widest;
}

/* The activation buffer's layout for B rows of T: one entry per array. */
static size_t activation_plan(const model *m, model_activations *a, int B, int T, carve *plan) {
    size_t L = (size_t)m->L, bt = (size_t)B * T, d = (size_t)m->d, ff = (size_t)m->d_ff;
    size_t K = state_copies(m, false), KM = state_copies(m, true);
    bool lm = m->cfg.head == HEAD_LM, keep_p = m->cfg.learn_gamma, sharded = m->cut.chunks > 1;
    attention_layer_sizes z = {&m->cfg, &m->fmm, sharded ? &m->cut : NULL, T};
    carve all[] = {
        {&a->residual, (L + 1) * bt * d},
        {&a->mid, K * bt * d},
        {&a->ln1, K * bt * d},
        {&a->ln1_mean, K * bt},
        {&a->ln1_rstd, K * bt},
        {&a->q_hat, K * bt * d},
        {&a->k_hat, K * bt * d},
        {&a->v_heads, K * bt * d},
        {&a->p_q, keep_p ? K * bt * d : 0},
        {&a->p_k, keep_p ? K * bt * d : 0},
        {&a->att_saved, K * B * m->H * attention_saved_per_head(&z)},
        {&a->att_out, K * bt * d},
        {&a->ln2, KM * bt * d},
        {&a->ln2_mean, KM * bt},
        {&a->ln2_rstd, KM * bt},
        {&a->fc_act, KM * bt * ff},
        {&a->fc_slope, KM * bt * ff},
        {&a->fc_pre, work_floats(m, bt)},
        {&a->ln_f, bt * d},
        {&a->ln_f_mean, bt},
        {&a->ln_f_rstd, bt},
        {&a->logits, lm ? model_head_pass_rows(m, (int)bt) * (size_t)m->V : (size_t)B * m->n_out},
        {&a->pooled, lm ? 0 : (size_t)B * d},
        {&a->losses, bt},
        {&a->d_residual, bt * d},
        {&a->d_model_rows, bt * d},
        {&a->d_pooled, lm ? 0 : (size_t)B * d},
        {&a->pool_counts, lm ? 0 : (size_t)B},
        {&a->cls_grads, lm || !sharded ? 0 : (size_t)m->n_out * (d + 1)},
        {&a->exchange, attention_exchange_floats(&z, B)},
        {&a->att_row_sums, attention_row_sums_floats(&z, B)},
        {&a->head_scratch, attention_scratch_per_head(&z) * (size_t)attention_threads()},
        {&a->sum_partials, kernel_sum_partials_floats(widest_sum(m))},
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

void model_reserve_activations(model *m, int B, int T) {
    model_activations *a = &m->acts;
    if (a->mem && B <= a->B && T <= a->T && a->kept_logits == m->keep_logits && a->head_rows == m->head_rows &&
        attention_threads() <= a->threads && a->cut_chunks == m->cut.chunks && a->cut_seq == m->cut.T_seq)
        return;
    activations_free(a);
    a->B = B;
    a->T = T;
    a->cut_chunks = m->cut.chunks;
    a->cut_seq = m->cut.T_seq;
    a->threads = attention_threads();
    a->kept_logits = m->keep_logits;
    a->head_rows = m->head_rows;
    a->state_of = -1;
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
    a->qkv = a->fc_pre;                  /* work_floats */
    a->predictions = sys_calloc((size_t)B * T, sizeof(int32_t));
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
        /* the LM head runs on passes of model_head_pass_rows rows */
        int r = i < 4 ? rows : model_head_pass_rows(m, rows);
        out[n++] = (gemm_shape){GEMM_CLASS_FORWARD, r, o, in, 1.0f, count};
        out[n++] = (gemm_shape){GEMM_CLASS_BACKWARD_DATA, r, in, o, 0.0f, count};
        out[n++] = (gemm_shape){GEMM_CLASS_BACKWARD_WEIGHT, o, in, r, 0.0f, count};
    }
    return n;
}
