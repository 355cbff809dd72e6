/* The checkpoint store (docs/design.md §8.4); see store.h. Names are written
 * (snprintf) and parsed (store_checkpoint_step) only here. */
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/sys.h"
#include "hdf5/h5reader.h"
#include "parallel/dist.h"

/* Written with at least 8 digits (ckpt_00000600.h5); step 10^8 and later
 * take more, so names are ordered by their value, never as text. */
#define CHECKPOINT_NAME "ckpt_%08lld.h5"
#define CHECKPOINT_PREFIX "ckpt_"
#define CHECKPOINT_SUFFIX ".h5"
#define TEMPORARY_INFIX ".tmp."

/* The value of the decimal digits at s (one or more: no sign, no blank,
 * leading zeros allowed) in *value when it is at most LLONG_MAX: the number
 * of digits, or 0 (none, or a value past LLONG_MAX). */
static size_t parse_digits(const char *s, long long *value) {
    size_t n = 0;
    long long v = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[n] - '0', &v)) return 0;
    *value = v;
    return n;
}

/* The length of the checkpoint name at the start of `name` (its step in
 * *step), or 0: the one rule of docs/files.md §4 (checkpoint names): the
 * name CHECKPOINT_NAME writes for its step and no other, so that a step has
 * one name (ckpt_600.h5 and ckpt_000000600.h5 are not checkpoints) and the
 * Python package's rule is the same. */
static size_t checkpoint_name_length(const char *name, long long *step) {
    size_t prefix = strlen(CHECKPOINT_PREFIX), suffix = strlen(CHECKPOINT_SUFFIX);
    if (strncmp(name, CHECKPOINT_PREFIX, prefix) != 0) return 0;
    size_t digits = parse_digits(name + prefix, step);
    if (digits == 0 || strncmp(name + prefix + digits, CHECKPOINT_SUFFIX, suffix) != 0) return 0;
    char canonical[32];
    if ((size_t)snprintf(canonical, sizeof canonical, CHECKPOINT_NAME, *step) != prefix + digits + suffix ||
        strncmp(canonical, name, prefix + digits + suffix) != 0)
        return 0;
    return prefix + digits + suffix;
}

bool store_checkpoint_step(const char *name, long long *step) {
    long long value;
    size_t n = checkpoint_name_length(name, &value);
    if (n == 0 || name[n] != '\0') return false;
    if (step) *step = value;
    return true;
}

static int make_directory(const char *path, status *err) {
    if (!path[0]) return status_fail(err, EXIT_USAGE, "train.out_dir = '': an empty path names no directory");
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
    struct stat st;
    if (stat(buf, &st) == 0 && !S_ISDIR(st.st_mode)) /* EEXIST: something, not always a directory */
        return status_fail(err, EXIT_USAGE, "train.out_dir = %s: exists and is not a directory", path);
    return 0;
}

/* The temporary name of a write to `path`: unique per process; ranks
 * writing together (docs/scale.md §7) use one name, rank 0's. */
static void temporary_path(const char *path, h5writer_mode writers, char *tmp, size_t len) {
    int pid = (int)getpid();
    if (writers != H5WRITER_ALONE) dist_broadcast_bytes(&pid, sizeof pid);
    snprintf(tmp, len, "%s.tmp.%d", path, pid);
}

/* <checkpoint name or best.h5>.tmp.<digits> (temporary_path's names). */
static bool is_temporary_name(const char *name) {
    long long value;
    size_t base = checkpoint_name_length(name, &value);
    if (base == 0 && strncmp(name, STORE_BEST_NAME, strlen(STORE_BEST_NAME)) == 0) base = strlen(STORE_BEST_NAME);
    if (base == 0 || strncmp(name + base, TEMPORARY_INFIX, strlen(TEMPORARY_INFIX)) != 0) return false;
    const char *pid = name + base + strlen(TEMPORARY_INFIX);
    size_t digits = parse_digits(pid, &value);
    return digits > 0 && pid[digits] == '\0';
}

/* The step of a listed path (store_list takes checkpoint names only). */
static long long step_of(const char *path) {
    const char *name = strrchr(path, '/');
    long long step = -1;
    store_checkpoint_step(name ? name + 1 : path, &step);
    return step;
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

/* dir/.lock, locked with flock for the life of the process: the kernel
 * releases it however the process ends (exit, signal, crash), so a stale
 * lock file never blocks a later run. The descriptor is deliberately kept
 * open (and not inherited by exec'ed children). */
static int lock_directory(const char *dir, status *err) {
    char path[STORE_PATH_MAX];
    snprintf(path, sizeof path, "%s/.lock", dir);
    /* a regular file, never a link or a FIFO (whose read below would block): docs/files.md §4 */
    status opened;
    int fd = sys_open_file(path, SYS_LOCK, "the run's lock", &opened);
    if (fd < 0) return status_fail(err, EXIT_USAGE, "train.out_dir = %s: %s", dir, opened.message);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[32] = "";
        ssize_t n = read(fd, holder, sizeof holder - 1);
        holder[n > 0 ? n : 0] = '\0';
        close(fd);
        return status_fail(err, EXIT_USAGE,
                           "train.out_dir = %s is in use by another run (pid %s holds %s): one run per directory", dir,
                           holder[0] ? strtok(holder, "\n") : "unknown", path);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)len) != len)
        log_rank0("warning: %s: cannot record this run's pid\n", path);
    return 0;
}

/* Checkpoints and metrics.h5 of an earlier run, removed for --overwrite. */
static void remove_earlier_run(const char *dir) {
    store_listing l;
    store_list(dir, &l);
    for (int i = 0; i < l.n; i++) remove(l.paths[i]);
    char metrics[STORE_PATH_MAX];
    snprintf(metrics, sizeof metrics, "%s/metrics.h5", dir);
    remove(metrics);
    log_rank0("--overwrite: removed %d checkpoint%s and metrics.h5 of the earlier run in %s\n", l.n,
              l.n == 1 ? "" : "s", dir);
    store_listing_free(&l);
}

bool store_overwrite_removes(const char *dir, const char *path) {
    struct stat target, st;
    if (stat(path, &target) != 0) return false;
    store_listing l;
    store_list(dir, &l);
    bool removes = false;
    for (int i = 0; i < l.n && !removes; i++)
        removes = stat(l.paths[i], &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino;
    store_listing_free(&l);
    char metrics[STORE_PATH_MAX];
    snprintf(metrics, sizeof metrics, "%s/metrics.h5", dir);
    return removes || (stat(metrics, &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino);
}

int store_open_run(const char *dir, bool resuming, bool overwrite, status *err) {
    if (make_directory(dir, err) != 0 || lock_directory(dir, err) != 0) return err->code;
    store_listing l;
    store_list(dir, &l);
    int held = l.n, special = -1;
    char newest[STORE_PATH_MAX] = "";
    if (held) snprintf(newest, sizeof newest, "%s", l.paths[held - 1]);
    /* a special file (a FIFO) under a checkpoint's name would block a read forever */
    for (int i = 0; i < held && special < 0; i++) {
        int fd = sys_open_file(l.paths[i], SYS_READ, "checkpoint", err);
        if (fd >= 0) close(fd);
        else special = i;
    }
    store_listing_free(&l);
    if (special >= 0) return EXIT_BAD_FILE;
    if (held && !resuming && !overwrite)
        return status_fail(err, EXIT_USAGE,
                           "train.out_dir = %s holds %d checkpoint%s of an earlier run (newest %s): pass --resume auto "
                           "to continue it, or --overwrite to replace it",
                           dir, held, held == 1 ? "" : "s", newest);
    if (overwrite && !resuming) remove_earlier_run(dir);
    char marker[STORE_PATH_MAX];
    snprintf(marker, sizeof marker, "%s/STOPPED", dir);
    remove(marker); /* the marker of an earlier stop (store_mark_stopped) */
    remove_stale_temporaries(dir);
    return 0;
}

/* dir/ckpt_<step, at least 8 digits>.h5 */
static void store_checkpoint_path(const char *dir, long long step, char *path, size_t len) {
    char name[32];
    snprintf(name, sizeof name, CHECKPOINT_NAME, step);
    snprintf(path, len, "%s/%s", dir, name);
}

void store_best_path(const char *dir, char *path, size_t len) { snprintf(path, len, "%s/" STORE_BEST_NAME, dir); }

/* By step (a step has one name, store_checkpoint_step). */
static int compare_names(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    long long sx = step_of(x), sy = step_of(y);
    return sx != sy ? (sx < sy ? -1 : 1) : strcmp(x, y);
}

void store_list(const char *dir, store_listing *out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 16;
    char **paths = sys_calloc((size_t)cap, sizeof(char *));
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        if (!store_checkpoint_step(entry->d_name, NULL)) continue;
        if (n == cap) paths = sys_realloc(paths, sizeof(char *) * (size_t)(cap *= 2));
        paths[n] = sys_calloc(STORE_PATH_MAX, 1);
        snprintf(paths[n++], STORE_PATH_MAX, "%s/%s", dir, entry->d_name);
    }
    if (d) closedir(d);
    /* by value: ckpt_100000000.h5 is newer than ckpt_99999999.h5 */
    qsort(paths, (size_t)n, sizeof(char *), compare_names);
    out->paths = paths;
    out->n = n;
}

void store_listing_free(store_listing *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

/* Keeps the newest `keep` checkpoints at or below `step`; files from later
 * steps (another timeline) are neither counted nor deleted. */
static void store_prune(const char *dir, int keep, long long step) {
    store_listing l;
    store_list(dir, &l);
    int eligible = 0;
    for (int i = 0; i < l.n; i++) eligible += step_of(l.paths[i]) <= step;
    for (int i = 0, seen = 0; i < l.n; i++)
        if (step_of(l.paths[i]) <= step && seen++ < eligible - keep) remove(l.paths[i]);
    store_listing_free(&l);
}

int store_write_checkpoint(const char *path, const model *m, const checkpoint_info *info, const metric_table *train,
                           const metric_table *eval, h5writer_mode writers, status *err) {
    char tmp[STORE_PATH_MAX + 32];
    temporary_path(path, writers, tmp, sizeof tmp);
    return checkpoint_write(path, tmp, m, info, train, eval, writers, err);
}

int store_write_grads(const char *path, const model *m, double loss, status *err) {
    char tmp[STORE_PATH_MAX + 32];
    temporary_path(path, H5WRITER_ALONE, tmp, sizeof tmp);
    return checkpoint_write_grads(path, tmp, m, loss, err);
}

int store_write_logits(const char *path, const float *logits, int ndim, int B, int T, int width,
                       const logits_file_source *source, status *err) {
    char tmp[STORE_PATH_MAX + 32];
    temporary_path(path, H5WRITER_ALONE, tmp, sizeof tmp);
    return logits_file_write(path, tmp, logits, ndim, B, T, width, source, err);
}

/* Before the one retry of a failed checkpoint write (docs/cli.md §5, full
 * disk): the checkpoints at or below `step` that pruning would remove once
 * the new one is written, but never the newest of them, the last state on
 * disk until a newer one is complete. `path` (the one being written) is not
 * counted. Returns how many were removed. Rank 0. */
static int free_for_retry(const char *dir, int keep, long long step, const char *path) {
    store_listing l;
    store_list(dir, &l);
    int eligible = 0, removed = 0;
    for (int i = 0; i < l.n; i++) eligible += step_of(l.paths[i]) <= step && strcmp(l.paths[i], path) != 0;
    int surplus = eligible - (keep - 1) < eligible - 1 ? eligible - (keep - 1) : eligible - 1;
    for (int i = 0, seen = 0; i < l.n && seen < surplus; i++) {
        if (step_of(l.paths[i]) > step || strcmp(l.paths[i], path) == 0) continue;
        seen++;
        if (remove(l.paths[i]) != 0) continue;
        removed++;
        log_rank0("removed %s, which train.keep = %d drops anyway, to make room for the checkpoint\n", l.paths[i],
                  keep);
    }
    store_listing_free(&l);
    return removed;
}

/* The failure of a checkpoint write, said in full: the directory, what
 * failed, the bytes it needs against those free, and the newest checkpoint
 * left (docs/cli.md §5). */
static void describe_save_failure(const char *dir, long long step, double need, int freed, status *err) {
    char why[sizeof err->message], newest[STORE_PATH_MAX + 64] = "no checkpoint is on disk";
    snprintf(why, sizeof why, "%s", err->message);
    store_listing l;
    store_list(dir, &l);
    for (int i = l.n - 1; i >= 0; i--)
        if (step_of(l.paths[i]) < step) {
            snprintf(newest, sizeof newest, "the newest checkpoint, %s, is intact", l.paths[i]);
            break;
        }
    store_listing_free(&l);
    double free_bytes = sys_free_bytes(dir);
    char room[96] = "";
    if (free_bytes >= 0) snprintf(room, sizeof room, ", %.3g MB are free", free_bytes / 1e6);
    status_fail(err, EXIT_BAD_FILE,
                "train.out_dir = %s: the checkpoint of step %lld cannot be written (%s): it needs about %.3g MB%s "
                "after removing %d older checkpoint%s that train.keep allows; %s",
                dir, step, why, need / 1e6, room, freed, freed == 1 ? "" : "s", newest);
}

int store_save(const char *dir, int keep, const model *m, const checkpoint_info *info, const metric_table *train,
               const metric_table *eval, h5writer_mode writers, char *path, size_t len, status *err) {
    store_checkpoint_path(dir, info->step, path, len);
    bool leader = writers == H5WRITER_ALONE || dist_rank() == 0;
    int rc = store_write_checkpoint(path, m, info, train, eval, writers, err);
    if (rc != 0) {
        /* a full disk: room from what retention drops anyway, then one retry */
        int freed = leader ? free_for_retry(dir, keep, info->step, path) : 0;
        if (writers != H5WRITER_ALONE) dist_broadcast_bytes(&freed, sizeof freed);
        if (freed > 0) rc = store_write_checkpoint(path, m, info, train, eval, writers, err);
        if (rc != 0) describe_save_failure(dir, info->step, checkpoint_size_estimate(m, info, train, eval), freed, err);
    }
    if (rc == 0 && leader) store_prune(dir, keep, info->step);
    return rc;
}

int store_load_newest(const char *dir, store_loader load, void *ctx, char *path, size_t len, status *err) {
    store_listing l;
    store_list(dir, &l);
    int rc = STORE_SKIP;
    for (int i = l.n - 1; i >= 0 && rc == STORE_SKIP; i--) {
        rc = load(l.paths[i], ctx, err);
        /* a file another program is writing is not a bad file: falling back
         * past it would resume from (or show) an older state without a word */
        if (rc == STORE_SKIP && h5reader_is_locked(l.paths[i])) {
            size_t used = strlen(err->message);
            snprintf(err->message + used, sizeof err->message - used, "; not falling back to an older checkpoint");
            rc = err->code = EXIT_BAD_FILE;
        }
        if (rc == STORE_SKIP) log_rank0("warning: skipping checkpoint that does not load: %s\n", err->message);
        else if (rc == 0 && path) snprintf(path, len, "%s", l.paths[i]);
    }
    store_listing_free(&l);
    return rc;
}

int store_resume_newest(const char *dir, store_loader load, void *ctx, bool *resumed, status *err) {
    int rc = store_load_newest(dir, load, ctx, NULL, 0, err);
    *resumed = rc == 0;
    return rc == STORE_SKIP ? 0 : rc;
}

bool store_is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int store_mark_stopped(const char *dir, const char *checkpoint, int signo, status *err) {
    char marker[STORE_PATH_MAX], text[STORE_PATH_MAX + 64];
    snprintf(marker, sizeof marker, "%s/STOPPED", dir);
    int fd = sys_open_file(marker, SYS_REPLACE, "the stop marker", err);
    if (fd < 0) return err->code;
    int len = snprintf(text, sizeof text, "signal %d: checkpoint %s\n", signo, checkpoint);
    bool written = write(fd, text, (size_t)len) == len;
    int cause = errno;
    close(fd);
    return written ? 0 : status_fail(err, EXIT_BAD_FILE, "%s: cannot write: %s", marker, strerror(cause));
}
