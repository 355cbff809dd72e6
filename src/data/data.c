/* Task generators of docs/tasks.md §2 (chain, copy, listops, text). Each sample draws
 * from its own counter stream keyed by (seed, split, step, global index). */
#include "data/data.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/sys.h"
#include "data/chain.h"
#include "data/corpus.h"
#include "data/listops.h"
#include "data/tokenizer.h"
#include "parallel/context.h"
#include "parallel/dist.h"

struct data_source {
    config cfg;
    /* text: the documents of data.path, mapped; train = stream tokens
     * [0, train_end) of `text`, eval = [eval_start, eval->size) of `eval`:
     * `text` itself, or the validation set data.eval_path (docs/tasks.md §2) */
    corpus text, eval_text;
    const corpus *eval;
    long long train_end, eval_start;
    bool eval_in_order; /* eval --batches all: window after window (data_eval_in_order) */
    tokenizer tok;      /* data.tokenizer of token files: the bytes of every id, or none */
    /* listops from LRA TSV rows: tokens [n_rows][T] and labels; the last
     * data.eval_fraction of the rows are the eval split */
    int32_t *rows, *row_labels;
    int n_rows, n_train_rows;
    /* scratch allocated once at open, so that no sample lives on the stack
     * (T comes from the config) or is allocated per step: the T + 1 tokens
     * of a sample; the chain generator's own (chain.h) */
    int32_t *sequence;
    /* a whole row's inputs and targets, of which a context group's rank
     * keeps its shard (data_fill_shard) */
    int32_t *row_inputs, *row_targets;
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

/* The start-up line of docs/tasks.md §2: documents, bytes (or tokens),
 * skipped files and the two splits. */
static void log_summary(const data_source *d) {
    const corpus *t = &d->text;
    const char *unit = t->format == CORPUS_BYTES ? "bytes" : "tokens";
    char eval[160];
    if (d->eval == t)
        snprintf(eval, sizeof eval, "eval split: the %s of data.path", t->n_docs == 1 ? "tail" : "last documents");
    else
        snprintf(eval, sizeof eval, "eval split: data.eval_path, %d document%s, %lld bytes, %d skipped",
                 d->eval->n_docs, d->eval->n_docs == 1 ? "" : "s", d->eval->bytes, d->eval->n_skipped);
    log_rank0("corpus: %d document%s, %lld bytes as %s, %d skipped | %s | train %lld %s, eval %lld %s\n", t->n_docs,
              t->n_docs == 1 ? "" : "s", t->bytes, t->format == CORPUS_BYTES ? "text" : "token ids", t->n_skipped, eval,
              d->train_end, unit, d->eval->size - d->eval_start, unit);
}

/* The tokenizer of token files: the model data.tokenizer names, the one the
 * run recorded (data.tokenizer_checksum), with no more pieces than the
 * embedding has rows (docs/tasks.md §2, tokenizer). */
static int open_tokenizer(data_source *d, status *st) {
    const config *c = &d->cfg;
    if (!c->tokenizer[0] || d->text.format != CORPUS_TOKENS) return 0;
    if (tokenizer_open(&d->tok, c->tokenizer, st) != 0) return st->code;
    char now[17];
    tokenizer_checksum_text(d->tok.checksum, now);
    if (c->tokenizer_checksum[0] && strcmp(now, c->tokenizer_checksum) != 0)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.tokenizer = %s: checksum %s, but the run recorded data.tokenizer_checksum = %s "
                           "(another model under that name)",
                           c->tokenizer, now, c->tokenizer_checksum);
    if (d->tok.n_pieces > c->vocab_size)
        return status_fail(st, EXIT_BAD_FILE, "data.tokenizer = %s: %d pieces, more than model.vocab_size = %d",
                           c->tokenizer, d->tok.n_pieces, c->vocab_size);
    return 0;
}

static int open_text(data_source *d, status *st) {
    const config *c = &d->cfg;
    corpus_options train = {"data.path", c->data_format, c->vocab_size, c->data_include, c->data_exclude};
    corpus_options eval = train;
    eval.key = "data.eval_path";
    if (corpus_open(&d->text, config_data_source(c), &train, st)) return st->code;
    d->eval = &d->text;
    if (config_eval_source(c)[0]) {
        if (corpus_open(&d->eval_text, config_eval_source(c), &eval, st)) return st->code;
        if (d->eval_text.format != d->text.format)
            return status_fail(st, EXIT_BAD_FILE, "data.eval_path = %s holds %s, data.path %s", config_eval_source(c),
                               d->eval_text.format == CORPUS_BYTES ? "text" : "token files",
                               d->text.format == CORPUS_BYTES ? "text" : "token files");
        d->eval = &d->eval_text;
        d->train_end = d->text.size;
        d->eval_start = 0;
    } else {
        corpus_split(&d->text, c->eval_fraction, &d->train_end, &d->eval_start);
    }
    long long eval_size = d->eval->size - d->eval_start;
    if (d->train_end < c->seq_len + 1 || eval_size < c->seq_len + 1)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: %d document(s) of %lld tokens split into %lld train and %lld eval "
                           "tokens (%s), too short for data.seq_len = %d in both splits",
                           config_data_source(c), d->text.n_docs, d->text.size, d->train_end, eval_size,
                           d->eval == &d->text ? "data.eval_fraction" : "data.eval_path", c->seq_len);
    log_summary(d);
    return open_tokenizer(d, st);
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
    d->row_inputs = sys_calloc(2 * ((size_t)c->seq_len + 1), sizeof(int32_t));
    d->row_targets = d->row_inputs + c->seq_len + 1;
    if (c->task == TASK_CHAIN) d->chain = chain_open(c);
    int rc = 0;
    if (c->task == TASK_TEXT) rc = open_text(d, st);
    if (c->task == TASK_LISTOPS) rc = open_listops(d, st);
    if (rc == 0) return d;
    data_close(d);
    return NULL;
}

long long data_eval_windows(const data_source *d) {
    if (d->cfg.task != TASK_TEXT) return 0;
    return (d->eval->size - d->eval_start - 1) / d->cfg.seq_len;
}

void data_eval_in_order(data_source *d) { d->eval_in_order = true; }

/* Eval window w of the split in order: inputs [w T, (w + 1) T) of it, the
 * targets one token on; past the last window nothing is counted. */
static void text_window(const data_source *d, long long w, int32_t *inputs, int32_t *targets, int T) {
    if (w >= data_eval_windows(d)) {
        memset(inputs, 0, sizeof(int32_t) * T);
        for (int t = 0; t < T; t++) targets[t] = -1;
        return;
    }
    corpus_read(d->eval, d->eval_start + w * T, T, inputs);
    corpus_read(d->eval, d->eval_start + w * T + 1, T, targets);
}

double data_target_bytes(const data_source *d, const int32_t *targets, size_t n) {
    if (d->cfg.task != TASK_TEXT || (d->text.format == CORPUS_TOKENS && d->tok.n_pieces == 0)) return NAN;
    double bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (targets[i] >= 0)
            bytes += d->text.format == CORPUS_BYTES ? 1 : targets[i] < d->tok.n_pieces ? d->tok.length[targets[i]] : 0;
    return bytes;
}

const tokenizer *data_tokenizer(const data_source *d) { return d->tok.n_pieces ? &d->tok : NULL; }

void data_close(data_source *d) {
    corpus_close(&d->text);
    corpus_close(&d->eval_text);
    tokenizer_free(&d->tok);
    free(d->rows);
    free(d->row_labels);
    free(d->sequence);
    free(d->row_inputs);
    chain_close(d->chain);
    free(d);
}

/* Rows of global batch `global_B` that rank r of n takes (docs/tasks.md §2). */
static void data_shard_range(int global_B, int rank, int n_ranks, int *first, int *count) {
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

/* text: T + 1 consecutive tokens of the split's stream from a random offset
 * (they may run across a separator into the next document). */
static long long text_start(const data_source *d, uint64_t key, int split, int len, const corpus **from) {
    *from = split == SPLIT_TRAIN ? &d->text : d->eval;
    long long lo = split == SPLIT_TRAIN ? 0 : d->eval_start, hi = split == SPLIT_TRAIN ? d->train_end : (*from)->size;
    long long span = hi - lo - len + 1;
    return lo + (long long)(rng_uniform(key, 0) * (double)span);
}

static void text_sample(const data_source *d, uint64_t key, int split, int32_t *seq, int len) {
    const corpus *from;
    long long start = text_start(d, key, split, len, &from);
    corpus_read(from, start, len, seq);
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

/* Row `index` of (split, step): T inputs, targets and the label. */
static int fill_row(const data_source *d, int split, long long step, long long index, int32_t *inputs, int32_t *targets,
                    int32_t *label, int T, status *st) {
    const config *c = &d->cfg;
    int32_t *seq = d->sequence;
    uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)index);
    *label = 0;
    if (c->task == TASK_LISTOPS) return listops_sample(d, key, split, inputs, targets, label, T, st);
    if (c->task == TASK_CHAIN) {
        chain_sample(d->chain, key, chain_periods_of(c, split == SPLIT_LENGTH), inputs, targets, T);
        return 0;
    }
    if (c->task == TASK_TEXT && d->eval_in_order && split == SPLIT_EVAL) {
        text_window(d, step * c->batch_size + index, inputs, targets, T);
        return 0;
    }
    if (c->task == TASK_TEXT) {
        text_sample(d, key, split, seq, T + 1);
        memcpy(targets, seq + 1, sizeof(int32_t) * T);
    } else {
        copy_sample(c, key, seq, targets, T);
    }
    memcpy(inputs, seq, sizeof(int32_t) * T);
    return 0;
}

int data_fill(const data_source *d, data_batch *b, int split, long long step, long long first, status *st) {
    int T = b->T;
    for (int r = 0; r < b->B; r++)
        if (fill_row(d, split, step, first + r, b->inputs + (size_t)r * T, b->targets + (size_t)r * T, &b->labels[r], T,
                     st) != 0)
            return st->code;
    return 0;
}

/* A text sample's ranges read in place: the rank reads only its shard of
 * the corpus (docs/design.md §8.12). */
static void text_ranges(const data_source *d, int split, long long step, long long index, const context_cut *cut,
                        int32_t *inputs, int32_t *targets) {
    const config *c = &d->cfg;
    uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)index);
    const corpus *from;
    long long start = text_start(d, key, split, cut->T_seq + 1, &from); /* text_sample's window */
    for (int r = 0, at = 0; r < cut->n; at += cut->len[r], r++) {
        corpus_read(from, start + cut->start[r], cut->len[r], inputs + at);
        corpus_read(from, start + cut->start[r] + 1, cut->len[r], targets + at);
    }
}

/* The rows [first, first + b->B) of (split, step) cut to a context group
 * rank's positions (docs/design.md §8.12): b's rows hold cut->total
 * positions, range after range; `full` (or NULL) receives the whole rows
 * too, for the metrics that count over a whole sequence. A text sample is
 * read in place, only its shard, when no whole row is asked for. */
static int data_fill_shard(const data_source *d, data_batch *b, data_batch *full, const context_cut *cut, int split,
                           long long step, long long first, status *st) {
    int T = cut->T_seq;
    for (int r = 0; r < b->B; r++) {
        int32_t *inputs = b->inputs + (size_t)r * b->T, *targets = b->targets + (size_t)r * b->T;
        bool in_place = !full && d->cfg.task == TASK_TEXT && !(d->eval_in_order && split == SPLIT_EVAL);
        if (in_place) {
            b->labels[r] = 0;
            text_ranges(d, split, step, first + r, cut, inputs, targets);
            continue;
        }
        int32_t *row_in = full ? full->inputs + (size_t)r * T : d->row_inputs;
        int32_t *row_tg = full ? full->targets + (size_t)r * T : d->row_targets;
        if (fill_row(d, split, step, first + r, row_in, row_tg, &b->labels[r], T, st) != 0) return st->code;
        if (full) full->labels[r] = b->labels[r];
        for (int k = 0, at = 0; k < cut->n; at += cut->len[k], k++) {
            memcpy(inputs + at, row_in + cut->start[k], sizeof(int32_t) * cut->len[k]);
            memcpy(targets + at, row_tg + cut->start[k], sizeof(int32_t) * cut->len[k]);
        }
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
    int groups = context_data_size(), count;
    if (groups > cfg->batch_size)
        return status_fail(err, EXIT_USAGE,
                           "train.batch_size = %d is smaller than the number of data-parallel groups (%d ranks / "
                           "dist.context = %d): every group needs a sample",
                           cfg->batch_size, groups, context_size());
    s->data = data_open(cfg, err);
    if (!s->data) return err->code;
    /* the ranks of a context group share their group's rows, each its positions (docs/design.md §8.12) */
    data_shard_range(cfg->batch_size, context_data_rank(), groups, &s->first, &count);
    s->cut = context_cut_of(cfg->seq_len, context_size(), context_rank(), config_context_zigzag(cfg));
    data_batch_alloc(&s->batch, count, s->cut.total);
    if (s->cut.chunks > 1) data_batch_alloc(&s->full, count, cfg->seq_len);
    return 0;
}

int data_shard_fill(data_shard *s, int split, long long step, bool full_rows, status *st) {
    if (s->cut.chunks == 1) return data_fill(s->data, &s->batch, split, step, s->first, st);
    return data_fill_shard(s->data, &s->batch, full_rows ? &s->full : NULL, &s->cut, split, step, s->first, st);
}

void data_shard_close(data_shard *s) {
    data_batch_free(&s->batch);
    data_batch_free(&s->full);
    data_close(s->data);
    memset(s, 0, sizeof *s);
}
