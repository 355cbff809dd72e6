/* The text corpus of docs/tasks.md §2; see corpus.h. */
#include "data/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/sys.h"
#include "data/token_file.h"

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

/* A regular, non-empty file opened for reading (sys_open_file: never a
 * FIFO or a device, docs/files.md §4): its descriptor, or -1 with a status
 * naming the key. */
static int open_regular(const char *key, const char *path, long long *size, status *st) {
    int fd = sys_open_file(path, SYS_READ, NULL, st);
    struct stat s;
    if (fd >= 0 && fstat(fd, &s) == 0 && s.st_size > 0) {
        *size = (long long)s.st_size;
        return fd;
    }
    if (fd >= 0) {
        close(fd);
        status_fail(st, EXIT_BAD_FILE, "%s: the file is empty", path);
    }
    char why[sizeof st->message];
    snprintf(why, sizeof why, "%s", st->message);
    status_fail(st, EXIT_BAD_FILE, "%s = %s", key, why);
    return -1;
}

/* PROT_READ + MAP_SHARED: every rank on a node reads the same page-cache
 * pages; nothing is copied into the process. Closes fd. */
static int map_fd(const char *key, const char *path, int fd, long long size, const unsigned char **bytes, status *st) {
    void *mapping = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (mapping == MAP_FAILED)
        return status_fail(st, EXIT_BAD_FILE,
                           "%s = %s: cannot map: %s (mappings are limited by vm.max_map_count = %ld)", key, path,
                           strerror(map_errno), max_map_count());
    *bytes = mapping;
    return 0;
}

int corpus_map_file(const char *path, const unsigned char **bytes, long long *size, status *st) {
    int fd = open_regular("data.path", path, size, st);
    return fd < 0 ? EXIT_BAD_FILE : map_fd("data.path", path, fd, *size, bytes, st);
}

/* A small document read into memory: a mapping per document would run
 * into vm.max_map_count (65530 by default) for a directory of many small
 * files, and costs a page per file anyway. Closes fd. */
static int read_fd(const char *key, const char *path, int fd, long long size, const unsigned char **bytes, status *st) {
    unsigned char *buf = sys_calloc((size_t)size, 1);
    long long got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, (size_t)(size - got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int why = n < 0 ? errno : 0;
            close(fd);
            free(buf);
            return status_fail(st, EXIT_BAD_FILE, "%s = %s: cannot read: %s", key, path,
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

/* A file of a directory walk left out: one warning line, counted for the
 * summary (docs/tasks.md §2). Returns 0: the walk goes on. */
static int skip(corpus *c, const char *message) {
    log_rank0("warning: %s; skipped\n", message);
    c->n_skipped++;
    return 0;
}

/* Token ids are checked once, at open, against the embedding's rows. */
static int check_ids(const corpus_options *opt, const corpus_document *d, const token_file_layout *l, status *st) {
    for (long long i = 0; i < d->size; i++) {
        long long id = token_file_get(d->data, d->width, i);
        if (id < 0 || id >= opt->vocab_size)
            return status_fail(st, EXIT_BAD_FILE,
                               "%s = %s: token id %lld at token %lld (byte offset %lld) is outside model.vocab_size "
                               "= %d",
                               opt->key, d->path, id, i, l->offset + i * d->width, opt->vocab_size);
    }
    return 0;
}

/* What the file holds, from its first CORPUS_SNIFF bytes: 0 and its layout;
 * EXIT_BAD_FILE/EXIT_USAGE and a status; or 1 when a walked file is binary. */
static int sniff(corpus *c, const corpus_options *opt, const char *path, int fd, long long size, bool walked,
                 token_file_layout *l, status *st) {
    unsigned char head[CORPUS_SNIFF];
    ssize_t got = pread(fd, head, size < CORPUS_SNIFF ? (size_t)size : CORPUS_SNIFF, 0);
    if (got < 0) return status_fail(st, EXIT_BAD_FILE, "%s = %s: cannot read: %s", opt->key, path, strerror(errno));
    token_file_kind kind = token_file_detect(opt->format, path, head, (size_t)got);
    int format = kind == TOKEN_FILE_TEXT ? CORPUS_BYTES : CORPUS_TOKENS;
    if (format == CORPUS_BYTES && walked && memchr(head, 0, (size_t)got)) return 1;
    if (c->n_docs > 0 && format != c->format)
        return status_fail(st, EXIT_BAD_FILE,
                           "%s = %s: a %s among %s (data.format = auto decides by file); set data.format, or leave "
                           "it out with data.exclude",
                           opt->key, path, format == CORPUS_BYTES ? "text file" : "token file",
                           format == CORPUS_BYTES ? "token files" : "text files");
    if (format == CORPUS_BYTES && opt->vocab_size != 256)
        return status_fail(st, EXIT_USAGE,
                           "%s = %s: a text file is read as bytes and needs model.vocab_size = 256, got %d (token "
                           "files: data.format = tokens)",
                           opt->key, path, opt->vocab_size);
    c->format = format;
    *l = (token_file_layout){kind, 0, size, 1};
    return kind == TOKEN_FILE_TEXT ? 0 : token_file_layout_of(opt->key, path, kind, head, (size_t)got, size, l, st);
}

static int add_document(corpus *c, const corpus_options *opt, const char *path, bool walked, status *st) {
    corpus_document doc = {0};
    int fd = open_regular(opt->key, path, &doc.base_size, st);
    if (fd < 0) return walked ? skip(c, st->message) : EXIT_BAD_FILE;
    token_file_layout l;
    int rc = sniff(c, opt, path, fd, doc.base_size, walked, &l, st);
    if (rc == 1) status_fail(st, EXIT_BAD_FILE, "%s = %s: binary (a NUL byte in its first 4 KiB)", opt->key, path);
    if (rc != 0) close(fd);
    if (rc == 1) return skip(c, st->message);
    if (rc != 0) return rc;
    doc.owned = doc.base_size <= CORPUS_READ_MAX;
    if (!doc.owned && c->n_mapped >= max_map_count() / 2) {
        close(fd);
        return status_fail(st, EXIT_BAD_FILE,
                           "%s = %s: more than %d documents larger than %d KiB, each a memory mapping, would pass "
                           "half of vm.max_map_count = %ld; join documents into fewer files",
                           opt->key, path, c->n_mapped, CORPUS_READ_MAX >> 10, max_map_count());
    }
    if ((doc.owned ? read_fd : map_fd)(opt->key, path, fd, doc.base_size, &doc.base, st)) return EXIT_BAD_FILE;
    doc.path = copy_string(path);
    doc.data = doc.base + l.offset;
    doc.width = l.width;
    doc.size = l.count;
    c->n_mapped += !doc.owned;
    if (c->n_docs == c->capacity) {
        c->capacity = c->capacity ? 2 * c->capacity : 16;
        c->docs = sys_realloc(c->docs, sizeof(corpus_document) * (size_t)c->capacity);
    }
    c->docs[c->n_docs++] = doc; /* added before the check, so that corpus_close frees it */
    return c->format == CORPUS_TOKENS ? check_ids(opt, &doc, &l, st) : 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = sys_calloc(n, 1);
    strcpy(path, dir);
    if (path[0] && path[strlen(path) - 1] != '/') strcat(path, "/");
    return strcat(path, name);
}

/* Whether a glob of the comma-separated `list` matches the path `rel`
 * (relative to the directory named) or one of its tails after a '/', so
 * "*.pyc" and "__pycache__/..." match at any depth (docs/tasks.md §2). */
static bool matches(const char *list, const char *rel) {
    bool hit = false;
    char *patterns = copy_string(list);
    for (char *p = strtok(patterns, ","); p && !hit; p = strtok(NULL, ","))
        for (const char *tail = rel; tail && !hit; tail = strchr(tail, '/') ? strchr(tail, '/') + 1 : NULL)
            hit = fnmatch(p, tail, 0) == 0;
    free(patterns);
    return hit;
}

typedef struct {
    corpus *c;
    const corpus_options *opt;
    const char *root; /* the directory named, for data.include/exclude */
} walk;

static int add_tree(const walk *w, const char *dir, status *st);

/* One directory entry: sub-directories recurse, regular files (also through a
 * symbolic link) become documents unless empty or filtered out; other
 * kinds, and links to directories (which could form a cycle), are left out;
 * dangling links and files that cannot be read are skipped with a warning. */
static int add_entry(const walk *w, const char *path, status *st) {
    struct stat own, target;
    if (lstat(path, &own) != 0) {
        status_fail(st, EXIT_BAD_FILE, "%s = %s: cannot read: %s", w->opt->key, path, strerror(errno));
        return skip(w->c, st->message);
    }
    if (S_ISDIR(own.st_mode)) return add_tree(w, path, st);
    const char *rel = path + strlen(w->root) + (w->root[strlen(w->root) - 1] != '/');
    if ((w->opt->include[0] && !matches(w->opt->include, rel)) || matches(w->opt->exclude, rel)) return 0;
    if (stat(path, &target) != 0) {
        status_fail(st, EXIT_BAD_FILE, "%s = %s: %s", w->opt->key, path,
                    S_ISLNK(own.st_mode) ? "a dangling symbolic link" : strerror(errno));
        return skip(w->c, st->message);
    }
    if (!S_ISREG(target.st_mode) || target.st_size == 0) return 0;
    return add_document(w->c, w->opt, path, true, st);
}

/* Every non-hidden entry of dir, recursively, in readdir order (sorted later). */
static int add_tree(const walk *w, const char *dir, status *st) {
    DIR *listing = opendir(dir);
    if (!listing) {
        status_fail(st, EXIT_BAD_FILE, "%s = %s: cannot read: %s", w->opt->key, dir, strerror(errno));
        return dir == w->root ? EXIT_BAD_FILE : skip(w->c, st->message);
    }
    int rc = 0;
    for (struct dirent *e = readdir(listing); e && rc == 0; e = readdir(listing)) {
        if (e->d_name[0] == '.') continue; /* hidden files, "." and ".." */
        char *path = join_path(dir, e->d_name);
        rc = add_entry(w, path, st);
        free(path);
    }
    closedir(listing);
    return rc;
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(((const corpus_document *)a)->path, ((const corpus_document *)b)->path);
}

/* One item of the path list: a directory's files sorted by path, or one file. */
static int add_item(corpus *c, const corpus_options *opt, const char *item, status *st) {
    struct stat s;
    if (stat(item, &s) != 0 || !S_ISDIR(s.st_mode)) return add_document(c, opt, item, false, st);
    int first = c->n_docs, skipped = c->n_skipped;
    walk w = {c, opt, item};
    if (add_tree(&w, item, st)) return st->code;
    if (c->n_docs == first)
        return status_fail(st, EXIT_BAD_FILE,
                           "%s = %s: the directory holds no non-empty regular file (hidden files are left out, "
                           "%d skipped with a warning%s)",
                           opt->key, item, c->n_skipped - skipped,
                           opt->include[0] || opt->exclude[0] ? ", data.include/data.exclude applied" : "");
    qsort(c->docs + first, (size_t)(c->n_docs - first), sizeof(corpus_document), compare_paths);
    return 0;
}

int corpus_open(corpus *c, const char *spec, const corpus_options *opt, status *st) {
    memset(c, 0, sizeof *c);
    status_clear(st);
    char *items = copy_string(spec);
    int rc = 0;
    for (char *item = items, *next; item && rc == 0; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        rc = item[0]
                 ? add_item(c, opt, item, st)
                 : status_fail(st, EXIT_BAD_FILE, "%s = %s: an empty path in the comma-separated list", opt->key, spec);
    }
    free(items);
    if (rc) {
        corpus_close(c);
        return rc;
    }
    c->separator = c->format == CORPUS_BYTES;
    for (int i = 0; i < c->n_docs; i++) {
        c->docs[i].start = c->size + (i > 0) * c->separator;
        c->size = c->docs[i].start + c->docs[i].size;
        c->bytes += c->docs[i].base_size;
    }
    return 0;
}

void corpus_close(corpus *c) {
    for (int i = 0; i < c->n_docs; i++) {
        if (c->docs[i].owned) free((void *)c->docs[i].base);
        else corpus_unmap(c->docs[i].base, c->docs[i].base_size);
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
    /* the last m documents (1 <= m < n) whose tokens come closest to the
     * fraction of all document tokens; ties go to the smaller m */
    long long total = c->size - (long long)(c->n_docs - 1) * c->separator, eval_tokens = 0;
    double target = eval_fraction * (double)total, best_gap = -1;
    int best_first = c->n_docs - 1;
    for (int first = c->n_docs - 1; first >= 1; first--) {
        eval_tokens += c->docs[first].size;
        double gap = eval_tokens > target ? eval_tokens - target : target - eval_tokens;
        if (best_gap < 0 || gap < best_gap) best_gap = gap, best_first = first;
    }
    *eval_start = c->docs[best_first].start;
    *train_end = *eval_start - c->separator; /* the separator before it belongs to neither split */
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
        if (at == c->docs[doc].size) { /* past this document: the separator (text), then the next */
            doc++;
            at = 0;
            if (c->separator) {
                out[t] = CORPUS_SEPARATOR;
                continue;
            }
        }
        out[t] = (int32_t)token_file_get(c->docs[doc].data, c->docs[doc].width, at++);
    }
}
