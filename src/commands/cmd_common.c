/* Exiting wrappers of the command layer around the core modules' status
 * returns (docs/design.md §8.7: exit codes; §8.1: only commands exit). */
#include "commands/cmd_common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/blas_core.h"
#include "base/build_info.h"
#include "base/cpu.h"
#include "base/float_env.h"
#include "base/log.h"
#include "base/sys.h"
#include "data/tokenizer.h"
#include "kernels/gemm.h"
#include "parallel/arrivals.h"
#include "parallel/context.h"
#include "parallel/dist.h"
#include "store/checkpoint.h"
#include "store/store.h"

static void print_message(const char *fmt, va_list args) {
    fputs("momfmm: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    fflush(stderr);
}

_Noreturn void cmd_fail(int exit_code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    print_message(fmt, args);
    va_end(args);
    /* A lone failing rank would leave the others waiting in a collective:
     * take the whole job down with the same code. */
    if (dist_size() > 1) dist_abort(exit_code);
    context_free();
    dist_finalize();
    exit(exit_code);
}

_Noreturn void cmd_fail_all(int exit_code, const char *fmt, ...) {
    if (dist_rank() == 0) {
        va_list args;
        va_start(args, fmt);
        print_message(fmt, args);
        va_end(args);
    }
    context_free();
    dist_finalize();
    exit(exit_code);
}

void cmd_fail_if_any(int rc, status *st) {
    if (dist_agree_status(rc, st) != 0) cmd_fail_all(st->code, "%s", st->message);
}

/* Ends with st->code and its message: through cmd_fail_all when every rank
 * reached the same status, else through cmd_fail (this rank alone failed). */
static _Noreturn void cmd_exit_on_status(const status *st, bool every_rank_alike) {
    if (every_rank_alike) cmd_fail_all(st->code, "%s", st->message);
    cmd_fail(st->code, "%s", st->message);
}

static bool stdout_was_closed;

void cmd_guard_standard_streams(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int null = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (null >= 0 && null != fd) {
            dup2(null, fd);
            close(null);
        }
        if (fd == 1) stdout_was_closed = true;
    }
}

int cmd_finish_output(int rc) {
    int cause = log_output_error();
    bool failed = ferror(stdout) != 0;
    if (fflush(stdout) != 0) failed = true, cause = cause ? cause : errno;
    if (fclose(stdout) != 0) failed = true, cause = cause ? cause : errno;
    if (rc != 0 || log_output_closed()) return rc;
    if (stdout_was_closed) {
        fprintf(stderr, "momfmm: standard output is closed: the command's output is lost\n");
        return EXIT_BAD_FILE;
    }
    if (!failed) return rc;
    fprintf(stderr, "momfmm: standard output: write failed (%s): the command's output is lost\n",
            cause ? strerror(cause) : "an I/O error");
    return EXIT_BAD_FILE;
}

/* data.tokenizer_checksum: what the named model is now (a value given is
 * replaced), so that every later reader checks it reads the same model. */
static void cmd_record_tokenizer(config *c) {
    tokenizer t = {0};
    status st;
    /* every rank agrees, with a model or without: a node-local one may fail on one rank alone */
    cmd_fail_if_any(c->tokenizer[0] ? tokenizer_open(&t, c->tokenizer, &st) : 0, &st);
    c->tokenizer_checksum[0] = '\0';
    if (!c->tokenizer[0]) return;
    tokenizer_checksum_text(t.checksum, c->tokenizer_checksum);
    tokenizer_free(&t);
}

/* The watchdog's hook (docs/design.md §8.11), on its own thread while the
 * main thread waits inside MPI: one line and _exit, because exit()'s
 * handlers and MPI_Abort could wait for the very peer that is gone; mpirun
 * sees a rank end without MPI_Finalize and ends the job. */
static void collective_timed_out(const char *message) {
    dprintf(2, "momfmm: %s\n", message);
    _exit(EXIT_DIST_TIMEOUT);
}

/* Every rank reads its config (one file, or each its own under an MPMD
 * launch, which train then compares) and agrees on the outcome, so that a
 * file that fails on one rank alone still ends every rank in one line;
 * from here on, its collectives are watched (dist.timeout). */
config cmd_load_config(const char *path, int n_overrides, char *const *overrides) {
    config c;
    status st;
    config_defaults(&c);
    int rc = config_load_file(&c, path, &st);
    for (int i = 0; rc == 0 && i < n_overrides; i++) rc = config_apply_override(&c, overrides[i], &st);
    /* the checks of keys against each other name where the values came
     * from: a clash between the file and a --set is neither's alone */
    char origin[PATH_MAX + 16]; /* the file opened: its name is within PATH_MAX */
    snprintf(origin, sizeof origin, "%s%s", path, n_overrides > 0 ? " with --set" : "");
    if (rc == 0) rc = config_check(&c, origin, &st);
    if (rc == 0) rc = config_resolve_data_path(&c, false, &st);
    cmd_fail_if_any(rc, &st);
    cmd_record_tokenizer(&c);
    if (dist_watch_start(c.timeout, collective_timed_out, &st) != 0) cmd_fail(st.code, "%s", st.message);
    /* the D x C grid (docs/design.md §8.12): every rank refuses the same np alike */
    if (context_init(c.context, (context_scan_method)c.context_scan, &st) != 0) cmd_exit_on_status(&st, true);
    return c;
}

/* MPI only for a process that a launcher started: alone, every command is a
 * world of one and starts no MPI runtime (no singleton daemon, session
 * directory or TMPDIR use), so that it works under env -i, an odd TMPDIR or
 * a tight ulimit -n, and many at once beside a run (docs/cli.md §5). */
/* blas_core_bound_threads' verdict, said once the rank is known (cmd_dist_init). */
static status threads_verdict;
static char threads_note[160];

void cmd_bound_threads(void) { blas_core_bound_threads(threads_note, sizeof threads_note, &threads_verdict); }

void cmd_dist_init(int *argc, char ***argv) {
    status st;
    if (dist_launched() && dist_init(argc, argv, &st) != 0) cmd_exit_on_status(&st, true);
    if (threads_verdict.code != 0) cmd_exit_on_status(&threads_verdict, true);
    if (threads_note[0] && dist_rank() == 0) fprintf(stderr, "momfmm: warning: %s\n", threads_note);
}

/* A world of one: fail and cmd_fail_all are the same here. */
void cmd_check_launch(void) {
    status st;
    if (dist_check_launch(&st) != 0) cmd_exit_on_status(&st, false);
}

/* Every rank gathered every checksum and holds the same status, so all of
 * them finish together with exit 1 (docs/design.md §8.7). */
void cmd_check_consistency(const model *m, long long step) {
    status st;
    if (dist_check_consistency(m->params, m->n_params * sizeof(float), step, &st) != 0) cmd_exit_on_status(&st, true);
}

static gemm_engine engine_of(const config *c) {
    if (c->precision == PRECISION_BF16) return GEMM_ONEDNN_BF16;
    switch (c->gemm) {
    case GEMM_IMPL_AUTO: return GEMM_AUTO;
    case GEMM_IMPL_ONEDNN: return GEMM_ONEDNN_F32;
    case GEMM_IMPL_AVX512: return GEMM_AVX512_F32;
    default: return GEMM_OPENBLAS;
    }
}

void cmd_use_precision(const config *c) {
    gemm_engine engine = engine_of(c);
    const char *why = gemm_unavailable_reason(engine);
    if (why)
        cmd_fail_all(EXIT_USAGE, "%s cannot run here: %s",
                     c->precision == PRECISION_BF16 ? "train.precision = bf16"
                     : c->gemm == GEMM_IMPL_AVX512  ? "train.gemm = avx512"
                                                    : "train.gemm = onednn",
                     why);
    /* this rank's limits (ulimit -v) may be its own: it alone fails */
    status st;
    if (blas_core_reserve_buffers(blas_core_threads(), &st) != 0) cmd_exit_on_status(&st, false);
    gemm_ctx *previous = gemm_default();
    /* oneDNN threads like OpenBLAS: blas_core_threads() per rank */
    gemm_set_default(gemm_create(engine, blas_core_threads()));
    gemm_destroy(previous);
}

void cmd_note_bf16_speed(const config *c) {
    if (c->precision != PRECISION_BF16) return;
    cpu_peak peak = cpu_measure_peak(1, 0.1);
    if (peak.bf16_gflops <= 0)
        log_rank0("note: train.precision = bf16 without native bf16 here: %s (MOMFMM_FORCE_BF16), slower than "
                  "fp32\n",
                  gemm_bf16_how());
    else if (peak.bf16_gflops < 1.8 * peak.fp32_gflops)
        log_rank0("note: this CPU's bf16 dot-product peak is %.2f x its fp32 FMA peak (%.0f vs %.0f GFLOP/s per "
                  "core, measured): bf16 is not expected to train faster than fp32 here\n",
                  peak.bf16_gflops / peak.fp32_gflops, peak.bf16_gflops, peak.fp32_gflops);
    else
        log_rank0("bf16: dot-product peak %.2f x the fp32 FMA peak (%.0f vs %.0f GFLOP/s per core, measured)\n",
                  peak.bf16_gflops / peak.fp32_gflops, peak.bf16_gflops, peak.fp32_gflops);
}

/* The config of `path`, or of a run directory's newest checkpoint whose
 * config reads (listed oldest first by the store); false when none reads:
 * the command itself then reports the file's problem. */
static bool read_checkpoint_config(const char *path, config *c, checkpoint_info *info) {
    status st;
    if (!store_is_directory(path)) return checkpoint_read_config(path, c, info, &st) == 0;
    store_listing l;
    store_list(path, &l);
    bool found = false;
    for (int i = l.n - 1; i >= 0 && !found; i--) found = checkpoint_read_config(l.paths[i], c, info, &st) == 0;
    store_listing_free(&l);
    return found;
}

void cmd_use_checkpoint_precision(const char *ckpt, const char *precision) {
    config c;
    checkpoint_info info = {0};
    if (!read_checkpoint_config(ckpt, &c, &info)) config_defaults(&c);
    if (precision) {
        char assignment[64];
        snprintf(assignment, sizeof assignment, "train.precision=%s", precision);
        status st; /* the key's own check: fp32|bf16, did you mean */
        if (config_apply_override(&c, assignment, &st) != 0) cmd_exit_on_status(&st, true);
    }
    /* a checkpoint trained in bf16, read where bf16 cannot run: the way out
     * is the option, not the config (docs/scale.md §7) */
    const char *why = c.precision == PRECISION_BF16 && !precision ? gemm_unavailable_reason(GEMM_ONEDNN_BF16) : NULL;
    if (why)
        cmd_fail_all(EXIT_USAGE,
                     "%s: trained with train.precision = bf16, which cannot run here: %s; --precision fp32 "
                     "runs it in fp32",
                     ckpt, why);
    cmd_use_precision(&c);
    /* train.gemm = auto: the engines the run trained with, when recorded */
    gemm_engine engines[GEMM_CLASSES];
    if (info.gemm_engines[0] && gemm_class_engines_parse(info.gemm_engines, engines))
        gemm_set_class_engines(gemm_default(), engines);
}

const char *cmd_precision_description(void) {
    static char text[512];
    gemm_ctx *ctx = gemm_default();
    bool bf16 = ctx && gemm_ctx_engine(ctx) == GEMM_ONEDNN_BF16;
    snprintf(text, sizeof text, "%s | gemm %s", bf16 ? "bf16" : "fp32", ctx ? gemm_describe(ctx) : "openblas sgemm");
    return text;
}

const char *cmd_ranks_threads(void) {
    static char text[64];
    int size = dist_size(), threads = blas_core_threads();
    snprintf(text, sizeof text, "%d rank%s x %d thread%s", size, size == 1 ? "" : "s", threads,
             threads == 1 ? "" : "s");
    return text;
}

void cmd_print_banner(void) {
    char hosts[4096], reduce[64] = "";
    dist_host_names(hosts, sizeof hosts);
    if (dist_size() > 1 && dist_rank() == 0)
        snprintf(reduce, sizeof reduce, " | all-reduce %s", dist_allreduce_algorithm());
    log_rank0("momfmm: %s on%s%s | OpenBLAS core %s | subnormals %s | version %s (git %s)\n", cmd_ranks_threads(),
              hosts, reduce, blas_core_description(), float_env_flushing() ? "flushed to zero" : "kept (IEEE)",
              build_version_number(), build_revision());
}

/* The directory a new output goes in (its temporary is made beside it,
 * then renamed) must exist and take files: refused before any work, naming
 * it, rather than after the work naming the temporary. It is not created:
 * an output path is taken as cp takes one. */
static void check_output_directory(const char *flag, const char *out) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else slash[slash == dir] = '\0'; /* "/x.h5" lies in "/" */
    struct stat st;
    if (stat(dir, &st) != 0)
        cmd_fail_all(EXIT_USAGE, "%s %s: its directory %s: %s", flag, out, dir,
                     errno == ENOENT ? "does not exist (create it first)" : strerror(errno));
    if (!S_ISDIR(st.st_mode)) cmd_fail_all(EXIT_USAGE, "%s %s: %s is not a directory", flag, out, dir);
    if (access(dir, W_OK | X_OK) != 0)
        cmd_fail_all(EXIT_USAGE, "%s %s: cannot write in its directory %s: %s", flag, out, dir, strerror(errno));
}

void cmd_check_output(const char *flag, const char *out, const char *const *inputs, int n_inputs, bool force) {
    struct stat st, input;
    if (!out[0]) cmd_fail_all(EXIT_USAGE, "%s: an empty path names no file", flag);
    if (lstat(out, &st) != 0) {
        check_output_directory(flag, out);
        return;
    }
    bool named = stat(out, &st) == 0; /* through a link: the file it names */
    for (int i = 0; i < n_inputs && named; i++)
        if (stat(inputs[i], &input) == 0 && input.st_dev == st.st_dev && input.st_ino == st.st_ino)
            cmd_fail_all(EXIT_USAGE, "%s %s: is the input %s; choose another file", flag, out, inputs[i]);
    /* a link, a FIFO or a device is never replaced, --force or not (docs/files.md §4) */
    status why;
    if (sys_check_replaceable(out, &why) != 0) cmd_fail_all(EXIT_USAGE, "%s: %s", flag, why.message);
    if (!force)
        cmd_fail_all(EXIT_USAGE,
                     "%s %s: the file exists; remove it, choose another name, or pass --force to replace it", flag,
                     out);
}
