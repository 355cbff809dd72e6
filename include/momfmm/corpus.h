/* The text corpus of docs/tasks.md §2: the documents that data.path names (a
 * file, a directory walked recursively in sorted order, or a comma-separated
 * list of either). Documents above CORPUS_READ_MAX are memory-mapped
 * read-only, their pages the kernel's shared page cache rather than per-rank
 * heap; smaller ones are read. The documents are addressed as one stream,
 * joined by CORPUS_SEPARATOR. */
#ifndef MOMFMM_CORPUS_H
#define MOMFMM_CORPUS_H
#include <stdbool.h>
#include <stdint.h>

#include "momfmm/status.h"

/* The byte between two documents: NUL, which text never contains, so the
 * model sees an unambiguous end of document (docs/tasks.md §2). */
enum { CORPUS_SEPARATOR = 0x00 };
/* Documents up to this size are read into memory, larger ones mapped: one
 * mapping per document would pass vm.max_map_count for a directory of
 * tens of thousands of small files (docs/tasks.md §2). */
enum { CORPUS_READ_MAX = 64 << 10 };

typedef struct {
    char *path;
    const unsigned char *bytes; /* the read-only mapping, or (owned) a copy on the heap */
    bool owned;                 /* a small document, read rather than mapped */
    long long size;
    long long start; /* offset of the first byte in the joined stream */
} corpus_document;

typedef struct {
    corpus_document *docs;
    int n_docs, capacity, n_mapped;
    long long size; /* of the joined stream: every document and n_docs - 1 separators */
} corpus;

/* Maps every document of `spec` (data.path). 0, or EXIT_BAD_FILE and a status
 * naming the path that is missing, unreadable, empty or not a regular file;
 * c is then empty again. */
int corpus_open(corpus *c, const char *spec, status *st);
void corpus_close(corpus *c);

/* Maps one regular file read-only (refusing FIFOs and devices without
 * blocking on them). 0, or EXIT_BAD_FILE and a status naming the path. */
int corpus_map_file(const char *path, const unsigned char **bytes, long long *size, status *st);
void corpus_unmap(const unsigned char *bytes, long long size);

/* The train split is stream bytes [0, *train_end), the eval split
 * [*eval_start, size): one document is cut at the fraction, several are
 * split by whole documents (docs/tasks.md §2). */
void corpus_split(const corpus *c, double eval_fraction, long long *train_end, long long *eval_start);

/* len bytes of the joined stream from offset on (inside it) into out. */
void corpus_read(const corpus *c, long long offset, int len, int32_t *out);
#endif
