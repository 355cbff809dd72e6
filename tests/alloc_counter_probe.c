/* The allocation counter's own check (tests/e2e/test_allocations.py): a
 * loop of argv[1] turns that allocates once a turn from one site, a
 * per-step allocation in miniature, which the counter must see grow. */
#include <stdio.h>
#include <stdlib.h>

void *volatile last; /* the blocks escape, so the compiler keeps each call */

int main(int argc, char **argv) {
    long turns = argc == 2 ? strtol(argv[1], NULL, 10) : -1;
    if (turns < 0) {
        fprintf(stderr, "usage: alloc_counter_probe TURNS\n");
        return 2;
    }
    for (long i = 0; i < turns; i++) {
        free(last);
        last = malloc(64);
        if (!last) return 1;
    }
    free(last);
    return 0;
}
