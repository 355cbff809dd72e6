/* The table of config keys (docs/config.md §6), shared by the files of the
 * config module only: config.c owns the table and parses with it,
 * config_format.c formats and compares configs with it, config_suggest.c
 * finds the key or section a mistyped name meant. Not a public header:
 * everyone else goes through momfmm/config.h. */
#ifndef MOMFMM_CONFIG_TABLE_H
#define MOMFMM_CONFIG_TABLE_H

#include <stddef.h>

typedef enum { KEY_INT, KEY_INT64, KEY_DOUBLE, KEY_BOOL, KEY_STRING, KEY_ENUM, KEY_LIST } config_key_type;

/* Whether a key must agree between a checkpoint and a resumed run. */
typedef enum { ROLE_SCHEDULE = 0, ROLE_MODEL = 1 } config_key_role;

typedef struct {
    const char *section, *name;
    config_key_type type;
    size_t offset, size;  /* size: string capacity */
    const char *fallback; /* default, as INI text */
    double min, max;      /* numeric limits, inclusive */
    const char *choices;  /* KEY_ENUM, KEY_LIST: "a|b|c", index = stored value */
    config_key_role role;
} config_key;

extern const config_key CONFIG_KEYS[];
extern const size_t CONFIG_N_KEYS;
#define CONFIG_MAX_KEYS 256 /* a bound for arrays over the table (checked in config.c) */

/* config_suggest.c: "; did you mean ...?" for an unknown key (an alias
 * first), an unknown section, a mistyped choice of "a|b|c"; or "". */
void config_suggest_key(const char *section, const char *name, char *out, size_t len);
void config_suggest_section(const char *section, char *out, size_t len);
void config_suggest_choice(const char *choices, const char *value, char *out, size_t len);
/* "section.key" that a bare key name means (an alias, or its own name in a
 * section), or "". */
void config_qualify_key(const char *name, char *out, size_t len);

/* The value as typed for a message: control bytes as \xNN, cut with "..." */
const char *config_shown(const char *value, char *buf, size_t len);

#endif
