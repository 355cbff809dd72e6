/* Commands that read a checkpoint (SPEC 5): inspect, eval, generate. */
#ifndef MOMFMM_INFERENCE_H
#define MOMFMM_INFERENCE_H
#include <stdbool.h>

int command_inspect(const char *ckpt);
/* Eval metrics of SPEC 3; with stream, the eval batches go through the
 * streaming path in segments of `segment` tokens, and the largest logit
 * difference from the full forward is reported. */
int command_eval(const char *ckpt, bool stream, int segment);
/* Greedy (temperature 0) or sampled continuation of a comma- or
 * space-separated token prompt, through the streaming path. */
int command_generate(const char *ckpt, const char *prompt, int n_tokens, double temperature, long long seed);
#endif
