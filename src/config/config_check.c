/* The config's checks of values against each other (docs/config.md): what
 * no single key's range can say (a chain period beyond the vocabulary, a
 * minimum above its maximum, keys that belong to another task). The keys'
 * own types and ranges are parsed in config.c. */
#include "config/config.h"

#include <stdbool.h>
#include <stdio.h>

#include "base/status.h"

#define REJECT(...) return status_fail(st, EXIT_USAGE, __VA_ARGS__)
/* The chain's periods (docs/tasks.md §2): each range ordered, and every
 * period within the tokens a chain may use, which must be distinct: the
 * vocabulary, less the fillers' range when there are fillers. */
static int check_chain(const config *c, const char *origin, status *st) {
    if (c->chain_len_max > 0 && c->chain_len_max < c->chain_len)
        REJECT("%s: data.chain_len_max = %d is below data.chain_len = %d", origin, c->chain_len_max, c->chain_len);
    if (c->eval_chain_len_max > 0 && c->eval_chain_len_max < c->eval_chain_len)
        REJECT("%s: data.eval_chain_len_max = %d is below data.eval_chain_len = %d (0 = no length eval)", origin,
               c->eval_chain_len_max, c->eval_chain_len);
    bool fillers = c->chain_noise > 0;
    if (fillers && c->chain_fillers >= c->vocab_size)
        REJECT("%s: data.chain_fillers = %d leaves no chain token of model.vocab_size = %d", origin, c->chain_fillers,
               c->vocab_size);
    int tokens = fillers ? c->vocab_size - c->chain_fillers : c->vocab_size;
    const struct {
        const char *name;
        int value;
    } periods[] = {{"chain_len", c->chain_len},
                   {"chain_len_max", c->chain_len_max},
                   {"eval_chain_len", c->eval_chain_len},
                   {"eval_chain_len_max", c->eval_chain_len_max}};
    for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++)
        if (periods[i].value > tokens)
            REJECT("%s: data.%s = %d exceeds the %d chain tokens of model.vocab_size = %d%s (tokens must be distinct)",
                   origin, periods[i].name, periods[i].value, tokens, c->vocab_size,
                   fillers ? " less data.chain_fillers" : "");
    return 0;
}

/* Context parallelism (docs/design.md §8.12): what a cut sequence can run.
 * Every chunk holds a position; FMM's band reaches only the next rank
 * (its halo comes from one neighbour, so k - 1 keys must fit in the
 * shortest shard); softmax crosses ranks as ring attention on the tiled
 * kernel; the read-outs and the streamed eval need whole sequences. */
static int check_context(const config *c, const char *origin, status *st) {
    if (c->context == 1) return 0;
    int chunks = config_context_zigzag(c) ? 2 * c->context : c->context, shortest = c->seq_len / chunks;
    if (shortest < 1)
        REJECT("%s: data.seq_len = %d cannot be cut in the %d %s of dist.context = %d", origin, c->seq_len, chunks,
               chunks > c->context ? "zigzag chunks" : "shards", c->context);
    int half = c->fmm_bandwidth < c->seq_len ? c->fmm_bandwidth : c->seq_len;
    if (c->attention == ATTENTION_FMM && half - 1 > shortest)
        REJECT("%s: fmm.bandwidth = %d needs the %d keys before each shard from one neighbour, more than the %d "
               "positions of the shortest shard (data.seq_len / dist.context): lower fmm.bandwidth or dist.context",
               origin, c->fmm_bandwidth, half - 1, shortest);
    if (c->attention == ATTENTION_SOFTMAX && c->attention_impl == ATTENTION_DENSE)
        REJECT("%s: dist.context = %d runs softmax as ring attention on the tiled kernel: attention.impl = dense "
               "keeps T x T probabilities, use attention.impl = tiled",
               origin, c->context);
    if (c->eval_readouts == 1)
        REJECT("%s: train.eval_readouts = true needs whole sequences on a rank (the read-outs pair positions of every "
               "shard): dist.context = %d; use auto or false, and eval the checkpoint afterwards",
               origin, c->context);
    return 0;
}

int config_check_model(const config *c, const char *origin, status *st) {
    if (c->d_model % c->n_heads != 0)
        REJECT("%s: model.d_model = %d is not divisible by model.n_heads = %d", origin, c->d_model, c->n_heads);
    if (config_head_dim(c) % 2 != 0)
        REJECT("%s: model.d_model / model.n_heads = %d is odd; RoPE needs an even head dimension", origin,
               config_head_dim(c));
    status_clear(st);
    return 0;
}

int config_check(const config *c, const char *origin, status *st) {
    int rc = config_check_model(c, origin, st);
    if (rc != 0) return rc;
    if (c->max_seq_len > 0 && c->seq_len > c->max_seq_len)
        REJECT("%s: data.seq_len = %d exceeds model.max_seq_len = %d", origin, c->seq_len, c->max_seq_len);
    if (c->head == HEAD_CLS && c->task != TASK_LISTOPS)
        REJECT("%s: model.head = cls needs data.task = listops", origin);
    /* ListOps labels are the values 0..9, one per digit token. */
    if (c->head == HEAD_CLS && c->n_classes < CONFIG_LISTOPS_CLASSES)
        REJECT("%s: model.n_classes = %d is below the %d classes of data.task = listops", origin, c->n_classes,
               CONFIG_LISTOPS_CLASSES);
    if (c->head == HEAD_LM && c->task == TASK_LISTOPS) REJECT("%s: data.task = listops needs model.head = cls", origin);
    if (c->task == TASK_COPY && c->vocab_size < 11)
        REJECT("%s: data.task = copy needs model.vocab_size >= 11 (symbols 1..10), got %d", origin, c->vocab_size);
    if (c->task == TASK_COPY && c->seq_len < 4)
        REJECT("%s: data.task = copy needs data.seq_len >= 4, got %d", origin, c->seq_len);
    if (c->task == TASK_CHAIN && check_chain(c, origin, st) != 0) return st->code;
    if (c->task == TASK_TEXT && c->data_format == 1 && c->vocab_size != 256)
        REJECT("%s: data.format = bytes is byte-level and needs model.vocab_size = 256", origin);
    if (c->task != TASK_TEXT &&
        (c->eval_path[0] || c->data_format != 0 || c->data_include[0] || c->data_exclude[0] || c->tokenizer[0]))
        REJECT(
            "%s: data.eval_path, data.format, data.include, data.exclude and data.tokenizer are for data.task = text",
            origin);
    if (c->task == TASK_TEXT && !c->data_path[0]) REJECT("%s: data.task = text needs data.path", origin);
    if (c->task == TASK_LISTOPS && c->listops_min_len > c->listops_max_len)
        REJECT("%s: data.listops_min_len = %d exceeds data.listops_max_len = %d", origin, c->listops_min_len,
               c->listops_max_len);
    if (c->task == TASK_LISTOPS && !c->data_path[0] && c->listops_min_len > c->seq_len)
        REJECT("%s: data.listops_min_len = %d exceeds data.seq_len = %d", origin, c->listops_min_len, c->seq_len);
    if (c->min_lr > c->lr) REJECT("%s: train.min_lr = %g exceeds train.lr = %g", origin, c->min_lr, c->lr);
    /* AdamW's decoupled decay p -= lr * wd * p (docs/model.md §1.4): at lr * wd >= 1 the factor 1 - lr * wd is
     * zero or negative, flipping the weights every step, and past 2 they grow without bound */
    if (c->lr * c->weight_decay >= 1)
        REJECT("%s: train.lr x train.weight_decay = %g x %g = %g: must be below 1, else the decoupled decay "
               "p -= lr*wd*p flips the weights' sign every step (and past 2 grows them without bound)",
               origin, c->lr, c->weight_decay, c->lr * c->weight_decay);
    if (check_context(c, origin, st) != 0) return st->code;
    status_clear(st);
    return 0;
}
#undef REJECT
