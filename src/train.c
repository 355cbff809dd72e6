/* Training loop (SPEC 1.4, 2, 3, 5): data-parallel steps, logging,
 * evaluation, checkpoints; and the `bench` command that times the same step. */
#include "momfmm/train.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "momfmm/checkpoint.h"
#include "momfmm/cmd_common.h"
#include "momfmm/common.h"
#include "momfmm/live_metrics.h"
#include "momfmm/optimizer.h"
#include "momfmm/readouts.h"

/* MemAvailable of /proc/meminfo in bytes, or 0 when unknown. */
static double available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024.0;
}

/* Refuses up front (exit 2) a run whose buffers cannot fit in this node's
 * memory, rather than being killed mid-allocation. */
static void check_memory(const trainer *t) {
    const model *m = &t->model;
    double need = (double)model_activation_bytes(m, t->batch.B, t->batch.T) + 4.0 * sizeof(float) * m->n_params;
    MPI_Comm node;
    int local_ranks = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local_ranks);
    MPI_Comm_free(&node);
    double available = available_memory();
    /* shards and nodes differ: decide on the fullest node, everywhere alike */
    double fill = available > 0 ? need * local_ranks / available : 0, worst_fill = fill;
    MPI_Allreduce(&fill, &worst_fill, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    log_rank0("memory: %.2f GB per rank (activations for %d x %d, parameters, gradients, moments)\n", need / 1e9,
              t->batch.B, t->batch.T);
    if (worst_fill > 1.0)
        fail_all(EXIT_USAGE, "this run needs %.0f%% of the available memory on the fullest node (here %.1f GB per rank "
                 "x %d ranks, %.1f GB available): reduce train.batch_size, data.seq_len or the model "
                 "(attention.kind = softmax stores T x T per head)",
                 100 * worst_fill, need / 1e9, local_ranks, available / 1e9);
}

void trainer_create(trainer *t, const config *cfg) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    int size = process_count();
    if (size > cfg->batch_size)
        fail_all(EXIT_USAGE, "train.batch_size = %d is smaller than the number of ranks (%d): every rank needs a sample",
                 cfg->batch_size, size);
    model_create(&t->model, cfg);
    model_init_parameters(&t->model);
    /* Every rank initialises from the same seed; the broadcast makes the
     * identical start explicit rather than assumed. */
    dist_broadcast_floats(t->model.params, t->model.n_params);
    t->data = data_open(cfg);
    int count;
    shard_range(cfg->batch_size, process_rank(), size, &t->shard_first, &count);
    batch_alloc(&t->batch, count, cfg->seq_len);
    check_memory(t);
    t->reducer = grad_reducer_create(&t->model, cfg->bucket_mb, cfg->overlap);
    metric_tables_standard(&t->train_log, &t->eval_log, cfg->n_layers, cfg->n_heads);
    t->reduce_scratch = xcalloc(2 + t->model.n_buffer, sizeof(double));
}

void trainer_free(trainer *t) {
    live_metrics_close(t->live);
    grad_reducer_free(t->reducer);
    batch_free(&t->batch);
    data_close(t->data);
    metric_table_free(&t->train_log);
    metric_table_free(&t->eval_log);
    free(t->reduce_scratch);
    model_free(&t->model);
}

/* One reduction carries the loss sum, the target count and the momentum
 * buffer sums (SPEC 1.2: buffers are the global-batch mean). */
static double reduce_forward_results(trainer *t, double *global_count) {
    model *m = &t->model;
    long long count;
    double *r = t->reduce_scratch;
    r[0] = model_loss_sum(m, t->batch.targets, t->batch.B, t->batch.T, &count);
    r[1] = (double)count;
    bool buffers = m->momentum;
    for (size_t i = 0; buffers && i < m->n_buffer; i++) r[2 + i] = m->buffer_sums[i];
    dist_sum_doubles(r, 2 + (buffers ? (int)m->n_buffer : 0));
    for (size_t i = 0; buffers && i < m->n_buffer; i++) m->buffers[i] = (float)(r[2 + i] / t->cfg.batch_size);
    *global_count = r[1];
    return r[1] > 0 ? r[0] / r[1] : 0.0;
}

step_result trainer_step(trainer *t) {
    model *m = &t->model;
    batch *b = &t->batch;
    step_result res = {0};
    long long step = t->step + 1;
    data_fill(t->data, b, SPLIT_TRAIN, step, t->shard_first);
    model_forward(m, b->inputs, b->targets, b->labels, b->B, b->T, m->momentum);
    double global_count;
    res.loss = reduce_forward_results(t, &global_count);
    model_zero_grads(m);
    float scale = global_count > 0 ? (float)(1.0 / global_count) : 0.0f;
    backward_hooks hooks = grad_reducer_hooks(t->reducer);
    model_backward(m, b->inputs, b->targets, b->labels, b->B, b->T, scale, &hooks);
    res.allreduce_wait_s = grad_reducer_finish(t->reducer);
    res.grad_norm = grad_global_norm(m->grads, m->n_params);
    clip_gradients(m->grads, m->n_params, res.grad_norm, t->cfg.grad_clip);
    res.lr = learning_rate(&t->cfg, step);
    adamw_settings s = {res.lr, t->cfg.beta1, t->cfg.beta2, t->cfg.adam_eps, t->cfg.weight_decay};
    adamw_step_model(m, step, &s);
    t->step = step;
    t->tokens_seen += (long long)t->cfg.batch_size * t->cfg.seq_len;
    return res;
}

void trainer_evaluate(trainer *t, eval_metrics *out, double *gain_R) {
    model *m = &t->model;
    batch *b = &t->batch;
    metric_sums sums;
    memset(&sums, 0, sizeof sums);
    /* gain sums per layer, then the row count: one reduction with the rest */
    double *gains = xcalloc((size_t)m->L + 1, sizeof(double));
    for (int i = 0; i < t->cfg.eval_batches; i++) {
        data_fill(t->data, b, SPLIT_EVAL, i, t->shard_first);
        model_forward(m, b->inputs, b->targets, b->labels, b->B, b->T, false);
        metrics_accumulate(&sums, b, m->acts.losses, m->acts.predictions, t->cfg.head == HEAD_CLS, m->V);
        if (gain_R) {
            block_gains(m, b->B, b->T, (uint64_t)t->cfg.seed + (uint64_t)i, t->shard_first, gains);
            gains[m->L] += b->B;
        }
    }
    dist_sum_doubles((double *)&sums, (int)METRIC_SUMS_DOUBLES);
    metrics_finish(&sums, out);
    if (gain_R) {
        dist_sum_doubles(gains, m->L + 1);
        for (int l = 0; l < m->L; l++) gain_R[l] = gains[l] / gains[m->L];
    }
    free(gains);
}

void trainer_log_eval(trainer *t, eval_metrics *e) {
    model *m = &t->model;
    double *row = xcalloc((size_t)t->eval_log.row_width, sizeof(double));
    double *gain_R = row + 7 + OCCURRENCE_BINS, *gamma = gain_R + m->L;
    trainer_evaluate(t, e, gain_R);
    momentum_gammas(m, gamma);
    double head[7] = {(double)t->step, e->loss, e->L_new, e->L_rep, e->delta_12, e->acc, e->exact_match};
    memcpy(row, head, sizeof head);
    memcpy(row + 7, e->loss_by_k, sizeof e->loss_by_k);
    metric_table_append(&t->eval_log, row);
    free(row);
}

/* ---- train command ------------------------------------------------------ */

static volatile sig_atomic_t stop_requested = 0;
static void request_stop(int signo) { stop_requested = signo; }

/* SPEC 5: SIGTERM, SIGINT, SIGUSR1 finish the step, checkpoint, exit 0. */
static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = request_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* main() blocked these from start-up on; one that came meanwhile is
     * delivered now, as a stop request */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

/* Every rank stops at the same step: a signal seen by any rank counts. */
static bool ranks_agree_to_stop(void) {
    int mine = stop_requested != 0, any = mine;
    if (process_count() > 1) MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any != 0;
}

static void make_directory(const char *path) {
    char buf[CONFIG_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0775);
            *p = '/';
        }
    if (mkdir(buf, 0775) != 0 && errno != EEXIST) fail(EXIT_USAGE, "train.out_dir = %s: cannot create: %s", path, strerror(errno));
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Names ckpt_<8 digits>.h5 in dir, sorted oldest first. Caller frees. */
static int list_checkpoints(const char *dir, char ***names_out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 16;
    char **names = xcalloc((size_t)cap, sizeof(char *));
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        unsigned long long step;
        char tail[8];
        if (sscanf(entry->d_name, "ckpt_%8llu%4s", &step, tail) != 2 || strcmp(tail, ".h5") != 0 ||
            strlen(entry->d_name) != 16)
            continue;
        if (n == cap) names = realloc(names, sizeof(char *) * (size_t)(cap *= 2));
        names[n++] = strdup(entry->d_name);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof(char *), compare_names);
    *names_out = names;
    return n;
}

static long long checkpoint_step(const char *name) { return atoll(name + strlen("ckpt_")); }

/* Keeps the newest `keep` checkpoints at or below this run's step. Files
 * from later steps (another timeline: a resume from an older checkpoint, or
 * a file that did not load) are neither counted nor deleted. */
static void prune_checkpoints(const char *dir, int keep, long long step) {
    char **names;
    int n = list_checkpoints(dir, &names), eligible = 0;
    for (int i = 0; i < n; i++) eligible += checkpoint_step(names[i]) <= step;
    for (int i = 0, seen = 0; i < n; i++) {
        if (checkpoint_step(names[i]) <= step && seen++ < eligible - keep) {
            char path[CONFIG_PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            remove(path);
        }
        free(names[i]);
    }
    free(names);
}

/* Temporary files of writes that a crash interrupted (never a checkpoint's
 * name) are removed when a run starts in the directory. */
static void remove_stale_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        unsigned long long step;
        int used = 0;
        if (sscanf(entry->d_name, "ckpt_%8llu.h5.tmp.%*d%n", &step, &used) == 1 && used > 0 &&
            entry->d_name[used] == '\0') {
            char path[CONFIG_PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
            if (remove(path) == 0) log_rank0("removed %s, left by an interrupted write\n", path);
        }
    }
    if (d) closedir(d);
}

/* Returns false when rank 0 could not write the checkpoint. */
static bool save_checkpoint(trainer *t) {
    if (process_rank() != 0) return true;
    char path[CONFIG_PATH_MAX + 32], err[CONFIG_PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/ckpt_%08lld.h5", t->cfg.out_dir, t->step);
    checkpoint_info info = {t->step, t->tokens_seen, process_count()};
    double start = wall_seconds();
    if (checkpoint_write(path, &t->model, &info, &t->train_log, &t->eval_log, err, sizeof err) != 0) {
        fprintf(stderr, "momfmm: checkpoint at step %lld not written: %s\n", t->step, err);
        return false;
    }
    struct stat st;
    double seconds = wall_seconds() - start, mb = stat(path, &st) == 0 ? st.st_size / 1e6 : 0;
    printf("checkpoint %s | %.1f MB in %.2f s (%.0f MB/s)\n", path, mb, seconds, mb / (seconds > 0 ? seconds : 1e-9));
    fflush(stdout);
    prune_checkpoints(t->cfg.out_dir, t->cfg.keep, t->step);
    return true;
}

static void log_train(trainer *t, const step_result *r, double tokens_per_s, double elapsed, long long steps_done) {
    double row[5] = {(double)t->step, r->loss, r->lr, r->grad_norm, tokens_per_s};
    metric_table_append(&t->train_log, row);
    double eta = steps_done > 0 ? elapsed / steps_done * (double)(t->cfg.steps - t->step) : 0;
    log_rank0("step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | ETA %dm%02ds\n", t->step,
              t->cfg.steps, r->loss, r->lr, r->grad_norm, tokens_per_s, (int)(eta / 60), (int)fmod(eta, 60));
}

/* Rank 0 mirrors the metric tables into metrics.h5 as they grow; a write
 * failure (e.g. a full disk) is reported once and the mirror stops, while
 * training and checkpoints go on. */
static void publish_metrics(trainer *t) {
    char err[256];
    if (t->live && live_metrics_append(t->live, &t->train_log, &t->eval_log, err, sizeof err) != 0) {
        fprintf(stderr, "momfmm: warning: %s; live metrics stop here (checkpoints keep the history)\n", err);
        live_metrics_abandon(t->live);
        t->live = NULL;
    }
}

static void log_eval(trainer *t) {
    eval_metrics e;
    trainer_log_eval(t, &e);
    const double *gain_R = t->eval_log.values + (t->eval_log.n_rows - 1) * t->eval_log.row_width + 7 + OCCURRENCE_BINS;
    log_rank0("eval step %lld | loss %.4f | L_new %.4f | L_rep %.4f | delta_12 %.4f | acc %.4f | exact %.4f | gain_R",
              t->step, e.loss, e.L_new, e.L_rep, e.delta_12, e.acc, e.exact_match);
    for (int l = 0; l < t->model.L; l++) log_rank0(" %.3f", gain_R[l]);
    log_rank0("\n");
}

/* Fresh parameters, moments, buffers and history: the state of step 0. */
static void trainer_reset(trainer *t) {
    model *m = &t->model;
    model_init_parameters(m);
    memset(m->adam_m, 0, sizeof(float) * 2 * m->n_params);
    t->train_log.n_rows = t->eval_log.n_rows = 0;
    t->step = t->tokens_seen = 0;
}

/* Loads `path` into the trainer. A file that does not load returns -1 with
 * the reason (the trainer is then reset); a config that changes the model
 * or the data exits 3 listing every differing key (SPEC 4, resume). */
static int try_resume(trainer *t, const char *path, char *err, size_t err_len) {
    config saved;
    checkpoint_info info;
    if (checkpoint_try_read_config(path, &saved, &info, err, err_len) != 0) return -1;
    char diff[4096];
    if (config_compare_keys(&saved, &t->cfg, true, diff, sizeof diff) > 0)
        fail_all(EXIT_BAD_FILE, "%s: the config differs in keys that change the model or the data (checkpoint vs now): %s",
                 path, diff);
    if (checkpoint_try_read_state(path, &t->model, true, &t->train_log, &t->eval_log, err, err_len) != 0) {
        trainer_reset(t);
        return -1;
    }
    if (config_compare_keys(&saved, &t->cfg, false, diff, sizeof diff) > 0)
        log_rank0("warning: schedule keys changed since the checkpoint (checkpoint vs now): %s\n", diff);
    t->step = info.step;
    t->tokens_seen = info.tokens_seen;
    if (info.world_size != process_count())
        log_rank0("note: checkpoint written by %d ranks, resuming on %d (same math up to float summation order)\n",
                  info.world_size, process_count());
    log_rank0("resumed from %s at step %lld\n", path, t->step);
    return 0;
}

/* --resume PATH must load; --resume auto takes the newest checkpoint in
 * train.out_dir that loads, reporting (never deleting) those that do not. */
static void resume_training(trainer *t, const char *how) {
    char err[CONFIG_PATH_MAX + 512];
    if (strcmp(how, "auto") != 0) {
        if (try_resume(t, how, err, sizeof err) != 0) fail_all(EXIT_BAD_FILE, "%s", err);
    } else {
        char **names;
        int n = list_checkpoints(t->cfg.out_dir, &names);
        bool resumed = false;
        for (int i = n - 1; i >= 0 && !resumed; i--) {
            char path[CONFIG_PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/%s", t->cfg.out_dir, names[i]);
            resumed = try_resume(t, path, err, sizeof err) == 0;
            if (!resumed) log_rank0("warning: skipping checkpoint that does not load: %s\n", err);
        }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        if (!resumed) log_rank0("no checkpoint to resume in %s: starting at step 0\n", t->cfg.out_dir);
    }
    /* every rank read the file itself: make sure they agree */
    dist_check_consistency(&t->model, t->step);
}

static config load_config(const char *path, int n_overrides, char **overrides) {
    config c;
    config_defaults(&c);
    config_load_file(&c, path);
    for (int i = 0; i < n_overrides; i++) config_apply_override(&c, overrides[i]);
    config_validate(&c, path, EXIT_USAGE);
    return c;
}

int command_train(const char *config_path, int n_overrides, char **overrides, const char *resume) {
    config cfg = load_config(config_path, n_overrides, overrides);
    dist_check_launch();
    install_stop_handlers();
    if (process_rank() == 0) {
        make_directory(cfg.out_dir);
        remove_stale_temporaries(cfg.out_dir);
    }
    trainer t;
    trainer_create(&t, &cfg);
    dist_describe();
    if (resume) resume_training(&t, resume);
    if (process_rank() == 0) {
        char err[CONFIG_PATH_MAX + 64];
        char *ini = config_to_ini(&cfg);
        t.live = live_metrics_open(cfg.out_dir, ini, &t.train_log, &t.eval_log, err, sizeof err);
        free(ini);
        if (!t.live) fprintf(stderr, "momfmm: warning: %s; training goes on without it\n", err);
    }
    log_rank0("model: %zu parameters | global batch %d x %d | %lld steps\n", t.model.n_params, cfg.batch_size,
              cfg.seq_len, cfg.steps);
    long long first_step = t.step;
    double start = wall_seconds(), interval_start = start;
    long long interval_tokens = 0;
    bool stopped = false, final_saved = true;
    while (t.step < cfg.steps && !stopped) {
        step_result r = trainer_step(&t);
        interval_tokens += (long long)cfg.batch_size * cfg.seq_len;
        bool logged = false;
        if (t.step % cfg.log_interval == 0 || t.step == cfg.steps) {
            double now = wall_seconds();
            log_train(&t, &r, interval_tokens / (now - interval_start), now - start, t.step - first_step);
            interval_start = now;
            interval_tokens = 0;
            logged = true;
        }
        if (cfg.eval_interval > 0 && (t.step % cfg.eval_interval == 0 || t.step == cfg.steps)) {
            log_eval(&t);
            logged = true;
        }
        if (logged) publish_metrics(&t);
        if (cfg.check_interval > 0 && t.step % cfg.check_interval == 0) dist_check_consistency(&t.model, t.step);
        stopped = ranks_agree_to_stop();
        if (stopped) log_rank0("stop requested: writing a checkpoint at step %lld\n", t.step);
        bool periodic = cfg.ckpt_interval > 0 && t.step % cfg.ckpt_interval == 0;
        if (periodic || stopped || t.step == cfg.steps) {
            bool saved = save_checkpoint(&t);
            if (stopped || t.step == cfg.steps) final_saved = saved;
        }
    }
    if (t.step == first_step && t.step >= cfg.steps) log_rank0("nothing to do: already at step %lld of %lld\n", t.step, cfg.steps);
    trainer_free(&t);
    /* a scheduler reads exit 0 as "done": not so when the last state is lost */
    if (!final_saved) fprintf(stderr, "momfmm: the final checkpoint was not written: exiting with status 1\n");
    return final_saved ? 0 : 1;
}

/* ---- bench command ------------------------------------------------------ */

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times `steps` training steps after two warm-up steps and reports the
 * median step (robust on a shared machine), as tools/bench_torch.py does. */
int command_bench(const char *config_path, int n_overrides, char **overrides, int steps) {
    config cfg = load_config(config_path, n_overrides, overrides);
    cfg.steps = steps + 2;
    trainer t;
    trainer_create(&t, &cfg);
    dist_describe();
    for (int i = 0; i < 2; i++) trainer_step(&t); /* warm-up: allocations, caches */
    double wait = 0, *times = xcalloc((size_t)steps, sizeof(double));
    for (int i = 0; i < steps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double start = wall_seconds();
        wait += trainer_step(&t).allreduce_wait_s;
        MPI_Barrier(MPI_COMM_WORLD);
        times[i] = wall_seconds() - start;
    }
    qsort(times, (size_t)steps, sizeof(double), compare_doubles);
    double median = times[steps / 2];
    double tokens = (double)cfg.batch_size * cfg.seq_len;
    double flops = model_flops_per_token(&t.model, cfg.seq_len) * tokens;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double rss_mb = usage.ru_maxrss / 1024.0, max_rss_mb = rss_mb;
    MPI_Allreduce(&rss_mb, &max_rss_mb, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    log_rank0("bench: %d ranks x %d threads | batch %d x %d | %s attention | %d steps | step min %.1f ms, max %.1f ms\n",
              process_count(), dist_threads(), cfg.batch_size, cfg.seq_len,
              cfg.attention == ATTENTION_FMM ? "fmm" : "softmax", steps, 1e3 * times[0], 1e3 * times[steps - 1]);
    log_rank0("bench tokens_per_s=%.1f ms_per_step=%.3f gflops=%.3f allreduce_wait_ms=%.3f peak_rss_mb=%.1f\n",
              tokens / median, 1e3 * median, flops / median / 1e9, 1e3 * wait / steps, max_rss_mb);
    free(times);
    trainer_free(&t);
    return 0;
}
