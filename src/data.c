/* Task generators of docs/tasks.md §2 (chain, copy, listops, text). Each sample draws
 * from its own counter stream keyed by (seed, split, step, global index). */
#include "momfmm/data.h"

#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdio.h>

#include "momfmm/common.h"
#include "momfmm/listops.h"
#include "momfmm/rng.h"

struct data_source {
    config cfg;
    /* text: the file's bytes; train = [0, split_at), eval = [split_at, size) */
    unsigned char *text;
    long long text_size, split_at;
    /* listops from LRA TSV rows: tokens [n_rows][T] and labels; the last
     * data.eval_fraction of the rows are the eval split */
    int32_t *rows, *row_labels;
    int n_rows, n_train_rows;
};

void batch_alloc(batch *b, int B, int T) {
    b->B = B;
    b->T = T;
    b->inputs = xcalloc((size_t)B * T, sizeof(int32_t));
    b->targets = xcalloc((size_t)B * T, sizeof(int32_t));
    b->labels = xcalloc((size_t)B, sizeof(int32_t));
}

void batch_free(batch *b) {
    free(b->inputs);
    free(b->targets);
    free(b->labels);
    memset(b, 0, sizeof *b);
}

/* The file's bytes (NUL-terminated, caller frees), or NULL and a status. */
static unsigned char *read_file(const char *path, long long *size, status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        status_fail(st, EXIT_BAD_FILE, "data.path = %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = xcalloc((size_t)*size + 1, 1);
    bool complete = fread(bytes, 1, (size_t)*size, f) == (size_t)*size;
    fclose(f);
    if (!complete) {
        free(bytes);
        status_fail(st, EXIT_BAD_FILE, "data.path = %s: read failed", path);
        return NULL;
    }
    return bytes;
}

static int open_text(data_source *d, status *st) {
    const config *c = &d->cfg;
    d->text = read_file(c->data_path, &d->text_size, st);
    if (!d->text) return EXIT_BAD_FILE;
    d->split_at = (long long)((1.0 - c->eval_fraction) * (double)d->text_size);
    if (d->split_at < c->seq_len + 1 || d->text_size - d->split_at < c->seq_len + 1)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s: %lld bytes is too short for data.seq_len = %d in both "
                           "splits (data.eval_fraction = %g)", c->data_path, d->text_size, c->seq_len, c->eval_fraction);
    return 0;
}

/* One "Source<TAB>Target" row into the next free row of d; 0, or a status. */
static int add_listops_row(data_source *d, char *line, int line_no, int *cap, status *st) {
    const config *c = &d->cfg;
    char *tab = strchr(line, '\t');
    if (!tab) return status_fail(st, EXIT_BAD_FILE, "data.path = %s:%d: expected Source<TAB>Target", c->data_path, line_no);
    *tab = '\0';
    if (d->n_rows == *cap) {
        *cap *= 2;
        d->rows = xrealloc(d->rows, sizeof(int32_t) * (size_t)*cap * c->seq_len);
        d->row_labels = xrealloc(d->row_labels, sizeof(int32_t) * (size_t)*cap);
    }
    int32_t *tokens = d->rows + (size_t)d->n_rows * c->seq_len;
    int length = listops_tokenize(line, tokens, c->seq_len);
    int label = atoi(tab + 1);
    if (length <= 0) return 0; /* longer than data.seq_len (or unknown words): LRA drops these too */
    if (label < 0 || label > 9)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s:%d: Target %s is not 0..9", c->data_path, line_no, tab + 1);
    d->row_labels[d->n_rows++] = label;
    return 0;
}

/* LRA TSV: a header line, then "Source<TAB>Target" rows. */
static int open_listops_tsv(data_source *d, status *st) {
    const config *c = &d->cfg;
    long long size;
    char *text = (char *)read_file(c->data_path, &size, st);
    if (!text) return EXIT_BAD_FILE;
    int cap = 1024, line_no = 0, rc = 0;
    d->rows = xcalloc((size_t)cap * c->seq_len, sizeof(int32_t));
    d->row_labels = xcalloc((size_t)cap, sizeof(int32_t));
    for (char *line = strtok(text, "\n"); line && rc == 0; line = strtok(NULL, "\n")) {
        if (++line_no == 1 && strncmp(line, "Source", 6) == 0) continue;
        rc = add_listops_row(d, line, line_no, &cap, st);
    }
    free(text);
    if (rc) return rc;
    d->n_train_rows = (int)((1.0 - c->eval_fraction) * d->n_rows);
    if (d->n_train_rows < 1 || d->n_rows - d->n_train_rows < 1)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: %d usable rows (length <= data.seq_len = %d) is too few for both splits",
                           c->data_path, d->n_rows, c->seq_len);
    return 0;
}

data_source *data_try_open(const config *c, status *st) {
    data_source *d = xcalloc(1, sizeof *d);
    d->cfg = *c;
    int rc = 0;
    if (c->task == TASK_TEXT) rc = open_text(d, st);
    if (rc == 0 && c->task == TASK_LISTOPS && c->data_path[0]) rc = open_listops_tsv(d, st);
    if (rc == 0 && c->task == TASK_LISTOPS && c->vocab_size < LISTOPS_VOCAB)
        rc = status_fail(st, EXIT_USAGE, "data.task = listops needs model.vocab_size >= %d, got %d", LISTOPS_VOCAB,
                         c->vocab_size);
    if (rc == 0) return d;
    data_close(d);
    return NULL;
}

void data_close(data_source *d) {
    free(d->text);
    free(d->rows);
    free(d->row_labels);
    free(d);
}

void shard_range(int global_B, int rank, int n_ranks, int *first, int *count) {
    long long lo = (long long)rank * global_B / n_ranks, hi = (long long)(rank + 1) * global_B / n_ranks;
    *first = (int)lo;
    *count = (int)(hi - lo);
}

/* chain: L distinct tokens repeated to T+1; after the first pass each token
 * is replaced by a random one with probability data.noise. */
static void chain_sample(const config *c, uint64_t key, int32_t *seq, int len) {
    int L = c->chain_len;
    uint64_t counter = 0;
    int32_t chain[L];
    for (int i = 0; i < L; i++) {
        int32_t token;
        bool repeated;
        do {
            token = (int32_t)rng_below(key, counter++, (uint32_t)c->vocab_size);
            repeated = false;
            for (int j = 0; j < i; j++) repeated |= chain[j] == token;
        } while (repeated);
        chain[i] = token;
    }
    for (int t = 0; t < len; t++) {
        seq[t] = chain[t % L];
        /* separate counter ranges keep the noise draws independent of the chain draws */
        if (t >= L && c->noise > 0 && rng_uniform(key, (1ULL << 40) + 2 * (uint64_t)t) < c->noise)
            seq[t] = (int32_t)rng_below(key, (1ULL << 40) + 2 * (uint64_t)t + 1, (uint32_t)c->vocab_size);
    }
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

/* text: T + 1 bytes from a random offset of the split. */
static void text_sample(const data_source *d, uint64_t key, int split, int32_t *seq, int len) {
    long long lo = split == SPLIT_TRAIN ? 0 : d->split_at, hi = split == SPLIT_TRAIN ? d->split_at : d->text_size;
    long long span = hi - lo - len + 1;
    long long start = lo + (long long)(rng_uniform(key, 0) * (double)span);
    for (int t = 0; t < len; t++) seq[t] = d->text[start + t];
}

/* listops: a generated expression, or a TSV row of the split; targets mark
 * the valid (non-padding) positions for the cls head's pooling. */
static void listops_sample(const data_source *d, uint64_t key, int split, int32_t *inputs, int32_t *targets,
                           int32_t *label, int T) {
    const config *c = &d->cfg;
    int length;
    if (d->rows) {
        int lo = split == SPLIT_TRAIN ? 0 : d->n_train_rows, n = split == SPLIT_TRAIN ? d->n_train_rows : d->n_rows - d->n_train_rows;
        int row = lo + (int)rng_below(key, 0, (uint32_t)n);
        memcpy(inputs, d->rows + (size_t)row * T, sizeof(int32_t) * T);
        *label = d->row_labels[row];
        for (length = 0; length < T && inputs[length] != LISTOPS_PAD; length++) {}
    } else {
        listops_limits lim = {c->listops_min_len, c->listops_max_len, c->listops_max_depth, c->listops_max_args};
        *label = listops_generate(key, &lim, T, inputs, &length);
    }
    for (int t = 0; t < T; t++) targets[t] = t < length ? 0 : -1;
}

void data_fill(const data_source *d, batch *b, int split, long long step, long long first) {
    const config *c = &d->cfg;
    int T = b->T;
    int32_t seq[T + 1];
    for (int r = 0; r < b->B; r++) {
        uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)(first + r));
        int32_t *inputs = b->inputs + (size_t)r * T, *targets = b->targets + (size_t)r * T;
        b->labels[r] = 0;
        if (c->task == TASK_LISTOPS) {
            listops_sample(d, key, split, inputs, targets, &b->labels[r], T);
            continue;
        }
        if (c->task == TASK_TEXT) {
            text_sample(d, key, split, seq, T + 1);
            memcpy(targets, seq + 1, sizeof(int32_t) * T);
        } else if (c->task == TASK_COPY) {
            copy_sample(c, key, seq, targets, T);
        } else {
            chain_sample(c, key, seq, T + 1);
            memcpy(targets, seq + 1, sizeof(int32_t) * T);
        }
        memcpy(inputs, seq, sizeof(int32_t) * T);
    }
}
