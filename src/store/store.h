/* The checkpoint store (docs/design.md §8.4): the run directory
 * train.out_dir and everything about where checkpoint files go. Checkpoints
 * are named ckpt_<step>.h5, at least 8 digits; a write goes to a temporary name
 * (<final name>.tmp.<pid>) that is renamed into place, and a run starting in
 * the directory removes temporaries an interrupted write left. Pruning keeps
 * the newest train.keep checkpoints at or below the run's step. Auto-resume
 * takes the newest checkpoint that loads. The file format is checkpoint.h's. */
#ifndef MOMFMM_STORE_H
#define MOMFMM_STORE_H
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "config/config.h"
#include "store/checkpoint.h"
#include "store/logits_file.h"

#define STORE_PATH_MAX (CONFIG_PATH_MAX + 64)

/* train.keep_best (docs/design.md §8.4): dir/best.h5, the checkpoint of the
 * lowest eval loss so far, written atomically (store_write_checkpoint) and
 * never pruned (not a checkpoint name, so neither listed nor resumed). */
#define STORE_BEST_NAME "best.h5"
void store_best_path(const char *dir, char *path, size_t len);

/* Opens the run directory of a training run (docs/design.md §8.4): creates
 * dir (with parents), removes stale temporaries (reporting each), and locks
 * dir for the life of the process (dir/.lock, flock: released on any exit), so that a
 * second concurrent run is refused (EXIT_USAGE naming the holder's pid),
 * and refuses a directory holding an earlier run's checkpoints unless the
 * run resumes or overwrites (which removes the checkpoints and
 * metrics.h5 first). Rank 0 only. */
int store_open_run(const char *dir, bool resuming, bool overwrite, status *err);
/* Whether `path` is one of the files (the same inode) that --overwrite
 * would remove from dir: a checkpoint or metrics.h5. */
bool store_overwrite_removes(const char *dir, const char *path);

/* dir/STOPPED, naming the checkpoint a signal stop wrote: the job scripts
 * (jobs/ *.sbatch) read it to report the stop as a success whatever the
 * launcher's exit status (docs/cli.md §5). store_open_run removes it.
 * Written as a regular file, never through a link (docs/files.md §4); 0,
 * or EXIT_BAD_FILE in err. */
int store_mark_stopped(const char *dir, const char *checkpoint, int signo, status *err);

/* The one rule of checkpoint names (docs/files.md §4): exactly the name the
 * store writes for a step in [0, LLONG_MAX], "ckpt_" + the step zero-padded
 * to 8 digits (more past 10^8, no leading zero then) + ".h5". Whether `name`
 * (no directory) is one, with its step in *step (may be NULL). Anything else
 * (ckpt_600.h5, ckpt_-1.h5, ckpt_1e3.h5, ckpt_.h5, 20 digits) is not a
 * checkpoint: never listed, pruned or resumed. */
bool store_checkpoint_step(const char *name, long long *step);

/* Checkpoint paths in dir, oldest first: by step (not as text: step 10^8
 * has nine digits), two names of one step by name. */
typedef struct {
    char **paths;
    int n;
} store_listing;
void store_list(const char *dir, store_listing *out);
void store_listing_free(store_listing *l);

/* Writes any checkpoint or gradient file atomically through a temporary name
 * (with H5WRITER_TOGETHER every rank calls, and the name is rank 0's). */
int store_write_checkpoint(const char *path, const model *m, const checkpoint_info *info, const metric_table *train,
                           const metric_table *eval, h5writer_mode writers, status *err);
int store_write_grads(const char *path, const model *m, double loss, status *err);
/* The /logits file of `momfmm logits` (logits_file_write), written alone. */
int store_write_logits(const char *path, const float *logits, int ndim, int B, int T, int width,
                       const logits_file_source *source, status *err);

/* The checkpoint of info->step in dir, then pruning (by rank 0) to the
 * newest `keep` at or below that step. Fills path (len bytes) with the
 * file written. When the write fails (a full disk, any write error), the
 * older checkpoints that this pruning would remove anyway are removed first
 * (never the newest: the last state stays until a newer one is complete)
 * and, when that freed any, the write is tried once more; a failure then
 * is EXIT_BAD_FILE with a message naming dir, the bytes needed and free,
 * and the newest checkpoint left (docs/cli.md §5). */
int store_save(const char *dir, int keep, const model *m, const checkpoint_info *info, const metric_table *train,
               const metric_table *eval, h5writer_mode writers, char *path, size_t len, status *err);

/* Tries load(path, ctx, err) on the checkpoints of dir, newest first, until
 * one returns 0 (*resumed = true). A checkpoint that returns STORE_SKIP is
 * reported and skipped (never deleted); any other code ends the search and
 * is returned, with its message in err. */
enum { STORE_SKIP = -1 };
typedef int (*store_loader)(const char *path, void *ctx, status *err);
int store_resume_newest(const char *dir, store_loader load, void *ctx, bool *resumed, status *err);

/* The search of store_resume_newest, for the commands that read a run
 * directory (inspect, eval; docs/cli.md §5): returns 0 with the path of the
 * checkpoint that loaded in path (len bytes; path may be NULL), STORE_SKIP
 * when none did (or there is none), or the code that ended the search. */
int store_load_newest(const char *dir, store_loader load, void *ctx, char *path, size_t len, status *err);

/* Whether path names a directory (a run directory rather than a file). */
bool store_is_directory(const char *path);
#endif
