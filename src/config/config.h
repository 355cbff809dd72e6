/* The resolved configuration of docs/config.md §6: every INI key, typed, with defaults. */
#ifndef MOMFMM_CONFIG_H
#define MOMFMM_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum { ATTENTION_SOFTMAX = 0, ATTENTION_FMM = 1 } config_attention_kind;
/* attention.impl: softmax attention in tiles, linear memory (default), or
 * with its T x T probabilities stored (docs/model.md §1.3) */
typedef enum { ATTENTION_TILED = 0, ATTENTION_DENSE = 1 } config_attention_impl;
typedef enum { HEAD_LM = 0, HEAD_CLS = 1 } config_head_kind;
typedef enum { APPLY_QK = 0, APPLY_Q = 1 } config_momentum_target;
typedef enum { PLACEMENT_POST_ROPE = 0, PLACEMENT_PRE_ROPE = 1 } config_momentum_placement;
typedef enum { SCHEDULE_COSINE = 0, SCHEDULE_CONSTANT = 1 } config_schedule;
typedef enum { NONFINITE_STOP = 0, NONFINITE_SKIP = 1 } config_nonfinite_policy;
/* train.on_save_failure (docs/cli.md §5): a checkpoint that cannot be written ends the run, or not */
typedef enum { SAVE_FAILURE_STOP = 0, SAVE_FAILURE_CONTINUE = 1 } config_save_failure_policy;
/* train.precision and train.gemm (docs/scale.md §7) */
typedef enum { PRECISION_FP32 = 0, PRECISION_BF16 = 1 } config_precision;
typedef enum { GEMM_IMPL_OPENBLAS = 0, GEMM_IMPL_ONEDNN = 1, GEMM_IMPL_AUTO = 2, GEMM_IMPL_AVX512 = 3 } config_gemm;
/* train.recompute (docs/scale.md §7): every block keeps its forward state;
 * or its MLP's is remade by backward block by block; or the whole block's,
 * from the block's input */
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_MLP = 1, RECOMPUTE_BLOCK = 2 } config_recompute;
typedef enum { TASK_CHAIN = 0, TASK_COPY = 1, TASK_LISTOPS = 2, TASK_TEXT = 3 } config_task;

#define CONFIG_PATH_MAX 1024
/* Room for any value as config_ini writes it: a string quoted with every
 * byte escaped as \xNN (ini_quote) is at most 4 x its length + 2. */
#define CONFIG_VALUE_MAX (4 * CONFIG_PATH_MAX + 64)

/* A key whose value is a comma-separated list of names from a fixed set
 * (fmm.kernels): items are the names' indices in that set, in order. */
#define CONFIG_LIST_MAX 8
typedef struct {
    int n;
    int items[CONFIG_LIST_MAX];
} config_list;
/* fmm.kernels names, in the order of their indices (the fmm_feature_map values
 * of fmm.h, which tests/test_fmm.c checks against these names). */
#define CONFIG_FMM_KERNELS "elu|elu_flip|tanh"

/* ListOps labels are the values 0..9 of its expressions (docs/tasks.md §2). */
enum { CONFIG_LISTOPS_CLASSES = 10 };

typedef struct {
    /* [model] */
    int vocab_size, d_model, n_heads, n_layers, d_ff, max_seq_len;
    double rope_base;
    bool causal;
    int head; /* config_head_kind */
    int n_classes;
    /* [attention] */
    int attention;      /* config_attention_kind */
    int attention_impl; /* config_attention_impl */
    /* [momentum] */
    double gamma, beta, gamma2;
    bool learn_gamma, anchor;
    int apply_to;  /* config_momentum_target */
    int placement; /* config_momentum_placement */
    /* [fmm] */
    int fmm_bandwidth, fmm_chunk;
    config_list fmm_kernels; /* indices into CONFIG_FMM_KERNELS */
    double fmm_eps;
    /* [data] */
    int task; /* config_task */
    int seq_len, chain_len;
    double noise, eval_fraction;
    /* chain (docs/tasks.md §2): period range, fillers, length-generalisation eval periods */
    int chain_len_max, chain_fillers, eval_chain_len, eval_chain_len_max;
    double chain_noise;
    char data_path[CONFIG_PATH_MAX];
    char data_resolved[CONFIG_PATH_MAX]; /* data.resolved_path: data.path made absolute (config_resolve_data_path) */
    char eval_path[CONFIG_PATH_MAX], eval_resolved[CONFIG_PATH_MAX]; /* data.eval_path, data.resolved_eval_path */
    int data_format;                                                 /* data.format: corpus_format's order */
    char data_include[CONFIG_PATH_MAX], data_exclude[CONFIG_PATH_MAX];
    char tokenizer[CONFIG_PATH_MAX], tokenizer_checksum[32]; /* data.tokenizer, data.tokenizer_checksum */
    int listops_min_len, listops_max_len, listops_max_depth, listops_max_args;
    /* [train] */
    long long steps;
    int batch_size, warmup, log_interval, eval_interval, eval_batches;
    int ckpt_interval, keep;
    bool keep_best;     /* best.h5: the checkpoint of the lowest eval loss (docs/design.md §8.4) */
    int eval_readouts;  /* train.eval_readouts: 0 auto, 1 true, 2 false (config_eval_readouts) */
    bool eval_at_start; /* train.eval_at_start: an eval before the first step */
    double lr, min_lr, weight_decay, beta1, beta2, adam_eps, grad_clip;
    int schedule; /* config_schedule */
    long long seed;
    char out_dir[CONFIG_PATH_MAX];
    int on_nonfinite;    /* config_nonfinite_policy */
    int on_save_failure; /* config_save_failure_policy */
    int precision;       /* config_precision */
    int gemm;            /* config_gemm */
    int recompute;       /* config_recompute */
    /* [dist] */
    double bucket_mb;
    bool overlap;
    int check_interval;
    int micro_batch;    /* train.micro_batch: rows per forward/backward, 0 = the whole shard */
    int zero;           /* dist.zero: 1 = ZeRO-1, AdamW moments sharded over ranks */
    double timeout;     /* dist.timeout: seconds a collective may wait for a peer (docs/design.md §8.11) */
    bool collective_io; /* dist.collective_io: ZeRO-1 checkpoint data through MPI-IO collective buffering */
    int context;        /* dist.context: ranks per sequence, C of the D x C grid (docs/design.md §8.12) */
    int context_scan;   /* dist.context_scan: how the far-field state crosses them (context_scan_method's order) */
} config;

/* Defaults of docs/config.md §6 (and of configs/README.md). */
void config_defaults(config *c);
/* Code 1 naming the key when a compiled-in default does not parse (a bug,
 * caught by the unit test). */
int config_check_defaults(status *st);
/* The limits of the i-th numeric key of the table (docs/config.md §6), for
 * the test that trains at every one of them (tests/test_ranges.c): false
 * past the last. `exclusive`: the range is (min, max). */
typedef struct {
    char name[64]; /* "section.key" */
    double min, max;
    bool integer, exclusive;
} config_numeric_key;
bool config_numeric_key_at(size_t i, config_numeric_key *out);

/* Reads an INI file over the defaults. On an unknown section or key (with a
 * "did you mean" when one is close), a key or section set twice (naming both
 * lines), a value out of its range (stating the range) or otherwise bad,
 * EXIT_USAGE naming the file, the line and the key (docs/config.md §6,
 * docs/design.md §8.7; the command layer's cmd_load_config in cmd_common.h
 * exits on it). Lines may be of any length. */
int config_load_file(config *c, const char *path, status *st);

/* Reads INI text (e.g. a checkpoint's config_ini attribute) with the same
 * rules; `origin` names the source in messages. Returns 0, or EXIT_USAGE. */
int config_load_string(config *c, const char *text, const char *origin, status *st);

/* Applies one "section.key=value" override; EXIT_USAGE on error. */
int config_apply_override(config *c, const char *assignment, status *st);

/* Cross-key checks (d_model % n_heads, even head dimension, ...) naming
 * `origin` and the key; returns 0 or EXIT_USAGE. */
int config_check(const config *c, const char *origin, status *st);
/* The part of config_check that the shapes of a model depend on (head
 * dimension), which model_create checks itself. */
int config_check_model(const config *c, const char *origin, status *st);

/* The full resolved config as INI text (docs/files.md §4 `config_ini`), numbers in
 * their shortest round-trip form. Caller frees. */
char *config_to_ini(const config *c);

/* data.resolved_path (docs/config.md §6): every relative item of data.path
 * (a comma-separated list), and of data.eval_path into
 * data.resolved_eval_path, joined to the current directory, so that a run,
 * its resume and `eval` of its checkpoints read the same files from any
 * directory. keep_resolved: a checkpoint's config keeps the value it
 * recorded, and one written before the key existed gets the current
 * directory's (what such a file always meant). 0, or EXIT_USAGE. */
int config_resolve_data_path(config *c, bool keep_resolved, status *st);
/* What the data modules open: data.resolved_path, or data.path when unset. */
const char *config_data_source(const config *c);
/* The same for the validation set: data.resolved_eval_path, or data.eval_path. */
const char *config_eval_source(const config *c);

/* Whether evals measure gain_R (docs/metrics.md §3): train.eval_readouts, whose
 * auto means on for momentum runs and for the synthetic tasks (whose R is
 * compared against gamma = 0), off for text without momentum. */
bool config_eval_readouts(const config *c);
/* Whether a run evaluates at all: train.eval_interval > 0 or
 * train.eval_at_start (docs/config.md); the trainer makes its evaluator's
 * buffers, and counts them, only then. */
bool config_evaluates(const config *c);
/* True when momentum attention is on (docs/model.md §1.2). */
bool config_momentum_enabled(const config *c);
/* Whether a context group cuts each sequence in zigzag chunks (causal
 * softmax: ring attention's balance) rather than contiguous shards
 * (docs/design.md §8.12). */
bool config_context_zigzag(const config *c);
/* dh, the head dimension d_model / n_heads (docs/README.md, conventions):
 * the one place it is divided; config_check_model refuses a d_model that
 * n_heads does not divide, or an odd dh. */
int config_head_dim(const config *c);
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
/* Over every key: the first that differs as "section.key = a vs b" in out
 * (values quoted as in config_ini, cut for a message); returns how many
 * keys differ (0: out is ""). */
int config_first_difference(const config *a, const config *b, char *out, size_t out_len);
/* x in the fewest significant digits (%.1g ... %.17g) that strtod reads back
 * as exactly x: 0.2 rather than 0.20000000000000001 (docs/config.md §6, the
 * config_ini text). `out` needs room for 32 bytes; returns out. */
char *config_format_double(double x, char *out, size_t len);
#endif
