/* AdamW, learning-rate schedule and global-norm clipping (docs/model.md §1.4). */
#ifndef MOMFMM_OPTIMIZER_H
#define MOMFMM_OPTIMIZER_H
#include <stddef.h>

#include "config/config.h"
#include "model/model.h"

/* Learning rate at 1-based step `step`: linear warmup over train.warmup steps,
 * then cosine from lr to min_lr over the remaining steps, or constant. */
double optimizer_learning_rate(const config *c, long long step);

/* Sum of squares in double, in fixed lanes (vectorised, the same sum on
 * every machine): ZeRO-1 sums it over the ranks' slices for the exact global
 * norm (docs/scale.md §7). */
double optimizer_sum_squares(const float *grads, size_t n);
/* Global L2 norm of the gradient buffer (double accumulation). */
double optimizer_global_norm(const float *grads, size_t n);

/* PyTorch's clip_grad_norm_ as a factor: max_norm / (norm + 1e-6) when norm
 * exceeds max_norm (> 0), else 1. AdamW applies it to each gradient as it
 * reads it (optimizer_settings.grad_scale), which saves a pass over the
 * gradients and gives the same floats as scaling them first. */
float optimizer_clip_factor(double norm, double max_norm);

/* One AdamW step (PyTorch semantics) at 1-based step t over a contiguous
 * range; decay applies to the entries whose model_param says so. Each
 * gradient is multiplied by grad_scale first (clipping; 1 for none). */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    float grad_scale;
} optimizer_settings;

/* The whole model, tensor by tensor so that decay follows docs/model.md §1.4.
 * Where the GEMM engine keeps a bf16 copy of the weights (docs/scale.md §7),
 * the same pass writes it (docs/design.md §8.10): no model_params_changed
 * after this step. */
void optimizer_step_model(model *mdl, long long t, const optimizer_settings *s);
/* AdamW on elements [lo, hi) of the flat buffer, inside the model's moment
 * range (ZeRO-1 slice, docs/scale.md §7); grads[0] is element lo. Weight decay
 * follows each tensor's model_param, so a slice may cut tensors anywhere.
 * The bf16 copy is left to model_params_changed, after the all-gather. */
void optimizer_step_range(model *mdl, size_t lo, size_t hi, const float *grads, long long t,
                          const optimizer_settings *s);
#endif
