/* ListOps generator and evaluator (docs/tasks.md §2, after LRA's listops.py). */
#include "data/listops.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

typedef struct {
    uint64_t key, counter;
    const listops_limits *lim;
    int32_t *out;
    int len, cap;
    bool overflow;
} generator;

static void emit(generator *g, int32_t token) {
    if (g->len < g->cap) g->out[g->len] = token;
    else g->overflow = true;
    g->len++;
}

/* LRA: below max_depth a value with probability 0.75, else an operator. */
static void generate_tree(generator *g, int depth) {
    bool value = depth >= g->lim->max_depth || rng_uniform(g->key, g->counter++) > 0.25;
    if (value) {
        emit(g, LISTOPS_DIGIT0 + (int32_t)rng_below(g->key, g->counter++, 10));
        return;
    }
    emit(g, LISTOPS_MIN + (int32_t)rng_below(g->key, g->counter++, 4));
    int n_args = 2 + (int)rng_below(g->key, g->counter++, (uint32_t)(g->lim->max_args - 1));
    for (int i = 0; i < n_args && g->len <= g->lim->max_len; i++) generate_tree(g, depth + 1);
    emit(g, LISTOPS_CLOSE);
}

static int compare_ints(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Evaluates the expression starting at *pos; -1 if malformed. */
static int evaluate_at(const int32_t *tokens, int length, int *pos) {
    if (*pos >= length) return -1;
    int32_t t = tokens[(*pos)++];
    if (t >= LISTOPS_DIGIT0 && t < LISTOPS_DIGIT0 + 10) return t - LISTOPS_DIGIT0;
    if (t < LISTOPS_MIN || t > LISTOPS_SM) return -1;
    int args[256], n = 0;
    while (*pos < length && tokens[*pos] != LISTOPS_CLOSE) {
        int v = evaluate_at(tokens, length, pos);
        if (v < 0 || n == 256) return -1;
        args[n++] = v;
    }
    if (*pos >= length || n == 0) return -1;
    (*pos)++; /* ']' */
    int result = args[0], sum = 0;
    for (int i = 0; i < n; i++) {
        if (t == LISTOPS_MIN && args[i] < result) result = args[i];
        if (t == LISTOPS_MAX && args[i] > result) result = args[i];
        sum += args[i];
    }
    if (t == LISTOPS_SM) return sum % 10;
    if (t == LISTOPS_MED) {
        /* LRA: int(np.median(args)), the mean of the middle two when n is even, truncated */
        qsort(args, (size_t)n, sizeof(int), compare_ints);
        return n % 2 ? args[n / 2] : (args[n / 2 - 1] + args[n / 2]) / 2;
    }
    return result;
}

int listops_evaluate(const int32_t *tokens, int length) {
    int pos = 0;
    int v = evaluate_at(tokens, length, &pos);
    return pos == length ? v : -1;
}

long long listops_longest(const listops_limits *lim) {
    /* a node at depth >= max_depth is a digit; above, an operator with
     * max_args arguments one level down; saturated well above any T */
    long long length = 1;
    for (int depth = lim->max_depth - 1; depth >= 0; depth--) {
        long long op = 2 + (long long)lim->max_args * length;
        length = op < (1LL << 40) ? op : (1LL << 40);
    }
    return length;
}

int listops_generate(uint64_t key, const listops_limits *lim, int T, int32_t *tokens, int *length) {
    int cap = lim->max_len < T ? lim->max_len : T;
    for (uint64_t attempt = 0; attempt < LISTOPS_MAX_ATTEMPTS; attempt++) {
        generator g = {rng_key(key, attempt, 0x11, 0), 0, lim, tokens, 0, cap, false};
        /* the root is always an operator, as in LRA's data */
        emit(&g, LISTOPS_MIN + (int32_t)rng_below(g.key, g.counter++, 4));
        int n_args = 2 + (int)rng_below(g.key, g.counter++, (uint32_t)(lim->max_args - 1));
        for (int i = 0; i < n_args && g.len <= cap; i++) generate_tree(&g, 1);
        emit(&g, LISTOPS_CLOSE);
        if (g.overflow || g.len < lim->min_len || g.len > cap) continue;
        for (int t = g.len; t < T; t++) tokens[t] = LISTOPS_PAD;
        *length = g.len;
        return listops_evaluate(tokens, g.len);
    }
    *length = 0;
    return -1;
}

int listops_tokenize(const char *source, int32_t *tokens, int T) {
    static const struct {
        const char *word;
        int32_t token;
    } words[] = {
        {"[MIN", LISTOPS_MIN}, {"[MAX", LISTOPS_MAX}, {"[MED", LISTOPS_MED}, {"[SM", LISTOPS_SM}, {"]", LISTOPS_CLOSE},
    };
    int n = 0;
    const char *p = source;
    while (*p) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || *p == '\n' || *p == '\r') break;
        size_t len = strcspn(p, " \t\r\n");
        int32_t token = -1;
        if (len == 1 && (*p == '(' || *p == ')')) token = -2;
        else if (len == 1 && *p >= '0' && *p <= '9') token = LISTOPS_DIGIT0 + (*p - '0');
        for (size_t w = 0; w < sizeof words / sizeof words[0] && token == -1; w++)
            if (strlen(words[w].word) == len && strncmp(p, words[w].word, len) == 0) token = words[w].token;
        if (token == -1) return LISTOPS_UNKNOWN_WORD;
        if (token >= 0 && n == T) return LISTOPS_TOO_LONG;
        if (token >= 0) tokens[n++] = token;
        p += len;
    }
    for (int t = n; t < T; t++) tokens[t] = LISTOPS_PAD;
    return n;
}
