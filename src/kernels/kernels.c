/* Layer kernels of docs/model.md §1; see kernels.h for the conventions.
 *
 * Threads (docs/design.md §8.10): row-wise work runs on OpenMP's threads,
 * row by row; a sum over rows (a bias or LayerNorm gradient) in fixed
 * blocks of rows, each block's partial sums made beside its rows' own
 * work, then the blocks added in order; the embedding's scatter-add column
 * by column. Either way every float is computed as on one thread: these
 * kernels give the same results on any number of threads (the GEMMs do
 * not, gemm.c). Each parallel loop calls a per-row (or per-column-range)
 * function compiled with the ISA clones. */
#include "kernels/kernels.h"

#include <omp.h>

#include "base/cpu.h"
#include "base/fast_math.h"
#include "kernels/gemm.h"

#include "kernels_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Work below this many floats stays on one thread: a parallel region costs
 * a few microseconds. */
#define PARALLEL_MIN_DEFAULT 16384
size_t kernel_parallel_min_floats = PARALLEL_MIN_DEFAULT;

void kernel_set_parallel_min(size_t floats) { kernel_parallel_min_floats = floats ? floats : PARALLEL_MIN_DEFAULT; }

/* The last pass of a column sum, and the embedding's scatter-add, give
 * each thread one contiguous range of columns, a multiple of COLUMN_ALIGN
 * floats wide (whole vectors); a column's sum is the same on any split. */
#define COLUMN_ALIGN 16

static void thread_columns(int dim, int *lo, int *hi) {
    int per = (dim + omp_get_num_threads() - 1) / omp_get_num_threads();
    per = (per + COLUMN_ALIGN - 1) / COLUMN_ALIGN * COLUMN_ALIGN;
    int start = omp_get_thread_num() * per;
    *lo = start < dim ? start : dim;
    *hi = start + per < dim ? start + per : dim;
}

/* Sums over rows run in blocks of rows fixed by the row count alone
 * (docs/design.md §8.10): each block's rows are added in order into the
 * block's partial sums, in the pass that makes the rows' other results,
 * then each column adds the blocks' partials in order. Split by columns
 * instead (each thread half of every row), two threads ran GELU's and
 * LayerNorm's backward barely faster than one, at times slower: each
 * thread's stream of half rows made the prefetchers fetch the other half
 * too (bench_d256, GELU's backward 6.5 ms a step on two threads, 3.9 by
 * blocks). The blocks are at least SUM_BLOCK_ROWS_MIN rows, at most
 * SUM_BLOCKS_MAX of them, so the partials take SUM_BLOCKS_MAX rows per
 * sum. */
#define SUM_BLOCKS_MAX 64
#define SUM_BLOCK_ROWS_MIN 32

kernel_row_blocks kernel_row_blocks_of(int rows) {
    int count = (rows + SUM_BLOCK_ROWS_MIN - 1) / SUM_BLOCK_ROWS_MIN;
    if (count > SUM_BLOCKS_MAX) count = SUM_BLOCKS_MAX;
    if (count < 1) count = 1;
    int per = (rows + count - 1) / count;
    return (kernel_row_blocks){per, per ? (rows + per - 1) / per : 1};
}

int kernel_block_end(kernel_row_blocks blocks, int b, int rows) {
    int end = (b + 1) * blocks.rows_per;
    return end < rows ? end : rows;
}

size_t kernel_sum_partials_floats(int max_dim) { return (size_t)SUM_BLOCKS_MAX * 2 * (size_t)max_dim; }

/* out[c] += the blocks' partials[b * stride + c] in block order, c in [lo, hi). */
VECTOR_CLONES static void add_block_partials(float *out, const float *partials, int count, size_t stride, int lo,
                                             int hi) {
    for (int b = 0; b < count; b++) {
        const float *row = partials + (size_t)b * stride;
        for (int c = lo; c < hi; c++) out[c] += row[c];
    }
}

void kernel_add_blocks_on_thread(float *out, const float *partials, int count, size_t stride, int dim) {
    int lo, hi;
    thread_columns(dim, &lo, &hi);
    add_block_partials(out, partials, count, stride, lo, hi);
}

/* partial[c] = the sum of rows [r0, r1) of rows_data in order. */
VECTOR_CLONES static void block_column_sums(float *partial, const float *rows_data, int r0, int r1, int dim) {
    memset(partial, 0, sizeof(float) * dim);
    for (int r = r0; r < r1; r++) {
        const float *row = rows_data + (size_t)r * dim;
        for (int c = 0; c < dim; c++) partial[c] += row[c];
    }
}

static void linear_forward(float *out, gemm_operand inp, const float *weight, const float *bias, int rows, int in_dim,
                           int out_dim) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)rows * out_dim >= kernel_parallel_min_floats)
        for (int r = 0; r < rows; r++) memcpy(out + (size_t)r * out_dim, bias, sizeof(float) * out_dim);
        beta = 1.0f;
    }
    gemm_product_mixed(false, true, rows, out_dim, in_dim, 1.0f, inp, in_dim, (gemm_operand){weight, NULL}, in_dim,
                       beta, out, out_dim);
}

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int rows, int in_dim,
                    int out_dim) {
    linear_forward(out, (gemm_operand){inp, NULL}, weight, bias, rows, in_dim, out_dim);
}

void matmul_forward_bf16(float *out, const uint16_t *inp, const float *weight, const float *bias, int rows, int in_dim,
                         int out_dim) {
    linear_forward(out, (gemm_operand){NULL, inp}, weight, bias, rows, in_dim, out_dim);
}

static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, gemm_operand inp,
                            const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials) {
    gemm_hold(dout, rows, out_dim); /* both products read dout: bf16 converts it once */
    gemm_product_mixed(true, false, out_dim, in_dim, rows, 1.0f, (gemm_operand){dout, NULL}, out_dim, inp, in_dim,
                       accumulate ? 1.0f : 0.0f, dweight, in_dim);
    if (dbias) {
        if (!accumulate) memset(dbias, 0, sizeof(float) * out_dim);
        kernel_row_blocks blocks = kernel_row_blocks_of(rows);
#pragma omp parallel if ((size_t)rows * out_dim >= kernel_parallel_min_floats)
        {
#pragma omp for schedule(static)
            for (int b = 0; b < blocks.count; b++)
                block_column_sums(partials + (size_t)b * out_dim, dout, b * blocks.rows_per,
                                  kernel_block_end(blocks, b, rows), out_dim);
            kernel_add_blocks_on_thread(dbias, partials, blocks.count, (size_t)out_dim, out_dim);
        }
    }
    /* last: dinp may be inp's memory (the model's one work buffer) */
    if (dinp)
        gemm_product(false, false, rows, in_dim, out_dim, 1.0f, dout, out_dim, weight, in_dim, 0.0f, dinp, in_dim);
    gemm_release();
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials) {
    linear_backward(dinp, dweight, dbias, dout, (gemm_operand){inp, NULL}, weight, rows, in_dim, out_dim, accumulate,
                    partials);
}

void matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const uint16_t *inp,
                          const float *weight, int rows, int in_dim, int out_dim, bool accumulate, float *partials) {
    linear_backward(dinp, dweight, dbias, dout, (gemm_operand){NULL, inp}, weight, rows, in_dim, out_dim, accumulate,
                    partials);
}

/* LayerNorm's sums run in NORM_LANES fixed lanes, then the lanes in order
 * and the tail: strict C11 may not reorder a sequential sum, so the mean's
 * and the variance's double sums ran at one add per add latency (8 cycles
 * an element); lanes vectorise, and every clone and machine adds the same
 * floats in the same order. The lanes are GCC's generic vectors (written
 * as arrays, GCC vectorised across the lanes' iterations, a transpose per
 * load), and they are never indexed inside a loop, so that they stay in
 * registers. */
#define NORM_LANES 16
typedef float norm_floats __attribute__((vector_size(NORM_LANES * sizeof(float))));
/* double lanes in two halves of one zmm each: GCC 12 kept a vector wider
 * than a register in memory, a store and a load per add */
typedef float half_floats __attribute__((vector_size(NORM_LANES / 2 * sizeof(float))));
typedef double half_doubles __attribute__((vector_size(NORM_LANES / 2 * sizeof(double))));
typedef struct {
    half_doubles lo, hi;
} norm_doubles;

/* Macros and pointers: a function taking or returning a 64-byte vector
 * would change the ABI between the clones (as in tile_gemm.c). */
#define LOAD_LANES(v, p) memcpy(&(v), (p), sizeof(v))

/* The lanes of x[i..i + NORM_LANES), as two halves. */
#define LOAD_HALVES(first, second, x, i) (LOAD_LANES(first, (x) + (i)), LOAD_LANES(second, (x) + (i) + NORM_LANES / 2))
#define ADD_AS_DOUBLES(lanes, first, second)                     \
    ((lanes).lo += __builtin_convertvector(first, half_doubles), \
     (lanes).hi += __builtin_convertvector(second, half_doubles))

static inline double sum_double_lanes(const norm_doubles *lanes) {
    double sum = 0;
    for (int k = 0; k < NORM_LANES / 2; k++) sum += lanes->lo[k];
    for (int k = 0; k < NORM_LANES / 2; k++) sum += lanes->hi[k];
    return sum;
}

static inline float sum_float_lanes(const norm_floats *lanes) {
    float sum = 0;
    for (int k = 0; k < NORM_LANES; k++) sum += (*lanes)[k];
    return sum;
}

/* Mean and 1/std of one row from its sum, saved for the backward. */
static inline void layernorm_row_stats(float *mean, float *rstd, const float *x, int dim, double sum) {
    float mu = (float)(sum / dim);
    norm_doubles lanes = {{0}, {0}};
    double tail = 0;
    int i = 0;
    for (; i + NORM_LANES <= dim; i += NORM_LANES) {
        half_floats first, second;
        LOAD_HALVES(first, second, x, i);
        half_doubles a = __builtin_convertvector(first - mu, half_doubles);
        half_doubles b = __builtin_convertvector(second - mu, half_doubles);
        lanes.lo += a * a, lanes.hi += b * b;
    }
    for (; i < dim; i++) tail += (double)(x[i] - mu) * (x[i] - mu);
    *mean = mu;
    *rstd = (float)(1.0 / sqrt((sum_double_lanes(&lanes) + tail) / dim + 1e-5));
}

/* y = (x - mean) rstd weight + bias, in fp32 or, where only a product
 * reads y and it reads bf16 (y16), in bf16 alone, piece by piece: the
 * bits the product engine would make of the fp32 y (docs/design.md
 * §8.10). */
static inline void layernorm_row_output(float *y, uint16_t *y16, const float *x, const float *weight, const float *bias,
                                        int dim, float mu, float rs) {
    if (!y16) {
        for (int i = 0; i < dim; i++) y[i] = (x[i] - mu) * rs * weight[i] + bias[i];
        return;
    }
    float piece[KERNEL_BF16_PIECE];
    for (int i0 = 0; i0 < dim; i0 += KERNEL_BF16_PIECE) {
        int n = dim - i0 < KERNEL_BF16_PIECE ? dim - i0 : KERNEL_BF16_PIECE;
        for (int i = 0; i < n; i++) piece[i] = (x[i0 + i] - mu) * rs * weight[i0 + i] + bias[i0 + i];
        cpu_f32_to_bf16(y16 + i0, piece, (size_t)n);
    }
}

static inline void layernorm_finish_row(float *y, uint16_t *y16, float *mean, float *rstd, const float *x,
                                        const float *weight, const float *bias, int dim, double sum) {
    layernorm_row_stats(mean, rstd, x, dim, sum);
    layernorm_row_output(y, y16, x, weight, bias, dim, *mean, *rstd);
}

VECTOR_CLONES static void layernorm_forward_row(float *y, uint16_t *y16, float *mean, float *rstd, const float *x,
                                                const float *weight, const float *bias, int dim) {
    norm_doubles lanes = {{0}, {0}};
    double tail = 0;
    int i = 0;
    for (; i + NORM_LANES <= dim; i += NORM_LANES) {
        half_floats first, second;
        LOAD_HALVES(first, second, x, i);
        ADD_AS_DOUBLES(lanes, first, second);
    }
    for (; i < dim; i++) tail += x[i];
    layernorm_finish_row(y, y16, mean, rstd, x, weight, bias, dim, sum_double_lanes(&lanes) + tail);
}

/* out or, where it is not NULL, out16 */
static void layernorm_forward_any(float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        layernorm_forward_row(out16 ? NULL : out + at, out16 ? out16 + at : NULL, &mean[r], &rstd[r], inp + at, weight,
                              bias, dim);
    }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias,
                       int rows, int dim) {
    layernorm_forward_any(out, NULL, mean, rstd, inp, weight, bias, rows, dim);
}

void layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int rows, int dim) {
    layernorm_forward_any(NULL, out, mean, rstd, inp, weight, bias, rows, dim);
}

/* x = x + product_bias + residual, summed as it is written, then the norm
 * of x while the row is in L1: the residual add and the bias of the
 * product before it cost no pass of their own (docs/design.md §8.10). The
 * same floats as the add followed by layernorm_forward_row. */
VECTOR_CLONES static void layernorm_residual_row(float *y, uint16_t *y16, float *mean, float *rstd, float *x,
                                                 const float *product_bias, const float *residual, const float *weight,
                                                 const float *bias, int dim) {
    norm_doubles lanes = {{0}, {0}};
    double tail = 0;
    int i = 0;
    for (; i + NORM_LANES <= dim; i += NORM_LANES) {
        /* summed from the registers: reloading the stored row stalled on
         * store-to-load forwarding */
        half_floats first, second, b1, b2, r1, r2;
        LOAD_HALVES(first, second, x, i), LOAD_HALVES(b1, b2, product_bias, i), LOAD_HALVES(r1, r2, residual, i);
        first = first + b1 + r1, second = second + b2 + r2;
        memcpy(x + i, &first, sizeof first), memcpy(x + i + NORM_LANES / 2, &second, sizeof second);
        ADD_AS_DOUBLES(lanes, first, second);
    }
    for (; i < dim; i++) {
        x[i] = x[i] + product_bias[i] + residual[i];
        tail += x[i];
    }
    layernorm_finish_row(y, y16, mean, rstd, x, weight, bias, dim, sum_double_lanes(&lanes) + tail);
}

static void layernorm_residual_any(float *out, uint16_t *out16, float *mean, float *rstd, float *x,
                                   const float *product_bias, const float *residual, const float *weight,
                                   const float *bias, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * dim;
        layernorm_residual_row(out16 ? NULL : out + at, out16 ? out16 + at : NULL, &mean[r], &rstd[r], x + at,
                               product_bias, residual + at, weight, bias, dim);
    }
}

void layernorm_residual_forward(float *out, float *mean, float *rstd, float *x, const float *product_bias,
                                const float *residual, const float *weight, const float *bias, int rows, int dim) {
    layernorm_residual_any(out, NULL, mean, rstd, x, product_bias, residual, weight, bias, rows, dim);
}

void layernorm_residual_forward_bf16(uint16_t *out, float *mean, float *rstd, float *x, const float *product_bias,
                                     const float *residual, const float *weight, const float *bias, int rows, int dim) {
    layernorm_residual_any(NULL, out, mean, rstd, x, product_bias, residual, weight, bias, rows, dim);
}

/* dL/dxhat = dy * w; dx += rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
 * the two means summed in lanes as the forward's. */
VECTOR_CLONES static void layernorm_backward_row(float *dx, const float *dy, const float *x, const float *weight,
                                                 float mu, float rs, int dim) {
    norm_floats lanes_dxhat = {0}, lanes_dxhat_xhat = {0};
    float tail_dxhat = 0, tail_dxhat_xhat = 0;
    int i = 0;
    for (; i + NORM_LANES <= dim; i += NORM_LANES) {
        norm_floats xv, dyv, wv;
        LOAD_LANES(xv, x + i), LOAD_LANES(dyv, dy + i), LOAD_LANES(wv, weight + i);
        norm_floats xhat = (xv - mu) * rs, dxhat = dyv * wv;
        lanes_dxhat += dxhat;
        lanes_dxhat_xhat += dxhat * xhat;
    }
    for (; i < dim; i++) {
        float xhat = (x[i] - mu) * rs, dxhat = dy[i] * weight[i];
        tail_dxhat += dxhat;
        tail_dxhat_xhat += dxhat * xhat;
    }
    float mean_dxhat = (sum_float_lanes(&lanes_dxhat) + tail_dxhat) / dim;
    float mean_dxhat_xhat = (sum_float_lanes(&lanes_dxhat_xhat) + tail_dxhat_xhat) / dim;
    for (i = 0; i < dim; i++) {
        float xhat = (x[i] - mu) * rs, dxhat = dy[i] * weight[i];
        dx[i] += rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
}

/* Rows [r0, r1) of LayerNorm's backward, and their sums for the weight
 * and bias gradients into the block's partials pw and pb. */
VECTOR_CLONES static void layernorm_backward_block(float *dinp, float *pw, float *pb, const float *dout,
                                                   const float *inp, const float *weight, const float *mean,
                                                   const float *rstd, int r0, int r1, int dim) {
    memset(pw, 0, sizeof(float) * dim);
    memset(pb, 0, sizeof(float) * dim);
    for (int r = r0; r < r1; r++) {
        size_t at = (size_t)r * dim;
        const float *x = inp + at, *dy = dout + at;
        float mu = mean[r], rs = rstd[r];
        layernorm_backward_row(dinp + at, dy, x, weight, mu, rs, dim);
        for (int c = 0; c < dim; c++) {
            pw[c] += dy[c] * ((x[c] - mu) * rs);
            pb[c] += dy[c];
        }
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int rows, int dim, bool accumulate,
                        float *partials) {
    if (!accumulate) memset(dweight, 0, sizeof(float) * dim), memset(dbias, 0, sizeof(float) * dim);
    kernel_row_blocks blocks = kernel_row_blocks_of(rows);
    size_t stride = 2 * (size_t)dim; /* a block's weight partials, then its bias partials */
#pragma omp parallel if ((size_t)rows * dim >= kernel_parallel_min_floats)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < blocks.count; b++) {
            float *pw = partials + b * stride;
            layernorm_backward_block(dinp, pw, pw + dim, dout, inp, weight, mean, rstd, b * blocks.rows_per,
                                     kernel_block_end(blocks, b, rows), dim);
        }
        kernel_add_blocks_on_thread(dweight, partials, blocks.count, stride, dim);
        kernel_add_blocks_on_thread(dbias, partials + dim, blocks.count, stride, dim);
    }
}

/* x = x + product_bias + residual, rows of dim. */
VECTOR_CLONES static void residual_add_row(float *x, const float *product_bias, const float *residual, int dim) {
    for (int i = 0; i < dim; i++) x[i] = x[i] + product_bias[i] + residual[i];
}

void residual_add(float *x, const float *product_bias, const float *residual, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) residual_add_row(x + (size_t)r * dim, product_bias, residual + (size_t)r * dim, dim);
}

void embedding_forward(float *out, const int32_t *tokens, const float *table, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) memcpy(out + (size_t)r * dim, table + (size_t)tokens[r] * dim, sizeof(float) * dim);
}

/* Rows may share a token, so the scatter-add runs by column ranges, each
 * range's rows in order. */
VECTOR_CLONES static void embedding_backward_columns(float *dtable, const int32_t *tokens, const float *dout, int rows,
                                                     int dim, int lo, int hi) {
    for (int r = 0; r < rows; r++) {
        float *row = dtable + (size_t)tokens[r] * dim;
        const float *g = dout + (size_t)r * dim;
        for (int c = lo; c < hi; c++) row[c] += g[c];
    }
}

void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int rows, int dim) {
#pragma omp parallel if ((size_t)rows * dim >= kernel_parallel_min_floats)
    {
        int lo, hi;
        thread_columns(dim, &lo, &hi);
        embedding_backward_columns(dtable, tokens, dout, rows, dim, lo, hi);
    }
}

/* The first index of the maximum: chunks of lanes compared at once, which
 * vectorises (a scan that stops at the first match does not), then the
 * chunk that holds it. None equal (a row of NaN): the last index, as a
 * scalar scan gives. */
static inline int first_index_of(const float *p, int n, float value) {
    int j = 0;
    for (; j + REDUCTION_LANES <= n; j += REDUCTION_LANES) {
        int hit = 0;
        for (int l = 0; l < REDUCTION_LANES; l++) hit |= p[j + l] == value;
        if (hit) break;
    }
    while (j < n - 1 && p[j] != value) j++;
    return j;
}

/* Softmax and loss of one row; with `grad` (training) the row then becomes
 * grad_scale * (p - onehot) while it is in cache, the floats of
 * cross_entropy_backward. */
VECTOR_CLONES static void cross_entropy_row(float *p, float *loss, int32_t *prediction, int target, int n_classes,
                                            bool grad, float grad_scale) {
    float max = fast_max_lanes(p, n_classes);
    /* log-sum-exp form: exact even where p[target] underflows to 0 */
    float target_logit = target >= 0 ? p[target] - max : 0.0f;
    *prediction = first_index_of(p, n_classes, max);
    for (int c = 0; c < n_classes; c++) p[c] = fast_exp_nonpositive(p[c] - max);
    double sum = fast_sum_lanes(p, n_classes);
    float inv = (float)(1.0 / sum);
    *loss = target < 0 ? 0.0f : (float)(log(sum) - (double)target_logit);
    if (!grad) {
        for (int c = 0; c < n_classes; c++) p[c] *= inv;
    } else if (target < 0) {
        memset(p, 0, sizeof(float) * n_classes);
    } else {
        for (int c = 0; c < n_classes; c++) p[c] = p[c] * inv * grad_scale;
        p[target] -= grad_scale;
    }
}

static void cross_entropy_rows(float *p, float *losses, int32_t *predictions, const int32_t *targets, int rows,
                               int n_classes, bool grad, float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n_classes >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++)
        cross_entropy_row(p + (size_t)r * n_classes, &losses[r], &predictions[r], targets[r], n_classes, grad, scale);
}

void cross_entropy_forward(float *probs, float *losses, int32_t *predictions, const int32_t *targets, int rows,
                           int n_classes) {
    cross_entropy_rows(probs, losses, predictions, targets, rows, n_classes, false, 0.0f);
}

void cross_entropy_forward_backward(float *logits, float *losses, int32_t *predictions, const int32_t *targets,
                                    int rows, int n_classes, float scale) {
    cross_entropy_rows(logits, losses, predictions, targets, rows, n_classes, true, scale);
}

void cross_entropy_backward(float *probs, const int32_t *targets, int rows, int n_classes, float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n_classes >= kernel_parallel_min_floats)
    for (int r = 0; r < rows; r++) {
        float *p = probs + (size_t)r * n_classes;
        int target = targets[r];
        if (target < 0) {
            memset(p, 0, sizeof(float) * n_classes);
            continue;
        }
        for (int c = 0; c < n_classes; c++) p[c] *= scale;
        p[target] -= scale;
    }
}
