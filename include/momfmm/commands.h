/* The command layer of docs/cli.md §5 (docs/design.md §8.1, §8.7): each command
 * runs the core modules and turns a failed status into the exit codes of
 * docs/cli.md §5; nothing below this layer exits. cmd_train.c has train and
 * bench, cmd_checkpoint.c the commands that read a checkpoint. */
#ifndef MOMFMM_COMMANDS_H
#define MOMFMM_COMMANDS_H
#include <stdbool.h>

/* Stop-signal handlers (docs/cli.md §5): installed first thing in main, and
 * released to the default actions for commands other than train. */
void stop_handlers_install_early(void);
void stop_handlers_release(void);
int command_train(const char *config_path, int n_overrides, char **overrides, const char *resume, bool overwrite);
int command_bench(const char *config_path, int n_overrides, char **overrides, int steps);
int command_inspect(const char *ckpt);
/* Eval metrics of docs/metrics.md §3; with stream, the eval batches also go through the
 * streaming path in segments of `segment` tokens, and the largest logit
 * difference from the full forward is reported. */
int command_eval(const char *ckpt, bool stream, int segment);
/* Greedy (temperature 0) or sampled continuation of a comma- or
 * space-separated token prompt, through the streaming path. */
int command_generate(const char *ckpt, const char *prompt, int n_tokens, double temperature, long long seed);
#endif
