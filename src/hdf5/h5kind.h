/* Which of momfmm's own HDF5 files a file is (docs/files.md §4, another of
 * momfmm's files): a checkpoint given where a token file belongs, or a
 * metrics.h5 where a checkpoint belongs, is named for what it is
 * ("r/metrics.h5: a run's live metrics (metrics.h5), not a checkpoint")
 * instead of for the first thing the reader missed in it. The kinds are
 * told apart by what each writer always puts in its file. */
#ifndef MOMFMM_H5KIND_H
#define MOMFMM_H5KIND_H
#include "base/status.h"
#include "hdf5/h5reader.h"

typedef enum {
    H5KIND_OTHER,       /* none of ours (or damaged past telling) */
    H5KIND_CHECKPOINT,  /* root attribute 'format', or a /model group */
    H5KIND_METRICS,     /* root attribute 'config_ini' or a /metrics group, and not a checkpoint */
    H5KIND_GRADS,       /* /grads (momfmm loss --grads) */
    H5KIND_LOGITS,      /* /logits (momfmm logits --out) */
    H5KIND_LOSS_TOKENS, /* /inputs (momfmm loss) */
    H5KIND_TOKENS,      /* /tokens (momfmm logits, data.path) */
} h5kind;

/* The kind of the file at `path`: the first kind whose mark it holds (a
 * link on the way to a mark fails as h5reader_exists does). The file is
 * opened as h5reader_run_into opens it, with `open_flags` (`what` names it
 * where it cannot be opened); 0, or EXIT_BAD_FILE with the reader's
 * message in err. */
int h5kind_of_path(const char *path, const char *what, unsigned open_flags, h5kind *kind, status *err);
/* "a checkpoint", "a run's live metrics (metrics.h5)", ... */
const char *h5kind_name(h5kind kind);
/* Fails "<path>: <its kind>, not <wanted>" when the file lacks the mark of
 * `wanted` and holds that of another of our kinds; returns otherwise, and
 * the reader goes on to name what is missing or damaged. */
void h5kind_require(h5reader *r, h5kind wanted);
#endif
