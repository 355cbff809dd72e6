/* Suggestions for mistyped words (docs/cli.md §5, docs/config.md §6). The
 * words compared are short (commands, options, keys), but a typed word may
 * be a whole long config line, so the distance stops early when the lengths
 * alone rule a match out. */
#include "base/suggest.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"

static int min3(int a, int b, int c) {
    int m = a < b ? a : b;
    return m < c ? m : c;
}

/* Three rows of the dynamic programme: the swap looks two rows back. */
int suggest_distance(const char *a, const char *b, int limit) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (abs(la - lb) > limit) return limit + 1;
    int *rows = sys_calloc(3 * ((size_t)lb + 1), sizeof(int));
    int *before = rows, *previous = rows + lb + 1, *current = rows + 2 * (lb + 1);
    for (int j = 0; j <= lb; j++) previous[j] = j;
    for (int i = 1; i <= la; i++) {
        current[0] = i;
        for (int j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            current[j] = min3(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && before[j - 2] + 1 < current[j])
                current[j] = before[j - 2] + 1;
        }
        int *spare = before;
        before = previous, previous = current, current = spare;
    }
    int distance = previous[lb];
    free(rows);
    return distance;
}

bool suggest_is_close(const char *typed, const char *known, int distance) {
    size_t longer = strlen(typed) > strlen(known) ? strlen(typed) : strlen(known);
    return distance <= 2 && (size_t)(2 * distance) < longer;
}

const char *suggest_closest(const char *typed, const char *const *candidates, size_t n) {
    const char *best = NULL;
    int best_distance = 3;
    for (size_t i = 0; i < n; i++) {
        int d = suggest_distance(typed, candidates[i], 2);
        if (d < best_distance && suggest_is_close(typed, candidates[i], d)) best = candidates[i], best_distance = d;
    }
    return best;
}

const char *suggest_alias_lookup(const suggest_alias *aliases, const char *typed) {
    for (const suggest_alias *a = aliases; a->typed; a++)
        if (!strcmp(a->typed, typed)) return a->meant;
    return NULL;
}
