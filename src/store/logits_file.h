/* The files of `momfmm logits` (docs/cli.md §5, docs/files.md §4): the
 * tokens to run, an HDF5 /tokens of uint16 or int32 ids, [T] or [B, T]; and
 * the logits written, /logits float32 [B, T, V] (lm) or [B, n_classes] (cls)
 * with attributes naming the checkpoint. Returns 0, or EXIT_BAD_FILE with a
 * message naming the file and the problem. */
#ifndef MOMFMM_LOGITS_FILE_H
#define MOMFMM_LOGITS_FILE_H
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

/* The token ids of /tokens as rows: [T] reads as one row. */
typedef struct {
    int B, T;
    int32_t *ids; /* [B*T], row-major; the caller frees */
} logits_file_tokens;

/* Reads /tokens, refusing another type or rank, an empty one, T longer
 * than `max_T` positions (the model's), logits that cannot fit in memory
 * (out_width floats per position with `per_position`, else per row), and
 * an id outside [0, vocab) (naming its offset, the first such). */
int logits_file_read_tokens(const char *path, int vocab, int max_T, int out_width, bool per_position,
                            logits_file_tokens *out, status *err);

/* What the attributes of a logits file record. */
typedef struct {
    const char *checkpoint; /* the checkpoint read */
    long long step, tokens_seen;
} logits_file_source;

/* Writes /logits of `ndim` (3: [B, T, width], 2: [B, width]) through `tmp`
 * atomically (h5writer_run), with root attributes checkpoint, step,
 * tokens_seen and momfmm_version. */
int logits_file_write(const char *path, const char *tmp, const float *logits, int ndim, int B, int T, int width,
                      const logits_file_source *source, status *err);
#endif
