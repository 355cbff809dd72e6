/* Streaming inference (docs/model.md §1.2; docs/cli.md §5: `generate`, `eval --stream`;
 * docs/design.md §8.6): S sequences advance together through segments of
 * tokens; each layer keeps a key/value cache, the momentum carry (each
 * sequence's previous x and p per head), and for FMM the far-field state, so
 * a stream fed in segments gives the logits of the whole stream fed at once.
 * Causal lm models only.
 *
 * Sliding window (docs/model.md, streaming; `generate` past model.max_seq_len):
 * stream_slide drops the oldest cached keys and values. Cached keys keep the
 * RoPE rotation of their absolute position and new rows are rotated at
 * theirs (dropped + pos), so attention scores still depend only on relative
 * positions; the momentum carries continue; the FMM far field is a running
 * sum over every key ever seen, dropped ones included, while its near band
 * only looks back model.fmm.bandwidth keys anyway. */
#ifndef MOMFMM_STREAM_H
#define MOMFMM_STREAM_H
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

typedef struct {
    int S, capacity, pos, n_max;     /* sequences, positions, consumed, segment cap */
    float *k_cache, *v_cache;        /* [L][S][H][capacity][dh] (k-hat after shear, RoPE) */
    float *carry_x, *carry_p;        /* [L][2][S][H][dh] */
    float *far_state;                /* [L][S][H][fmm_stream_state_floats] */
    float *x, *mid, *ln, *qkv, *att; /* segment activations [S*n_max][...] */
    float *fc, *stats;               /* MLP and LayerNorm scratch */
    float *head_scratch, *probs;     /* per-head temporaries, attention weights */
    float *rope_cos, *rope_sin;      /* RoPE of the segment's absolute positions [n_max][dh/2] */
    long long dropped;               /* positions slid out of the caches (stream_slide) */
    float *mem;
} stream_state;

/* 0 when the model can stream `capacity` positions, else EXIT_USAGE in err:
 * not a causal lm model, or a capacity beyond the model's positions. */
int stream_check(const model *m, int capacity, status *err);
/* Returns 0, or the failure of stream_check. */
int stream_create(stream_state *st, const model *m, int S, int capacity, int n_max, status *err);
void stream_free(stream_state *st);
/* Feeds tokens [S][n] (n <= n_max, pos + n <= capacity); logits [S][n][V].
 * Returns 0, or 1 (internal) in err for a segment beyond those bounds. */
int stream_forward(model *m, stream_state *st, const int32_t *tokens, int n, float *logits, status *err);
/* Keeps the newest `keep` (<= pos) cached positions of every sequence and
 * layer, moved to the front of the caches; pos becomes keep. */
void stream_slide(const model *m, stream_state *st, int keep);
#endif
