/* ListOps (docs/tasks.md §2): evaluator on known expressions, tokenizer on LRA's
 * source format, and the generator's lengths, tokens and values. */
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "data/listops.h"
#include "test_util.h"

static int value_of(const char *source) {
    int32_t tokens[64];
    int n = listops_tokenize(source, tokens, 64);
    return n < 0 ? -2 : listops_evaluate(tokens, n);
}

int main(void) {
    test_check(value_of("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9, "[MAX 2 9 [MIN 4 7 ] 0 ] = 9", NULL);
    test_check(value_of("[SM 5 6 ]") == 1, "[SM 5 6 ] = 1 (sum mod 10)", NULL);
    test_check(value_of("[MED 1 2 3 4 ]") == 2, "[MED 1 2 3 4 ] = 2 (int of 2.5)", NULL);
    test_check(value_of("[MED 7 1 3 ]") == 3, "[MED 7 1 3 ] = 3", NULL);
    test_check(value_of("[MIN 3 [MAX 1 8 ] ]") == 3, "[MIN 3 [MAX 1 8 ] ] = 3", NULL);
    test_check(value_of("( ( [MAX 2 9 ) [MIN 4 7 ] 0 ] )") == 9, "LRA parentheses are ignored", NULL);
    test_check(value_of("[MAX 2 9") == -1, "malformed: missing ]", NULL);
    test_check(value_of("[MAX 2 x ]") == -2, "unknown word rejected", NULL);
    int32_t tokens[8];
    test_check(listops_tokenize("[SM 1 2 3 4 5 6 7 ]", tokens, 8) == -1, "longer than T rejected", NULL);

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
    test_check(bad == 0, "2000 generated: lengths, tokens, values", NULL);
    int classes = 0;
    for (int v = 0; v < 10; v++) classes += counts[v] > 0;
    test_check(classes == 10, "generated values cover all 10 classes", NULL);
    int32_t a[128], b[128];
    int la, lb;
    int va = listops_generate(rng_key(1, 2, 3, 4), &lim, 128, a, &la);
    int vb = listops_generate(rng_key(1, 2, 3, 4), &lim, 128, b, &lb);
    test_check(va >= 0 && va == vb && la == lb && memcmp(a, b, sizeof a) == 0, "same key, same expression", NULL);
    return test_summary("test_listops");
}
