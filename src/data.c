/* Task generators of docs/tasks.md §2 (chain, copy, listops, text). Each sample draws
 * from its own counter stream keyed by (seed, split, step, global index). */
#include "momfmm/data.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/chain.h"
#include "momfmm/corpus.h"
#include "momfmm/dist.h"
#include "momfmm/listops.h"
#include "momfmm/rng.h"
#include "momfmm/status.h"
#include "momfmm/sys.h"

struct data_source {
    config cfg;
    /* text: the documents of data.path, mapped; train = stream bytes
     * [0, train_end), eval = [eval_start, text.size) (docs/tasks.md §2) */
    corpus text;
    long long train_end, eval_start;
    /* listops from LRA TSV rows: tokens [n_rows][T] and labels; the last
     * data.eval_fraction of the rows are the eval split */
    int32_t *rows, *row_labels;
    int n_rows, n_train_rows;
    /* scratch allocated once at open, so that no sample lives on the stack
     * (T comes from the config) or is allocated per step: the T + 1 tokens
     * of a sample; the chain generator's own (chain.h) */
    int32_t *sequence;
    chain_sampler *chain;
};

void data_batch_alloc(data_batch *b, int B, int T) {
    b->B = B;
    b->T = T;
    b->inputs = sys_calloc((size_t)B * T, sizeof(int32_t));
    b->targets = sys_calloc((size_t)B * T, sizeof(int32_t));
    b->labels = sys_calloc((size_t)B, sizeof(int32_t));
}

void data_batch_free(data_batch *b) {
    free(b->inputs);
    free(b->targets);
    free(b->labels);
    memset(b, 0, sizeof *b);
}

static int open_text(data_source *d, status *st) {
    const config *c = &d->cfg;
    if (corpus_open(&d->text, config_data_source(c), st)) return EXIT_BAD_FILE;
    corpus_split(&d->text, c->eval_fraction, &d->train_end, &d->eval_start);
    long long eval_bytes = d->text.size - d->eval_start;
    if (d->train_end < c->seq_len + 1 || eval_bytes < c->seq_len + 1)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: %d document(s) of %lld bytes split into %lld train and "
                           "%lld eval bytes, too short for data.seq_len = %d in both splits (data.eval_fraction = %g)",
                           config_data_source(c), d->text.n_docs, d->text.size, d->train_end, eval_bytes, c->seq_len,
                           c->eval_fraction);
    return 0;
}

/* A Target field: one integer 0..9 (surrounding blanks allowed); -1 if not. */
static int parse_label(const char *field) {
    char *end;
    errno = 0;
    long value = strtol(field, &end, 10);
    bool digits = end != field;
    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
    return digits && !*end && errno == 0 && value >= 0 && value <= 9 ? (int)value : -1;
}

/* One "Source<TAB>Target" row into the next free row of d; 0, or a status. */
static int add_listops_row(data_source *d, char *line, int line_no, int *cap, status *st) {
    const config *c = &d->cfg;
    char *tab = strchr(line, '\t');
    if (!tab)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s:%d: expected Source<TAB>Target", config_data_source(c),
                           line_no);
    *tab = '\0';
    int label = parse_label(tab + 1);
    if (label < 0)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s:%d: Target '%s' is not an integer 0..9",
                           config_data_source(c), line_no, tab + 1);
    if (d->n_rows == *cap) {
        *cap *= 2;
        d->rows = sys_realloc(d->rows, sizeof(int32_t) * (size_t)*cap * c->seq_len);
        d->row_labels = sys_realloc(d->row_labels, sizeof(int32_t) * (size_t)*cap);
    }
    int32_t *tokens = d->rows + (size_t)d->n_rows * c->seq_len;
    int length = listops_tokenize(line, tokens, c->seq_len);
    if (length == LISTOPS_UNKNOWN_WORD)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s:%d: Source has a word other than [MIN [MAX [MED [SM ] "
                           "( ) and the digits",
                           config_data_source(c), line_no);
    if (length <= 0) return 0; /* empty, or longer than data.seq_len: LRA drops these too */
    d->row_labels[d->n_rows++] = label;
    return 0;
}

/* LRA TSV: a header line, then "Source<TAB>Target" rows; blank lines are
 * skipped, and a UTF-8 byte-order mark before the header. The file is
 * mapped and each line copied into a reused buffer. */
static int parse_listops_tsv(data_source *d, const unsigned char *bytes, long long size, status *st) {
    int cap = 1024, rc = 0;
    d->rows = sys_calloc((size_t)cap * d->cfg.seq_len, sizeof(int32_t));
    d->row_labels = sys_calloc((size_t)cap, sizeof(int32_t));
    char *line = NULL;
    long long line_cap = 0, pos = 0;
    if (size >= 3 && !memcmp(bytes, "\xEF\xBB\xBF", 3)) pos = 3; /* a UTF-8 byte-order mark (editors write one) */
    for (int line_no = 1; pos < size && rc == 0; line_no++) {
        const unsigned char *newline = memchr(bytes + pos, '\n', (size_t)(size - pos));
        long long length = newline ? newline - (bytes + pos) : size - pos;
        if (length + 1 > line_cap) line = sys_realloc(line, (size_t)(line_cap = length + 1));
        memcpy(line, bytes + pos, (size_t)length);
        line[length] = '\0';
        pos += length + 1;
        if (length == 0 || (line_no == 1 && strncmp(line, "Source", 6) == 0)) continue;
        rc = add_listops_row(d, line, line_no, &cap, st);
    }
    free(line);
    return rc;
}

static int open_listops_tsv(data_source *d, status *st) {
    const config *c = &d->cfg;
    const unsigned char *bytes;
    long long size;
    if (corpus_map_file(config_data_source(c), &bytes, &size, st)) return EXIT_BAD_FILE;
    int rc = parse_listops_tsv(d, bytes, size, st);
    corpus_unmap(bytes, size);
    if (rc) return rc;
    d->n_train_rows = (int)((1.0 - c->eval_fraction) * d->n_rows);
    if (d->n_train_rows < 1 || d->n_rows - d->n_train_rows < 1)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: %d usable rows (length <= data.seq_len = %d) is too few for both splits",
                           config_data_source(c), d->n_rows, c->seq_len);
    return 0;
}

static listops_limits listops_limits_of(const config *c) {
    return (listops_limits){c->listops_min_len, c->listops_max_len, c->listops_max_depth, c->listops_max_args};
}

/* Limits that no expression can meet would make the generator retry for
 * ever (docs/tasks.md §2): refuse them, and limits that almost none meet. */
static int check_listops_limits(data_source *d, status *st) {
    const config *c = &d->cfg;
    listops_limits lim = listops_limits_of(c);
    int cap = c->listops_max_len < c->seq_len ? c->listops_max_len : c->seq_len;
    if (cap < LISTOPS_SHORTEST)
        return status_fail(st, EXIT_USAGE,
                           "data.listops_max_len = %d and data.seq_len = %d allow %d tokens, but the "
                           "shortest expression (an operator, two digits and ']') has %d",
                           c->listops_max_len, c->seq_len, cap, (int)LISTOPS_SHORTEST);
    long long longest = listops_longest(&lim);
    if (c->listops_min_len > longest)
        return status_fail(st, EXIT_USAGE,
                           "data.listops_min_len = %d exceeds the longest expression (%lld tokens) "
                           "that data.listops_max_depth = %d and data.listops_max_args = %d allow",
                           c->listops_min_len, longest, c->listops_max_depth, c->listops_max_args);
    int length;
    uint64_t key = rng_key((uint64_t)c->seed, SPLIT_EVAL, 0, 0);
    if (listops_generate(key, &lim, c->seq_len, d->sequence, &length) < 0)
        return status_fail(st, EXIT_USAGE,
                           "data.listops_min_len = %d, data.listops_max_len = %d: no expression of an "
                           "allowed length in %d attempts; widen the range",
                           c->listops_min_len, c->listops_max_len, LISTOPS_MAX_ATTEMPTS);
    return 0;
}

static int open_listops(data_source *d, status *st) {
    const config *c = &d->cfg;
    if (c->vocab_size < LISTOPS_VOCAB)
        return status_fail(st, EXIT_USAGE, "data.task = listops needs model.vocab_size >= %d, got %d", LISTOPS_VOCAB,
                           c->vocab_size);
    return config_data_source(c)[0] ? open_listops_tsv(d, st) : check_listops_limits(d, st);
}

data_source *data_open(const config *c, status *st) {
    data_source *d = sys_calloc(1, sizeof *d);
    d->cfg = *c;
    d->sequence = sys_calloc((size_t)c->seq_len + 1, sizeof(int32_t));
    if (c->task == TASK_CHAIN) d->chain = chain_open(c);
    int rc = 0;
    if (c->task == TASK_TEXT) rc = open_text(d, st);
    if (c->task == TASK_LISTOPS) rc = open_listops(d, st);
    if (rc == 0) return d;
    data_close(d);
    return NULL;
}

void data_close(data_source *d) {
    corpus_close(&d->text);
    free(d->rows);
    free(d->row_labels);
    free(d->sequence);
    chain_close(d->chain);
    free(d);
}

void data_shard_range(int global_B, int rank, int n_ranks, int *first, int *count) {
    long long lo = (long long)rank * global_B / n_ranks, hi = (long long)(rank + 1) * global_B / n_ranks;
    *first = (int)lo;
    *count = (int)(hi - lo);
}

/* copy: [s_1..s_n, 0, s_1..s_n, 0, 0 ...], symbols 1..10, n uniform in
 * [T/4, (T-1)/2). Counted: the targets predicting the separator and the copy. */
static void copy_sample(const config *c, uint64_t key, int32_t *seq, int32_t *targets, int T) {
    int lo = T / 4, hi = (T - 1) / 2;
    int n = hi > lo ? lo + (int)rng_below(key, 0, (uint32_t)(hi - lo)) : (lo > 1 ? lo : 1);
    memset(seq, 0, sizeof(int32_t) * (T + 1));
    for (int i = 0; i < n; i++) {
        seq[i] = 1 + (int32_t)rng_below(key, 1 + (uint64_t)i, 10);
        seq[n + 1 + i] = seq[i];
    }
    for (int t = 0; t < T; t++) targets[t] = (t >= n - 1 && t <= 2 * n - 1) ? seq[t + 1] : -1;
    (void)c;
}

/* text: T + 1 consecutive bytes of the split's stream from a random offset
 * (they may run across a separator into the next document). */
static void text_sample(const data_source *d, uint64_t key, int split, int32_t *seq, int len) {
    long long lo = split == SPLIT_TRAIN ? 0 : d->eval_start, hi = split == SPLIT_TRAIN ? d->train_end : d->text.size;
    long long span = hi - lo - len + 1;
    long long start = lo + (long long)(rng_uniform(key, 0) * (double)span);
    corpus_read(&d->text, start, len, seq);
}

/* listops: a generated expression, or a TSV row of the split; targets mark
 * the valid (non-padding) positions for the cls head's pooling. */
static int listops_sample(const data_source *d, uint64_t key, int split, int32_t *inputs, int32_t *targets,
                          int32_t *label, int T, status *st) {
    const config *c = &d->cfg;
    int length;
    if (d->rows) {
        int lo = split == SPLIT_TRAIN ? 0 : d->n_train_rows,
            n = split == SPLIT_TRAIN ? d->n_train_rows : d->n_rows - d->n_train_rows;
        int row = lo + (int)rng_below(key, 0, (uint32_t)n);
        memcpy(inputs, d->rows + (size_t)row * T, sizeof(int32_t) * T);
        *label = d->row_labels[row];
        for (length = 0; length < T && inputs[length] != LISTOPS_PAD; length++) {}
    } else {
        listops_limits lim = listops_limits_of(c);
        *label = listops_generate(key, &lim, T, inputs, &length);
        /* check_listops_limits let these limits through, so this is a rare miss */
        if (*label < 0)
            return status_fail(st, EXIT_USAGE,
                               "data.listops_min_len = %d, data.listops_max_len = %d: no expression of an allowed "
                               "length in %d attempts; widen the range",
                               c->listops_min_len, c->listops_max_len, LISTOPS_MAX_ATTEMPTS);
    }
    for (int t = 0; t < T; t++) targets[t] = t < length ? 0 : -1;
    return 0;
}

int data_fill(const data_source *d, data_batch *b, int split, long long step, long long first, status *st) {
    const config *c = &d->cfg;
    int T = b->T;
    int32_t *seq = d->sequence;
    for (int r = 0; r < b->B; r++) {
        uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)(first + r));
        int32_t *inputs = b->inputs + (size_t)r * T, *targets = b->targets + (size_t)r * T;
        b->labels[r] = 0;
        if (c->task == TASK_LISTOPS) {
            if (listops_sample(d, key, split, inputs, targets, &b->labels[r], T, st) != 0) return st->code;
            continue;
        }
        if (c->task == TASK_CHAIN) {
            chain_sample(d->chain, key, chain_periods_of(c, split == SPLIT_LENGTH), inputs, targets, T);
            continue;
        }
        if (c->task == TASK_TEXT) {
            text_sample(d, key, split, seq, T + 1);
            memcpy(targets, seq + 1, sizeof(int32_t) * T);
        } else {
            copy_sample(c, key, seq, targets, T);
        }
        memcpy(inputs, seq, sizeof(int32_t) * T);
    }
    return 0;
}

int data_sample_period(const data_source *d, int split, long long step, long long index) {
    const config *c = &d->cfg;
    if (c->task != TASK_CHAIN) return 0;
    uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)index);
    return chain_period(key, chain_periods_of(c, split == SPLIT_LENGTH));
}

int data_shard_open(data_shard *s, const config *cfg, status *err) {
    memset(s, 0, sizeof *s);
    int size = dist_size(), count;
    if (size > cfg->batch_size)
        return status_fail(err, EXIT_USAGE,
                           "train.batch_size = %d is smaller than the number of ranks (%d): every rank needs a sample",
                           cfg->batch_size, size);
    s->data = data_open(cfg, err);
    if (!s->data) return err->code;
    data_shard_range(cfg->batch_size, dist_rank(), size, &s->first, &count);
    data_batch_alloc(&s->batch, count, cfg->seq_len);
    return 0;
}

void data_shard_close(data_shard *s) {
    data_batch_free(&s->batch);
    data_close(s->data);
    memset(s, 0, sizeof *s);
}
