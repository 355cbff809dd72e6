/* Exiting wrappers of the command layer around the core modules' status
 * returns (docs/design.md §8.7: exit codes; §8.1: only commands exit). */
#include "momfmm/cmd_common.h"

#include "momfmm/dist.h"

_Noreturn void exit_on_status(const status *st, bool every_rank_alike) {
    if (every_rank_alike) fail_all(st->code, "%s", st->message);
    fail(st->code, "%s", st->message);
}

void dist_init(int *argc, char ***argv) {
    status st;
    if (dist_try_init(argc, argv, &st) != 0) exit_on_status(&st, true);
}

/* A world of one: fail and fail_all are the same here. */
void dist_check_launch(void) {
    status st;
    if (dist_try_check_launch(&st) != 0) exit_on_status(&st, false);
}

/* Every rank gathered every checksum and holds the same status, so all of
 * them finish together with exit 1 (docs/design.md §8.7). */
void dist_check_consistency(const model *m, long long step) {
    status st;
    if (dist_try_check_consistency(m, step, &st) != 0) exit_on_status(&st, true);
}
