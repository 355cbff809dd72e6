/* The text corpus of docs/tasks.md §2: the documents that data.path (or
 * data.eval_path) names (a file, a directory walked recursively in sorted
 * order, or a comma-separated list of either), as bytes of text or as the
 * ids of token files (token_file.h). Documents above CORPUS_READ_MAX are
 * memory-mapped read-only, their pages the kernel's shared page cache
 * rather than per-rank heap; smaller ones are read. The documents are
 * addressed as one stream; text documents are joined by CORPUS_SEPARATOR. */
#ifndef MOMFMM_CORPUS_H
#define MOMFMM_CORPUS_H
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

/* The byte between two text documents: NUL, which text never contains, so
 * the model sees an unambiguous end of document (docs/tasks.md §2). Token
 * files are joined without one: their tokenizer's end-of-text id is in them. */
enum { CORPUS_SEPARATOR = 0x00 };
/* Documents up to this size are read into memory, larger ones mapped: one
 * mapping per document would pass vm.max_map_count for a directory of
 * tens of thousands of small files (docs/tasks.md §2). */
enum { CORPUS_READ_MAX = 64 << 10 };
/* A text document found by a directory walk with a NUL byte in its first
 * CORPUS_SNIFF bytes is binary and skipped (docs/tasks.md §2). */
enum { CORPUS_SNIFF = 4096 };

/* data.format: the order of the key's choices. */
typedef enum { CORPUS_AUTO = 0, CORPUS_BYTES = 1, CORPUS_TOKENS = 2 } corpus_format;

typedef struct {
    const char *key;     /* "data.path" or "data.eval_path", for messages */
    int format;          /* corpus_format */
    int vocab_size;      /* token ids must lie in [0, vocab_size) */
    const char *include; /* comma-separated globs a walked file must match ("" = every file) */
    const char *exclude; /* comma-separated globs no walked file may match */
} corpus_options;

typedef struct {
    char *path;
    const unsigned char *base; /* the read-only mapping of the file, or (owned) a copy on the heap */
    long long base_size;       /* bytes of the file */
    bool owned;                /* a small document, read rather than mapped */
    const unsigned char *data; /* the first token: base + the token file's offset */
    int width;                 /* bytes per token: 1 (text), 2 (uint16), 4 (int32) */
    long long size;            /* tokens (bytes, for text) */
    long long start;           /* offset of the first token in the joined stream */
} corpus_document;

typedef struct {
    corpus_document *docs;
    int n_docs, capacity, n_mapped;
    int n_skipped;   /* files of a directory walk skipped with a warning */
    int format;      /* CORPUS_BYTES or CORPUS_TOKENS, as decided by the files */
    int separator;   /* tokens between documents: 1 for text, 0 for token files */
    long long size;  /* of the joined stream: every document and the separators */
    long long bytes; /* of the files as stored (for the start-up summary) */
} corpus;

/* Opens every document of `spec` under `opt`. 0, or EXIT_BAD_FILE and a
 * status naming the key and the path that is missing, unreadable, empty,
 * not a regular file or a bad token file (or EXIT_USAGE for a byte corpus
 * with model.vocab_size other than 256); c is then empty again. Files of a
 * directory walk that cannot be read, dangling links and binary text files
 * are skipped with one warning line each and counted. */
int corpus_open(corpus *c, const char *spec, const corpus_options *opt, status *st);
void corpus_close(corpus *c);

/* Maps one regular file read-only (refusing FIFOs and devices without
 * blocking on them). 0, or EXIT_BAD_FILE and a status naming the path. */
int corpus_map_file(const char *path, const unsigned char **bytes, long long *size, status *st);
void corpus_unmap(const unsigned char *bytes, long long size);

/* The train split is stream tokens [0, *train_end), the eval split
 * [*eval_start, size): one document is cut at the fraction, several are
 * split by whole documents (docs/tasks.md §2). */
void corpus_split(const corpus *c, double eval_fraction, long long *train_end, long long *eval_start);

/* len tokens of the joined stream from offset on (inside it) into out. */
void corpus_read(const corpus *c, long long offset, int len, int32_t *out);
#endif
