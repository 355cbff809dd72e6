/* The transformer of docs/model.md §1. Parameters, gradients and AdamW moments are four
 * contiguous buffers of n_params floats sharing one layout (as llm.c does):
 * the model_param table names each tensor's slice, so all-reduce, checksums
 * and checkpoints are one loop. Activations are one more buffer. */
#ifndef MOMFMM_MODEL_H
#define MOMFMM_MODEL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "attention/fmm.h"
#include "base/status.h"
#include "config/config.h"
#include "kernels/gemm.h"

#define PARAM_NAME_MAX 64

typedef struct {
    char name[PARAM_NAME_MAX]; /* docs/files.md §4 name, e.g. "blocks/0/attn/qkv/weight" */
    int ndim;
    int shape[2];
    size_t offset, numel;
    bool decay;  /* AdamW weight decay applies (2-D weights, docs/model.md §1.4) */
    int layer;   /* block index, or -1 */
    size_t slot; /* byte offset of the float* in model_tensors / model_block_tensors */
} model_param;

typedef struct {
    float *ln1_weight, *ln1_bias, *qkv_weight, *qkv_bias, *proj_weight, *proj_bias;
    float *momentum_gamma, *fmm_blend; /* NULL unless learn_gamma / fmm */
    float *ln2_weight, *ln2_bias, *fc_weight, *fc_bias, *mlp_proj_weight, *mlp_proj_bias;
} model_block_tensors;

typedef struct {
    float *tok_emb;
    model_block_tensors *blocks;
    float *ln_f_weight, *ln_f_bias;
    float *head_weight;           /* lm */
    float *cls_weight, *cls_bias; /* cls */
} model_tensors;

/* Saved forward state and backward scratch for a batch of B rows of T. */
typedef struct {
    int B, T;                         /* capacity */
    int threads;                      /* heads' scratch areas (attention_threads() when reserved) */
    bool kept_logits;                 /* laid out with probs apart from logits */
    int cut_chunks, cut_seq;          /* laid out for this cut (model.cut) */
    int head_rows;                    /* laid out for passes of these rows (model.head_rows) */
    int state_of;                     /* the block forwarded last, -1 none; with train.recompute the
                                       * [L] of what it remakes is [1], that block's (docs/scale.md §7) */
    float *residual;                  /* [L+1][B*T*d]: block inputs, final stream */
    float *mid;                       /* [L][B*T*d]: after attention */
    float *ln1, *ln1_mean, *ln1_rstd; /* [L][B*T*d], [L][B*T] */
    float *q_hat, *k_hat, *v_heads;   /* [L][B*H*T*dh] head-major, rotated, sheared */
    float *p_q, *p_k;                 /* [L][B*H*T*dh], momentum p (learned gamma) */
    float *att_saved;                 /* [L][B*H*saved_per_head] */
    float *att_out;                   /* [L][B*T*d] heads merged */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc_act, *fc_slope; /* [L][B*T*d_ff]: the GELU output (read by the MLP's output product,
                               * in bf16 alone where the products read bf16: the first half of
                               * each layer's floats; backward writes its gradient d_ff over
                               * it) and its slope (read by GELU's backward) */
    float *fc_pre;            /* [B*T*d_ff]: one layer's fc product, read by GELU's forward alone;
                               * shares its memory with qkv (params.c's work_floats) */
    float *ln_f, *ln_f_mean, *ln_f_rstd;
    float *logits;        /* [B*T*V] (lm) or [B*n_classes] (cls) */
    float *probs;         /* the same shape: softmax of logits; == logits (overwritten)
                                        * unless the model keeps logits */
    bool dlogits;         /* probs holds the loss's gradient instead (model_forward_train) */
    bool head_done;       /* the LM head's gradients are made (model_forward_train) */
    float *pooled;        /* [B*d] (cls) */
    float *losses;        /* [B*T] (lm) or [B] (cls) */
    int32_t *predictions; /* [B*T] or [B] */
    /* scratch */
    float *qkv;                       /* [B*T*3d]: the qkv product, then its gradient */
    float *d_residual, *d_model_rows; /* [B*T*d] */
    float *d_pooled;                  /* [B*d] (cls) */
    float *pool_counts;               /* [B] (cls): valid positions of each row, over the context group */
    float *cls_grads;                 /* [n_out*(d+1)] (cls, context rank > 0): the head's gradients, dropped */
    float *exchange;                  /* the context group's messages (attention_exchange_floats) */
    float *att_row_sums;              /* each batch row's share of attention's sums over the batch */
    float *head_scratch;              /* per-head scratch: T*T or fmm scratch, + 2*T*dh */
    float *sum_partials;              /* the blocks' partial sums of a bias or LayerNorm gradient (kernels.h) */
    float *mem;
} model_activations;

typedef struct model model;
/* Hooks of the backward pass for the data-parallel layer: block_done after
 * block `layer` has all its gradients (-1: all gradients done), to launch
 * all-reduce buckets; progress between kernels, because Open MPI advances
 * non-blocking collectives only inside MPI calls. Either may be NULL. */
typedef struct {
    void (*block_done)(void *ctx, int layer);
    void (*progress)(void *ctx);
    void *ctx;
} model_backward_hooks;

struct model {
    config cfg;
    int d, H, dh, L, V, d_ff, n_out; /* n_out: V (lm) or n_classes (cls) */
    bool momentum;
    fmm_settings fmm;
    model_param *entries;
    int n_entries;
    size_t n_params;
    float *params, *grads, *adam_m, *adam_v; /* grads, moments: NULL for inference */
    /* The moments cover elements [moment_first, moment_first + moment_count)
     * of the flat buffer: all of it, or this rank's ZeRO-1 slice
     * (dist.zero = 1, docs/scale.md §7); adam_m[0] is element moment_first. */
    size_t moment_first, moment_count;
    /* The forward leaves logits in acts.logits and probabilities in
     * acts.probs (eval --stream compares logits, docs/design.md §8.5);
     * otherwise the softmax overwrites the logits, saving B*T*V floats. */
    bool keep_logits;
    /* Otherwise the LM head runs on passes of at most head_rows rows
     * (HEAD_PASS_FLOATS / V, at least 256), its logits one pass's, and
     * backward remakes each pass's logits (docs/scale.md §7): a long shard
     * does not hold B*T*V floats. Tests may lower it. */
    int head_rows;
    model_tensors w, g; /* views into params and grads */
    /* docs/model.md §1.2 momentum buffers prev_q, prev_k: [L][2][H][dh]. buffer_sums
     * collects this rank's sum of last-position vectors during a training
     * forward, so that averaging over the global batch is one reduction. */
    float *buffers, *buffer_sums;
    size_t n_buffer;
    int rope_positions;
    float *rope_cos, *rope_sin;
    /* This rank's positions of every sequence (model_cut_sequences): whole
     * sequences (one chunk) unless a context group shares them
     * (dist.context > 1, docs/design.md §8.12). */
    context_cut cut;
    model_activations acts;
};

/* Builds the layout and allocates every buffer (parameters, gradients,
 * AdamW moments); parameters are zero until model_init_parameters or a
 * checkpoint fills them. Returns 0, or EXIT_USAGE in err for a config that
 * config_check rejects. */
int model_create(model *m, const config *cfg, status *err);
/* The same with parameters only: forward passes (eval, inspect, generate),
 * no backward and no optimizer step. */
int model_create_for_inference(model *m, const config *cfg, status *err);
void model_free(model *m);
/* The number of parameters of the model a config describes: the layout
 * model_create builds, counted without allocating (the checkpoint reader
 * bounds a file's model by it before creating one). */
size_t model_param_count(const config *cfg);
/* Keeps the AdamW moments of elements [first, first + count) only, zeroed:
 * the trainer's ZeRO-1 slice (dist.zero = 1, docs/scale.md §7), before any
 * step or resume. */
void model_shard_moments(model *m, size_t first, size_t count);
/* Deterministic initialisation from train.seed (identical on every rank). */
void model_init_parameters(model *m);
/* The same for elements [first, first + count) of the flat parameters
 * alone, the others zero, and without model_params_changed: a rank's share
 * of the draws, which the trainer then sends to every rank (docs/design.md
 * §8.3). Any cut of [0, n_params) into ranges gives the bits of
 * model_init_parameters. */
void model_init_parameter_range(model *m, size_t first, size_t count);
/* To be called whenever m->params change (initialisation, loading, a
 * ZeRO-1 step, a broadcast; optimizer_step_model writes the copy itself):
 * refreshes the bf16 copy of the weights when the GEMM engine is bf16
 * (docs/scale.md §7), else does nothing. */
void model_params_changed(const model *m);

/* From now on the model's rows are this rank's positions of sequences of
 * T_seq (context_cut_of for the context group; zigzag for causal softmax,
 * docs/design.md §8.12): forwards take T = m->cut.total. Whole sequences
 * again with a context group of one. */
void model_cut_sequences(model *m, int T_seq);

/* Forward on B rows of T tokens (T <= data.seq_len). targets: [B*T] for lm
 * (-1 = ignored); for cls, `targets` marks valid positions (-1 = padding)
 * and labels [B] holds the classes. Fills acts.losses and acts.predictions.
 * With collect_buffers the last-position vectors are summed into buffer_sums. */
void model_forward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                   bool collect_buffers);
/* model_forward for training: the softmax's pass over the logits leaves the loss's gradient, loss_scale *
 * (p - onehot), where the probabilities would be (docs/design.md §8.10: one pass fewer), for model_backward, which
 * must then be given the same loss_scale and `accumulate`. An LM head runs its own backward products at once, pass
 * by pass (docs/scale.md §7), its weight gradient added with `accumulate` (as model_backward's). */
void model_forward_train(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                         bool collect_buffers, float loss_scale, bool accumulate);
/* Block l alone: acts.residual[l] -> acts.residual[l + 1] (after a forward
 * at this B, T has reserved the activations). */
void model_block_forward(model *m, int layer, int B, int T, bool collect_buffers);
/* Makes block `layer`'s forward state of the last forward on B rows of T
 * readable (model_attention_saved, model_block_mid): with train.recompute
 * one copy of the MLP's (mlp) or the whole block's state (block) is kept,
 * of the last block forwarded, and another block's is remade, bit for bit
 * (docs/scale.md §7); does nothing otherwise or when it is there. The
 * block's output is not rewritten. */
void model_block_restore(model *m, int layer, int B, int T);
/* Block `layer`'s x + attention (its attention sublayer's output with the
 * residual), [B*T*d], as its last forward or model_block_restore left it. */
float *model_block_mid(const model *m, int layer, int B, int T);
/* Sum of this rank's per-target (lm) or per-row (cls) losses, and their count. */
double model_loss_sum(const model *m, const int32_t *targets, int B, int T, long long *count);
/* The count of model_loss_sum before any forward: the trainer needs the
 * global count of the whole batch before the first micro-batch's backward
 * (docs/scale.md §7, gradient accumulation). */
long long model_target_count(const model *m, const int32_t *targets, int B, int T);
/* Backward of loss_scale * sum of losses (loss_scale = 1 / global count)
 * into m->grads: added to what they hold with `accumulate` (later
 * micro-batches, docs/scale.md §7), else written, the weight-gradient
 * GEMMs with beta = 0, so that no pass zeroes the gradients first. */
void model_backward(model *m, const int32_t *inputs, const int32_t *targets, const int32_t *labels, int B, int T,
                    float loss_scale, const model_backward_hooks *hooks, bool accumulate);
/* Block `layer`'s view for the attention sublayer (attention.h): settings,
 * rope tables, that block's gamma and blend with their gradients, its
 * momentum buffers, and (with collect_buffers) where to sum the last-position
 * vectors. */
attention_layer model_attention_layer(model *m, int layer, bool collect_buffers);
/* Block `layer`'s saved attention state of the last forward on B rows of T
 * (q-hat, k-hat, v, the kernel's saved floats), for attention_weight; with
 * train.recompute, after model_block_restore of that block. */
attention_saved model_attention_saved(const model *m, int layer, int B, int T);
/* Bytes of the activation buffer for B rows of T (saved forward state and
 * backward scratch), so that a run can refuse up front what will not fit. */
size_t model_activation_bytes(const model *m, int B, int T);
/* The products of the linear layers on `rows` rows (qkv, proj, the MLP and
 * the lm head, forward and both backward), for timing the GEMM engines
 * (gemm_tune_part). Fills at most MODEL_GEMM_SHAPES; returns how many. */
#define MODEL_GEMM_SHAPES 15
int model_gemm_shapes(const model *m, int rows, gemm_shape *out);
/* Matmul FLOPs of one forward+backward per token (for throughput figures). */
double model_flops_per_token(const model *m, int T);

#endif
