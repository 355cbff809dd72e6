/* ListOps (docs/tasks.md §2, after LRA): nested MIN/MAX/MED/SM expressions over
 * digits, classified by their value (10 classes). */
#ifndef MOMFMM_LISTOPS_H
#define MOMFMM_LISTOPS_H
#include <stdint.h>

/* Token ids: 0 pad, 1..10 the digits 0..9, then the operators and ']'. */
enum {
    LISTOPS_PAD = 0,
    LISTOPS_DIGIT0 = 1,
    LISTOPS_MIN = 11,
    LISTOPS_MAX = 12,
    LISTOPS_MED = 13,
    LISTOPS_SM = 14,
    LISTOPS_CLOSE = 15,
    LISTOPS_VOCAB = 16
};

typedef struct {
    int min_len, max_len, max_depth, max_args;
} listops_limits;

/* The shortest expression: an operator, two digits and ']'. */
enum { LISTOPS_SHORTEST = 4 };

/* The longest expression the depth and argument limits allow (saturated
 * at 2^40): with listops_min_len above it, or min(max_len, T) below
 * LISTOPS_SHORTEST, no attempt can succeed (docs/tasks.md §2). */
long long listops_longest(const listops_limits *lim);

/* Attempts per sample before listops_generate gives up: far above what
 * satisfiable limits need, so that rare-but-possible lengths fail loudly
 * instead of looping for ever. */
#define LISTOPS_MAX_ATTEMPTS 100000

/* Draws an expression from the LRA generator (values with probability
 * 0.75 below max_depth, else an operator with 2..max_args arguments),
 * retried until its length lies in [min_len, max_len] (and fits T).
 * Writes its tokens (padded to T) and returns its value 0..9, or -1 (and
 * length 0) when LISTOPS_MAX_ATTEMPTS attempts all failed. */
int listops_generate(uint64_t key, const listops_limits *lim, int T, int32_t *tokens, int *length);

/* Value of a token sequence (for LRA TSV rows and tests); -1 if malformed. */
int listops_evaluate(const int32_t *tokens, int length);

/* Tokenises one LRA "Source" string ("( [MAX 2 9 ] )": parentheses are
 * ignored) up to its end or a line break. Returns the length, or
 * LISTOPS_TOO_LONG if longer than T, or LISTOPS_UNKNOWN_WORD. */
enum { LISTOPS_TOO_LONG = -1, LISTOPS_UNKNOWN_WORD = -2 };
int listops_tokenize(const char *source, int32_t *tokens, int T);
#endif
