/* Task generators of SPEC 2 (chain, copy). Each sample draws from its own
 * counter stream keyed by (seed, split, step, global index). */
#include "momfmm/data.h"

#include <stdlib.h>
#include <string.h>

#include "momfmm/common.h"
#include "momfmm/rng.h"

struct data_source {
    config cfg;
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

data_source *data_open(const config *c) {
    if (c->task == TASK_LISTOPS || c->task == TASK_TEXT)
        fail_all(EXIT_USAGE, "data.task = %s is not available in this build (tasks: chain, copy)",
                 c->task == TASK_LISTOPS ? "listops" : "text");
    data_source *d = xcalloc(1, sizeof *d);
    d->cfg = *c;
    return d;
}

void data_close(data_source *d) { free(d); }

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

void data_fill(const data_source *d, batch *b, int split, long long step, long long first) {
    const config *c = &d->cfg;
    int T = b->T;
    int32_t seq[T + 1];
    for (int r = 0; r < b->B; r++) {
        uint64_t key = rng_key((uint64_t)c->seed, (uint64_t)split, (uint64_t)step, (uint64_t)(first + r));
        int32_t *inputs = b->inputs + (size_t)r * T, *targets = b->targets + (size_t)r * T;
        if (c->task == TASK_COPY) {
            copy_sample(c, key, seq, targets, T);
        } else {
            chain_sample(c, key, seq, T + 1);
            memcpy(targets, seq + 1, sizeof(int32_t) * T);
        }
        memcpy(inputs, seq, sizeof(int32_t) * T);
        b->labels[r] = 0;
    }
}
