/* "Did you mean" for the config (docs/config.md §6: suggestions): aliases
 * people bring from other trainers, the closest key, section or choice.
 * Part of the config module: config.c calls these while parsing. */
#include <stdio.h>
#include <string.h>

#include "base/suggest.h"

#include "config_table.h"

/* Names people bring from other trainers (docs/config.md §6: suggestions). */
static const suggest_alias KEY_ALIASES[] = {
    {"learning_rate", "train.lr"},
    {"learningrate", "train.lr"},
    {"max_lr", "train.lr"},
    {"n_head", "model.n_heads"},
    {"num_heads", "model.n_heads"},
    {"nhead", "model.n_heads"},
    {"n_layer", "model.n_layers"},
    {"num_layers", "model.n_layers"},
    {"depth", "model.n_layers"},
    {"vocab", "model.vocab_size"},
    {"n_vocab", "model.vocab_size"},
    {"hidden_size", "model.d_model"},
    {"n_embd", "model.d_model"},
    {"dim", "model.d_model"},
    {"ffn_dim", "model.d_ff"},
    {"intermediate_size", "model.d_ff"},
    {"batch", "train.batch_size"},
    {"bs", "train.batch_size"},
    {"max_steps", "train.steps"},
    {"num_steps", "train.steps"},
    {"iterations", "train.steps"},
    {"warmup_steps", "train.warmup"},
    {"max_grad_norm", "train.grad_clip"},
    {"clip", "train.grad_clip"},
    {"wd", "train.weight_decay"},
    {"output_dir", "train.out_dir"},
    {"run_dir", "train.out_dir"},
    {"seq_length", "data.seq_len"},
    {"block_size", "data.seq_len"},
    {"context_length", "data.seq_len"},
    {"momentum", "momentum.gamma"},
    {"attention", "attention.kind"},
    {NULL, NULL},
};

/* "; did you mean section.key?" for an unknown key, or "": an alias first,
 * then the key whose name is closest, counting a different section as one
 * more edit (so "[modle] n_heads" finds model.n_heads). */
void config_suggest_key(const char *section, const char *name, char *out, size_t len) {
    const char *alias = suggest_alias_lookup(KEY_ALIASES, name);
    if (alias) {
        snprintf(out, len, "; did you mean %s?", alias);
        return;
    }
    const config_key *best = NULL;
    int best_score = 3;
    for (size_t i = 0; i < CONFIG_N_KEYS; i++) {
        int d = suggest_distance(name, CONFIG_KEYS[i].name, 2);
        int score = d + (strcmp(section, CONFIG_KEYS[i].section) != 0);
        if (score < best_score && suggest_is_close(name, CONFIG_KEYS[i].name, d))
            best = &CONFIG_KEYS[i], best_score = score;
    }
    if (best) snprintf(out, len, "; did you mean %s.%s?", best->section, best->name);
    else out[0] = '\0';
}

/* "; did you mean [section]?" for an unknown section, or "". */
void config_suggest_section(const char *section, char *out, size_t len) {
    /* every row's section: a repeated one ties with itself */
    const char *names[CONFIG_MAX_KEYS];
    for (size_t i = 0; i < CONFIG_N_KEYS; i++) names[i] = CONFIG_KEYS[i].section;
    const char *best = suggest_closest(section, names, CONFIG_N_KEYS);
    if (best) snprintf(out, len, "; did you mean [%s]?", best);
    else out[0] = '\0';
}

/* "; did you mean chain?" for a mistyped word of "a|b|c", or "". */
void config_suggest_choice(const char *choices, const char *value, char *out, size_t len) {
    char words[256];
    const char *list[16];
    size_t n = 0;
    snprintf(words, sizeof words, "%s", choices);
    for (char *w = strtok(words, "|"); w && n < 16; w = strtok(NULL, "|")) list[n++] = w;
    const char *best = suggest_closest(value, list, n);
    if (best) snprintf(out, len, "; did you mean %s?", best);
    else out[0] = '\0';
}

/* "section.key" for a bare key name (--set lr=0.1): an alias, else the key
 * of that name in the last section that has one; or "". */
void config_qualify_key(const char *name, char *out, size_t len) {
    const char *alias = suggest_alias_lookup(KEY_ALIASES, name);
    out[0] = '\0';
    for (size_t i = 0; !alias && i < CONFIG_N_KEYS; i++)
        if (!strcmp(CONFIG_KEYS[i].name, name)) snprintf(out, len, "%s.%s", CONFIG_KEYS[i].section, name);
    if (alias) snprintf(out, len, "%s", alias);
}
