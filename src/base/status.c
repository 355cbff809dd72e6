/* Failures: status messages and the panic hook (docs/design.md §8.7). */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static status_panic_hook panic_hook;

void status_escape_controls(char *message, size_t len) {
    char out[sizeof((status *)0)->message];
    size_t j = 0, cap = len < sizeof out ? len : sizeof out;
    for (const unsigned char *p = (const unsigned char *)message; *p && j + 5 < cap; p++) {
        if (*p < 0x20 || *p == 0x7f) j += (size_t)snprintf(out + j, cap - j, "\\x%02x", *p);
        else out[j++] = (char)*p;
    }
    out[j] = '\0';
    memcpy(message, out, j + 1);
}

int status_fail(status *st, int code, const char *fmt, ...) {
    if (!st) return code;
    va_list args;
    va_start(args, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, args);
    va_end(args);
    status_escape_controls(st->message, sizeof st->message);
    st->code = code;
    return code;
}

status_panic_hook status_at_panic(status_panic_hook hook) {
    status_panic_hook previous = panic_hook;
    panic_hook = hook;
    return previous;
}

_Noreturn void status_panic(int exit_code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("momfmm: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(args);
    if (panic_hook) panic_hook(exit_code);
    exit(exit_code);
}
