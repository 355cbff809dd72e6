/* The INI syntax of config files (docs/config.md §6): "[section]" lines,
 * "key = value" or "key: value" lines, blank lines and comments (a line
 * starting with ';' or '#', or ';' or '#' after whitespace outside a quoted
 * value), CRLF line ends and a UTF-8 byte-order mark; lines of any length;
 * quoted values with backslash escapes. What the sections and keys
 * mean is config.c's; this module only splits the text. */
#ifndef MOMFMM_INI_H
#define MOMFMM_INI_H
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* Called for each section header, each pair, and each line that is neither
 * (text: the stripped line); `line` counts from 1. A non-zero return stops
 * the parse and is returned by ini_parse. */
typedef struct {
    int (*section)(void *ctx, int line, const char *name);
    int (*pair)(void *ctx, int line, const char *key, const char *value);
    int (*malformed)(void *ctx, int line, const char *text);
    void *ctx;
} ini_handlers;

int ini_parse(const char *text, const ini_handlers *h);

/* Quoted values (docs/config.md §6, escaping): a value that starts with '"'
 * runs to the next unescaped '"', with the escapes \n \t \r \\ \" \; \#
 * and \xNN (any byte but NUL); only blanks and a comment may follow. A
 * value that does not start with '"' is taken verbatim, as it always was.
 * ini_unquote decodes `value` in place (unchanged when not quoted): 0, or -1
 * with the reason in why. */
int ini_unquote(char *value, char *why, size_t len);
/* The escapes above decoded in place in `text` (no quotes around it), the
 * one decoder of them: config values and generate --stop (docs/cli.md §5).
 * 0, or -1 with the reason in why (an unknown escape, \x without two hex
 * digits, \x00, a backslash at the end). */
int ini_unescape(char *text, char *why, size_t len);
/* `value` as config_ini writes it: verbatim, or quoted with the escapes
 * above (valid UTF-8 kept, other bytes as \xNN); caller frees. */
char *ini_quote(const char *value);

/* A config file as a NUL-terminated string (caller frees), or NULL and a
 * status naming the file (EXIT_USAGE): missing, unreadable, not a regular
 * file (a FIFO would block, a directory would read as empty), or not text. */
char *ini_read_file(const char *path, status *st);
#endif
