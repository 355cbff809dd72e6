/* AdamW with PyTorch semantics (docs/model.md §1.4): bias-corrected moments, eps after
 * the square root, decoupled weight decay p -= lr * wd * p applied first. */
#include "training/optimizer.h"

#include <math.h>

#include "base/cpu.h"
#include "base/fast_math.h"
#include "kernels/gemm.h"

double optimizer_learning_rate(const config *c, long long step) {
    if (c->warmup > 0 && step <= c->warmup) return c->lr * (double)step / (double)c->warmup;
    if (c->schedule == SCHEDULE_CONSTANT) return c->lr;
    long long decay_steps = c->steps - c->warmup;
    if (decay_steps <= 0) return c->lr;
    double progress = (double)(step - c->warmup) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * progress));
}

/* A sequential double sum may not be reordered (strict C11), so it runs at
 * one add per cycle; eight fixed lanes vectorise and give every clone and
 * machine the same sum. */
#define SQUARE_LANES 8

VECTOR_CLONES static double block_sum_squares(const float *grads, size_t n) {
    double lanes[SQUARE_LANES] = {0};
    size_t i = 0;
    for (; i + SQUARE_LANES <= n; i += SQUARE_LANES)
        for (int k = 0; k < SQUARE_LANES; k++) lanes[k] += (double)grads[i + k] * grads[i + k];
    for (int k = 0; i < n; i++, k++) lanes[k] += (double)grads[i] * grads[i];
    double sum = 0;
    for (int k = 0; k < SQUARE_LANES; k++) sum += lanes[k];
    return sum;
}

/* Blocks whose size depends on n alone, summed by any thread and added in
 * block order: the same sum on any number of threads. */
#define SQUARE_BLOCKS_MAX 4096
#define SQUARE_BLOCK_MIN 65536

double optimizer_sum_squares(const float *grads, size_t n) {
    size_t block = (n + SQUARE_BLOCKS_MAX - 1) / SQUARE_BLOCKS_MAX;
    block = block < SQUARE_BLOCK_MIN ? SQUARE_BLOCK_MIN : block;
    size_t blocks = (n + block - 1) / block;
    double partial[SQUARE_BLOCKS_MAX];
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t lo = b * block, hi = lo + block < n ? lo + block : n;
        partial[b] = block_sum_squares(grads + lo, hi - lo);
    }
    double sum = 0;
    for (size_t b = 0; b < blocks; b++) sum += partial[b];
    return sum;
}

double optimizer_global_norm(const float *grads, size_t n) { return sqrt(optimizer_sum_squares(grads, n)); }

float optimizer_clip_factor(double norm, double max_norm) {
    if (max_norm <= 0 || norm <= max_norm) return 1.0f;
    return (float)(max_norm / (norm + 1e-6));
}

typedef struct {
    float b1, b2, one_minus_b1, one_minus_b2, correction2_sqrt, step_size, decay_factor, scale, eps;
} adamw_constants;

VECTOR_CLONES static void adamw_block(float *params, const float *grads, float *m, float *v, size_t n,
                                      const adamw_constants *k) {
    float b1 = k->b1, b2 = k->b2, one_minus_b1 = k->one_minus_b1, one_minus_b2 = k->one_minus_b2;
    float correction2_sqrt = k->correction2_sqrt, step_size = k->step_size, eps = k->eps;
    float decay_factor = k->decay_factor, scale = k->scale;
    for (size_t i = 0; i < n; i++) {
        float g = scale == 1.0f ? grads[i] : grads[i] * scale;
        params[i] *= decay_factor;
        m[i] = b1 * m[i] + one_minus_b1 * g;
        v[i] = b2 * v[i] + one_minus_b2 * g * g;
        float denom = sqrtf(v[i]) / correction2_sqrt + eps;
        params[i] -= step_size * m[i] / denom;
    }
}

/* Parameters updated, then converted to their bf16 copy while still in L1
 * (8 KB): the copy costs a write of 2 bytes per parameter in AdamW's pass
 * instead of a pass of its own that read the 4 bytes again (docs/design.md
 * §8.10). */
#define COPY_BLOCK 2048

static void optimizer_adamw(float *params, const float *grads, float *m, float *v, size_t n, long long t,
                            const optimizer_settings *s, int decay, uint16_t *bf16) {
    float lr = (float)s->lr;
    adamw_constants k = {
        .b1 = (float)s->beta1,
        .b2 = (float)s->beta2,
        /* 1 - beta in double: 1.0f - 0.999f is off by 1e-5 relative */
        .one_minus_b1 = (float)(1.0 - s->beta1),
        .one_minus_b2 = (float)(1.0 - s->beta2),
        .correction2_sqrt = (float)sqrt(1.0 - pow(s->beta2, (double)t)),
        .step_size = lr / (float)(1.0 - pow(s->beta1, (double)t)),
        .decay_factor = decay ? 1.0f - lr * (float)s->weight_decay : 1.0f,
        .scale = s->grad_scale,
        .eps = (float)s->eps,
    };
    for (size_t at = 0; at < n; at += COPY_BLOCK) {
        size_t len = n - at < COPY_BLOCK ? n - at : COPY_BLOCK;
        adamw_block(params + at, grads + at, m + at, v + at, len, &k);
        if (bf16) cpu_f32_to_bf16(bf16 + at, params + at, len);
    }
}

/* [lo, hi) tensor by tensor: the piece of each entry inside the range. */
static void step_chunk(model *mdl, size_t lo, size_t hi, const float *grads, long long t, const optimizer_settings *s,
                       uint16_t *bf16) {
    for (int i = 0; i < mdl->n_entries; i++) {
        const model_param *e = &mdl->entries[i];
        size_t a = e->offset > lo ? e->offset : lo, end = e->offset + e->numel, b = end < hi ? end : hi;
        if (a >= b) continue;
        size_t moment = a - mdl->moment_first;
        optimizer_adamw(mdl->params + a, grads + (a - lo), mdl->adam_m + moment, mdl->adam_v + moment, b - a, t, s,
                        e->decay, bf16 ? bf16 + a : NULL);
    }
}

/* Elementwise, so chunks of the range run on OpenMP's threads with the
 * results of one thread (docs/design.md §8.10). bf16: the copy of the
 * whole parameter buffer to write, or NULL. */
#define STEP_CHUNK 65536

static void step_range(model *mdl, size_t lo, size_t hi, const float *grads, long long t, const optimizer_settings *s,
                       uint16_t *bf16) {
    size_t chunks = (hi - lo + STEP_CHUNK - 1) / STEP_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t a = lo + c * STEP_CHUNK, b = a + STEP_CHUNK < hi ? a + STEP_CHUNK : hi;
        step_chunk(mdl, a, b, grads + (a - lo), t, s, bf16);
    }
}

void optimizer_step_model(model *mdl, long long t, const optimizer_settings *s) {
    step_range(mdl, 0, mdl->n_params, mdl->grads, t, s, gemm_weights_for_update(gemm_default(), mdl->params));
}

void optimizer_step_range(model *mdl, size_t lo, size_t hi, const float *grads, long long t,
                          const optimizer_settings *s) {
    step_range(mdl, lo, hi, grads, t, s, NULL);
}
