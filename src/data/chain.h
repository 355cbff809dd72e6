/* The chain task of docs/tasks.md §2: a cycle of distinct tokens repeated, its
 * period fixed (data.chain_len) or drawn per sample from a range
 * (data.chain_len_max), with filler tokens from a range of their own placed
 * between the chain tokens (data.chain_noise). Every draw is a pure function
 * of the sample's key (rng.h), so any rank makes any sample and a resumed run
 * needs no generator state; the sampler holds scratch allocated once. */
#ifndef MOMFMM_CHAIN_H
#define MOMFMM_CHAIN_H
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

/* The periods a sample may have: uniform in [lo, hi]. */
typedef struct {
    int lo, hi;
} chain_periods;

/* The training and eval periods [chain_len, chain_len_max], or with
 * length_eval those of the length-generalisation eval [eval_chain_len,
 * eval_chain_len_max] (docs/tasks.md §2); a max of 0 means the lower end. */
chain_periods chain_periods_of(const config *c, bool length_eval);
/* The period of the sample of `key`: lo when the range is one value (no
 * draw: the fixed-period task of before), else lo + below(key, 2^42, hi - lo + 1). */
int chain_period(uint64_t key, chain_periods p);

typedef struct chain_sampler chain_sampler;
/* Scratch for samples of up to data.seq_len under config c (its periods,
 * both ranges, may be far longer than a sample: only the tokens a sample
 * reaches are drawn). */
chain_sampler *chain_open(const config *c);
void chain_close(chain_sampler *s);
/* One sample of T positions with periods p: inputs[T] and targets[T]
 * (targets[t] = x_{t+1}, or -1 where x_{t+1} is a filler). */
void chain_sample(chain_sampler *s, uint64_t key, chain_periods p, int32_t *inputs, int32_t *targets, int T);
#endif
