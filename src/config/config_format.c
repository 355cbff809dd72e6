/* A config as text (docs/config.md §6): each key's value formatted as INI reads
 * it back, the resolved `config_ini` a checkpoint stores, and the comparisons
 * of two configs that resume and `--init` report. The key table and parsing
 * are in config.c; these only read the table. */
#include "config/config.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"
#include "config/ini.h"

#include "config_table.h"

/* The name of choice `index` of "a|b|c". */
static void choice_name(const char *choices, int index, char *out, size_t len) {
    const char *p = choices;
    for (int i = 0; i < index && p; i++) p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL;
    size_t n = p ? strcspn(p, "|") : 0;
    snprintf(out, len, "%.*s", (int)n, p ? p : "");
}

static void format_value(const config *c, const config_key *key, char *out, size_t len) {
    const char *field = (const char *)c + key->offset;
    switch (key->type) {
    case KEY_INT: snprintf(out, len, "%d", *(const int *)field); break;
    case KEY_INT64: snprintf(out, len, "%lld", *(const long long *)field); break;
    case KEY_DOUBLE: config_format_double(*(const double *)field, out, len); break;
    case KEY_BOOL: snprintf(out, len, "%s", *(const bool *)field ? "true" : "false"); break;
    case KEY_STRING: { /* quoted when it would not read back verbatim (docs/config.md §6) */
        char *quoted = ini_quote(field);
        snprintf(out, len, "%s", quoted);
        free(quoted);
        break;
    }
    case KEY_ENUM: choice_name(key->choices, *(const int *)field, out, len); break;
    case KEY_LIST: {
        const config_list *list = (const config_list *)field;
        size_t used = 0;
        out[0] = '\0';
        for (int i = 0; i < list->n && used < len; i++) {
            char name[64];
            choice_name(key->choices, list->items[i], name, sizeof name);
            used += (size_t)snprintf(out + used, len - used, "%s%s", i ? "," : "", name);
        }
        break;
    }
    }
}

char *config_to_ini(const config *c) {
    size_t cap = 64 + CONFIG_N_KEYS * (CONFIG_VALUE_MAX + 64), len = 0;
    char *text = sys_calloc(cap, 1);
    const char *section = "";
    for (size_t i = 0; i < CONFIG_N_KEYS; i++) {
        if (strcmp(section, CONFIG_KEYS[i].section) != 0) {
            section = CONFIG_KEYS[i].section;
            len += (size_t)snprintf(text + len, cap - len, "%s[%s]\n", len ? "\n" : "", section);
        }
        char value[CONFIG_VALUE_MAX];
        format_value(c, &CONFIG_KEYS[i], value, sizeof value);
        len += (size_t)snprintf(text + len, cap - len, "%s = %s\n", CONFIG_KEYS[i].name, value);
    }
    return text;
}

/* "section.key: a vs b; ..." for every key of the table where `wanted` holds
 * and the two configs differ; returns how many differ. */
static int compare_where(const config *a, const config *b, bool (*wanted)(const config_key *), char *out,
                         size_t out_len) {
    int differing = 0;
    size_t len = 0;
    if (out_len) out[0] = '\0';
    for (size_t i = 0; i < CONFIG_N_KEYS; i++) {
        if (!wanted(&CONFIG_KEYS[i])) continue;
        char va[CONFIG_VALUE_MAX], vb[CONFIG_VALUE_MAX];
        format_value(a, &CONFIG_KEYS[i], va, sizeof va);
        format_value(b, &CONFIG_KEYS[i], vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        differing++;
        if (len < out_len)
            len += (size_t)snprintf(out + len, out_len - len, "%s%s.%s: %s vs %s", differing > 1 ? "; " : "",
                                    CONFIG_KEYS[i].section, CONFIG_KEYS[i].name, va, vb);
    }
    return differing;
}

static bool is_model_key(const config_key *k) { return k->role == ROLE_MODEL; }
static bool is_any_key(const config_key *k) { return k != NULL; }

int config_first_difference(const config *a, const config *b, char *out, size_t out_len) {
    for (size_t i = 0; i < CONFIG_N_KEYS; i++) {
        char va[CONFIG_VALUE_MAX], vb[CONFIG_VALUE_MAX];
        format_value(a, &CONFIG_KEYS[i], va, sizeof va);
        format_value(b, &CONFIG_KEYS[i], vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        char ca[64], cb[64];
        snprintf(out, out_len, "%s.%s = %s vs %s", CONFIG_KEYS[i].section, CONFIG_KEYS[i].name,
                 config_shown(va, ca, sizeof ca), config_shown(vb, cb, sizeof cb));
        return compare_where(a, b, is_any_key, NULL, 0);
    }
    if (out_len) out[0] = '\0';
    return 0;
}
static bool is_schedule_key(const config_key *k) { return k->role != ROLE_MODEL; }

int config_compare_keys(const config *a, const config *b, bool model_keys, char *out, size_t out_len) {
    return compare_where(a, b, model_keys ? is_model_key : is_schedule_key, out, out_len);
}

static bool is_architecture_key(const config_key *k) {
    return k->role == ROLE_MODEL && strcmp(k->section, "data") != 0 && strcmp(k->section, "train") != 0 &&
           strcmp(k->section, "dist") != 0;
}

int config_compare_architecture(const config *a, const config *b, char *out, size_t out_len) {
    return compare_where(a, b, is_architecture_key, out, out_len);
}
