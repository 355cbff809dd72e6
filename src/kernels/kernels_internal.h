/* Private to the layer kernels of kernels.h: what kernels.c (matmul,
 * LayerNorm, embedding, cross-entropy) and gelu.c (GELU with its bias)
 * share — when a loop goes parallel, and the fixed blocks of rows in which
 * a sum over rows runs so that it gives the same floats on any number of
 * threads (docs/design.md §8.10). Defined in kernels.c. */
#ifndef MOMFMM_KERNELS_INTERNAL_H
#define MOMFMM_KERNELS_INTERNAL_H
#include <stddef.h>

/* Work below this many floats stays on one thread (kernel_set_parallel_min). */
extern size_t kernel_parallel_min_floats;

/* A sum over `rows` rows in `count` blocks of `rows_per` rows, fixed by the
 * row count alone. */
typedef struct {
    int rows_per, count;
} kernel_row_blocks;

kernel_row_blocks kernel_row_blocks_of(int rows);
/* One past block b's last row. */
int kernel_block_end(kernel_row_blocks blocks, int b, int rows);
/* Inside a parallel region: out += the blocks' partials (stride floats
 * apart), this thread's range of the dim columns. */
void kernel_add_blocks_on_thread(float *out, const float *partials, int count, size_t stride, int dim);

/* An output made in bf16 alone (the GELU's, the LayerNorms' before a
 * product) is made in pieces of this many floats on the stack, each
 * converted while it is in L1: the fp32 output never reaches memory. */
#define KERNEL_BF16_PIECE 512

#endif
