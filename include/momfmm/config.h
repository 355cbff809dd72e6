/* The resolved configuration of docs/config.md §6: every INI key, typed, with defaults. */
#ifndef MOMFMM_CONFIG_H
#define MOMFMM_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "momfmm/common.h"

typedef enum { ATTENTION_SOFTMAX = 0, ATTENTION_FMM = 1 } attention_kind;
typedef enum { HEAD_LM = 0, HEAD_CLS = 1 } head_kind;
typedef enum { APPLY_QK = 0, APPLY_Q = 1 } momentum_target;
typedef enum { PLACEMENT_POST_ROPE = 0, PLACEMENT_PRE_ROPE = 1 } momentum_placement;
typedef enum { SCHEDULE_COSINE = 0, SCHEDULE_CONSTANT = 1 } lr_schedule;
typedef enum { NONFINITE_STOP = 0, NONFINITE_SKIP = 1 } nonfinite_policy;
/* train.precision and train.gemm (docs/scale.md §7) */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16 = 1 } precision_kind;
typedef enum { GEMM_IMPL_OPENBLAS = 0, GEMM_IMPL_ONEDNN = 1 } gemm_impl;
typedef enum { TASK_CHAIN = 0, TASK_COPY = 1, TASK_LISTOPS = 2, TASK_TEXT = 3 } task_kind;

#define CONFIG_PATH_MAX 1024

typedef struct {
    /* [model] */
    int vocab_size, d_model, n_heads, n_layers, d_ff, max_seq_len;
    double rope_base;
    bool causal;
    int head; /* head_kind */
    int n_classes;
    /* [attention] */
    int attention; /* attention_kind */
    /* [momentum] */
    double gamma, beta, gamma2;
    bool learn_gamma, anchor;
    int apply_to;  /* momentum_target */
    int placement; /* momentum_placement */
    /* [fmm] */
    int fmm_bandwidth, fmm_chunk;
    char fmm_kernels[256];
    double fmm_eps;
    /* [data] */
    int task; /* task_kind */
    int seq_len, chain_len;
    double noise, eval_fraction;
    char data_path[CONFIG_PATH_MAX];
    int listops_min_len, listops_max_len, listops_max_depth, listops_max_args;
    /* [train] */
    long long steps;
    int batch_size, warmup, log_interval, eval_interval, eval_batches;
    int ckpt_interval, keep;
    bool keep_best; /* best.h5: the checkpoint of the lowest eval loss (docs/design.md §8.4) */
    double lr, min_lr, weight_decay, beta1, beta2, adam_eps, grad_clip;
    int schedule; /* lr_schedule */
    long long seed;
    char out_dir[CONFIG_PATH_MAX];
    int on_nonfinite; /* nonfinite_policy */
    int precision; /* precision_kind */
    int gemm;      /* gemm_impl */
    /* [dist] */
    double bucket_mb;
    bool overlap;
    int check_interval;
    int micro_batch; /* train.micro_batch: rows per forward/backward, 0 = the whole shard */
    int zero;        /* dist.zero: 1 = ZeRO-1, AdamW moments sharded over ranks */
    bool collective_io; /* dist.collective_io: ZeRO-1 checkpoint data through MPI-IO collective buffering */
} config;

/* Defaults of docs/config.md §6 (and of configs/README.md). */
void config_defaults(config *c);
/* Code 1 naming the key when a compiled-in default does not parse (a bug,
 * caught by the unit test). */
int config_check_defaults(status *st);

/* Reads an INI file over the defaults. On an unknown section or key (with a
 * "did you mean" when one is close), a key or section set twice (naming both
 * lines), a value out of its range (stating the range) or otherwise bad,
 * EXIT_USAGE naming the file, the line and the key (docs/config.md §6,
 * docs/design.md §8.7; the command layer's cmd_load_config in cmd_common.h
 * exits on it). Lines may be of any length. */
int config_try_load_file(config *c, const char *path, status *st);

/* Reads INI text (e.g. a checkpoint's config_ini attribute) with the same
 * rules; `origin` names the source in messages. Returns 0, or -1 with a
 * message in err. */
int config_load_string(config *c, const char *text, const char *origin,
                       char *err, size_t err_len);

/* Applies one "section.key=value" override; EXIT_USAGE on error. */
int config_try_apply_override(config *c, const char *assignment, status *st);

/* Cross-key checks (d_model % n_heads, even head dimension, ...) naming
 * `origin` and the key; returns 0 or -1 with the message in err. */
int config_check(const config *c, const char *origin, char *err, size_t err_len);

/* The full resolved config as INI text (docs/files.md §4 `config_ini`), numbers in
 * their shortest round-trip form. Caller frees. */
char *config_to_ini(const config *c);

/* True when momentum attention is on (docs/model.md §1.2). */
bool config_momentum_enabled(const config *c);
/* Rows per forward/backward of a shard of shard_rows: train.micro_batch, or
 * the whole shard when 0 or larger (docs/scale.md §7, micro-batches). */
int config_micro_rows(const config *c, int shard_rows);

/* Compares the keys that change the model or the data (model_keys = true;
 * they must match on resume) or the schedule keys (false; they may change).
 * Writes "section.key: a vs b; ..." into out; returns how many differ. */
int config_compare_keys(const config *a, const config *b, bool model_keys, char *out, size_t out_len);
/* The same over the keys that define the network alone (sections model,
 * attention, momentum, fmm): what `train --init` requires to match, while
 * data, train and dist keys may change (docs/cli.md §5). */
int config_compare_architecture(const config *a, const config *b, char *out, size_t out_len);
#endif
