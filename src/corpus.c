/* The text corpus of docs/tasks.md §2; see corpus.h. */
#include "momfmm/corpus.h"
#include "momfmm/sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* vm.max_map_count, the kernel's limit on a process's mappings. */
static long max_map_count(void) {
    static long limit = 0;
    if (limit == 0) {
        FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
        if (!f || fscanf(f, "%ld", &limit) != 1 || limit <= 0) limit = 65530;
        if (f) fclose(f);
    }
    return limit;
}

static const char *kind_of(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket" : "a device";
}

/* A regular, non-empty file opened for reading: its descriptor, or -1 with
 * a status. stat first, so that a device is never opened; O_NONBLOCK, so
 * that a FIFO swapped in between cannot block the open; fstat to be sure. */
/* status_fail for open_regular, whose failures return -1 (not a descriptor). */
static int refuse(status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(status *st, const char *fmt, ...) {
    char message[sizeof st->message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    status_fail(st, EXIT_BAD_FILE, "%s", message);
    return -1;
}

static int open_regular(const char *path, long long *size, status *st) {
    struct stat s;
    if (stat(path, &s) != 0) return refuse(st, "data.path = %s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(s.st_mode)) return refuse(st, "data.path = %s: not a regular file but %s", path, kind_of(s.st_mode));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return refuse(st, "data.path = %s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) {
        close(fd);
        return refuse(st, "data.path = %s: not a regular file", path);
    }
    if (s.st_size == 0) {
        close(fd);
        status_fail(st, EXIT_BAD_FILE, "data.path = %s: the file is empty", path);
        return -1;
    }
    *size = (long long)s.st_size;
    return fd;
}

int corpus_map_file(const char *path, const unsigned char **bytes, long long *size, status *st) {
    int fd = open_regular(path, size, st);
    if (fd < 0) return EXIT_BAD_FILE;
    /* PROT_READ + MAP_SHARED: every rank on a node reads the same page-cache
     * pages; nothing is copied into the process */
    void *mapping = mmap(NULL, (size_t)*size, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (mapping == MAP_FAILED)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: cannot map: %s (mappings are limited by vm.max_map_count "
                           "= %ld)",
                           path, strerror(map_errno), max_map_count());
    *bytes = mapping;
    return 0;
}

/* A small document read into memory: a mapping per document would run
 * into vm.max_map_count (65530 by default) for a directory of many small
 * files, and costs a page per file anyway. */
static int read_small_file(const char *path, const unsigned char **bytes, long long *size, status *st) {
    int fd = open_regular(path, size, st);
    if (fd < 0) return EXIT_BAD_FILE;
    unsigned char *buf = sys_calloc((size_t)*size, 1);
    long long got = 0;
    while (got < *size) {
        ssize_t n = read(fd, buf + got, (size_t)(*size - got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int why = n < 0 ? errno : 0;
            close(fd);
            free(buf);
            return status_fail(st, EXIT_BAD_FILE, "data.path = %s: cannot read: %s", path,
                               why ? strerror(why) : "the file shrank while being read");
        }
        got += n;
    }
    close(fd);
    *bytes = buf;
    return 0;
}

void corpus_unmap(const unsigned char *bytes, long long size) {
    if (bytes) munmap((void *)bytes, (size_t)size);
}

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(sys_calloc(n, 1), s, n);
}

static int add_document(corpus *c, const char *path, status *st) {
    corpus_document doc = {0};
    struct stat s;
    doc.owned = stat(path, &s) == 0 && s.st_size <= CORPUS_READ_MAX;
    if (!doc.owned && c->n_mapped >= max_map_count() / 2)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: more than %d documents larger than %d KiB, each a memory mapping, would "
                           "pass half of vm.max_map_count = %ld; join documents into fewer files",
                           path, c->n_mapped, CORPUS_READ_MAX >> 10, max_map_count());
    if ((doc.owned ? read_small_file : corpus_map_file)(path, &doc.bytes, &doc.size, st)) return EXIT_BAD_FILE;
    c->n_mapped += !doc.owned;
    if (c->n_docs == c->capacity) {
        c->capacity = c->capacity ? 2 * c->capacity : 16;
        c->docs = sys_realloc(c->docs, sizeof(corpus_document) * (size_t)c->capacity);
    }
    doc.path = copy_string(path);
    c->docs[c->n_docs++] = doc;
    return 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = sys_calloc(n, 1);
    strcpy(path, dir);
    if (path[0] && path[strlen(path) - 1] != '/') strcat(path, "/");
    return strcat(path, name);
}

static int add_tree(corpus *c, const char *dir, status *st);

/* One directory entry: sub-directories recurse, regular files (also through a
 * symbolic link) become documents unless empty; other kinds, and links to
 * directories (which could form a cycle), are skipped. */
static int add_entry(corpus *c, const char *path, status *st) {
    struct stat own, target;
    if (lstat(path, &own) != 0)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s: cannot read: %s", path, strerror(errno));
    if (S_ISDIR(own.st_mode)) return add_tree(c, path, st);
    if (stat(path, &target) != 0)
        return status_fail(st, EXIT_BAD_FILE, "data.path = %s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(target.st_mode) || target.st_size == 0) return 0;
    return add_document(c, path, st);
}

/* Every non-hidden entry of dir, recursively, in readdir order (sorted later). */
static int add_tree(corpus *c, const char *dir, status *st) {
    DIR *listing = opendir(dir);
    if (!listing) return status_fail(st, EXIT_BAD_FILE, "data.path = %s: cannot read: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e = readdir(listing); e && rc == 0; e = readdir(listing)) {
        if (e->d_name[0] == '.') continue; /* hidden files, "." and ".." */
        char *path = join_path(dir, e->d_name);
        rc = add_entry(c, path, st);
        free(path);
    }
    closedir(listing);
    return rc;
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(((const corpus_document *)a)->path, ((const corpus_document *)b)->path);
}

/* One item of data.path: a directory's files sorted by path, or one file. */
static int add_item(corpus *c, const char *item, status *st) {
    struct stat s;
    if (stat(item, &s) != 0 || !S_ISDIR(s.st_mode)) return add_document(c, item, st);
    int first = c->n_docs;
    if (add_tree(c, item, st)) return EXIT_BAD_FILE;
    if (c->n_docs == first)
        return status_fail(st, EXIT_BAD_FILE,
                           "data.path = %s: the directory holds no non-empty regular file "
                           "(hidden files are skipped)",
                           item);
    qsort(c->docs + first, (size_t)(c->n_docs - first), sizeof(corpus_document), compare_paths);
    return 0;
}

int corpus_open(corpus *c, const char *spec, status *st) {
    memset(c, 0, sizeof *c);
    char *items = copy_string(spec);
    int rc = 0;
    for (char *item = items, *next; item && rc == 0; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        rc = item[0]
                 ? add_item(c, item, st)
                 : status_fail(st, EXIT_BAD_FILE, "data.path = %s: an empty path in the comma-separated list", spec);
    }
    free(items);
    if (rc) {
        corpus_close(c);
        return rc;
    }
    for (int i = 0; i < c->n_docs; i++) {
        c->docs[i].start = c->size + (i > 0);
        c->size = c->docs[i].start + c->docs[i].size;
    }
    return 0;
}

void corpus_close(corpus *c) {
    for (int i = 0; i < c->n_docs; i++) {
        if (c->docs[i].owned) free((void *)c->docs[i].bytes);
        else corpus_unmap(c->docs[i].bytes, c->docs[i].size);
        free(c->docs[i].path);
    }
    free(c->docs);
    memset(c, 0, sizeof *c);
}

void corpus_split(const corpus *c, double eval_fraction, long long *train_end, long long *eval_start) {
    if (c->n_docs == 1) {
        *train_end = *eval_start = (long long)((1.0 - eval_fraction) * (double)c->size);
        return;
    }
    /* the last m documents (1 <= m < n) whose bytes come closest to the
     * fraction of all document bytes; ties go to the smaller m */
    long long total = c->size - (c->n_docs - 1), eval_bytes = 0;
    double target = eval_fraction * (double)total, best_gap = -1;
    int best_first = c->n_docs - 1;
    for (int first = c->n_docs - 1; first >= 1; first--) {
        eval_bytes += c->docs[first].size;
        double gap = eval_bytes > target ? eval_bytes - target : target - eval_bytes;
        if (best_gap < 0 || gap < best_gap) best_gap = gap, best_first = first;
    }
    *eval_start = c->docs[best_first].start;
    *train_end = *eval_start - 1; /* the separator before it belongs to neither split */
}

/* The document holding stream offset `offset` (or the separator after it). */
static int document_at(const corpus *c, long long offset) {
    int lo = 0, hi = c->n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->docs[mid].start <= offset) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void corpus_read(const corpus *c, long long offset, int len, int32_t *out) {
    int doc = document_at(c, offset);
    long long at = offset - c->docs[doc].start;
    for (int t = 0; t < len; t++) {
        if (at == c->docs[doc].size) { /* past this document: the separator, then the next */
            out[t] = CORPUS_SEPARATOR;
            doc++;
            at = 0;
            continue;
        }
        out[t] = c->docs[doc].bytes[at++];
    }
}
