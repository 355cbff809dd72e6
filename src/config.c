/* INI configuration (SPEC 6), table-driven: one row per key gives its section,
 * name, type, default and limits, so parsing, validation, the resolved
 * `config_ini` text and the resume comparison all read the same table. */
#include "momfmm/config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/common.h"
#include "momfmm/fmm.h"

typedef enum { KEY_INT, KEY_INT64, KEY_DOUBLE, KEY_BOOL, KEY_STRING, KEY_ENUM } key_type;

/* Whether a key must agree between a checkpoint and a resumed run. */
typedef enum { ROLE_SCHEDULE = 0, ROLE_MODEL = 1 } key_role;

typedef struct {
    const char *section, *name;
    key_type type;
    size_t offset, size;   /* size: string capacity */
    const char *fallback;  /* default, as INI text */
    double min, max;       /* numeric limits, inclusive */
    const char *choices;   /* KEY_ENUM: "a|b|c", index = stored value */
    key_role role;
} config_key;

#define OFF(f) offsetof(config, f), sizeof(((config *)0)->f)
#define BIG 1e18
static const config_key KEYS[] = {
    {"model", "vocab_size", KEY_INT, OFF(vocab_size), "64", 2, 1 << 24, NULL, ROLE_MODEL},
    {"model", "d_model", KEY_INT, OFF(d_model), "64", 2, 1 << 16, NULL, ROLE_MODEL},
    {"model", "n_heads", KEY_INT, OFF(n_heads), "4", 1, 4096, NULL, ROLE_MODEL},
    {"model", "n_layers", KEY_INT, OFF(n_layers), "2", 1, 4096, NULL, ROLE_MODEL},
    {"model", "d_ff", KEY_INT, OFF(d_ff), "256", 1, 1 << 20, NULL, ROLE_MODEL},
    {"model", "max_seq_len", KEY_INT, OFF(max_seq_len), "0", 0, 1 << 24, NULL, ROLE_MODEL},
    {"model", "rope_base", KEY_DOUBLE, OFF(rope_base), "10000", 1e-6, BIG, NULL, ROLE_MODEL},
    {"model", "causal", KEY_BOOL, OFF(causal), "true", 0, 1, NULL, ROLE_MODEL},
    {"model", "head", KEY_ENUM, OFF(head), "lm", 0, 0, "lm|cls", ROLE_MODEL},
    {"model", "n_classes", KEY_INT, OFF(n_classes), "10", 1, 1 << 20, NULL, ROLE_MODEL},
    {"attention", "kind", KEY_ENUM, OFF(attention), "softmax", 0, 0, "softmax|fmm", ROLE_MODEL},
    {"momentum", "gamma", KEY_DOUBLE, OFF(gamma), "0", -BIG, BIG, NULL, ROLE_MODEL},
    {"momentum", "learn_gamma", KEY_BOOL, OFF(learn_gamma), "false", 0, 1, NULL, ROLE_MODEL},
    {"momentum", "beta", KEY_DOUBLE, OFF(beta), "0", -BIG, BIG, NULL, ROLE_MODEL},
    {"momentum", "gamma2", KEY_DOUBLE, OFF(gamma2), "0", -BIG, BIG, NULL, ROLE_MODEL},
    {"momentum", "apply_to", KEY_ENUM, OFF(apply_to), "qk", 0, 0, "qk|q", ROLE_MODEL},
    {"momentum", "placement", KEY_ENUM, OFF(placement), "post_rope", 0, 0, "post_rope|pre_rope", ROLE_MODEL},
    {"momentum", "anchor", KEY_BOOL, OFF(anchor), "true", 0, 1, NULL, ROLE_MODEL},
    {"fmm", "bandwidth", KEY_INT, OFF(fmm_bandwidth), "5", 0, 1 << 24, NULL, ROLE_MODEL},
    {"fmm", "kernels", KEY_STRING, OFF(fmm_kernels), "elu", 0, 0, NULL, ROLE_MODEL},
    {"fmm", "eps", KEY_DOUBLE, OFF(fmm_eps), "1e-6", 0, BIG, NULL, ROLE_MODEL},
    {"fmm", "chunk", KEY_INT, OFF(fmm_chunk), "16", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    {"data", "task", KEY_ENUM, OFF(task), "chain", 0, 0, "chain|copy|listops|text", ROLE_MODEL},
    {"data", "seq_len", KEY_INT, OFF(seq_len), "64", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "chain_len", KEY_INT, OFF(chain_len), "10", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "noise", KEY_DOUBLE, OFF(noise), "0", 0, 1, NULL, ROLE_MODEL},
    {"data", "path", KEY_STRING, OFF(data_path), "", 0, 0, NULL, ROLE_MODEL},
    {"data", "eval_fraction", KEY_DOUBLE, OFF(eval_fraction), "0.1", 0, 1, NULL, ROLE_MODEL},
    {"data", "listops_min_len", KEY_INT, OFF(listops_min_len), "16", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "listops_max_len", KEY_INT, OFF(listops_max_len), "128", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "listops_max_depth", KEY_INT, OFF(listops_max_depth), "10", 1, 64, NULL, ROLE_MODEL},
    {"data", "listops_max_args", KEY_INT, OFF(listops_max_args), "10", 2, 64, NULL, ROLE_MODEL},
    {"train", "steps", KEY_INT64, OFF(steps), "1000", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "batch_size", KEY_INT, OFF(batch_size), "16", 1, 1 << 24, NULL, ROLE_MODEL},
    {"train", "lr", KEY_DOUBLE, OFF(lr), "1e-3", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "min_lr", KEY_DOUBLE, OFF(min_lr), "0", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "warmup", KEY_INT, OFF(warmup), "0", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "schedule", KEY_ENUM, OFF(schedule), "cosine", 0, 0, "cosine|constant", ROLE_SCHEDULE},
    {"train", "weight_decay", KEY_DOUBLE, OFF(weight_decay), "0.01", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "beta1", KEY_DOUBLE, OFF(beta1), "0.9", 0, 0.999999, NULL, ROLE_SCHEDULE},
    {"train", "beta2", KEY_DOUBLE, OFF(beta2), "0.999", 0, 0.999999999, NULL, ROLE_SCHEDULE},
    {"train", "adam_eps", KEY_DOUBLE, OFF(adam_eps), "1e-8", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "grad_clip", KEY_DOUBLE, OFF(grad_clip), "1.0", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "seed", KEY_INT64, OFF(seed), "1234", 0, BIG, NULL, ROLE_MODEL},
    {"train", "log_interval", KEY_INT, OFF(log_interval), "10", 1, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "eval_interval", KEY_INT, OFF(eval_interval), "100", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "eval_batches", KEY_INT, OFF(eval_batches), "4", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    {"train", "ckpt_interval", KEY_INT, OFF(ckpt_interval), "0", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "keep", KEY_INT, OFF(keep), "3", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    {"train", "out_dir", KEY_STRING, OFF(out_dir), "runs/default", 0, 0, NULL, ROLE_SCHEDULE},
    {"dist", "bucket_mb", KEY_DOUBLE, OFF(bucket_mb), "4", 1e-3, 1e6, NULL, ROLE_SCHEDULE},
    {"dist", "overlap", KEY_BOOL, OFF(overlap), "true", 0, 1, NULL, ROLE_SCHEDULE},
    {"dist", "check_interval", KEY_INT, OFF(check_interval), "100", 0, 1 << 30, NULL, ROLE_SCHEDULE},
};
#define N_KEYS (sizeof(KEYS) / sizeof(KEYS[0]))

static const config_key *find_key(const char *section, const char *name, bool *section_known) {
    *section_known = false;
    for (size_t i = 0; i < N_KEYS; i++) {
        if (strcmp(KEYS[i].section, section) != 0) continue;
        *section_known = true;
        if (strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    }
    return NULL;
}

static int parse_enum(const char *choices, const char *value) {
    size_t len = strlen(value);
    int index = 0;
    for (const char *p = choices; *p; index++) {
        const char *end = strchr(p, '|');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, value, n) == 0) return index;
        if (!end) break;
        p = end + 1;
    }
    return -1;
}

/* Stores `value` into the field of `key`; returns NULL or a reason. */
static const char *set_value(config *c, const config_key *key, const char *value) {
    char *field = (char *)c + key->offset;
    char *end = NULL;
    errno = 0;
    switch (key->type) {
    case KEY_INT:
    case KEY_INT64: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno) return "expected an integer";
        if ((double)v < key->min || (double)v > key->max) return "out of range";
        if (key->type == KEY_INT) *(int *)field = (int)v;
        else *(long long *)field = v;
        return NULL;
    }
    case KEY_DOUBLE: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v)) return "expected a number";
        if (v < key->min || v > key->max) return "out of range";
        *(double *)field = v;
        return NULL;
    }
    case KEY_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes")) *(bool *)field = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no")) *(bool *)field = false;
        else return "expected true or false";
        return NULL;
    case KEY_STRING:
        if (strlen(value) >= key->size) return "too long";
        strcpy(field, value);
        return NULL;
    case KEY_ENUM: {
        int v = parse_enum(key->choices, value);
        if (v < 0) return "not one of the allowed values";
        *(int *)field = v;
        return NULL;
    }
    }
    return "unknown key type";
}

/* A default that does not parse is a bug in KEYS, not an input error: the unit
 * test runs config_check_defaults, so config_defaults itself cannot fail. */
void config_defaults(config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++) set_value(c, &KEYS[i], KEYS[i].fallback);
}

int config_check_defaults(status *st) {
    config c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *why = set_value(&c, &KEYS[i], KEYS[i].fallback);
        if (why) return status_fail(st, 1, "internal: default of %s.%s: %s", KEYS[i].section, KEYS[i].name, why);
    }
    return 0;
}

typedef struct {
    config *c;
    const char *origin;
    int line;
    char *err;
    size_t err_len;
} parse_state;

static int handle_pair(void *user, const char *section, const char *name, const char *value) {
    parse_state *st = user;
    bool section_known;
    const config_key *key = find_key(section, name, &section_known);
    if (!key) {
        if (!section_known)
            snprintf(st->err, st->err_len, "%s:%d: unknown section [%s] (key %s)", st->origin,
                     st->line, section, name);
        else
            snprintf(st->err, st->err_len, "%s:%d: unknown key %s.%s", st->origin, st->line,
                     section, name);
        return 0;
    }
    const char *why = set_value(st->c, key, value);
    if (why) {
        char allowed[160] = "";
        if (key->type == KEY_ENUM) snprintf(allowed, sizeof allowed, " (allowed: %s)", key->choices);
        snprintf(st->err, st->err_len, "%s:%d: %s.%s = '%s': %s%s", st->origin, st->line, section,
                 name, value, why, allowed);
        return 0;
    }
    return 1;
}

/* inih's reader callback; counting lines here gives the handler its line
 * number, since inih calls the handler right after reading each line. */
typedef struct {
    const char *cursor;
    parse_state *state;
} string_stream;

/* inih reports a malformed line only by number after the whole parse, and
 * keeps going; checking here stops at the first bad line with a reason. */
static bool line_is_well_formed(const char *line) {
    while (*line == ' ' || *line == '\t' || *line == '\r') line++;
    if (!*line || *line == '\n' || *line == ';' || *line == '#') return true;
    if (*line == '[') return strchr(line, ']') != NULL;
    return strchr(line, '=') != NULL || strchr(line, ':') != NULL;
}

static char *read_line(char *buf, int size, void *stream) {
    string_stream *s = stream;
    parse_state *st = s->state;
    if (!*s->cursor || st->err[0]) return NULL;
    int n = 0;
    while (n < size - 1 && s->cursor[n] && s->cursor[n] != '\n') n++;
    if (s->cursor[n] == '\n' && n < size - 1) n++;
    memcpy(buf, s->cursor, (size_t)n);
    buf[n] = '\0';
    s->cursor += n;
    st->line++;
    if (!line_is_well_formed(buf)) {
        int shown = (int)strcspn(buf, "\r\n");
        snprintf(st->err, st->err_len, "%s:%d: malformed line (expected [section] or key = value): %.*s",
                 st->origin, st->line, shown < 60 ? shown : 60, buf);
        return NULL;
    }
    return buf;
}

int config_load_string(config *c, const char *text, const char *origin, char *err, size_t err_len) {
    parse_state st = {c, origin, 0, err, err_len};
    string_stream stream = {text, &st};
    err[0] = '\0';
    int rc = ini_parse_stream(read_line, &stream, handle_pair, &st);
    if (err[0]) return -1;
    if (rc != 0) snprintf(err, err_len, "%s:%d: malformed line", origin, rc > 0 ? rc : st.line);
    return rc == 0 ? 0 : -1;
}

/* The file as a NUL-terminated string (caller frees), or NULL and a status. */
static char *read_whole_file(const char *path, status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        status_fail(st, EXIT_USAGE, "%s: cannot open config: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *text = xcalloc(cap, 1);
    size_t got;
    while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            cap *= 2;
            text = xrealloc(text, cap);
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

int config_try_load_file(config *c, const char *path, status *st) {
    char *text = read_whole_file(path, st);
    if (!text) return EXIT_USAGE;
    char err[512];
    int rc = config_load_string(c, text, path, err, sizeof err);
    free(text);
    return rc ? status_fail(st, EXIT_USAGE, "%s", err) : 0;
}

int config_try_apply_override(config *c, const char *assignment, status *st) {
    const char *dot = strchr(assignment, '.');
    const char *eq = strchr(assignment, '=');
    if (!dot || !eq || dot > eq) return status_fail(st, EXIT_USAGE, "--set %s: expected section.key=value", assignment);
    char section[64], name[64];
    size_t ls = (size_t)(dot - assignment), ln = (size_t)(eq - dot - 1);
    if (ls >= sizeof section || ln >= sizeof name) return status_fail(st, EXIT_USAGE, "--set %s: key too long", assignment);
    memcpy(section, assignment, ls);
    section[ls] = '\0';
    memcpy(name, dot + 1, ln);
    name[ln] = '\0';
    parse_state ps = {c, "--set", 0, NULL, 0};
    char err[512];
    ps.err = err;
    ps.err_len = sizeof err;
    if (!handle_pair(&ps, section, name, eq + 1)) {
        /* Drop the ":0" line number that has no meaning for --set. */
        return status_fail(st, EXIT_USAGE, "--set %s", strchr(err, ' ') ? strchr(err, ' ') + 1 : err);
    }
    return 0;
}

bool config_momentum_enabled(const config *c) { return c->gamma != 0.0 || c->learn_gamma; }

int config_check(const config *c, const char *origin, char *err, size_t err_len) {
#define REJECT(...)                            \
    do {                                       \
        snprintf(err, err_len, __VA_ARGS__);   \
        return -1;                             \
    } while (0)
    if (c->d_model % c->n_heads != 0)
        REJECT("%s: model.d_model = %d is not divisible by model.n_heads = %d", origin, c->d_model, c->n_heads);
    if ((c->d_model / c->n_heads) % 2 != 0)
        REJECT("%s: model.d_model / model.n_heads = %d is odd; RoPE needs an even head dimension", origin,
               c->d_model / c->n_heads);
    if (c->max_seq_len > 0 && c->seq_len > c->max_seq_len)
        REJECT("%s: data.seq_len = %d exceeds model.max_seq_len = %d", origin, c->seq_len, c->max_seq_len);
    if (c->head == HEAD_CLS && c->task != TASK_LISTOPS)
        REJECT("%s: model.head = cls needs data.task = listops", origin);
    if (c->head == HEAD_LM && c->task == TASK_LISTOPS)
        REJECT("%s: data.task = listops needs model.head = cls", origin);
    if (c->task == TASK_COPY && c->vocab_size < 11)
        REJECT("%s: data.task = copy needs model.vocab_size >= 11 (symbols 1..10), got %d", origin, c->vocab_size);
    if (c->task == TASK_COPY && c->seq_len < 4)
        REJECT("%s: data.task = copy needs data.seq_len >= 4, got %d", origin, c->seq_len);
    if (c->task == TASK_CHAIN && c->chain_len > c->vocab_size)
        REJECT("%s: data.chain_len = %d exceeds model.vocab_size = %d (tokens must be distinct)", origin,
               c->chain_len, c->vocab_size);
    if (c->task == TASK_TEXT && c->vocab_size != 256)
        REJECT("%s: data.task = text is byte-level and needs model.vocab_size = 256", origin);
    if (c->task == TASK_TEXT && !c->data_path[0]) REJECT("%s: data.task = text needs data.path", origin);
    if (c->task == TASK_LISTOPS && c->listops_min_len > c->listops_max_len)
        REJECT("%s: data.listops_min_len = %d exceeds data.listops_max_len = %d", origin, c->listops_min_len,
               c->listops_max_len);
    if (c->task == TASK_LISTOPS && !c->data_path[0] && c->listops_min_len > c->seq_len)
        REJECT("%s: data.listops_min_len = %d exceeds data.seq_len = %d", origin, c->listops_min_len, c->seq_len);
    if (c->min_lr > c->lr) REJECT("%s: train.min_lr = %g exceeds train.lr = %g", origin, c->min_lr, c->lr);
    fmm_settings probe;
    char bad[64];
    if (fmm_parse_kernels(c->fmm_kernels, &probe, bad, sizeof bad) != 0)
        REJECT("%s: fmm.kernels: unknown or too many feature maps at '%s' (allowed: elu, elu_flip, tanh)",
               origin, bad);
    return 0;
#undef REJECT
}

static void format_value(const config *c, const config_key *key, char *out, size_t len) {
    const char *field = (const char *)c + key->offset;
    switch (key->type) {
    case KEY_INT: snprintf(out, len, "%d", *(const int *)field); break;
    case KEY_INT64: snprintf(out, len, "%lld", *(const long long *)field); break;
    case KEY_DOUBLE: snprintf(out, len, "%.17g", *(const double *)field); break;
    case KEY_BOOL: snprintf(out, len, "%s", *(const bool *)field ? "true" : "false"); break;
    case KEY_STRING: snprintf(out, len, "%s", field); break;
    case KEY_ENUM: {
        int index = *(const int *)field;
        const char *p = key->choices;
        for (int i = 0; i < index && p; i++) p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL;
        size_t n = p ? strcspn(p, "|") : 0;
        snprintf(out, len, "%.*s", (int)n, p ? p : "");
        break;
    }
    }
}

char *config_to_ini(const config *c) {
    size_t cap = 64 + N_KEYS * (CONFIG_PATH_MAX + 64), len = 0;
    char *text = xcalloc(cap, 1);
    const char *section = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        if (strcmp(section, KEYS[i].section) != 0) {
            section = KEYS[i].section;
            len += (size_t)snprintf(text + len, cap - len, "%s[%s]\n", len ? "\n" : "", section);
        }
        char value[CONFIG_PATH_MAX + 32];
        format_value(c, &KEYS[i], value, sizeof value);
        len += (size_t)snprintf(text + len, cap - len, "%s = %s\n", KEYS[i].name, value);
    }
    return text;
}

int config_compare_keys(const config *a, const config *b, bool model_keys, char *out, size_t out_len) {
    int differing = 0;
    size_t len = 0;
    if (out_len) out[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++) {
        if ((KEYS[i].role == ROLE_MODEL) != model_keys) continue;
        char va[CONFIG_PATH_MAX + 32], vb[CONFIG_PATH_MAX + 32];
        format_value(a, &KEYS[i], va, sizeof va);
        format_value(b, &KEYS[i], vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        differing++;
        if (len < out_len)
            len += (size_t)snprintf(out + len, out_len - len, "%s%s.%s: %s vs %s", differing > 1 ? "; " : "",
                                    KEYS[i].section, KEYS[i].name, va, vb);
    }
    return differing;
}
