/* One block's attention on a shard of each sequence of a context group
 * (attention_shard.c; docs/design.md §8.12): what attention.c calls when
 * the layer's cut (attention_layer.cut) has more than one chunk. Private to
 * src/attention/. */
#ifndef MOMFMM_ATTENTION_SHARD_H
#define MOMFMM_ATTENTION_SHARD_H
#include <stddef.h>

#include "attention/attention_types.h"

/* attention_forward and attention_backward on the shard. */
void attention_shard_forward(const attention_layer *a, const attention_saved *s, const float *qkv, float *out, int B,
                             int T);
void attention_shard_backward(const attention_layer *a, const attention_saved *s, const float *d_out, float *d_qkv,
                              int B, int T);
/* Its per-head saved floats and per-thread scratch, and the exchange
 * buffer for B rows (attention.h's sizes for a shard). */
size_t attention_shard_saved_per_head(const attention_layer_sizes *z);
size_t attention_shard_scratch_per_head(const attention_layer_sizes *z);
size_t attention_shard_exchange_floats(const attention_layer_sizes *z, int B);
#endif
