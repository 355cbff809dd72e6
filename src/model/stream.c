/* Streaming inference (docs/model.md §1.2; docs/cli.md §5: `generate`, `eval --stream`): the model
 * of model.c run on segments of a stream, with the caches and carries of
 * stream_state; see stream.h (docs/design.md §8.6). */
#include "model/stream.h"

#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "base/sys.h"
#include "kernels/kernels.h"

typedef struct {
    float **slot;
    size_t count;
} stream_carve;

int stream_check(const model *m, int capacity, status *err) {
    if (!m->cfg.causal || m->cfg.head != HEAD_LM)
        return status_fail(err, EXIT_USAGE, "streaming needs a causal lm model (model.causal = true, model.head = lm)");
    if (capacity > m->rope_positions)
        return status_fail(err, EXIT_USAGE, "stream of %d positions is longer than the model's %d (model.max_seq_len)",
                           capacity, m->rope_positions);
    return 0;
}

int stream_create(stream_state *st, const model *m, int S, int capacity, int n_max, status *err) {
    memset(st, 0, sizeof *st);
    if (stream_check(m, capacity, err) != 0) return err ? err->code : EXIT_USAGE;
    st->S = S, st->capacity = capacity, st->n_max = n_max;
    size_t L = (size_t)m->L, heads = (size_t)S * m->H, dh = (size_t)m->dh, rows = (size_t)S * n_max;
    size_t d = (size_t)m->d, ff = (size_t)m->d_ff;
    stream_carve plan[] = {
        {&st->k_cache, L * heads * capacity * dh},
        {&st->v_cache, L * heads * capacity * dh},
        {&st->carry_x, L * 2 * heads * dh},
        {&st->carry_p, L * 2 * heads * dh},
        {&st->far_state, L * heads * fmm_stream_state_floats(&m->fmm, m->dh)},
        {&st->x, rows * d},
        {&st->mid, rows * d},
        {&st->ln, rows * d},
        {&st->qkv, rows * 3 * d},
        {&st->att, rows * d},
        {&st->fc, rows * ff},
        {&st->stats, 2 * rows},
        {&st->head_scratch, attention_stream_scratch_floats(&m->cfg, &m->fmm, n_max, m->dh)},
        {&st->probs, attention_stream_probs_floats(&m->cfg, n_max, capacity)},
        {&st->rope_cos, (size_t)n_max * (dh / 2)},
        {&st->rope_sin, (size_t)n_max * (dh / 2)},
    };
    size_t total = 0, n = sizeof plan / sizeof plan[0];
    for (size_t i = 0; i < n; i++) total += plan[i].count;
    st->mem = sys_calloc(total, sizeof(float));
    float *cursor = st->mem;
    for (size_t i = 0; i < n; i++) {
        *plan[i].slot = cursor;
        cursor += plan[i].count;
    }
    return 0;
}

void stream_free(stream_state *st) {
    free(st->mem);
    memset(st, 0, sizeof *st);
}

/* Block l's slice of the caches and carries, for attention.c. */
static attention_stream_layer stream_layer(const model *m, const stream_state *st, int l) {
    size_t heads = (size_t)l * st->S * m->H, dh = (size_t)m->dh;
    attention_stream_layer a = {
        .S = st->S,
        .capacity = st->capacity,
        .pos = st->pos,
        .k_cache = st->k_cache + heads * st->capacity * dh,
        .v_cache = st->v_cache + heads * st->capacity * dh,
        .carry_x = st->carry_x + 2 * heads * dh,
        .carry_p = st->carry_p + 2 * heads * dh,
        .far_state = st->far_state + heads * fmm_stream_state_floats(&m->fmm, m->dh),
        .scratch = st->head_scratch,
        .probs = st->probs,
        .rope_pos = 0,
        .continued = st->dropped + st->pos > 0,
    };
    return a;
}

/* One block on the segment, the same kernels as model_block_forward. */
static void stream_block(model *m, stream_state *st, int l, int rows, int n) {
    const model_block_tensors *w = &m->w.blocks[l];
    float *mean = st->stats, *rstd = st->stats + rows;
    layernorm_forward(st->ln, mean, rstd, st->x, w->ln1_weight, w->ln1_bias, rows, m->d);
    matmul_forward(st->qkv, st->ln, w->qkv_weight, w->qkv_bias, rows, m->d, 3 * m->d);
    attention_layer view = model_attention_layer(m, l, false);
    view.rope_cos = st->rope_cos, view.rope_sin = st->rope_sin; /* the segment's absolute positions */
    attention_stream_layer cache = stream_layer(m, st, l);
    attention_stream_forward(&view, &cache, st->qkv, st->att, n);
    matmul_forward(st->mid, st->att, w->proj_weight, NULL, rows, m->d, m->d);
    layernorm_residual_forward(st->ln, mean, rstd, st->mid, w->proj_bias, st->x, w->ln2_weight, w->ln2_bias, rows,
                               m->d);
    matmul_forward(st->fc, st->ln, w->fc_weight, NULL, rows, m->d, m->d_ff);
    gelu_bias_forward(st->fc, NULL, st->fc, w->fc_bias, rows, m->d_ff);
    matmul_forward(st->x, st->fc, w->mlp_proj_weight, NULL, rows, m->d_ff, m->d);
    residual_add(st->x, w->mlp_proj_bias, st->mid, rows, m->d);
}

int stream_forward(model *m, stream_state *st, const int32_t *tokens, int n, float *logits, status *err) {
    if (n > st->n_max || st->pos + n > st->capacity)
        return status_fail(err, 1, "internal: stream segment of %d at %d exceeds %d / %d", n, st->pos, st->n_max,
                           st->capacity);
    int rows = st->S * n;
    rope_tables_from(st->rope_cos, st->rope_sin, st->dropped + st->pos, n, m->dh, m->cfg.rope_base);
    embedding_forward(st->x, tokens, m->w.tok_emb, rows, m->d);
    for (int l = 0; l < m->L; l++) stream_block(m, st, l, rows, n);
    layernorm_forward(st->ln, st->stats, st->stats + rows, st->x, m->w.ln_f_weight, m->w.ln_f_bias, rows, m->d);
    matmul_forward(logits, st->ln, m->w.head_weight, NULL, rows, m->d, m->V);
    st->pos += n;
    return 0;
}

void stream_slide(const model *m, stream_state *st, int keep) {
    if (keep >= st->pos) return;
    int drop = st->pos - keep;
    size_t dh = (size_t)m->dh, caches = (size_t)m->L * st->S * m->H;
    for (size_t c = 0; c < caches; c++) {
        float *k = st->k_cache + c * st->capacity * dh, *v = st->v_cache + c * st->capacity * dh;
        memmove(k, k + drop * dh, sizeof(float) * keep * dh);
        memmove(v, v + drop * dh, sizeof(float) * keep * dh);
    }
    st->dropped += drop;
    st->pos = keep;
}
