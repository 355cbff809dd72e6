/* A sentencepiece model (momfmm-tokenize's tokenizer.model) read for what the
 * C program needs of it (docs/tasks.md §2, tokenizer): the bytes each piece
 * decodes to, for bits per byte from the real byte count of the tokens
 * evaluated and for `generate` printing text. Encoding stays with the
 * Python tool. */
#ifndef MOMFMM_TOKENIZER_H
#define MOMFMM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    int n_pieces;
    int *length;          /* [n_pieces]: bytes piece i decodes to (0: control, unknown) */
    unsigned char **text; /* [n_pieces]: those bytes */
    uint64_t checksum;    /* FNV-1a of the model file (data.tokenizer_checksum) */
    unsigned char *model; /* the model file's bytes, which checkpoints carry (/tokenizer) */
    size_t model_size;
} tokenizer;

/* Reads the model file at `path` (ModelProto: pieces with their type; "▁"
 * decodes to a space, "<0xNN>" byte pieces to the byte), whole: a file cut
 * short or damaged anywhere is refused (tokenizer_from_bytes). 0, or
 * EXIT_BAD_FILE and a status naming data.tokenizer and the file. */
int tokenizer_open(tokenizer *t, const char *path, status *st);
/* The model in `bytes` (n of them, allocated with malloc; t owns them, also
 * after a failure, when they are freed), parsed to the end: every field
 * well formed, the pieces, then TrainerSpec and NormalizerSpec, and as many
 * pieces as TrainerSpec's vocab_size. 0, or EXIT_BAD_FILE and a status
 * "<origin>: not a sentencepiece model ...: <why>". */
int tokenizer_from_bytes(tokenizer *t, unsigned char *bytes, size_t n, const char *origin, status *st);
void tokenizer_free(tokenizer *t);

/* data.tokenizer_checksum's text of a checksum: 16 hex digits. */
void tokenizer_checksum_text(uint64_t checksum, char out[17]);
#endif
