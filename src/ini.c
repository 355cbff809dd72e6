/* The INI syntax (docs/config.md §6); see ini.h. */
#include "momfmm/ini.h"
#include "momfmm/sys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *strip(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* "[name]", then only a comment. */
static int section_line(const ini_handlers *h, int number, char *s) {
    char *close = strchr(s, ']');
    char *rest = close ? strip(close + 1) : NULL;
    if (!close || (*rest && *rest != ';' && *rest != '#')) return h->malformed(h->ctx, number, s);
    *close = '\0';
    return h->section(h->ctx, number, strip(s + 1));
}

/* The syntax inih accepted: "key = value" or "key: value", a ';' after
 * whitespace starts a comment, blanks and lines starting with ';' or '#'
 * are skipped. */
static int parse_line(const ini_handlers *h, int number, char *line) {
    char *s = strip(line);
    if (!*s || *s == ';' || *s == '#') return 0;
    if (*s == '[') return section_line(h, number, s);
    char *separator = s + strcspn(s, "=:");
    if (!*separator || separator == s) return h->malformed(h->ctx, number, s);
    *separator = '\0';
    char *value = separator + 1;
    for (char *p = value + 1; *p; p++)
        if (*p == ';' && (p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            break;
        }
    return h->pair(h->ctx, number, strip(s), strip(value));
}

/* Lines of any length: each is copied whole into a buffer that grows to
 * fit, unlike inih's fixed line buffer, which split a long line and parsed
 * its tail as a line of its own. */
int ini_parse(const char *text, const ini_handlers *h) {
    if (!strncmp(text, "\xEF\xBB\xBF", 3)) text += 3; /* a UTF-8 byte-order mark */
    size_t cap = 256;
    char *line = sys_calloc(cap, 1);
    int rc = 0, number = 0;
    for (const char *p = text; *p && rc == 0;) {
        size_t n = strcspn(p, "\n");
        if (n + 1 > cap) {
            cap = n + 1;
            line = sys_realloc(line, cap);
        }
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (p[n] == '\n');
        rc = parse_line(h, ++number, line);
    }
    free(line);
    return rc;
}

char *ini_read_file(const char *path, status *st) {
    if (access(path, R_OK) != 0) {
        status_fail(st, EXIT_USAGE, "%s: cannot open config: %s", path, strerror(errno));
        return NULL;
    }
    if (!sys_is_regular_file(path)) {
        status_fail(st, EXIT_USAGE, "%s: cannot open config: not a regular file", path);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        status_fail(st, EXIT_USAGE, "%s: cannot open config: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *text = sys_calloc(cap, 1);
    size_t got;
    while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            cap *= 2;
            text = sys_realloc(text, cap);
        }
    }
    fclose(f);
    text[len] = '\0';
    if (strlen(text) != len) {
        free(text);
        status_fail(st, EXIT_USAGE, "%s: not a text file", path);
        return NULL;
    }
    return text;
}
