/* INI configuration (docs/config.md §6), table-driven: one row per key gives its section,
 * name, type, default and limits, so parsing, validation, the resolved
 * `config_ini` text and the resume comparison all read the same table. */
#include "config/config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"
#include "config/ini.h"

#include "config_table.h"

#define OFF(f) offsetof(config, f), sizeof(((config *)0)->f)
/* An open end: messages state only the other limit. Every numeric range
 * is one that trains (docs/config.md §6; tests/test_ranges.c trains at
 * every limit of this table), or a refusal that says why: the limits that
 * guard the arithmetic rather than taste carry their reason in LIMIT_NOTES
 * (below); n_classes >= 2, since one class makes every cross-entropy 0 or
 * worse. */
#define BIG 1e18
#define STEPS_MAX 9007199254740992.0 /* 2^53 */
const config_key CONFIG_KEYS[] = {
    {"model", "vocab_size", KEY_INT, OFF(vocab_size), "64", 2, 1 << 24, NULL, ROLE_MODEL},
    {"model", "d_model", KEY_INT, OFF(d_model), "64", 2, 1 << 16, NULL, ROLE_MODEL},
    {"model", "n_heads", KEY_INT, OFF(n_heads), "4", 1, 4096, NULL, ROLE_MODEL},
    {"model", "n_layers", KEY_INT, OFF(n_layers), "2", 1, 4096, NULL, ROLE_MODEL},
    {"model", "d_ff", KEY_INT, OFF(d_ff), "256", 1, 1 << 20, NULL, ROLE_MODEL},
    {"model", "max_seq_len", KEY_INT, OFF(max_seq_len), "0", 0, 1 << 24, NULL, ROLE_MODEL},
    {"model", "rope_base", KEY_DOUBLE, OFF(rope_base), "10000", 1e-6, BIG, NULL, ROLE_MODEL},
    {"model", "causal", KEY_BOOL, OFF(causal), "true", 0, 1, NULL, ROLE_MODEL},
    {"model", "head", KEY_ENUM, OFF(head), "lm", 0, 0, "lm|cls", ROLE_MODEL},
    {"model", "n_classes", KEY_INT, OFF(n_classes), "10", 2, 1 << 20, NULL, ROLE_MODEL},
    {"attention", "kind", KEY_ENUM, OFF(attention), "softmax", 0, 0, "softmax|fmm", ROLE_MODEL},
    /* how softmax attention is computed, not what: the same model either way
     * (docs/model.md §1.3), so a run may resume with the other */
    {"attention", "impl", KEY_ENUM, OFF(attention_impl), "tiled", 0, 0, "tiled|dense", ROLE_SCHEDULE},
    {"momentum", "gamma", KEY_DOUBLE, OFF(gamma), "0", -100, 100, NULL, ROLE_MODEL},
    {"momentum", "learn_gamma", KEY_BOOL, OFF(learn_gamma), "false", 0, 1, NULL, ROLE_MODEL},
    {"momentum", "beta", KEY_DOUBLE, OFF(beta), "0", -1, 1, NULL, ROLE_MODEL},
    {"momentum", "gamma2", KEY_DOUBLE, OFF(gamma2), "0", -100, 100, NULL, ROLE_MODEL},
    {"momentum", "apply_to", KEY_ENUM, OFF(apply_to), "qk", 0, 0, "qk|q", ROLE_MODEL},
    {"momentum", "placement", KEY_ENUM, OFF(placement), "post_rope", 0, 0, "post_rope|pre_rope", ROLE_MODEL},
    {"momentum", "anchor", KEY_BOOL, OFF(anchor), "true", 0, 1, NULL, ROLE_MODEL},
    {"fmm", "bandwidth", KEY_INT, OFF(fmm_bandwidth), "5", 0, 1 << 24, NULL, ROLE_MODEL},
    {"fmm", "kernels", KEY_LIST, OFF(fmm_kernels), "elu", 0, 0, CONFIG_FMM_KERNELS, ROLE_MODEL},
    {"fmm", "eps", KEY_DOUBLE, OFF(fmm_eps), "1e-6", 1e-30, BIG, NULL, ROLE_MODEL},
    {"fmm", "chunk", KEY_INT, OFF(fmm_chunk), "16", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    {"data", "task", KEY_ENUM, OFF(task), "chain", 0, 0, "chain|copy|listops|text", ROLE_MODEL},
    {"data", "seq_len", KEY_INT, OFF(seq_len), "64", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "chain_len", KEY_INT, OFF(chain_len), "10", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "noise", KEY_DOUBLE, OFF(noise), "0", 0, 1, NULL, ROLE_MODEL},
    /* docs/tasks.md §2 chain: a period per sample, fillers between the chain
     * tokens; the length-generalisation eval only reads the model, so its
     * periods may change on resume */
    {"data", "chain_len_max", KEY_INT, OFF(chain_len_max), "0", 0, 1 << 24, NULL, ROLE_MODEL},
    {"data", "chain_noise", KEY_DOUBLE, OFF(chain_noise), "0", 0, 0.9, NULL, ROLE_MODEL},
    {"data", "chain_fillers", KEY_INT, OFF(chain_fillers), "16", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "eval_chain_len", KEY_INT, OFF(eval_chain_len), "0", 0, 1 << 24, NULL, ROLE_SCHEDULE},
    {"data", "eval_chain_len_max", KEY_INT, OFF(eval_chain_len_max), "0", 0, 1 << 24, NULL, ROLE_SCHEDULE},
    /* data.path as given (a schedule key: its text may change), and the
     * absolute path it named when the run started, which decides what is
     * read and must match on resume (docs/config.md §6) */
    {"data", "path", KEY_STRING, OFF(data_path), "", 0, 0, NULL, ROLE_SCHEDULE},
    {"data", "resolved_path", KEY_STRING, OFF(data_resolved), "", 0, 0, NULL, ROLE_MODEL},
    {"data", "eval_fraction", KEY_DOUBLE, OFF(eval_fraction), "0.1", 0, 1, NULL, ROLE_MODEL},
    /* the validation set, given and resolved as data.path is; when given, the
     * eval split (docs/tasks.md §2, validation set) */
    {"data", "eval_path", KEY_STRING, OFF(eval_path), "", 0, 0, NULL, ROLE_SCHEDULE},
    {"data", "resolved_eval_path", KEY_STRING, OFF(eval_resolved), "", 0, 0, NULL, ROLE_MODEL},
    /* what the files hold (docs/tasks.md §2, token files), and which files of
     * a directory count: both decide what is read, so both must match on resume */
    {"data", "format", KEY_ENUM, OFF(data_format), "auto", 0, 0, "auto|bytes|tokens", ROLE_MODEL},
    /* the sentencepiece model of token files (docs/tasks.md §2, tokenizer):
     * its path, made absolute at the start, and the checksum that must match */
    {"data", "tokenizer", KEY_STRING, OFF(tokenizer), "", 0, 0, NULL, ROLE_SCHEDULE},
    {"data", "tokenizer_checksum", KEY_STRING, OFF(tokenizer_checksum), "", 0, 0, NULL, ROLE_MODEL},
    {"data", "include", KEY_STRING, OFF(data_include), "", 0, 0, NULL, ROLE_MODEL},
    {"data", "exclude", KEY_STRING, OFF(data_exclude), "", 0, 0, NULL, ROLE_MODEL},
    {"data", "listops_min_len", KEY_INT, OFF(listops_min_len), "16", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "listops_max_len", KEY_INT, OFF(listops_max_len), "128", 1, 1 << 24, NULL, ROLE_MODEL},
    {"data", "listops_max_depth", KEY_INT, OFF(listops_max_depth), "10", 1, 64, NULL, ROLE_MODEL},
    {"data", "listops_max_args", KEY_INT, OFF(listops_max_args), "10", 2, 64, NULL, ROLE_MODEL},
    {"train", "steps", KEY_INT64, OFF(steps), "1000", 0, STEPS_MAX, NULL, ROLE_SCHEDULE},
    {"train", "batch_size", KEY_INT, OFF(batch_size), "16", 1, 1 << 24, NULL, ROLE_MODEL},
    {"train", "lr", KEY_DOUBLE, OFF(lr), "1e-3", 0, 1, NULL, ROLE_SCHEDULE},
    {"train", "min_lr", KEY_DOUBLE, OFF(min_lr), "0", 0, 1, NULL, ROLE_SCHEDULE},
    {"train", "warmup", KEY_INT, OFF(warmup), "0", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "schedule", KEY_ENUM, OFF(schedule), "cosine", 0, 0, "cosine|constant", ROLE_SCHEDULE},
    {"train", "weight_decay", KEY_DOUBLE, OFF(weight_decay), "0.01", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "beta1", KEY_DOUBLE, OFF(beta1), "0.9", 0, 0.999999, NULL, ROLE_SCHEDULE},
    {"train", "beta2", KEY_DOUBLE, OFF(beta2), "0.999", 0, 0.999999999, NULL, ROLE_SCHEDULE},
    {"train", "adam_eps", KEY_DOUBLE, OFF(adam_eps), "1e-8", 1e-30, BIG, NULL, ROLE_SCHEDULE},
    {"train", "grad_clip", KEY_DOUBLE, OFF(grad_clip), "1.0", 0, BIG, NULL, ROLE_SCHEDULE},
    {"train", "seed", KEY_INT64, OFF(seed), "1234", 0, BIG, NULL, ROLE_MODEL},
    {"train", "log_interval", KEY_INT, OFF(log_interval), "10", 1, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "eval_interval", KEY_INT, OFF(eval_interval), "100", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "eval_batches", KEY_INT, OFF(eval_batches), "4", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    /* docs/metrics.md §3: gain_R's perturbation passes cost about two
     * forwards per eval batch; auto measures them where they are read */
    {"train", "eval_readouts", KEY_ENUM, OFF(eval_readouts), "auto", 0, 0, "auto|true|false", ROLE_SCHEDULE},
    {"train", "eval_at_start", KEY_BOOL, OFF(eval_at_start), "false", 0, 1, NULL, ROLE_SCHEDULE},
    {"train", "ckpt_interval", KEY_INT, OFF(ckpt_interval), "0", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"train", "keep", KEY_INT, OFF(keep), "3", 1, 1 << 20, NULL, ROLE_SCHEDULE},
    {"train", "keep_best", KEY_BOOL, OFF(keep_best), "false", 0, 1, NULL, ROLE_SCHEDULE},
    {"train", "out_dir", KEY_STRING, OFF(out_dir), "runs/default", 0, 0, NULL, ROLE_SCHEDULE},
    {"train", "on_nonfinite", KEY_ENUM, OFF(on_nonfinite), "stop", 0, 0, "stop|skip", ROLE_SCHEDULE},
    /* docs/cli.md §5, full disk: steps whose state cannot be kept are not run unless asked */
    {"train", "on_save_failure", KEY_ENUM, OFF(on_save_failure), "stop", 0, 0, "stop|continue", ROLE_SCHEDULE},
    {"train", "micro_batch", KEY_INT, OFF(micro_batch), "0", 0, 1 << 24, NULL, ROLE_SCHEDULE},
    /* docs/scale.md §7: how the products run, not what the model is, so a
     * run may resume in another precision (with a warning) */
    {"train", "precision", KEY_ENUM, OFF(precision), "fp32", 0, 0, "fp32|bf16", ROLE_SCHEDULE},
    {"train", "gemm", KEY_ENUM, OFF(gemm), "auto", 0, 0, "openblas|onednn|auto|avx512", ROLE_SCHEDULE},
    /* docs/scale.md §7: what backward keeps, not what it computes (bitwise
     * the same gradients), so a run may resume with the other value */
    {"train", "recompute", KEY_ENUM, OFF(recompute), "none", 0, 0, "none|mlp|block", ROLE_SCHEDULE},
    {"dist", "bucket_mb", KEY_DOUBLE, OFF(bucket_mb), "4", 1e-3, 1e6, NULL, ROLE_SCHEDULE},
    {"dist", "overlap", KEY_BOOL, OFF(overlap), "true", 0, 1, NULL, ROLE_SCHEDULE},
    {"dist", "check_interval", KEY_INT, OFF(check_interval), "100", 0, 1 << 30, NULL, ROLE_SCHEDULE},
    {"dist", "zero", KEY_INT, OFF(zero), "0", 0, 1, NULL, ROLE_SCHEDULE},
    {"dist", "collective_io", KEY_BOOL, OFF(collective_io), "false", 0, 1, NULL, ROLE_SCHEDULE},
    {"dist", "timeout", KEY_DOUBLE, OFF(timeout), "300", 1, 1e6, NULL, ROLE_SCHEDULE},
    {"dist", "context", KEY_INT, OFF(context), "1", 1, 4096, NULL, ROLE_SCHEDULE},
    {"dist", "context_scan", KEY_ENUM, OFF(context_scan), "allgather", 0, 0, "allgather|exscan|ring", ROLE_SCHEDULE},
};
#define N_KEYS (sizeof(CONFIG_KEYS) / sizeof(CONFIG_KEYS[0]))
const size_t CONFIG_N_KEYS = N_KEYS;
_Static_assert(N_KEYS <= CONFIG_MAX_KEYS, "CONFIG_MAX_KEYS bounds the key table");

/* The limits that are not for taste (docs/config.md §6): open ones, and why
 * each is where it is, appended to a range message so that a refusal says
 * what the value would do. */
typedef struct {
    const char *section, *name;
    bool exclusive; /* (min, max) rather than [min, max] */
    const char *why;
} limit_note;

#define WHY_GAMMA "a shear of more than 100 times the velocity only drives the attention scores towards float overflow"
#define WHY_EPS "0 would make 0/0 of a sum whose terms all underflow"
static const limit_note LIMIT_NOTES[] = {
    {"momentum", "beta", true,
     "|beta| < 1: the velocity p_t = d_t + beta p_(t-1) grows as beta^t otherwise, and the first step's loss is NaN "
     "at T = 512 for beta = 2"},
    {"momentum", "gamma", false, WHY_GAMMA},
    {"momentum", "gamma2", false, WHY_GAMMA},
    {"fmm", "eps", false, WHY_EPS},
    {"train", "adam_eps", false, WHY_EPS},
    {"train", "lr", false,
     "an AdamW step moves every weight by about lr: at 10 the loss runs into the thousands, at 1e6 to NaN"},
    {"train", "steps", false, "steps are stored as doubles in the metric tables, exact up to 2^53"},
};

static const limit_note *note_of(const config_key *key) {
    for (size_t i = 0; i < sizeof LIMIT_NOTES / sizeof LIMIT_NOTES[0]; i++)
        if (!strcmp(LIMIT_NOTES[i].section, key->section) && !strcmp(LIMIT_NOTES[i].name, key->name))
            return &LIMIT_NOTES[i];
    return NULL;
}

static const config_key *find_key(const char *section, const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(CONFIG_KEYS[i].section, section) && !strcmp(CONFIG_KEYS[i].name, name)) return &CONFIG_KEYS[i];
    return NULL;
}

/* The first CONFIG_KEYS row of a section (its index stands for the section), or -1. */
static int section_index(const char *section) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(CONFIG_KEYS[i].section, section)) return (int)i;
    return -1;
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

typedef enum { SET_OK, SET_SYNTAX, SET_RANGE, SET_HUGE, SET_TOO_LONG, SET_CHOICE, SET_LIST } set_result;

/* "elu, elu_flip": names of `choices` separated by commas (blanks around
 * them ignored); a blank value is the empty list. */
static set_result parse_list(const char *choices, const char *value, config_list *out) {
    config_list list = {0};
    const char *p = value + strspn(value, " \t");
    while (*p) {
        size_t n = strcspn(p, ","), len = n;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        char name[64];
        if (len == 0 || len >= sizeof name || list.n == CONFIG_LIST_MAX) return SET_LIST;
        memcpy(name, p, len);
        name[len] = '\0';
        int index = parse_enum(choices, name);
        if (index < 0) return SET_LIST;
        list.items[list.n++] = index;
        if (!p[n]) break;
        p += n + 1;
        p += strspn(p, " \t");
        if (!*p) return SET_LIST; /* a trailing comma names an empty item */
    }
    *out = list;
    return SET_OK;
}

/* The first item of `value` that parse_list refuses, into out. */
static void bad_list_item(const char *choices, const char *value, char *out, size_t len) {
    const char *p = value;
    int n = 0;
    for (;;) {
        size_t k = strcspn(p, ",");
        const char *a = p, *b = p + k;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        char name[64] = "";
        if ((size_t)(b - a) < sizeof name) memcpy(name, a, (size_t)(b - a)), name[b - a] = '\0';
        if (n == CONFIG_LIST_MAX || !name[0] || parse_enum(choices, name) < 0) {
            snprintf(out, len, "%.*s", (int)(b - a), a);
            return;
        }
        n++;
        if (!p[k]) break;
        p += k + 1;
    }
    snprintf(out, len, "%s", "");
}

/* Whether v lies outside the key's limits, closed or open. */
static bool outside(const config_key *key, double v) {
    const limit_note *note = note_of(key);
    return v < key->min || v > key->max || (note && note->exclusive && (v == key->min || v == key->max));
}

/* Stores `value` into the field of `key`. */
static set_result set_value(config *c, const config_key *key, const char *value) {
    char *field = (char *)c + key->offset;
    char *end = NULL;
    errno = 0;
    switch (key->type) {
    case KEY_INT:
    case KEY_INT64: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end) return SET_SYNTAX;
        if (errno == ERANGE || outside(key, (double)v)) return SET_RANGE;
        if (key->type == KEY_INT) *(int *)field = (int)v;
        else *(long long *)field = v;
        return SET_OK;
    }
    case KEY_DOUBLE: {
        double v = strtod(value, &end);
        if (end == value || *end) return SET_SYNTAX;
        /* 1e400 or 1e-400: a number, but not one a double holds */
        if (errno == ERANGE && (isinf(v) || v == 0)) return SET_HUGE;
        if (!isfinite(v)) return SET_SYNTAX;
        if (outside(key, v)) return SET_RANGE;
        *(double *)field = v;
        return SET_OK;
    }
    case KEY_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes")) *(bool *)field = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no")) *(bool *)field = false;
        else return SET_CHOICE;
        return SET_OK;
    case KEY_STRING:
        if (strlen(value) >= key->size) return SET_TOO_LONG;
        strcpy(field, value);
        return SET_OK;
    case KEY_ENUM: {
        int v = parse_enum(key->choices, value);
        if (v < 0) return SET_CHOICE;
        *(int *)field = v;
        return SET_OK;
    }
    case KEY_LIST: return parse_list(key->choices, value, (config_list *)field);
    }
    return SET_SYNTAX;
}

/* A default that does not parse is a bug in CONFIG_KEYS, not an input error: the unit
 * test runs config_check_defaults, so config_defaults itself cannot fail. */
void config_defaults(config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++) set_value(c, &CONFIG_KEYS[i], CONFIG_KEYS[i].fallback);
}

int config_check_defaults(status *st) {
    config c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < N_KEYS; i++)
        if (set_value(&c, &CONFIG_KEYS[i], CONFIG_KEYS[i].fallback) != SET_OK)
            return status_fail(st, 1, "internal: default of %s.%s does not parse", CONFIG_KEYS[i].section,
                               CONFIG_KEYS[i].name);
    return 0;
}

bool config_numeric_key_at(size_t i, config_numeric_key *out) {
    for (size_t k = 0, seen = 0; k < N_KEYS; k++) {
        const config_key *key = &CONFIG_KEYS[k];
        if (key->type != KEY_INT && key->type != KEY_INT64 && key->type != KEY_DOUBLE) continue;
        if (seen++ != i) continue;
        const limit_note *note = note_of(key);
        *out = (config_numeric_key){
            .min = key->min, .max = key->max, .integer = key->type != KEY_DOUBLE, .exclusive = note && note->exclusive};
        snprintf(out->name, sizeof out->name, "%s.%s", key->section, key->name);
        return true;
    }
    return false;
}

/* The value as typed for a message: control bytes as \xNN (a file's bytes
 * stay out of the terminal), cut with "..." after about 57 characters. */
const char *config_shown(const char *value, char *buf, size_t len) {
    const unsigned char *p = (const unsigned char *)value;
    size_t j = 0, i = 0, limit = strlen(value) <= 60 ? 60 : 57;
    for (; p[i] && i < limit && j + 8 <= len; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f) j += (size_t)snprintf(buf + j, len - j, "\\x%02x", p[i]);
        else buf[j++] = (char)p[i];
    }
    snprintf(buf + j, len - j, "%s", p[i] ? "..." : "");
    return buf;
}

/* Here, not in config_format.c beside the other formatting: that file
 * reads this one's key table, and the range messages below need this, so
 * the two files would each call the other. %.17g always round-trips, so
 * the loop ends by 17 at the latest; infinities and NaN print as %g does.
 * Whole numbers below 1e16 keep their digits (10000, not 1e+04). */
char *config_format_double(double x, char *out, size_t len) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, len, "%.*g", digits, x);
        if (isnan(x) || strtod(out, NULL) == x) break;
    }
    if (strchr(out, 'e') && x == floor(x) && fabs(x) < 1e16) snprintf(out, len, "%.0f", x);
    return out;
}

/* "must be >= 0 (at most 1e+18)", "must be in [1, 4096]", "must be in
 * (-1, 1) (why)": a limit at +-BIG is named last, since a value beyond it
 * (1e19) is refused too and the message must say why. */
static void describe_range(const config_key *key, char *out, size_t len) {
    char lo[32], hi[32];
    config_format_double(key->min, lo, sizeof lo);
    config_format_double(key->max, hi, sizeof hi);
    const limit_note *note = note_of(key);
    int n;
    if (key->max >= BIG && key->min <= -BIG) n = snprintf(out, len, "must be in [%s, %s]", lo, hi);
    else if (key->max >= BIG) n = snprintf(out, len, "must be >= %s (at most %s)", lo, hi);
    else if (key->min <= -BIG) n = snprintf(out, len, "must be <= %s (at least %s)", hi, lo);
    else if (note && note->exclusive) n = snprintf(out, len, "must be in (%s, %s)", lo, hi);
    else n = snprintf(out, len, "must be in [%s, %s]", lo, hi);
    if (note && n >= 0 && (size_t)n < len) snprintf(out + n, len - (size_t)n, ": %s", note->why);
}

/* Why `value` does not fit `key`, as "section.key = value ..." text. */
static void describe_bad_value(const config_key *key, const char *value, set_result why, char *out, size_t len) {
    char cut[64], detail[160];
    const char *v = config_shown(value, cut, sizeof cut);
    switch (why) {
    case SET_RANGE:
        describe_range(key, detail, sizeof detail);
        snprintf(out, len, "%s.%s = %s is out of range: %s", key->section, key->name, v, detail);
        return;
    case SET_HUGE:
        describe_range(key, detail, sizeof detail);
        snprintf(out, len, "%s.%s = %s is out of range: beyond what a double holds (%s)", key->section, key->name, v,
                 detail);
        return;
    case SET_TOO_LONG:
        snprintf(out, len, "%s.%s = '%s': longer than %zu characters", key->section, key->name, v, key->size - 1);
        return;
    case SET_LIST: {
        char item[64], names[256];
        bad_list_item(key->choices, value, item, sizeof item);
        snprintf(names, sizeof names, "%s", key->choices);
        for (char *bar = strchr(names, '|'); bar; bar = strchr(bar, '|')) *bar = ',';
        config_suggest_choice(key->choices, item, detail, sizeof detail);
        snprintf(out, len, "%s.%s = '%s': '%s' is not one of %s, or more than %d names%s", key->section, key->name, v,
                 item, names, CONFIG_LIST_MAX, detail);
        return;
    }
    case SET_CHOICE: {
        const char *choices = key->type == KEY_BOOL ? "true|false" : key->choices;
        config_suggest_choice(choices, value, detail, sizeof detail);
        if (key->type == KEY_BOOL)
            snprintf(out, len, "%s.%s = '%s': expected true or false%s", key->section, key->name, v, detail);
        else
            snprintf(out, len, "%s.%s = '%s': not one of the allowed values (allowed: %s)%s", key->section, key->name,
                     v, key->choices, detail);
        return;
    }
    default:
        snprintf(out, len, "%s.%s = '%s': expected %s", key->section, key->name, v,
                 key->type == KEY_DOUBLE ? "a number" : "an integer");
    }
}

/* One parse: the file (or --set) being read, the line, and where each key
 * and section was first set, so that a repeat names both lines. */
typedef struct {
    config *c;
    const char *origin;
    int line;                 /* 0 for --set */
    char *section;            /* current [section], NULL before the first */
    int key_line[N_KEYS];     /* line that set CONFIG_KEYS[i], 0 = not yet */
    int section_line[N_KEYS]; /* by section_index */
    status *st;
} parse_state;

/* "<origin>:<line>: <message>" (or "--set <message>"): returns EXIT_USAGE. */
static int reject(parse_state *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int reject(parse_state *ps, const char *fmt, ...) {
    char message[sizeof ps->st->message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    if (ps->line > 0) return status_fail(ps->st, EXIT_USAGE, "%s:%d: %s", ps->origin, ps->line, message);
    return status_fail(ps->st, EXIT_USAGE, "%s %s", ps->origin, message);
}

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(sys_calloc(n, 1), s, n);
}

static int assign(parse_state *st, const char *name, const char *value) {
    char hint[160], cut[64];
    if (!st->section) {
        config_suggest_key("", name, hint, sizeof hint);
        return reject(st, "key %s is outside any [section]%s", config_shown(name, cut, sizeof cut), hint);
    }
    const config_key *key = find_key(st->section, name);
    if (!key) {
        config_suggest_key(st->section, name, hint, sizeof hint);
        if (section_index(st->section) < 0) {
            if (!hint[0]) config_suggest_section(st->section, hint, sizeof hint);
            return reject(st, "unknown section [%s] (key %s)%s", st->section, config_shown(name, cut, sizeof cut),
                          hint);
        }
        return reject(st, "unknown key %s.%s%s", st->section, config_shown(name, cut, sizeof cut), hint);
    }
    size_t index = (size_t)(key - CONFIG_KEYS);
    if (st->line > 0 && st->key_line[index])
        return reject(st, "duplicate key %s.%s (first set at line %d)", key->section, key->name, st->key_line[index]);
    st->key_line[index] = st->line;
    /* a quoted value (docs/config.md §6, escaping) is decoded first */
    char *text = copy_string(value), bad[128];
    if (ini_unquote(text, bad, sizeof bad) != 0) {
        free(text);
        return reject(st, "%s.%s = %s: bad quoted value: %s", key->section, key->name,
                      config_shown(value, cut, sizeof cut), bad);
    }
    set_result why = set_value(st->c, key, text);
    char message[1024];
    if (why != SET_OK) describe_bad_value(key, text, why, message, sizeof message);
    free(text);
    if (why == SET_OK) return 0;
    return reject(st, "%s", message);
}

/* ini_handlers of a config file: a known section may appear once. */
static int on_section(void *ctx, int line, const char *name) {
    parse_state *st = ctx;
    st->line = line;
    free(st->section);
    st->section = copy_string(name);
    int index = section_index(st->section);
    if (index < 0) return 0; /* reported with its first key, which names both */
    if (st->section_line[index])
        return reject(st, "duplicate section [%s] (first at line %d)", st->section, st->section_line[index]);
    st->section_line[index] = st->line;
    return 0;
}

static int on_pair(void *ctx, int line, const char *key, const char *value) {
    parse_state *st = ctx;
    st->line = line;
    return assign(st, key, value);
}

static int on_malformed(void *ctx, int line, const char *text) {
    parse_state *st = ctx;
    char cut[64];
    st->line = line;
    return reject(st, "malformed line (expected [section] or key = value): %s", config_shown(text, cut, sizeof cut));
}

int config_load_string(config *c, const char *text, const char *origin, status *st) {
    parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.c = c, ps.origin = origin, ps.st = st;
    status_clear(st);
    ini_handlers h = {on_section, on_pair, on_malformed, &ps};
    int rc = ini_parse(text, &h);
    free(ps.section);
    return rc;
}

int config_load_file(config *c, const char *path, status *st) {
    char *text = ini_read_file(path, st);
    if (!text) return EXIT_USAGE;
    int rc = config_load_string(c, text, path, st);
    free(text);
    return rc;
}

/* s without its leading and trailing blanks, in place. */
static char *strip_blanks(char *s) {
    s += strspn(s, " \t");
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    return s;
}

int config_apply_override(config *c, const char *assignment, status *st) {
    const char *eq = strchr(assignment, '=');
    const char *dot = strchr(assignment, '.');
    char cut[64];
    if (!eq || !dot || dot > eq) {
        char hint[160] = "";
        if (eq) {
            char *copy = copy_string(assignment);
            copy[eq - assignment] = '\0';
            char *name = strip_blanks(copy);
            char meant[96];
            config_qualify_key(name, meant, sizeof meant);
            if (meant[0]) snprintf(hint, sizeof hint, "; did you mean %s=%.40s?", meant, eq + 1);
            free(copy);
        }
        return status_fail(st, EXIT_USAGE, "--set %s: expected section.key=value%s",
                           config_shown(assignment, cut, sizeof cut), hint);
    }
    /* "train.lr = 0.01": blanks around the names and the value are not theirs */
    char *copy = copy_string(assignment);
    copy[dot - assignment] = copy[eq - assignment] = '\0';
    parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.c = c, ps.origin = "--set", ps.st = st;
    ps.section = copy_string(strip_blanks(copy));
    int rc = assign(&ps, strip_blanks(copy + (dot - assignment) + 1), strip_blanks(copy + (eq - assignment) + 1));
    free(ps.section);
    free(copy);
    return rc;
}
