/* The `logits` command (docs/cli.md §5): the model's forward (no gradients)
 * on the token ids of an HDF5 /tokens, its logits written to an HDF5 file
 * (docs/files.md §4), for comparing momfmm with other implementations
 * (momfmm.pt, docs/design.md §8.8) and for analysis. Every rank computes
 * the same logits; rank 0 writes them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "parallel/dist.h"
#include "store/checkpoint.h"
#include "store/logits_file.h"
#include "store/store.h"
#include "store/token_input.h"

/* Forward passes of at most train.batch_size rows (a size the run's
 * activations fitted at), each row's logits copied out before the next. */
static void forward_rows(model *m, const token_input_ids *t, float *logits) {
    bool lm = m->cfg.head == HEAD_LM;
    int rows = m->cfg.batch_size < t->B ? m->cfg.batch_size : t->B;
    size_t width = lm ? (size_t)t->T * m->n_out : (size_t)m->n_out;
    /* lm: no target counts; cls: every position is valid for the pooling */
    int32_t *targets = sys_calloc((size_t)rows * t->T, sizeof(int32_t));
    int32_t *labels = sys_calloc((size_t)rows, sizeof(int32_t));
    for (size_t i = 0; lm && i < (size_t)rows * t->T; i++) targets[i] = -1;
    m->keep_logits = true; /* else the softmax overwrites them (model.h) */
    for (int b = 0; b < t->B; b += rows) {
        int n = t->B - b < rows ? t->B - b : rows;
        model_forward(m, t->ids + (size_t)b * t->T, targets, labels, n, t->T, false);
        memcpy(logits + (size_t)b * width, m->acts.logits, sizeof(float) * (size_t)n * width);
    }
    free(labels);
    free(targets);
}

int command_logits(const char *ckpt, const char *tokens, const char *out, bool force) {
    const char *inputs[] = {ckpt, tokens};
    cmd_check_output("--out", out, inputs, 2, force);
    model m;
    checkpoint_info info;
    char path[STORE_PATH_MAX];
    command_load_run_checkpoint(ckpt, &m, path, sizeof path, &info);
    const char *read[] = {path, tokens}; /* a run directory's checkpoint is known only now */
    cmd_check_output("--out", out, read, 2, force);
    bool lm = m.cfg.head == HEAD_LM;
    token_input_ids t;
    status err;
    cmd_fail_if_any(token_input_read_ids(tokens, m.V, m.rope_positions, m.n_out, lm, &t, &err), &err);
    float *logits = sys_calloc((size_t)t.B * (lm ? (size_t)t.T : 1) * m.n_out, sizeof(float));
    forward_rows(&m, &t, logits);
    logits_file_source source = {.checkpoint = path, .step = info.step, .tokens_seen = info.tokens_seen};
    int rc = dist_rank() == 0 ? store_write_logits(out, logits, lm ? 3 : 2, t.B, t.T, m.n_out, &source, &err) : 0;
    cmd_fail_if_any(rc, &err);
    if (lm) log_rank0("wrote %s: /logits [%d, %d, %d] of %s (step %lld)\n", out, t.B, t.T, m.n_out, path, info.step);
    else log_rank0("wrote %s: /logits [%d, %d] of %s (step %lld)\n", out, t.B, m.n_out, path, info.step);
    free(logits);
    free(t.ids);
    model_free(&m);
    return 0;
}
