/* Failures (docs/design.md §8.7): the exit codes of docs/cli.md §5, the status
 * every module below the command layer returns, and the panic hook for the
 * failures no caller can handle. */
#ifndef MOMFMM_STATUS_H
#define MOMFMM_STATUS_H
#include <stddef.h>

/* docs/cli.md §5: 2 for a config or command-line error, 3 for a bad file,
 * 4 for a training run stopped by a non-finite loss or gradient norm, 5 for
 * a collective that a peer rank did not complete within dist.timeout. */
enum { EXIT_USAGE = 2, EXIT_BAD_FILE = 3, EXIT_DIVERGED = 4, EXIT_DIST_TIMEOUT = 5 };

/* The outcome of an operation: code 0 on success, else an exit code of
 * docs/cli.md §5 (EXIT_USAGE, EXIT_BAD_FILE, or 1 for an internal failure)
 * and a one-line message naming the file, key or value. Modules fill a
 * status and return; only the command layer turns a failed one into an exit. */
typedef struct {
    int code;
    char message[1024];
} status;

/* Sets st (when not NULL) to code and the formatted message; returns code,
 * so that `return status_fail(st, EXIT_BAD_FILE, "...")` reads as it does. */
int status_fail(status *st, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A message's control bytes (a newline or an escape sequence from a file's
 * value or name) rewritten as \xNN in place, so that a status stays one
 * line and a file's bytes never reach the terminal raw; status_fail does
 * it to every message. */
void status_escape_controls(char *message, size_t len);
static inline void status_clear(status *st) {
    if (st) st->code = 0, st->message[0] = '\0';
}

/* The last resort, after Lua's lua_atpanic: a failure that no caller can
 * handle (memory exhausted, a library's internal error) prints
 * "momfmm: <message>" and calls the panic hook with the exit code. The
 * default hook exits the process; the parallel runtime installs one that
 * ends every rank of the job, so that no rank waits for a dead one in a
 * collective (docs/design.md §8.7). A hook that returns is followed by
 * exit(exit_code). status_at_panic returns the previous hook. */
typedef void (*status_panic_hook)(int exit_code);
status_panic_hook status_at_panic(status_panic_hook hook);
_Noreturn void status_panic(int exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
