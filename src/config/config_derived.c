/* What a parsed config implies (docs/config.md §6): its data paths made
 * absolute, where its data comes from, and the values derived from several
 * keys (head dimension, micro-batch rows, momentum, read-outs). The key table
 * and parsing are in config.c; these read the config alone. */
#include "config/config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"

#include "config_table.h"

/* One path list made absolute item by item against the current directory. */
static int resolve_paths(const char *key, const char *given, char *resolved, size_t capacity, status *st) {
    resolved[0] = '\0';
    if (!given[0]) return 0;
    char cwd[CONFIG_PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return status_fail(st, EXIT_USAGE, "%s = %s: cannot make it absolute: the current directory: %s", key, given,
                           strerror(errno));
    char out[4 * CONFIG_PATH_MAX] = "";
    size_t used = 0;
    const char *p = given;
    for (;;) { /* each item of the comma-separated list */
        size_t n = strcspn(p, ",");
        bool absolute = n == 0 || p[0] == '/';
        used += (size_t)snprintf(out + used, sizeof out - used, "%s%s%s%.*s", used ? "," : "", absolute ? "" : cwd,
                                 absolute ? "" : "/", (int)n, p);
        if (used >= sizeof out || !p[n]) break;
        p += n + 1;
    }
    if (used >= capacity) {
        char cut[64];
        return status_fail(st, EXIT_USAGE, "%s = %s: as an absolute path it is longer than %zu characters", key,
                           config_shown(given, cut, sizeof cut), capacity - 1);
    }
    memcpy(resolved, out, used + 1);
    return 0;
}

int config_resolve_data_path(config *c, bool keep_resolved, status *st) {
    status_clear(st);
    if (!(keep_resolved && c->data_resolved[0]) &&
        resolve_paths("data.path", c->data_path, c->data_resolved, sizeof c->data_resolved, st))
        return st->code;
    if (!(keep_resolved && c->eval_resolved[0]) &&
        resolve_paths("data.eval_path", c->eval_path, c->eval_resolved, sizeof c->eval_resolved, st))
        return st->code;
    char tokenizer[CONFIG_PATH_MAX];
    if (!keep_resolved && !strchr(c->tokenizer, ',') &&
        resolve_paths("data.tokenizer", c->tokenizer, tokenizer, sizeof tokenizer, st) == 0)
        memcpy(c->tokenizer, tokenizer, sizeof tokenizer);
    return st->code;
}

const char *config_data_source(const config *c) { return c->data_resolved[0] ? c->data_resolved : c->data_path; }

const char *config_eval_source(const config *c) { return c->eval_resolved[0] ? c->eval_resolved : c->eval_path; }

bool config_momentum_enabled(const config *c) { return c->gamma != 0.0 || c->learn_gamma; }

int config_head_dim(const config *c) { return c->d_model / c->n_heads; }

bool config_context_zigzag(const config *c) { return c->attention == ATTENTION_SOFTMAX && c->causal; }

bool config_eval_readouts(const config *c) {
    if (c->eval_readouts != 0) return c->eval_readouts == 1;
    return config_momentum_enabled(c) || c->task != TASK_TEXT;
}

bool config_evaluates(const config *c) { return c->eval_interval > 0 || c->eval_at_start; }

int config_micro_rows(const config *c, int shard_rows) {
    return c->micro_batch > 0 && c->micro_batch < shard_rows ? c->micro_batch : shard_rows;
}
