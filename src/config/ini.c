/* The INI syntax (docs/config.md §6); see ini.h. */
#include "config/ini.h"
#include "base/sys.h"

#include <errno.h>
#include <stdbool.h>
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

/* Where a value's comment starts: a ';' or '#' after a blank, outside a
 * quoted value (docs/config.md §6). */
static char *comment_start(char *value) {
    char *p = value + strspn(value, " \t");
    if (*p == '"') { /* a quoted value: skip to its closing quote */
        for (p++; *p && *p != '"'; p++)
            if (*p == '\\' && p[1]) p++;
        if (!*p) return NULL; /* no closing quote: ini_unquote reports it */
        p++;
    }
    for (; *p; p++)
        if ((*p == ';' || *p == '#') && p > value && (p[-1] == ' ' || p[-1] == '\t')) return p;
    return NULL;
}

/* The syntax inih accepted: "key = value" or "key: value", a ';' or '#'
 * after whitespace starts a comment (not inside a quoted value), blanks and
 * lines starting with ';' or '#' are skipped. */
static int parse_line(const ini_handlers *h, int number, char *line) {
    char *s = strip(line);
    if (!*s || *s == ';' || *s == '#') return 0;
    if (*s == '[') return section_line(h, number, s);
    char *separator = s + strcspn(s, "=:");
    if (!*separator || separator == s) return h->malformed(h->ctx, number, s);
    *separator = '\0';
    char *value = separator + 1;
    char *comment = comment_start(value);
    if (comment) *comment = '\0';
    return h->pair(h->ctx, number, strip(s), strip(value));
}

/* ---- quoted values ---------------------------------------------------- */

/* The length of the valid UTF-8 sequence at p (1 to 4), or 0. */
static int utf8_length(const unsigned char *p) {
    int n = p[0] < 0x80                    ? 1
            : p[0] >= 0xC2 && p[0] <= 0xDF ? 2
            : p[0] >= 0xE0 && p[0] <= 0xEF ? 3
            : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4
                                           : 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] > 0x9F))) return 0; /* overlong, surrogate */
    if (n == 4 && ((p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] > 0x8F))) return 0;
    return n;
}

/* True when `value` would not read back verbatim unquoted: leading or
 * trailing blanks, a leading '"', ';' or '#', control bytes, or bytes that
 * are not UTF-8. */
static bool ini_needs_quotes(const char *value) {
    const unsigned char *p = (const unsigned char *)value;
    size_t n = strlen(value);
    if (n == 0) return false;
    if (p[0] == ' ' || p[0] == '\t' || p[0] == '"' || p[n - 1] == ' ' || p[n - 1] == '\t') return true;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x20 || p[i] == 0x7f || p[i] == ';' || p[i] == '#') return true;
        int len = utf8_length(p + i);
        if (len == 0) return true;
        i += (size_t)len;
    }
    return false;
}

char *ini_quote(const char *value) {
    size_t n = strlen(value);
    char *out = sys_calloc(4 * n + 3, 1);
    if (!ini_needs_quotes(value)) return memcpy(out, value, n + 1);
    const unsigned char *p = (const unsigned char *)value;
    size_t j = 0;
    out[j++] = '"';
    for (size_t i = 0; i < n;) {
        unsigned char ch = p[i];
        int len = utf8_length(p + i);
        if (ch == '"' || ch == '\\') out[j++] = '\\', out[j++] = (char)ch;
        else if (ch == '\n') out[j++] = '\\', out[j++] = 'n';
        else if (ch == '\t') out[j++] = '\\', out[j++] = 't';
        else if (ch == '\r') out[j++] = '\\', out[j++] = 'r';
        else if (ch < 0x20 || ch == 0x7f || len == 0) j += (size_t)snprintf(out + j, 5, "\\x%02x", ch);
        else {
            memcpy(out + j, p + i, (size_t)len);
            j += (size_t)len, i += (size_t)len;
            continue;
        }
        i++;
    }
    out[j++] = '"';
    out[j] = '\0';
    return out;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int ini_unescape(char *text, char *why, size_t len) {
    char *in = text, *out = text;
    for (; *in; in++) {
        if (*in != '\\') {
            *out++ = *in;
            continue;
        }
        char e = *++in;
        int hi, lo;
        switch (e) {
        case 'n': *out++ = '\n'; break;
        case 't': *out++ = '\t'; break;
        case 'r': *out++ = '\r'; break;
        case '\\':
        case '"':
        case ';':
        case '#': *out++ = e; break;
        case 'x':
            hi = hex_digit(in[1]), lo = hi >= 0 ? hex_digit(in[2]) : -1;
            if (lo < 0) {
                snprintf(why, len, "\\x needs two hex digits");
                return -1;
            }
            if (hi == 0 && lo == 0) {
                snprintf(why, len, "\\x00: a value cannot hold a NUL byte");
                return -1;
            }
            *out++ = (char)(hi * 16 + lo);
            in += 2;
            break;
        case '\0': snprintf(why, len, "a backslash at the end escapes nothing"); return -1;
        default:
            if ((unsigned char)e < 0x20 || (unsigned char)e >= 0x7f)
                snprintf(why, len, "unknown escape: a backslash before byte \\x%02x", (unsigned char)e);
            else snprintf(why, len, "unknown escape \\%c (known: \\n \\t \\r \\\\ \\\" \\; \\# \\xNN)", e);
            return -1;
        }
    }
    *out = '\0';
    return 0;
}

int ini_unquote(char *value, char *why, size_t len) {
    if (value[0] != '"') return 0;
    char *close = value + 1;
    for (; *close && *close != '"'; close++)
        if (*close == '\\' && close[1]) close++;
    if (*close != '"') {
        snprintf(why, len, "no closing quote");
        return -1;
    }
    const char *rest = close + 1 + strspn(close + 1, " \t");
    if (*rest) {
        snprintf(why, len, "text after the closing quote");
        return -1;
    }
    *close = '\0';
    memmove(value, value + 1, (size_t)(close - value)); /* the text between the quotes, its NUL included */
    return ini_unescape(value, why, len);
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
    /* never a FIFO (would block) or a directory (would read as empty): docs/files.md §4 */
    int fd = sys_open_file(path, SYS_READ, "config", st);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f && fd >= 0) {
        status_fail(st, EXIT_USAGE, "%s: cannot open config: %s", path, strerror(errno));
        close(fd);
    }
    if (!f) {
        st->code = EXIT_USAGE; /* a config that cannot be read is a config error (docs/cli.md §5) */
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
    if (sys_has_hdf5_signature(text, len)) {
        free(text);
        status_fail(st, EXIT_USAGE, "%s: an HDF5 file, not a config (INI text)", path);
        return NULL;
    }
    if (strlen(text) != len) {
        size_t at = strlen(text);
        free(text);
        status_fail(st, EXIT_USAGE, "%s: a NUL byte at offset %zu: not a text file", path, at);
        return NULL;
    }
    return text;
}
