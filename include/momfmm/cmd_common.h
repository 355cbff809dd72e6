/* The command layer's side of failure handling (docs/design.md §8.7): core
 * modules return a status, and only these functions (and the commands that
 * call them) turn a failed one into an exit code. Each wrapper keeps the name
 * and signature that callers used before the core function returned a
 * status (its core version is the *_try_* function of the same name). */
#ifndef MOMFMM_CMD_COMMON_H
#define MOMFMM_CMD_COMMON_H
#include <stdbool.h>

#include "momfmm/common.h"
#include "momfmm/config.h"
#include "momfmm/data.h"
#include "momfmm/model.h"

/* Ends with st->code and "momfmm: <message>": through fail_all when every
 * rank reached the same status (rank 0 prints, every rank finalises MPI),
 * else through fail (this rank alone failed: the whole job is aborted). */
_Noreturn void exit_on_status(const status *st, bool every_rank_alike);

/* Defaults, the INI file, the --set overrides and the cross-key checks, each
 * exiting 2 on error; the whole of a command's configuration step. */
config cmd_load_config(const char *path, int n_overrides, char *const *overrides);

void dist_init(int *argc, char ***argv);
void dist_check_launch(void);
void dist_check_consistency(const model *m, long long step);

/* docs/scale.md §7: makes the GEMM engine of train.precision and train.gemm
 * the process-wide one (gemm_set_default) before any model exists; exits 2
 * naming what is missing when this build or this CPU cannot run it. */
void cmd_use_precision(const config *c);
/* eval, generate and loss: the precision and GEMM of the checkpoint's
 * config, with `precision` ("fp32" or "bf16", from --precision) overriding
 * train.precision when not NULL. */
void cmd_use_checkpoint_precision(const char *ckpt, const char *precision);
/* "bf16 | gemm onednn-bf16 (oneDNN 2.6.3: brg:avx512_core_bf16)": the
 * precision and the implementations run so far, for the start-up line. */
const char *cmd_precision_description(void);
#endif
