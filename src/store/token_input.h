/* The token files that commands read as input (docs/files.md §4): the
 * `loss` command's batch (/inputs, /targets int32 [B, T], /labels [B] for
 * cls) and the `logits` command's ids (/tokens, uint16 or int32, [T] or
 * [B, T]). One reader for both: the same hostile-file checks (type, shape,
 * ids inside their range naming the first offset that is not, memory that
 * the result needs refused before it is allocated). The training corpora
 * are data/token_file.h's, read in place. Returns 0, or EXIT_BAD_FILE with
 * a message naming the file and the problem. */
#ifndef MOMFMM_TOKEN_INPUT_H
#define MOMFMM_TOKEN_INPUT_H
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "data/data.h"
#include "model/model.h"

/* The `loss` command's batch for model m into b: refuses T longer than the
 * model's positions, a batch whose activations cannot fit in memory, an id
 * of /inputs outside [0, V), of /targets outside [-1, V), a label outside
 * [0, classes), and targets that count no position. */
int token_input_read_batch(const char *path, const model *m, data_batch *b, status *err);

/* The ids of /tokens as rows: [T] reads as one row. */
typedef struct {
    int B, T;
    int32_t *ids; /* [B*T], row-major; the caller frees */
} token_input_ids;

/* Reads /tokens, refusing another type or rank, an empty one, T longer
 * than `max_T` positions (the model's), logits that cannot fit in memory
 * (out_width floats per position with `per_position`, else per row), and
 * an id outside [0, vocab). */
int token_input_read_ids(const char *path, int vocab, int max_T, int out_width, bool per_position, token_input_ids *out,
                         status *err);
#endif
