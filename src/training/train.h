/* The trainer (docs/model.md §1.4, docs/tasks.md §2, docs/metrics.md §3): data-parallel optimisation steps, periodic
 * evaluation into the metric tables, resume and save through the checkpoint
 * store. A core module (docs/design.md §8.1): it returns a status and never
 * exits; the commands (commands.h) run it. */
#ifndef MOMFMM_TRAIN_H
#define MOMFMM_TRAIN_H
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "config/config.h"
#include "data/metrics.h"
#include "eval/eval.h"
#include "model/model.h"
#include "parallel/dist.h"
#include "parallel/reducer.h"
#include "store/checkpoint.h"

/* What the command layer learns of a step in progress (docs/design.md
 * §8.7, stop signals); every member may be NULL. Between compute_begin and
 * compute_end the step only reads the state a checkpoint holds
 * (parameters, moments, momentum buffers, metric tables, step), so another
 * thread may write a checkpoint of it meanwhile. abandon is this rank's
 * vote, taken after the compute: if any rank votes for it, every rank
 * drops the step (no update; t->step stays), in the reduction the step
 * makes anyway. */
typedef struct {
    void (*compute_begin)(void *ctx);
    void (*compute_end)(void *ctx);
    bool (*abandon)(void *ctx);
    void *ctx;
} trainer_step_hooks;

typedef struct {
    config cfg;
    model model;
    data_shard shard; /* this rank's shard of the global data_batch */
    dist_reducer *reducer;
    metric_table train_log, eval_log;
    long long step, tokens_seen;
    long long skipped_steps;         /* non-finite steps skipped (train.on_nonfinite = skip) */
    double *reduce_scratch;          /* [1 + n_buffer]: loss sum, buffer sums over the micro-batches */
    evaluator *evaluator;            /* the periodic evaluation's buffers and result (trainer_log_eval); NULL
                                        in a run that never evaluates (config_evaluates) */
    double *eval_row;                /* [eval_log.row_width]: the row it appends (NULL likewise) */
    char init_from[CONFIG_PATH_MAX]; /* --init checkpoint of this run's timeline, or "" */
    char gemm_engines[128];          /* train.gemm = auto: the engine per product class, or "" */
    trainer_step_hooks hooks;        /* zero: none */
} trainer;

typedef struct {
    double loss, grad_norm, lr, allreduce_wait_s;
    double bpb;     /* bits per byte of the step's targets (docs/metrics.md §3); NaN unless text, and for token
                     * files a data.tokenizer */
    bool nonfinite; /* the loss or the gradient norm was NaN or infinite: no update */
    bool abandoned; /* a rank voted to drop the step (hooks.abandon): no update, t->step unchanged */
} train_step_result;

/* Where a trainer's weights and (train.gemm = auto) its engines' choice
 * come from: drawn from train.seed and timed at start-up, or a checkpoint's,
 * which trainer_resume or trainer_init_from then loads; a run that loads
 * one neither draws weights nor times the engines only to replace them
 * (docs/design.md §8.3). */
typedef enum { TRAINER_FRESH, TRAINER_FROM_CHECKPOINT } trainer_start;
/* A model at step 0 (TRAINER_FRESH: initialised from train.seed, identical
 * on every rank), its data shard and gradient reducer. Returns 0, or
 * EXIT_USAGE in err (the same on every rank): more ranks than rows, or
 * buffers that do not fit in the fullest node's memory. */
int trainer_create(trainer *t, const config *cfg, trainer_start start, status *err);
/* The initial weights (a collective): each rank draws its dist_partition
 * share, on its threads, and the shares are sent to every rank
 * (docs/design.md §8.3). trainer_create's fresh start, trainer_resume
 * without a checkpoint and `momfmm init` draw through it. */
void trainer_draw_weights(model *m);
void trainer_free(trainer *t);
/* One optimisation step at t->step + 1 (forward, backward, all-reduce,
 * clipping, AdamW) into *result; advances t->step. Returns 0, or the
 * data's failure (data_fill) in err. A step whose global loss or gradient
 * norm is not finite (the same on every rank after the reductions) changes
 * neither the parameters, the moments nor the momentum buffers and is
 * counted in t->skipped_steps; the caller stops or goes on
 * (train.on_nonfinite, docs/design.md §8.7). */
int trainer_step(trainer *t, train_step_result *result, status *err);
/* This rank's memory: bytes per parameter of the parameters, gradients
 * (with the ZeRO-1 slice of reduced gradients) and AdamW moments (8/np with
 * dist.zero = 1), and the activation bytes of one micro-batch (docs/scale.md §7). */
typedef struct {
    double param_bytes, grad_bytes, moment_bytes, activation_bytes;
    double eval_bytes; /* the evaluation's buffers (evaluator_bytes), 0 in a run that never evaluates */
} train_memory_use;
train_memory_use trainer_memory(const trainer *t);
/* Evaluates (eval.h) and appends the row of t->step to t->eval_log; *r:
 * the result, valid until the next evaluation. */
int trainer_log_eval(trainer *t, const eval_result **r, status *err);
/* --resume: `how` is a checkpoint path, which must load, or "auto", the
 * newest checkpoint in train.out_dir that loads (none: step 0). Returns 0,
 * or EXIT_BAD_FILE in err (a file that does not load, or a config that
 * changes the model or the data). */
int trainer_resume(trainer *t, const char *how, status *err);
/* --init (fine-tuning, docs/cli.md §5): the weights and momentum buffers of the
 * checkpoint at `path`, with the fresh optimizer and step 0 of
 * trainer_create. Returns 0, or EXIT_BAD_FILE in err: a file that does not
 * load, or one whose architecture keys differ (listing every one). */
int trainer_init_from(trainer *t, const char *path, status *err);
/* The checks of --init's source before anything is made (the command checks
 * it before the run directory is touched; trainer_init_from again, on the
 * file it then reads): its config reads, and its architecture keys are the
 * config's. 0, or EXIT_BAD_FILE in err naming "--init PATH"; info filled. */
int trainer_check_init_source(const config *cfg, const char *path, checkpoint_info *info, status *err);
/* Who writes the checkpoints (docs/scale.md §7): with ZeRO-1 on several
 * ranks no rank holds all the moments, so all write together; otherwise
 * rank 0 alone. */
h5writer_mode trainer_writers(const trainer *t);
/* The checkpoint of t->step into train.out_dir, pruned (store.h); path
 * receives its name. Every rank calls: with dist.zero = 1 on several ranks
 * all write the file together (docs/scale.md §7) and all return its
 * outcome; otherwise rank 0 writes it and the others return 0 at once. */
int trainer_save(const trainer *t, char *path, size_t len, status *err);
/* train.keep_best: best.h5 from the current state, written as trainer_save
 * writes (every rank calls), never pruned. */
int trainer_save_best(const trainer *t, status *err);
/* Whether every parameter is finite: a checkpoint of NaN or infinite
 * weights is never written (it would prune the good ones). */
bool trainer_weights_finite(const trainer *t);
#endif
