/* The `data` command (docs/cli.md §5): the first samples of a config's task as
 * the model gets them, so anyone can see what a task feeds it: each sample's
 * inputs and targets as token rows (a target that does not count prints as
 * "-"), the chain task's period per sample and the ListOps label. Samples come
 * from the same data_fill as training (docs/tasks.md §2), in the order a run
 * consumes them. A failed status becomes an exit here (docs/design.md §8.7). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "data/data.h"
#include "parallel/dist.h"

static const char *TASK_NAMES[] = {"chain", "copy", "listops", "text"};

/* train: sample n is row n mod B of step 1 + n / B (steps count from 1);
 * eval and lengen: row n mod B of batch n / B (docs/tasks.md §2). */
static int split_of(const char *name, const config *c) {
    if (!strcmp(name, "train")) return SPLIT_TRAIN;
    if (!strcmp(name, "eval")) return SPLIT_EVAL;
    if (strcmp(name, "lengen") != 0) cmd_fail_all(EXIT_USAGE, "data: --split %s: expected train, eval or lengen", name);
    if (c->task != TASK_CHAIN || c->eval_chain_len == 0)
        cmd_fail_all(EXIT_USAGE, "data: --split lengen needs data.task = chain and data.eval_chain_len > 0");
    return SPLIT_LENGTH;
}

static void print_row(const char *label, const int32_t *x, int T) {
    printf("  %-8s", label);
    for (int t = 0; t < T; t++) {
        if (x[t] < 0) printf(" -");
        else printf(" %d", x[t]);
    }
    printf("\n");
}

/* One sample: its place in the split, the chain period or the label, the rows. */
static void print_sample(const data_source *d, const config *c, const data_batch *b, int split, int n, long long step,
                         int row) {
    printf("sample %d (%s %lld, row %d)", n, split == SPLIT_TRAIN ? "step" : "batch", step, row);
    int period = data_sample_period(d, split, step, row);
    int counted = 0;
    for (int t = 0; t < b->T; t++) counted += b->targets[t] >= 0;
    if (period > 0) printf(" | period %d", period);
    if (c->task == TASK_LISTOPS) printf(" | label %d", b->labels[0]);
    printf(" | %d of %d targets counted\n", counted, b->T);
    print_row("inputs", b->inputs, b->T);
    print_row(c->task == TASK_LISTOPS ? "pooled" : "targets", b->targets, b->T);
}

int command_data(const char *config_path, int n_overrides, char *const *overrides, int show, const char *split_name) {
    config c = cmd_load_config(config_path, n_overrides, overrides);
    int split = split_of(split_name, &c);
    status err;
    data_source *d = data_open(&c, &err);
    cmd_fail_if_any(d ? 0 : err.code, &err); /* each rank opens the files itself: one may lack them */
    data_batch b;
    data_batch_alloc(&b, 1, c.seq_len);
    if (dist_rank() == 0)
        printf("data: task %s | data.seq_len %d | model.vocab_size %d | split %s | %d sample%s in the order of the "
               "run (global batch %d)\n",
               TASK_NAMES[c.task], c.seq_len, c.vocab_size, split_name, show, show == 1 ? "" : "s", c.batch_size);
    for (int n = 0; n < show; n++) {
        long long step = (split == SPLIT_TRAIN ? 1 : 0) + n / c.batch_size;
        int row = n % c.batch_size;
        cmd_fail_if_any(data_fill(d, &b, split, step, row, &err), &err);
        if (dist_rank() == 0) print_sample(d, &c, &b, split, n, step, row);
    }
    data_batch_free(&b);
    data_close(d);
    return 0;
}
