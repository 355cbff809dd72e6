/* Pre-tokenized corpora of docs/tasks.md §2 (token files): where the token
 * ids of a file lie and how wide they are, for the three layouts read in
 * place (memory-mapped by corpus.c, never copied): nanoGPT's flat uint16
 * array, llm.c's headered .bin, and an HDF5 `/tokens` dataset. */
#ifndef MOMFMM_TOKEN_FILE_H
#define MOMFMM_TOKEN_FILE_H
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum { TOKEN_FILE_TEXT = 0, TOKEN_FILE_NANOGPT = 1, TOKEN_FILE_LLMC = 2, TOKEN_FILE_HDF5 = 3 } token_file_kind;

/* llm.c's dev/data header: 256 little-endian int32, [0] the magic, [1] the
 * version (1: uint16 tokens), [2] the token count; the tokens follow. */
enum { TOKEN_FILE_LLMC_MAGIC = 20240520, TOKEN_FILE_LLMC_HEADER = 256 * 4 };

/* The token ids of a file: `count` little-endian integers of `width` bytes
 * (2: uint16, 4: int32) from byte `offset` on. */
typedef struct {
    token_file_kind kind;
    long long offset, count;
    int width;
} token_file_layout;

/* The kind of a file from its first bytes and name: `format` is data.format
 * (0 auto, 1 bytes, 2 tokens). Auto takes the llm.c magic or the HDF5
 * signature, else a name ending in ".bin" as nanoGPT's, else text; tokens
 * takes the same signatures, else nanoGPT's; bytes is always text. */
token_file_kind token_file_detect(int format, const char *path, const unsigned char *head, size_t head_len);

/* The layout of a token file of `size` bytes whose first head_len bytes are
 * `head`. 0, or EXIT_BAD_FILE and a status naming `key` (data.path or
 * data.eval_path) and the file: a wrong llm.c magic/version/size, an odd
 * nanoGPT size, an HDF5 /tokens that is missing, not 1-D, not uint16/int32
 * little-endian, chunked or compressed (which cannot be mapped). */
int token_file_layout_of(const char *key, const char *path, token_file_kind kind, const unsigned char *head,
                         size_t head_len, long long size, token_file_layout *out, status *st);

/* Token `i` of the ids at `data` (of `width` bytes each, little-endian). */
static inline long long token_file_get(const unsigned char *data, int width, long long i) {
    const unsigned char *p = data + i * width;
    if (width == 1) return p[0];
    if (width == 2) return (long long)p[0] | (long long)p[1] << 8;
    return (long long)(int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}
#endif
