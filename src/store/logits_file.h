/* The file `momfmm logits` writes (docs/cli.md §5, docs/files.md §4; the
 * tokens it reads are token_input.h's): /logits float32 [B, T, V] (lm) or
 * [B, n_classes] (cls) with attributes naming the checkpoint. Returns 0, or
 * an exit code with a message naming the file and the problem. */
#ifndef MOMFMM_LOGITS_FILE_H
#define MOMFMM_LOGITS_FILE_H
#include "base/status.h"

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
