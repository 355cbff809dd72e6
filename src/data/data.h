/* Tasks of docs/tasks.md §2. Every sample is a pure function of (seed, split, step,
 * global sample index), so any rank can make its own shard and a resumed
 * run needs no generator state. */
#ifndef MOMFMM_DATA_H
#define MOMFMM_DATA_H
#include <stdint.h>

#include "config/config.h"
#include "data/tokenizer.h"
#include "parallel/context.h"

/* SPLIT_LENGTH: the chain task's length-generalisation eval, chains of the
 * periods data.eval_chain_len .. data.eval_chain_len_max (docs/tasks.md §2). */
enum { SPLIT_TRAIN = 0, SPLIT_EVAL = 1, SPLIT_LENGTH = 2 };

typedef struct {
    int B, T;
    int32_t *inputs;  /* [B*T] */
    int32_t *targets; /* [B*T], -1 = not counted (cls: -1 = padding) */
    int32_t *labels;  /* [B] (cls) */
} data_batch;

void data_batch_alloc(data_batch *b, int B, int T);
void data_batch_free(data_batch *b);

typedef struct data_source data_source;
/* Opens what a task needs (the text corpus, mapped; a TSV file; scratch
 * buffers) and checks that its limits can be met; NULL and a status of
 * EXIT_USAGE or EXIT_BAD_FILE on a bad config or file (docs/design.md §8.7). */
data_source *data_open(const config *c, status *st);
void data_close(data_source *d);
/* The text eval split as whole windows of data.seq_len tokens, each the
 * inputs of one row (eval --batches all, docs/cli.md §5); 0 for other tasks. */
long long data_eval_windows(const data_source *d);
/* The bytes of text the counted targets (>= 0) of n stand for (docs/metrics.md
 * §3): one each for a byte corpus, each id's piece with data.tokenizer, NaN
 * for token files without one and for the other tasks. */
double data_target_bytes(const data_source *d, const int32_t *targets, size_t n);
/* data.tokenizer as read for token files, or NULL. */
const tokenizer *data_tokenizer(const data_source *d);
/* From now on eval batch i, global row g is window i * train.batch_size + g
 * in order, and rows past the last window count nothing. */
void data_eval_in_order(data_source *d);

/* Fills rows for global sample indices [first, first + b->B) of (split, step);
 * b->T is at most data.seq_len (the scratch of data_open is that long).
 * Returns 0, or EXIT_USAGE in st when the ListOps generator found no
 * expression of an allowed length (limits that data_open let through). */
int data_fill(const data_source *d, data_batch *b, int split, long long step, long long first, status *st);

/* The chain period of sample `index` of (split, step), as data_fill draws
 * it; 0 for the other tasks (docs/tasks.md §2). */
int data_sample_period(const data_source *d, int split, long long step, long long index);

/* This rank's shard of the global batch (docs/tasks.md §2) and its data
 * source: its data group's rows, each cut to this rank's positions when a
 * context group shares the sequences. */
typedef struct {
    data_source *data;
    data_batch batch; /* [B][cut.total] */
    data_batch full;  /* [B][seq_len] whole rows (a context group's, data_shard_fill with full_rows) */
    context_cut cut;
    int first; /* global index of the shard's first row */
} data_shard;

/* Returns 0, or EXIT_USAGE in err when there are more data-parallel groups
 * than rows, or the failure of data_open. */
int data_shard_open(data_shard *s, const config *cfg, status *err);
/* The shard's rows of (split, step); with full_rows also s->full. */
int data_shard_fill(data_shard *s, int split, long long step, bool full_rows, status *st);
void data_shard_close(data_shard *s);
#endif
