/* The command layer of docs/cli.md §5 (docs/design.md §8.1, §8.7): each command
 * runs the core modules and turns a failed status into the exit codes of
 * docs/cli.md §5; nothing below this layer exits. cmd_train.c has train and
 * bench, cmd_checkpoint.c init, loss, inspect and eval, cmd_generate.c
 * generate, cmd_logits.c logits, cmd_data.c data. */
#ifndef MOMFMM_COMMANDS_H
#define MOMFMM_COMMANDS_H
#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"
#include "store/checkpoint.h"

/* With `init`, the run starts from that checkpoint's weights (fine-tuning);
 * with `overwrite`, an earlier run's checkpoints in out_dir are removed. */
int command_train(const char *config_path, int n_overrides, char *const *overrides, const char *resume,
                  const char *init, bool overwrite);
/* The step-0 checkpoint of a config into `out` (--force replaces a file). */
int command_init(const char *config_path, int n_overrides, char *const *overrides, const char *out, bool force);
/* "loss <value>" of the checkpoint's model on a token file; with `grads`, the
 * gradient of every parameter into that file (docs/cli.md §5). */
int command_loss(const char *ckpt, const char *tokens, const char *grads, bool force);
int command_bench(const char *config_path, int n_overrides, char *const *overrides, int steps);
/* The first `show` samples of a split ("train", "eval" or "lengen") of the
 * config's task, printed as token rows with targets (docs/cli.md §5). */
int command_data(const char *config_path, int n_overrides, char *const *overrides, int show, const char *split);
int command_inspect(const char *ckpt);
/* A model for inference from a checkpoint, or from a run directory's newest
 * checkpoint that loads (docs/design.md §8.4; named on stdout then), the
 * file read in path and its step and counts in info (may be NULL); exits
 * on a failure, every rank alike. */
void command_load_run_checkpoint(const char *path_or_dir, model *m, char *path, size_t len, checkpoint_info *info);
/* The logits of the checkpoint's model on the ids of an HDF5 /tokens, [T]
 * or [B, T], into `out` (/logits, docs/files.md §4; cmd_logits.c). */
int command_logits(const char *ckpt, const char *tokens, const char *out, bool force);
/* Eval metrics of docs/metrics.md §3; with stream, the eval batches also go through the
 * streaming path in segments of `segment` tokens, and the largest logit
 * difference from the full forward is reported. */
int command_eval(const char *ckpt, bool stream, int segment, int n_overrides, char *const *overrides, int batches);
/* The options of `generate` (docs/cli.md §5), checked by the parser except
 * what needs the model (--text on a vocabulary other than bytes). */
typedef struct {
    const char *prompt, *text, *stop; /* ids; or text bytes; stop bytes (NULL: none) */
    int n_tokens, top_k;              /* top_k 0: every token */
    double temperature, top_p;        /* temperature 0: greedy; top_p in (0, 1] */
    long long seed;
} command_generate_options;
/* Greedy or sampled continuation of a prompt of ids or of text, through
 * the streaming path with a sliding window past model.max_seq_len
 * (cmd_generate.c). */
int command_generate(const char *ckpt, const command_generate_options *options);
#endif
