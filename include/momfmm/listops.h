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

/* Draws an expression from the LRA generator (values with probability
 * 0.75 below max_depth, else an operator with 2..max_args arguments),
 * retried until its length lies in [min_len, max_len] (and fits T).
 * Writes its tokens (padded to T) and returns its value 0..9. */
int listops_generate(uint64_t key, const listops_limits *lim, int T, int32_t *tokens, int *length);

/* Value of a token sequence (for LRA TSV rows and tests); -1 if malformed. */
int listops_evaluate(const int32_t *tokens, int length);

/* Tokenises one LRA "Source" string ("( [MAX 2 9 ] )": parentheses are
 * ignored). Returns the length, or -1 on an unknown word or if longer than T. */
int listops_tokenize(const char *source, int32_t *tokens, int T);
#endif
