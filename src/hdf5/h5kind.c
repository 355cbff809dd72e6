/* Telling momfmm's HDF5 files apart (docs/files.md §4, another of momfmm's
 * files); see h5kind.h. */
#include "hdf5/h5kind.h"

#include <stdbool.h>

static bool has_attr(h5reader *r, const char *name) { return H5Aexists(r->file, name) > 0; }

/* A checkpoint also holds config_ini and /metrics, so a metrics file is
 * what holds them without a checkpoint's marks. */
static bool is_kind(h5reader *r, h5kind kind) {
    switch (kind) {
    case H5KIND_CHECKPOINT: return has_attr(r, "format") || h5reader_exists(r, "/model");
    case H5KIND_METRICS:
        return !is_kind(r, H5KIND_CHECKPOINT) && (has_attr(r, "config_ini") || h5reader_exists(r, "/metrics"));
    case H5KIND_GRADS: return h5reader_exists(r, "/grads");
    case H5KIND_LOGITS: return h5reader_exists(r, "/logits");
    case H5KIND_LOSS_TOKENS: return h5reader_exists(r, "/inputs");
    case H5KIND_TOKENS: return h5reader_exists(r, "/tokens");
    case H5KIND_OTHER: break;
    }
    return false;
}

/* The order of the tries matters only for a file holding two kinds' marks
 * (a user's own file of /inputs and /tokens reads as a loss token file);
 * h5kind_require asks for the wanted mark first, so such a file is taken
 * by both readers. */
static h5kind kind_of(h5reader *r) {
    static const h5kind order[] = {H5KIND_CHECKPOINT, H5KIND_METRICS,     H5KIND_GRADS,
                                   H5KIND_LOGITS,     H5KIND_LOSS_TOKENS, H5KIND_TOKENS};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (is_kind(r, order[i])) return order[i];
    return H5KIND_OTHER;
}

static void kind_body(h5reader *r, void *ctx) { *(h5kind *)ctx = kind_of(r); }

int h5kind_of_path(const char *path, const char *what, unsigned open_flags, h5kind *kind, status *err) {
    *kind = H5KIND_OTHER;
    return h5reader_run_into(path, open_flags, what, kind_body, kind, err);
}

const char *h5kind_name(h5kind kind) {
    switch (kind) {
    case H5KIND_CHECKPOINT: return "a checkpoint";
    case H5KIND_METRICS: return "a run's live metrics (metrics.h5)";
    case H5KIND_GRADS: return "a gradient file (momfmm loss --grads)";
    case H5KIND_LOGITS: return "a logits file (momfmm logits --out)";
    case H5KIND_LOSS_TOKENS: return "a token file of /inputs and /targets (momfmm loss)";
    case H5KIND_TOKENS: return "a token file of /tokens (momfmm logits, data.path)";
    case H5KIND_OTHER: break;
    }
    return "an HDF5 file of no kind momfmm writes";
}

void h5kind_require(h5reader *r, h5kind wanted) {
    if (is_kind(r, wanted)) return;
    h5kind kind = kind_of(r);
    if (kind != H5KIND_OTHER) h5reader_fail(r, "%s, not %s", h5kind_name(kind), h5kind_name(wanted));
}
