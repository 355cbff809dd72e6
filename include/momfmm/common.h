/* Shared helpers: exit codes of docs/cli.md §5, failure reporting, allocation. */
#ifndef MOMFMM_COMMON_H
#define MOMFMM_COMMON_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* docs/cli.md §5: 2 for a config or command-line error, 3 for a bad file,
 * 4 for a training run stopped by a non-finite loss or gradient norm. */
enum { EXIT_USAGE = 2, EXIT_BAD_FILE = 3, EXIT_DIVERGED = 4 };

/* The outcome of a core module's operation (docs/design.md §8.7): code 0 on
 * success, else an exit code of docs/cli.md §5 (EXIT_USAGE, EXIT_BAD_FILE,
 * or 1 for an internal failure) and a one-line message naming the file, key
 * or value. Core modules fill a status and return; only the command layer
 * turns a failed status into an exit. */
typedef struct {
    int code;
    char message[1024];
} status;

/* Sets st (when not NULL) to code and the formatted message; returns code,
 * so that `return status_fail(st, EXIT_BAD_FILE, "...")` reads as it does. */
int status_fail(status *st, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void status_clear(status *st) {
    if (st) st->code = 0, st->message[0] = '\0';
}

/* Prints "momfmm: <message>" on stderr (rank 0 only when every rank fails the
 * same way) and ends the process, or the whole MPI job when it has several
 * ranks and only this one failed. Never returns. */
_Noreturn void fail(int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The same, for an error that every rank detects identically (config,
 * command line): rank 0 prints, every rank finalises MPI and exits. */
_Noreturn void fail_all(int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints a message from rank 0 only. */
void log_rank0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Running out of memory ends the process (exit 1) from wherever it happens:
 * the one failure that core modules do not return as a status
 * (docs/design.md §8.7). */
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t size);
double wall_seconds(void);

/* MemAvailable of /proc/meminfo in bytes, or 0 when unknown: the bound on
 * sizes that files and options declare (docs/files.md §4, hostile input). */
double memory_available_bytes(void);
/* Whether path names a regular file (or a link to one): FIFOs and devices
 * are refused before opening them, as an open or read could block forever. */
bool path_is_regular_file(const char *path);

/* x in the fewest significant digits (%.1g ... %.17g) that strtod reads back
 * as exactly x: 0.2 rather than 0.20000000000000001 (docs/config.md §6, the
 * config_ini text). `out` needs room for 32 bytes; returns out. */
char *format_shortest_double(double x, char *out, size_t len);
/* This rank and the number of ranks (0 and 1 without MPI); defined in dist.c,
 * the one file that calls MPI (docs/design.md §8.3). */
int process_rank(void);
int process_count(void);
#endif
