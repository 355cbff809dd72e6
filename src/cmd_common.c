/* Exiting wrappers of the command layer around the core modules' status
 * returns (docs/design.md §8.7: exit codes; §8.1: only commands exit). */
#include "momfmm/cmd_common.h"

#include "momfmm/dist.h"

_Noreturn void exit_on_status(const status *st, bool every_rank_alike) {
    if (every_rank_alike) fail_all(st->code, "%s", st->message);
    fail(st->code, "%s", st->message);
}

/* Every rank reads the same file and arguments, so every rank fails alike. */
config cmd_load_config(const char *path, int n_overrides, char *const *overrides) {
    config c;
    config_defaults(&c);
    config_load_file(&c, path);
    for (int i = 0; i < n_overrides; i++) config_apply_override(&c, overrides[i]);
    config_validate(&c, path, EXIT_USAGE);
    return c;
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

void config_load_file(config *c, const char *path) {
    status st;
    if (config_try_load_file(c, path, &st) != 0) exit_on_status(&st, true);
}

void config_apply_override(config *c, const char *assignment) {
    status st;
    if (config_try_apply_override(c, assignment, &st) != 0) exit_on_status(&st, true);
}

void config_validate(const config *c, const char *origin, int exit_code) {
    char err[512];
    if (config_check(c, origin, err, sizeof err) != 0) fail_all(exit_code, "%s", err);
}

/* Every rank opens the same file the same way. */
data_source *data_open(const config *c) {
    status st;
    data_source *d = data_try_open(c, &st);
    if (!d) exit_on_status(&st, true);
    return d;
}
