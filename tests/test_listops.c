/* ListOps (docs/tasks.md §2): evaluator on known expressions, tokenizer on LRA's
 * source format, and the generator's lengths, tokens and values. */
#include <stdio.h>
#include <string.h>

#include "momfmm/listops.h"
#include "momfmm/rng.h"

static int check(const char *name, int ok) {
    printf("%-48s %s\n", name, ok ? "ok" : "FAIL");
    return !ok;
}

static int value_of(const char *source) {
    int32_t tokens[64];
    int n = listops_tokenize(source, tokens, 64);
    return n < 0 ? -2 : listops_evaluate(tokens, n);
}

int main(void) {
    int fails = 0;
    fails += check("[MAX 2 9 [MIN 4 7 ] 0 ] = 9", value_of("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9);
    fails += check("[SM 5 6 ] = 1 (sum mod 10)", value_of("[SM 5 6 ]") == 1);
    fails += check("[MED 1 2 3 4 ] = 2 (int of 2.5)", value_of("[MED 1 2 3 4 ]") == 2);
    fails += check("[MED 7 1 3 ] = 3", value_of("[MED 7 1 3 ]") == 3);
    fails += check("[MIN 3 [MAX 1 8 ] ] = 3", value_of("[MIN 3 [MAX 1 8 ] ]") == 3);
    fails += check("LRA parentheses are ignored", value_of("( ( [MAX 2 9 ) [MIN 4 7 ] 0 ] )") == 9);
    fails += check("malformed: missing ]", value_of("[MAX 2 9") == -1);
    fails += check("unknown word rejected", value_of("[MAX 2 x ]") == -2);
    int32_t tokens[8];
    fails += check("longer than T rejected", listops_tokenize("[SM 1 2 3 4 5 6 7 ]", tokens, 8) == -1);

    listops_limits lim = {16, 100, 6, 5};
    int counts[10] = {0}, bad = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t seq[128];
        int length, value = listops_generate(rng_key(7, 0, 0, (uint64_t)i), &lim, 128, seq, &length);
        bad += length < lim.min_len || length > lim.max_len || value < 0 || value > 9;
        bad += listops_evaluate(seq, length) != value;
        for (int t = length; t < 128; t++) bad += seq[t] != LISTOPS_PAD;
        for (int t = 0; t < length; t++) bad += seq[t] <= LISTOPS_PAD || seq[t] >= LISTOPS_VOCAB;
        if (value >= 0 && value <= 9) counts[value]++;
    }
    fails += check("2000 generated: lengths, tokens, values", bad == 0);
    int classes = 0;
    for (int v = 0; v < 10; v++) classes += counts[v] > 0;
    fails += check("generated values cover all 10 classes", classes == 10);
    int32_t a[128], b[128];
    int la, lb;
    listops_generate(rng_key(1, 2, 3, 4), &lim, 128, a, &la);
    listops_generate(rng_key(1, 2, 3, 4), &lim, 128, b, &lb);
    fails += check("same key, same expression", la == lb && memcmp(a, b, sizeof a) == 0);
    printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
    return fails != 0;
}
