/* Exiting wrappers of the command layer around the core modules' status
 * returns (docs/design.md §8.7: exit codes; §8.1: only commands exit). */
#include "momfmm/cmd_common.h"

#include "momfmm/checkpoint.h"
#include "momfmm/dist.h"
#include "momfmm/gemm.h"
#include "momfmm/store.h"

#include <stdio.h>
#include <string.h>

_Noreturn void exit_on_status(const status *st, bool every_rank_alike) {
    if (every_rank_alike) fail_all(st->code, "%s", st->message);
    fail(st->code, "%s", st->message);
}

/* Every rank reads the same file and arguments, so every rank fails alike. */
config cmd_load_config(const char *path, int n_overrides, char *const *overrides) {
    config c;
    status st;
    config_defaults(&c);
    if (config_try_load_file(&c, path, &st) != 0) exit_on_status(&st, true);
    for (int i = 0; i < n_overrides; i++)
        if (config_try_apply_override(&c, overrides[i], &st) != 0) exit_on_status(&st, true);
    if (config_check(&c, path, st.message, sizeof st.message) != 0) fail_all(EXIT_USAGE, "%s", st.message);
    return c;
}

void dist_init(int *argc, char ***argv) {
    status st;
    if (dist_try_init(argc, argv, &st) != 0) exit_on_status(&st, true);
}

/* A world of one: fail and fail_all are the same here. */
void dist_check_launch(void) {
    status st;
    if (dist_try_check_launch(&st) != 0) exit_on_status(&st, false);
}

/* Every rank gathered every checksum and holds the same status, so all of
 * them finish together with exit 1 (docs/design.md §8.7). */
void dist_check_consistency(const model *m, long long step) {
    status st;
    if (dist_try_check_consistency(m, step, &st) != 0) exit_on_status(&st, true);
}

static gemm_engine engine_of(const config *c) {
    if (c->precision == PRECISION_BF16) return GEMM_ONEDNN_BF16;
    return c->gemm == GEMM_IMPL_ONEDNN ? GEMM_ONEDNN_F32 : GEMM_OPENBLAS;
}

void cmd_use_precision(const config *c) {
    gemm_engine engine = engine_of(c);
    const char *why = gemm_unavailable_reason(engine);
    if (why)
        fail_all(EXIT_USAGE, "%s cannot run here: %s", c->precision == PRECISION_BF16 ? "train.precision = bf16"
                                                                                    : "train.gemm = onednn",
                 why);
    gemm_ctx *previous = gemm_default();
    /* oneDNN threads like OpenBLAS: dist_threads() per rank */
    gemm_set_default(gemm_create(engine, dist_threads()));
    gemm_destroy(previous);
}

/* The config of `path`, or of a run directory's newest checkpoint whose
 * config reads (listed oldest first by the store); false when none reads:
 * the command itself then reports the file's problem. */
static bool read_checkpoint_config(const char *path, config *c) {
    checkpoint_info info;
    status st;
    if (!store_is_directory(path)) return checkpoint_read_config(path, c, &info, &st) == 0;
    store_listing l;
    store_list(path, &l);
    bool found = false;
    for (int i = l.n - 1; i >= 0 && !found; i--) found = checkpoint_read_config(l.paths[i], c, &info, &st) == 0;
    store_listing_free(&l);
    return found;
}

void cmd_use_checkpoint_precision(const char *ckpt, const char *precision) {
    config c;
    if (!read_checkpoint_config(ckpt, &c)) config_defaults(&c);
    if (precision) {
        char assignment[64];
        snprintf(assignment, sizeof assignment, "train.precision=%s", precision);
        status st; /* the key's own check: fp32|bf16, did you mean */
        if (config_try_apply_override(&c, assignment, &st) != 0) exit_on_status(&st, true);
    }
    cmd_use_precision(&c);
}

const char *cmd_precision_description(void) {
    static char text[512];
    gemm_ctx *ctx = gemm_default();
    bool bf16 = ctx && gemm_ctx_engine(ctx) == GEMM_ONEDNN_BF16;
    snprintf(text, sizeof text, "%s | gemm %s", bf16 ? "bf16" : "fp32",
             ctx ? gemm_describe(ctx) : "openblas sgemm");
    return text;
}
