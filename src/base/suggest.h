/* "Did you mean" for unknown commands, options, sections, keys and values
 * (docs/cli.md §5, docs/config.md §6): the closest known word by edit
 * distance, or the target of a known alias. */
#ifndef MOMFMM_SUGGEST_H
#define MOMFMM_SUGGEST_H
#include <stdbool.h>
#include <stddef.h>

/* Optimal-string-alignment distance: insertions, deletions, substitutions
 * and swaps of adjacent characters each count 1 ("trian" -> "train" is 1).
 * Returns a value above `limit` as soon as the distance must exceed it. */
int suggest_distance(const char *a, const char *b, int limit);

/* Close enough to offer `known` for `typed`: at most 2 edits, and fewer than
 * half the longer word's characters ("lr" is not offered for "ab"). */
bool suggest_is_close(const char *typed, const char *known, int distance);

/* The closest of n candidates that is close enough, or NULL; the first
 * one wins a tie. */
const char *suggest_closest(const char *typed, const char *const *candidates, size_t n);

/* An alias table: rows {typed, meant}, ended by {NULL, NULL}. */
typedef struct {
    const char *typed, *meant;
} suggest_alias;

/* `meant` of the row whose `typed` equals the word, or NULL. */
const char *suggest_alias_lookup(const suggest_alias *aliases, const char *typed);
#endif
