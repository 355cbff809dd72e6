/* The checkpoint store (docs/design.md §8.4); see store.h. Names are written
 * (snprintf) and parsed (sscanf) only here. */
#include "momfmm/store.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECKPOINT_NAME "ckpt_%08lld.h5"
#define CHECKPOINT_NAME_LEN 16 /* strlen("ckpt_00000000.h5") */

static int make_directory(const char *path, status *err) {
    char buf[CONFIG_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0775);
            *p = '/';
        }
    if (mkdir(buf, 0775) != 0 && errno != EEXIST)
        return status_fail(err, EXIT_USAGE, "train.out_dir = %s: cannot create: %s", path, strerror(errno));
    return 0;
}

/* The temporary name of a write to `path`: unique per process. */
static void temporary_path(const char *path, char *tmp, size_t len) {
    snprintf(tmp, len, "%s.tmp.%d", path, (int)getpid());
}

static bool is_temporary_name(const char *name) {
    unsigned long long step;
    int used = 0;
    sscanf(name, STORE_BEST_NAME ".tmp.%*d%n", &used);
    if (used > 0 && name[used] == '\0') return true;
    return sscanf(name, "ckpt_%8llu.h5.tmp.%*d%n", &step, &used) == 1 && used > 0 && name[used] == '\0';
}

static bool is_checkpoint_name(const char *name) {
    unsigned long long step;
    char tail[8];
    return sscanf(name, "ckpt_%8llu%4s", &step, tail) == 2 && strcmp(tail, ".h5") == 0 &&
           strlen(name) == CHECKPOINT_NAME_LEN;
}

static long long step_of(const char *path) {
    const char *name = strrchr(path, '/');
    return atoll((name ? name + 1 : path) + strlen("ckpt_"));
}

/* Temporary files of writes that a crash interrupted (never a checkpoint's
 * name) are removed when a run starts in the directory. */
static void remove_stale_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        if (!is_temporary_name(entry->d_name)) continue;
        char path[CONFIG_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        if (remove(path) == 0) log_rank0("removed %s, left by an interrupted write\n", path);
    }
    if (d) closedir(d);
}

int store_open(const char *dir, status *err) {
    if (make_directory(dir, err) != 0) return EXIT_USAGE;
    remove_stale_temporaries(dir);
    return 0;
}

void store_checkpoint_path(const char *dir, long long step, char *path, size_t len) {
    char name[32];
    snprintf(name, sizeof name, CHECKPOINT_NAME, step);
    snprintf(path, len, "%s/%s", dir, name);
}

void store_best_path(const char *dir, char *path, size_t len) { snprintf(path, len, "%s/" STORE_BEST_NAME, dir); }

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void store_list(const char *dir, store_listing *out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 16;
    char **paths = xcalloc((size_t)cap, sizeof(char *));
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        if (!is_checkpoint_name(entry->d_name)) continue;
        if (n == cap) paths = realloc(paths, sizeof(char *) * (size_t)(cap *= 2));
        paths[n] = xcalloc(STORE_PATH_MAX, 1);
        snprintf(paths[n++], STORE_PATH_MAX, "%s/%s", dir, entry->d_name);
    }
    if (d) closedir(d);
    /* one directory prefix: the names' order (fixed-width steps) is the paths' */
    qsort(paths, (size_t)n, sizeof(char *), compare_names);
    out->paths = paths;
    out->n = n;
}

void store_listing_free(store_listing *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

void store_prune(const char *dir, int keep, long long step) {
    store_listing l;
    store_list(dir, &l);
    int eligible = 0;
    for (int i = 0; i < l.n; i++) eligible += step_of(l.paths[i]) <= step;
    for (int i = 0, seen = 0; i < l.n; i++)
        if (step_of(l.paths[i]) <= step && seen++ < eligible - keep) remove(l.paths[i]);
    store_listing_free(&l);
}

int store_write_checkpoint(const char *path, const model *m, const checkpoint_info *info, const metric_table *train,
                           const metric_table *eval, status *err) {
    char tmp[STORE_PATH_MAX + 32];
    temporary_path(path, tmp, sizeof tmp);
    return checkpoint_write(path, tmp, m, info, train, eval, err);
}

int store_write_grads(const char *path, const model *m, double loss, status *err) {
    char tmp[STORE_PATH_MAX + 32];
    temporary_path(path, tmp, sizeof tmp);
    return grads_write(path, tmp, m, loss, err);
}

int store_save(const char *dir, int keep, const model *m, const checkpoint_info *info, const metric_table *train,
               const metric_table *eval, char *path, size_t len, status *err) {
    store_checkpoint_path(dir, info->step, path, len);
    int rc = store_write_checkpoint(path, m, info, train, eval, err);
    if (rc == 0) store_prune(dir, keep, info->step);
    return rc;
}

int store_resume_newest(const char *dir, store_loader load, void *ctx, bool *resumed, status *err) {
    store_listing l;
    store_list(dir, &l);
    int rc = STORE_SKIP;
    for (int i = l.n - 1; i >= 0 && rc == STORE_SKIP; i--) {
        rc = load(l.paths[i], ctx, err);
        if (rc == STORE_SKIP) log_rank0("warning: skipping checkpoint that does not load: %s\n", err->message);
    }
    store_listing_free(&l);
    *resumed = rc == 0;
    return rc == STORE_SKIP ? 0 : rc;
}
