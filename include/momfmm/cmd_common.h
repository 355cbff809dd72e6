/* The command layer's side of failure handling (docs/design.md §8.7): core
 * modules return a status, and only these functions (and the commands that
 * call them) turn a failed one into an exit code. Each wrapper keeps the name
 * and signature that callers used before the core function returned a
 * status (its core version is the *_try_* function of the same name). */
#ifndef MOMFMM_CMD_COMMON_H
#define MOMFMM_CMD_COMMON_H
#include <stdbool.h>

#include "momfmm/common.h"
#include "momfmm/model.h"

/* Ends with st->code and "momfmm: <message>": through fail_all when every
 * rank reached the same status (rank 0 prints, every rank finalises MPI),
 * else through fail (this rank alone failed: the whole job is aborted). */
_Noreturn void exit_on_status(const status *st, bool every_rank_alike);

void dist_init(int *argc, char ***argv);
void dist_check_launch(void);
void dist_check_consistency(const model *m, long long step);
#endif
