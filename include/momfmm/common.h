/* Shared helpers: exit codes of SPEC 5, failure reporting, allocation. */
#ifndef MOMFMM_COMMON_H
#define MOMFMM_COMMON_H
#include <stddef.h>
#include <stdint.h>

/* SPEC 5: 2 for a config or command-line error, 3 for a bad file. */
enum { EXIT_USAGE = 2, EXIT_BAD_FILE = 3 };

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

void *xcalloc(size_t count, size_t size);
double wall_seconds(void);
int process_rank(void);
int process_count(void);
#endif
