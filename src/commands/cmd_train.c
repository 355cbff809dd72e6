/* The `train` and `bench` commands (docs/cli.md §5; docs/design.md §8.1, §8.7): run
 * the trainer, log, publish metrics, checkpoint on signals; a failed status
 * becomes an exit here and nowhere below. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/blas_core.h"
#include "base/log.h"
#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "commands/signals.h"
#include "kernels/gemm.h"
#include "parallel/arrivals.h"
#include "parallel/dist.h"
#include "store/checkpoint.h"
#include "store/live_metrics.h"
#include "store/store.h"
#include "training/train.h"

/* Why this rank would stop: its own stop signal, SIGPIPE for a closed
 * stdout on rank 0 (train ... | head: EPIPE, log_output_closed), 0: none. */
static int own_stop_cause(void) {
    if (signals_stop_requested()) return signals_stop_requested();
    return log_output_closed() ? SIGPIPE : 0;
}

/* Every rank stops at the same step: a signal seen by any rank counts
 * (collective: the largest cause of all ranks, for STOPPED; 0: go on). */
static int agreed_stop_cause(void) { return (int)dist_max_double(own_stop_cause()); }

/* Every rank meets the same failures in trainer_create (same config, the
 * fullest node's memory decided everywhere alike). */
static void create_trainer(trainer *t, const config *cfg, trainer_start start) {
    status err;
    if (trainer_create(t, cfg, start, &err) != 0) cmd_fail_all(err.code, "%s", err.message);
}

/* An eval of the run: its step and metrics (docs/metrics.md §3). */
typedef struct {
    bool known;
    long long step;
    metric_values metrics;
} eval_record;

/* One step with its logging, eval and checkpoint; false once the run must
 * stop. *final_saved is whether the last state is on disk. */
typedef struct {
    long long first_step;
    double interval_tokens; /* a double: 2^30 steps of 2^48 tokens would overflow an int64 */
    double start, interval_start;
    live_metrics *live;
    bool final_saved, diverged;
    bool save_stopped;                /* a checkpoint could not be written: the run stopped (on_save_failure) */
    eval_record last_eval, best_eval; /* best: of best.h5 with train.keep_best */
    char latest[STORE_PATH_MAX];      /* the last checkpoint written, "" while none is */
} train_loop;

/* What a failed checkpoint write leads to, for its message: the run stops
 * (train.on_save_failure = stop, the default: steps whose state cannot be
 * kept are not run) or goes on (continue). A stop-signal checkpoint ends
 * the run either way. */
static const char *after_failed_save(const trainer *t, int stop_cause) {
    if (stop_cause) return "";
    if (t->cfg.on_save_failure == SAVE_FAILURE_CONTINUE)
        return "; training goes on without it (train.on_save_failure = continue)";
    return "; stopping here, exit 3 (train.on_save_failure = continue would train on without checkpoints)";
}

/* Returns false when rank 0 could not write the checkpoint (the store has
 * freed what train.keep allows and retried once); on success loop->latest
 * names it. Weights that are not finite are never written: they would
 * prune the good checkpoints (docs/design.md §8.7, divergence guard);
 * every rank holds the same weights, so every rank decides alike. */
static bool save_checkpoint(const trainer *t, train_loop *loop, int stop_cause) {
    status err;
    if (!trainer_weights_finite(t)) {
        fprintf(stderr, "momfmm: checkpoint at step %lld not written: the weights are not finite\n", t->step);
        return false;
    }
    double start = sys_seconds();
    char path[STORE_PATH_MAX];
    signals_clear_file_limit();
    /* every rank: with dist.zero = 1 all ranks write the file together, a
     * phase they enter together (docs/design.md §8.11); rank 0 alone does
     * not wait for the others, still in their step after a stop signal */
    dist_watch_phase("checkpoint write", trainer_writers(t) != H5WRITER_ALONE);
    int rc = trainer_save(t, path, sizeof path, &err);
    dist_watch_phase(NULL, false);
    if (dist_rank() != 0) return rc == 0;
    if (rc != 0) {
        fprintf(stderr, "momfmm: checkpoint at step %lld not written: %s%s%s\n", t->step, err.message,
                signals_file_limit_reached() ? " (it crossed the file size limit, as every later one would)" : "",
                after_failed_save(t, stop_cause));
        return false;
    }
    snprintf(loop->latest, sizeof loop->latest, "%s", path);
    struct stat st;
    double seconds = sys_seconds() - start, mb = stat(path, &st) == 0 ? st.st_size / 1e6 : 0;
    char together[64] = "";
    h5writer_mode writers = trainer_writers(t);
    if (writers != H5WRITER_ALONE)
        snprintf(together, sizeof together, " | %d ranks together (MPI-IO%s)", dist_size(),
                 writers == H5WRITER_COLLECTIVE ? ", collective" : "");
    printf("checkpoint %s | %.1f MB in %.2f s (%.0f MB/s)%s\n", path, mb, seconds, mb / (seconds > 0 ? seconds : 1e-9),
           together);
    if (stop_cause && store_mark_stopped(t->cfg.out_dir, path, stop_cause, &err) != 0)
        fprintf(stderr, "momfmm: warning: %s\n", err.message);
    log_flush();
    return true;
}

/* The stop writer (docs/design.md §8.7). A launcher that is stopping a job
 * kills its ranks soon after its SIGTERM: mpirun (Open MPI 4.1) one
 * odls_base_sigkill_timeout (1 s) later, Slurm after KillWait. A rank that
 * first finished its step would lose the work of a step longer than that.
 * So, on rank 0 when it writes checkpoints alone (not dist.zero = 1 on
 * several ranks), a thread waits for a stop signal and writes the
 * checkpoint of the last finished step at once, while the step in progress
 * computes: that only reads the state a checkpoint holds. The main thread
 * holds `lock` except during a step's compute (trainer_step_hooks), so the
 * writer never sees a half-updated state, and the step's end waits for the
 * writer; every rank then drops that step (hooks.abandon). */
typedef struct {
    trainer *t;
    train_loop *loop;
    pthread_mutex_t lock;
    pthread_t thread;
    bool started;
    atomic_bool quit;
    long long saved_step; /* the step of the stop checkpoint written, -1: none (under lock) */
} stop_writer;

/* Under the lock, on every rank alike (the collective write of dist.zero =
 * 1 included): the stop checkpoint of t->step, once. */
static void write_stop_checkpoint(stop_writer *w, int cause) {
    const trainer *t = w->t;
    if (w->saved_step == t->step) return;
    w->saved_step = t->step;
    if (dist_rank() == 0 && signals_stop_requested() == 0 && log_output_closed())
        fprintf(stderr, "momfmm: standard output closed (EPIPE): stopping at step %lld with a checkpoint\n", t->step);
    log_rank0("stop requested: writing a checkpoint at step %lld\n", t->step);
    w->loop->final_saved = save_checkpoint(t, w->loop, cause);
}

static void *stop_writer_main(void *arg) {
    stop_writer *w = arg;
    int fd = signals_wake_fd();
    for (;;) {
        char byte;
        ssize_t n = read(fd, &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || atomic_load(&w->quit)) return NULL;
        if (!signals_stop_requested()) continue;
        pthread_mutex_lock(&w->lock);
        if (!atomic_load(&w->quit)) write_stop_checkpoint(w, signals_stop_requested());
        pthread_mutex_unlock(&w->lock);
        return NULL;
    }
}

static void hold_state(void *ctx) { pthread_mutex_lock(&((stop_writer *)ctx)->lock); }
static void share_state(void *ctx) { pthread_mutex_unlock(&((stop_writer *)ctx)->lock); }
/* this rank's vote to drop the step in progress: a stop signal came */
static bool vote_to_abandon(void *ctx) {
    (void)ctx;
    return signals_stop_requested() != 0;
}

static void stop_writer_start(stop_writer *w, trainer *t, train_loop *loop) {
    *w = (stop_writer){.t = t, .loop = loop, .saved_step = -1};
    atomic_init(&w->quit, false);
    pthread_mutex_init(&w->lock, NULL);
    pthread_mutex_lock(&w->lock); /* the main thread's */
    t->hooks = (trainer_step_hooks){.abandon = vote_to_abandon, .ctx = w};
    if (dist_rank() != 0 || trainer_writers(t) != H5WRITER_ALONE || signals_wake_fd() < 0) return;
    w->started = pthread_create(&w->thread, NULL, stop_writer_main, w) == 0;
    if (w->started) t->hooks.compute_begin = share_state, t->hooks.compute_end = hold_state;
}

static void stop_writer_finish(stop_writer *w) {
    atomic_store(&w->quit, true);
    signals_wake();
    pthread_mutex_unlock(&w->lock);
    if (w->started) pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    w->t->hooks = (trainer_step_hooks){0};
}

static void log_train(trainer *t, const train_step_result *r, double tokens_per_s, double elapsed,
                      long long steps_done) {
    double row[16] = {0}, step = (double)t->step, bpb = r->bpb;
    const struct {
        const char *name;
        const double *value;
    } columns[] = {{"step", &step},
                   {"loss", &r->loss},
                   {"lr", &r->lr},
                   {"grad_norm", &r->grad_norm},
                   {"tokens_per_s", &tokens_per_s},
                   {"bpb", &bpb}};
    for (size_t i = 0; i < sizeof columns / sizeof columns[0]; i++)
        metric_table_set(&t->train_log, row, columns[i].name, columns[i].value);
    metric_table_append(&t->train_log, row);
    double eta = steps_done > 0 ? elapsed / steps_done * (double)(t->cfg.steps - t->step) : 0;
    char text_bpb[32] = ""; /* docs/metrics.md §3: text is read in bits per byte */
    if (t->cfg.task == TASK_TEXT && isfinite(bpb)) snprintf(text_bpb, sizeof text_bpb, " | bpb %.4f", bpb);
    log_rank0("step %lld/%lld | loss %.4f%s | lr %.3e | grad_norm %.3f | %.0f tok/s | ETA %dm%02ds\n", t->step,
              t->cfg.steps, r->loss, text_bpb, r->lr, r->grad_norm, tokens_per_s, (int)(eta / 60), (int)fmod(eta, 60));
}

/* Rank 0 mirrors the metric tables into metrics.h5 as they grow; a write
 * failure (e.g. a full disk) is reported once and the mirror stops, while
 * training and checkpoints go on. */
static void publish_metrics(trainer *t, live_metrics **live) {
    status err;
    if (*live && live_metrics_append(*live, &t->train_log, &t->eval_log, &err) != 0) {
        fprintf(stderr, "momfmm: warning: %s; live metrics stop here (checkpoints keep the history)\n", err.message);
        live_metrics_abandon(*live);
        *live = NULL;
    }
}

static live_metrics *open_live_metrics(const trainer *t) {
    if (dist_rank() != 0) return NULL;
    status err;
    char *ini = config_to_ini(&t->cfg);
    live_metrics *live = live_metrics_open(t->cfg.out_dir, ini, &t->train_log, &t->eval_log, &err);
    free(ini);
    if (!live) fprintf(stderr, "momfmm: warning: %s; training goes on without it\n", err.message);
    return live;
}

/* The lowest-loss row of an eval table into *best when lower than it. */
static void keep_lowest(eval_record *best, const metric_table *eval) {
    for (long long i = 0; i < eval->n_rows; i++) {
        metric_values e;
        metric_values_from_row(eval, i, &e);
        if (!isnan(e.loss) && (!best->known || e.loss < best->metrics.loss))
            *best = (eval_record){true, (long long)eval->values[i * eval->row_width], e};
    }
}

/* train.keep_best on a resumed run: the best so far is best.h5's, so that
 * a resume from an older checkpoint does not replace a better file. Rank 0. */
static void read_best_so_far(const trainer *t, eval_record *best) {
    char path[STORE_PATH_MAX];
    store_best_path(t->cfg.out_dir, path, sizeof path);
    metric_table train, eval;
    metric_tables_standard(&train, &eval, t->cfg.n_layers, t->cfg.n_heads);
    metric_tables_add_task_columns(&train, &eval, &t->cfg);
    status err;
    if (access(path, F_OK) == 0 && checkpoint_read_metrics(path, &train, &eval, &err) == 0) keep_lowest(best, &eval);
    else if (access(path, F_OK) == 0) fprintf(stderr, "momfmm: warning: %s; it will be replaced\n", err.message);
    if (best->known) printf("best so far: eval loss %.4f at step %lld (%s)\n", best->metrics.loss, best->step, path);
    metric_table_free(&train);
    metric_table_free(&eval);
}

/* best.h5 when the eval just logged beats the best so far: rank 0 decides
 * (it alone read the best so far back on resume), every rank takes part in
 * the write (trainer_save_best). */
static void save_if_best(const trainer *t, train_loop *loop) {
    if (!t->cfg.keep_best) return;
    const eval_record *now = &loop->last_eval;
    bool better =
        !isnan(now->metrics.loss) && (!loop->best_eval.known || now->metrics.loss < loop->best_eval.metrics.loss);
    if (!dist_any(dist_rank() == 0 && better)) return;
    status err;
    dist_watch_phase("best checkpoint write", trainer_writers(t) != H5WRITER_ALONE);
    int rc = trainer_save_best(t, &err);
    dist_watch_phase(NULL, false);
    if (rc != 0) {
        if (dist_rank() == 0) fprintf(stderr, "momfmm: warning: best checkpoint not written: %s\n", err.message);
        return;
    }
    loop->best_eval = *now;
    char path[STORE_PATH_MAX];
    store_best_path(t->cfg.out_dir, path, sizeof path);
    log_rank0("best %s | eval loss %.4f at step %lld\n", path, now->metrics.loss, t->step);
    if (dist_rank() == 0) log_flush();
}

static void log_eval(trainer *t, train_loop *loop) {
    const eval_result *r;
    status err;
    dist_watch_phase("eval", false);
    if (trainer_log_eval(t, &r, &err) != 0) cmd_fail(err.code, "%s", err.message);
    dist_watch_phase(NULL, false);
    char shown[256];
    metric_values_format(&r->metrics, t->cfg.task, 4, shown, sizeof shown);
    log_rank0("eval step %lld | %s", t->step, shown);
    if (r->length_eval) { /* docs/tasks.md §2: a positional solution fails here */
        char loss[32], rep[32];
        log_rank0(" | lengen loss %s L_rep %s", metric_text(r->length_metrics.loss, 4, loss, sizeof loss),
                  metric_text(r->length_metrics.L_rep, 4, rep, sizeof rep));
    }
    if (r->gains_measured) log_rank0(" | gain_R");
    for (int l = 0; l < t->model.L && r->gains_measured; l++) log_rank0(" %.3f", r->gain_R[l]);
    log_rank0("\n");
    loop->last_eval = (eval_record){true, t->step, r->metrics};
    save_if_best(t, loop);
}

/* A non-finite loss or gradient norm (the same on every rank): with
 * train.on_nonfinite = stop the run ends at once, keeping the checkpoints
 * it has (exit EXIT_DIVERGED); with skip the update was skipped and the run
 * goes on. Returns whether to stop. */
static bool stop_on_nonfinite(trainer *t, train_loop *loop, const train_step_result *r) {
    if (!r->nonfinite) return false;
    if (t->cfg.on_nonfinite == NONFINITE_SKIP) {
        log_rank0("step %lld: non-finite loss %g or grad_norm %g: update skipped (%lld skipped so far)\n", t->step,
                  r->loss, r->grad_norm, t->skipped_steps);
        return false;
    }
    /* what it could be caused by, said only where it is known: the first step
     * of a run from step 0 has made no update yet, so its NaN is no divergence */
    if (dist_rank() == 0 && t->step == 1)
        fprintf(stderr,
                "momfmm: step 1 is not finite (loss %g, grad_norm %g) before any update, so no training "
                "diverged: the %s of the initial weights (the config's init, or the --init checkpoint's) on the "
                "first batch overflows in float32; stopping without a checkpoint\n",
                r->loss, r->grad_norm, isfinite(r->loss) ? "backward" : "forward");
    else if (dist_rank() == 0)
        fprintf(stderr,
                "momfmm: training diverged at step %lld (loss %g, grad_norm %g): stopping without a checkpoint of "
                "this step; the checkpoints in %s are kept (train.on_nonfinite = skip skips such steps instead)\n",
                t->step, r->loss, r->grad_norm, t->cfg.out_dir);
    loop->diverged = true;
    return true;
}

static bool train_one_step(trainer *t, train_loop *loop, stop_writer *w) {
    const config *cfg = &t->cfg;
    train_step_result r;
    status err;
    dist_watch_step(t->step + 1);
    if (trainer_step(t, &r, &err) != 0) cmd_fail(err.code, "%s", err.message);
    if (r.abandoned) {
        /* a stop signal during the step: every rank dropped it, and the
         * checkpoint is the last finished step's (written already by the
         * stop writer, or now) */
        log_rank0("step %lld abandoned on a stop signal: its update is not applied\n", t->step + 1);
        write_stop_checkpoint(w, agreed_stop_cause());
        return false;
    }
    loop->interval_tokens += (double)cfg->batch_size * cfg->seq_len;
    bool logged = false;
    if (t->step % cfg->log_interval == 0 || t->step == cfg->steps) {
        double now = sys_seconds();
        log_train(t, &r, loop->interval_tokens / (now - loop->interval_start), now - loop->start,
                  t->step - loop->first_step);
        loop->interval_start = now;
        loop->interval_tokens = 0;
        logged = true;
    }
    if (cfg->eval_interval > 0 && !r.nonfinite && (t->step % cfg->eval_interval == 0 || t->step == cfg->steps)) {
        log_eval(t, loop);
        logged = true;
    }
    if (logged) publish_metrics(t, &loop->live);
    if (stop_on_nonfinite(t, loop, &r)) return false;
    if (cfg->check_interval > 0 && t->step % cfg->check_interval == 0) cmd_check_consistency(&t->model, t->step);
    int cause = agreed_stop_cause();
    if (cause) {
        write_stop_checkpoint(w, cause);
        return false;
    }
    bool periodic = cfg->ckpt_interval > 0 && t->step % cfg->ckpt_interval == 0;
    if (periodic || t->step == cfg->steps) {
        /* rank 0 alone knows when it wrote alone: every rank stops together */
        bool saved = !dist_any(!save_checkpoint(t, loop, 0));
        if (t->step == cfg->steps) loop->final_saved = saved;
        loop->save_stopped = !saved && cfg->on_save_failure == SAVE_FAILURE_STOP;
    }
    return !loop->save_stopped;
}

/* docs/cli.md §5: the run's summary on rank 0. */
static void print_summary(const trainer *t, const train_loop *loop, double seconds) {
    if (dist_rank() != 0) return;
    long long steps = t->step - loop->first_step;
    double tokens = (double)steps * t->cfg.batch_size * t->cfg.seq_len;
    printf("summary: step %lld of %lld (%lld this run) | %.1f s | %.0f tok/s\n", t->step, t->cfg.steps, steps, seconds,
           seconds > 0 ? tokens / seconds : 0.0);
    const eval_record *shown[] = {&loop->last_eval, &loop->best_eval};
    const char *names[] = {"final eval", "best eval"};
    for (int i = 0; i < 2; i++) {
        char text[256];
        if (!shown[i]->known) continue;
        metric_values_format(&shown[i]->metrics, t->cfg.task, 4, text, sizeof text);
        printf("summary: %s (step %lld) | %s\n", names[i], shown[i]->step, text);
    }
    char best[STORE_PATH_MAX] = "none (train.keep_best = false)";
    if (t->cfg.keep_best) store_best_path(t->cfg.out_dir, best, sizeof best);
    printf("summary: checkpoints | latest %s | best %s\n", loop->latest[0] ? loop->latest : "none written", best);
    log_flush();
}

/* Every rank must train the same config (an MPMD launch can give each its
 * own file or --set): the ranks compare a checksum of the resolved config
 * before anything is allocated by it, and rank 0 names the first key that
 * differs from the first rank that differs (docs/cli.md §5, exit 2). */
static void check_ranks_agree(const config *cfg) {
    char *ini = config_to_ini(cfg);
    int other = dist_first_differing_rank(dist_checksum(ini, strlen(ini)));
    if (other < 0) {
        free(ini);
        return;
    }
    unsigned long long len = strlen(ini) + 1;
    dist_broadcast_bytes_from(other, &len, sizeof len);
    char *theirs = sys_calloc((size_t)len + 1, 1);
    if (dist_rank() == other) memcpy(theirs, ini, (size_t)len);
    dist_broadcast_bytes_from(other, theirs, (size_t)len);
    config c;
    status st;
    config_defaults(&c);
    char diff[512] = "a key";
    int n = 0;
    if (dist_rank() == 0 && config_load_string(&c, theirs, "config_ini", &st) == 0)
        n = config_first_difference(cfg, &c, diff, sizeof diff);
    free(theirs);
    free(ini);
    char more[64] = "";
    if (n > 1) snprintf(more, sizeof more, " (and %d more key%s)", n - 1, n > 2 ? "s" : "");
    cmd_fail_all(EXIT_USAGE,
                 "the ranks' configs differ (rank 0 vs rank %d): %s%s; every rank must train the same config (one "
                 "file, the same --set)",
                 other, diff, more);
}

/* --init before the run directory is touched: a source that does not load
 * or does not fit the config creates nothing, and --overwrite never removes
 * the checkpoint the weights are to come from (docs/cli.md §5). */
static void check_init_source(const config *cfg, const char *init, bool overwrite) {
    if (overwrite && store_overwrite_removes(cfg->out_dir, init))
        cmd_fail_all(EXIT_USAGE,
                     "train --init %s --overwrite: the checkpoint lies in train.out_dir = %s, which --overwrite "
                     "would empty first; copy it elsewhere, or choose another train.out_dir",
                     init, cfg->out_dir);
    checkpoint_info info;
    status err;
    cmd_fail_if_any(trainer_check_init_source(cfg, init, &info, &err), &err); /* each rank read the file itself */
}

int command_train(const char *config_path, int n_overrides, char *const *overrides, const char *resume,
                  const char *init, bool overwrite) {
    if (resume && init)
        cmd_fail_all(EXIT_USAGE,
                     "train: --init starts a new run at step 0 from a checkpoint's weights, --resume continues "
                     "a run: give one of them");
    config cfg = cmd_load_config(config_path, n_overrides, overrides);
    check_ranks_agree(&cfg);
    cmd_use_precision(&cfg);
    cmd_check_launch();
    signals_catch_stops();
    if (init) check_init_source(&cfg, init, overwrite);
    /* rank 0 opens the run directory and every rank learns its verdict, so
     * that a refused start (a lock, an earlier run's checkpoints) ends every
     * rank with the code and no MPI_Abort */
    status err = {0};
    if (dist_rank() == 0) store_open_run(cfg.out_dir, resume != NULL, overwrite, &err);
    dist_broadcast_bytes(&err, sizeof err);
    if (err.code != 0) cmd_fail_all(err.code, "%s", err.message);
    cmd_print_banner(); /* the start-up line first, then what the trainer reports (memory) */
    cmd_note_bf16_speed(&cfg);
    trainer t;
    create_trainer(&t, &cfg, resume || init ? TRAINER_FROM_CHECKPOINT : TRAINER_FRESH);
    if (resume && trainer_resume(&t, resume, &err) != 0) cmd_fail_all(err.code, "%s", err.message);
    if (init && trainer_init_from(&t, init, &err) != 0) cmd_fail_all(err.code, "%s", err.message);
    train_loop loop = {.first_step = t.step, .live = open_live_metrics(&t), .final_saved = true};
    if (cfg.keep_best && t.step > 0 && dist_rank() == 0) read_best_so_far(&t, &loop.best_eval);
    log_rank0("model: %zu parameters | global batch %d x %d | %lld steps\n", t.model.n_params, cfg.batch_size,
              cfg.seq_len, cfg.steps);
    log_rank0("precision %s\n", cmd_precision_description());
    /* docs/cli.md §5: where a fine-tuning run starts from, before it moves */
    if (t.step == 0 && (cfg.eval_at_start || (init && cfg.eval_interval > 0))) {
        log_eval(&t, &loop);
        publish_metrics(&t, &loop.live);
    }
    loop.start = loop.interval_start = sys_seconds();
    stop_writer writer;
    stop_writer_start(&writer, &t, &loop);
    bool running = true;
    while (t.step < cfg.steps && running) {
        long long before = t.step;
        running = train_one_step(&t, &loop, &writer);
        /* oneDNN has now picked the implementation of every product shape */
        if (t.step != before && t.step == loop.first_step + 1 && gemm_default() &&
            gemm_ctx_engine(gemm_default()) != GEMM_OPENBLAS)
            log_rank0("precision %s (after the first step)\n", cmd_precision_description());
    }
    if (t.step == loop.first_step && t.step >= cfg.steps)
        log_rank0("nothing to do: already at step %lld of %lld\n", t.step, cfg.steps);
    if (!loop.last_eval.known && t.eval_log.n_rows > 0) {
        loop.last_eval.known = true;
        loop.last_eval.step = (long long)t.eval_log.values[(t.eval_log.n_rows - 1) * t.eval_log.row_width];
        metric_values_from_row(&t.eval_log, t.eval_log.n_rows - 1, &loop.last_eval.metrics);
    }
    stop_writer_finish(&writer);
    if (loop.save_stopped) loop.final_saved = false; /* said where it failed */
    if (!cfg.keep_best) keep_lowest(&loop.best_eval, &t.eval_log);
    print_summary(&t, &loop, sys_seconds() - loop.start);
    live_metrics_close(loop.live);
    trainer_free(&t);
    /* a scheduler reads exit 0 as "done": not so when the last state is lost
     * (docs/cli.md §5: a checkpoint that cannot be written is exit 3) */
    if (loop.diverged) return EXIT_DIVERGED;
    if (!loop.final_saved && !loop.save_stopped && dist_rank() == 0)
        fprintf(stderr, "momfmm: the final checkpoint was not written: exiting with status 3\n");
    return loop.final_saved ? 0 : EXIT_BAD_FILE;
}
