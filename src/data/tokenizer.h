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
 * decodes to a space, "<0xNN>" byte pieces to the byte). 0, or EXIT_BAD_FILE
 * and a status naming data.tokenizer and the file. */
int tokenizer_open(tokenizer *t, const char *path, status *st);
void tokenizer_free(tokenizer *t);
/* The model a checkpoint carries as its /tokenizer dataset (docs/files.md §4),
 * so that the checkpoint alone can print text. 0 with t->n_pieces = 0 when it
 * carries none; EXIT_BAD_FILE and a status when it is not a model. */
int tokenizer_from_checkpoint(tokenizer *t, const char *path, status *st);

/* data.tokenizer_checksum's text of a checksum: 16 hex digits. */
void tokenizer_checksum_text(uint64_t checksum, char out[17]);
#endif
