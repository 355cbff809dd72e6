/* What the commands share (docs/design.md §8.1, §8.7): failing with an exit
 * code, the configuration step, MPI start-up, the GEMM engine and the
 * start-up line. Modules below return a status; only these functions (and
 * the commands that call them) turn a failed one into an exit code. */
#ifndef MOMFMM_CMD_COMMON_H
#define MOMFMM_CMD_COMMON_H
#include <stdbool.h>

#include "base/status.h"
#include "config/config.h"
#include "model/model.h"

/* Prints "momfmm: <message>" on stderr and ends the process, or the whole
 * MPI job when it has several ranks and only this one failed. */
_Noreturn void cmd_fail(int exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, for an error that every rank detects identically (config,
 * command line): rank 0 prints, every rank finalises MPI and exits. */
_Noreturn void cmd_fail_all(int exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Every rank calls this with its own outcome of a step that every rank ran
 * (reading an input file, rank 0 writing an output): rc 0, or the exit code
 * whose message is in st. When any rank's step failed, rank 0 prints the
 * lowest failing rank's message once and every rank exits with its code
 * through MPI_Finalize (dist_agree_status), so a file refused under mpirun
 * reads as one line, not as MPI_Abort's banner, also when it failed on one
 * rank alone (docs/cli.md §5, under mpirun). Returns when no rank failed. */
void cmd_fail_if_any(int rc, status *st);

/* main's first act: descriptors 0, 1 and 2 open. One that is closed (a
 * shell's >&-) becomes /dev/null, so that no file the program opens (a
 * checkpoint, the lock) takes its number and receives the output; a closed
 * stdout is remembered for cmd_finish_output. */
void cmd_guard_standard_streams(void);
/* main's last act (docs/cli.md §5): stdout flushed, checked (ferror) and
 * closed. A failed write or close (a full device, a stdout that was closed,
 * an I/O error) means the command's output is lost: one line on stderr and
 * EXIT_BAD_FILE, unless the command failed already (rc != 0) or is a train
 * that stopped on its closed pipe (EPIPE, which it reports itself).
 * Returns the exit code. */
int cmd_finish_output(int rc);

/* Defaults, the INI file, the --set overrides and the cross-key checks, each
 * exiting 2 on error; the whole of a command's configuration step. */
config cmd_load_config(const char *path, int n_overrides, char *const *overrides);

/* OMP_NUM_THREADS bounded by the machine's CPUs and given to
 * OpenMP (blas_core_bound_threads), before anything could start a pool:
 * main calls it first. Its verdict is said by cmd_dist_init. */
void cmd_bound_threads(void);
/* Starts MPI (dist_init) when a launcher started the process (dist_launched;
 * alone it is a world of one without MPI); then, every rank alike, exit 2
 * for an OMP_NUM_THREADS that is no number, or rank 0's warning when it was
 * clamped (docs/cli.md §5, threads). */
void cmd_dist_init(int *argc, char ***argv);
void cmd_check_launch(void);
/* The parameters compared across ranks by checksum (exit 1 on a mismatch). */
void cmd_check_consistency(const model *m, long long step);

/* docs/scale.md §7: makes the GEMM engine of train.precision and train.gemm
 * the process-wide one (gemm_set_default) before any model exists; exits 2
 * naming what is missing when this build or this CPU cannot run it. */
void cmd_use_precision(const config *c);
/* train.precision = bf16 (train, bench): whether this CPU's bf16 peak,
 * measured, is the 1.8 x its fp32 peak that makes bf16 pay, said on rank 0
 * with both figures (AMX units are not probed: its oneDNN kernels are). */
void cmd_note_bf16_speed(const config *c);
/* eval, generate and loss: the precision and GEMM of the checkpoint's
 * config, with `precision` ("fp32" or "bf16", from --precision) overriding
 * train.precision when not NULL. */
void cmd_use_checkpoint_precision(const char *ckpt, const char *precision);
/* "bf16 | gemm onednn-bf16 (oneDNN 2.6.3: brg:avx512_core_bf16)": the
 * precision and the implementations run so far, for the start-up line. */
const char *cmd_precision_description(void);
/* An output file must not replace one of the command's inputs, nor any
 * existing file without --force, nor be a special file (docs/cli.md §5):
 * a mistyped --grads or --out would otherwise destroy a trained checkpoint
 * without a word. Every rank sees the same paths and fails alike (exit 2). */
void cmd_check_output(const char *flag, const char *out, const char *const *inputs, int n_inputs, bool force);
/* "1 rank x 1 thread", "4 ranks x 2 threads": this run's ranks and threads
 * per rank, singular or plural as the numbers say (static storage). */
const char *cmd_ranks_threads(void);
/* The start-up line (collective): ranks x threads, hosts, BLAS core,
 * subnormal mode, version. */
void cmd_print_banner(void);
#endif
