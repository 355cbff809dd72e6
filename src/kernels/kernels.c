/* Layer kernels of docs/model.md §1; see kernels.h for the conventions.
 *
 * Threads (docs/design.md §8.10): row-wise work runs on OpenMP's threads,
 * row by row; a sum over rows (a bias or LayerNorm gradient, the embedding
 * gradient) runs column by column instead, each column's rows added in
 * order. Either way every float is computed as on one thread: these
 * kernels give the same results on any number of threads (the GEMMs do
 * not, gemm.c). Each parallel loop calls a per-row (or per-column-range)
 * function compiled with the ISA clones. */
#include "kernels/kernels.h"

#include <omp.h>

#include "base/fast_math.h"
#include "kernels/gemm.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Work below this many floats stays on one thread: a parallel region costs
 * a few microseconds. */
#define PARALLEL_MIN_DEFAULT 16384
static size_t parallel_min_floats = PARALLEL_MIN_DEFAULT;

void kernel_set_parallel_min(size_t floats) { parallel_min_floats = floats ? floats : PARALLEL_MIN_DEFAULT; }

/* Columns per task of the column-wise sums: a multiple of every vector
 * width, so each range vectorises whole. */
#define COLUMN_BLOCK 64

static int column_blocks(int dim) { return (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK; }

/* out[c] += sum over rows of rows_data[r][c], c in block, rows in order. */
VECTOR_CLONES static void add_column_sums(float *out, const float *rows_data, int rows, int dim, int block) {
    int lo = block * COLUMN_BLOCK, hi = lo + COLUMN_BLOCK < dim ? lo + COLUMN_BLOCK : dim;
    for (int r = 0; r < rows; r++) {
        const float *row = rows_data + (size_t)r * dim;
        for (int c = lo; c < hi; c++) out[c] += row[c];
    }
}

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int rows, int in_dim,
                    int out_dim) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)rows * out_dim >= parallel_min_floats)
        for (int r = 0; r < rows; r++) memcpy(out + (size_t)r * out_dim, bias, sizeof(float) * out_dim);
        beta = 1.0f;
    }
    gemm_product(false, true, rows, out_dim, in_dim, 1.0f, inp, in_dim, weight, in_dim, beta, out, out_dim);
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int rows, int in_dim, int out_dim, bool accumulate) {
    if (dinp)
        gemm_product(false, false, rows, in_dim, out_dim, 1.0f, dout, out_dim, weight, in_dim, 0.0f, dinp, in_dim);
    gemm_product(true, false, out_dim, in_dim, rows, 1.0f, dout, out_dim, inp, in_dim, accumulate ? 1.0f : 0.0f,
                 dweight, in_dim);
    if (!dbias) return;
    if (!accumulate) memset(dbias, 0, sizeof(float) * out_dim);
#pragma omp parallel for schedule(static) if ((size_t)rows * out_dim >= parallel_min_floats)
    for (int block = 0; block < column_blocks(out_dim); block++) add_column_sums(dbias, dout, rows, out_dim, block);
}

VECTOR_CLONES static void layernorm_forward_row(float *y, float *mean, float *rstd, const float *x, const float *weight,
                                                const float *bias, int dim) {
    double sum = 0, sq = 0;
    for (int i = 0; i < dim; i++) sum += x[i];
    float mu = (float)(sum / dim);
    for (int i = 0; i < dim; i++) sq += (double)(x[i] - mu) * (x[i] - mu);
    float rs = (float)(1.0 / sqrt(sq / dim + 1e-5));
    for (int i = 0; i < dim; i++) y[i] = (x[i] - mu) * rs * weight[i] + bias[i];
    *mean = mu;
    *rstd = rs;
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias,
                       int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= parallel_min_floats)
    for (int r = 0; r < rows; r++)
        layernorm_forward_row(out + (size_t)r * dim, &mean[r], &rstd[r], inp + (size_t)r * dim, weight, bias, dim);
}

/* dL/dxhat = dy * w; dx += rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)). */
VECTOR_CLONES static void layernorm_backward_row(float *dx, const float *dy, const float *x, const float *weight,
                                                 float mu, float rs, int dim) {
    float mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int i = 0; i < dim; i++) {
        float xhat = (x[i] - mu) * rs, dxhat = dy[i] * weight[i];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * xhat;
    }
    mean_dxhat /= dim;
    mean_dxhat_xhat /= dim;
    for (int i = 0; i < dim; i++) {
        float xhat = (x[i] - mu) * rs, dxhat = dy[i] * weight[i];
        dx[i] += rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
}

/* dweight[c] += sum_r dy * xhat, dbias[c] += sum_r dy over the block's columns. */
VECTOR_CLONES static void layernorm_backward_columns(float *dweight, float *dbias, const float *dout, const float *inp,
                                                     const float *mean, const float *rstd, int rows, int dim,
                                                     int block) {
    int lo = block * COLUMN_BLOCK, hi = lo + COLUMN_BLOCK < dim ? lo + COLUMN_BLOCK : dim;
    for (int r = 0; r < rows; r++) {
        const float *x = inp + (size_t)r * dim, *dy = dout + (size_t)r * dim;
        float mu = mean[r], rs = rstd[r];
        for (int c = lo; c < hi; c++) {
            dweight[c] += dy[c] * ((x[c] - mu) * rs);
            dbias[c] += dy[c];
        }
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int rows, int dim, bool accumulate) {
    if (!accumulate) memset(dweight, 0, sizeof(float) * dim), memset(dbias, 0, sizeof(float) * dim);
    bool parallel = (size_t)rows * dim >= parallel_min_floats;
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static) nowait
        for (int r = 0; r < rows; r++)
            layernorm_backward_row(dinp + (size_t)r * dim, dout + (size_t)r * dim, inp + (size_t)r * dim, weight,
                                   mean[r], rstd[r], dim);
#pragma omp for schedule(static)
        for (int block = 0; block < column_blocks(dim); block++)
            layernorm_backward_columns(dweight, dbias, dout, inp, mean, rstd, rows, dim, block);
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static inline float gelu_tanh_term(float x) { return fast_tanh(GELU_SCALE * (x + 0.044715f * x * x * x)); }

/* Elementwise kernels run in chunks of this many floats, one per task. */
#define ELEMENT_CHUNK 16384

static size_t element_chunks(size_t n) { return (n + ELEMENT_CHUNK - 1) / ELEMENT_CHUNK; }
static size_t chunk_length(size_t n, size_t chunk) {
    size_t left = n - chunk * ELEMENT_CHUNK;
    return left < ELEMENT_CHUNK ? left : ELEMENT_CHUNK;
}

VECTOR_CLONES static void gelu_forward_chunk(float *out, float *tanh_saved, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], th = gelu_tanh_term(x);
        tanh_saved[i] = th;
        out[i] = 0.5f * x * (1.0f + th);
    }
}

void gelu_forward(float *out, float *tanh_saved, const float *inp, size_t n) {
#pragma omp parallel for schedule(static) if (element_chunks(n) > 1)
    for (size_t c = 0; c < element_chunks(n); c++) {
        size_t at = c * ELEMENT_CHUNK;
        gelu_forward_chunk(out + at, tanh_saved + at, inp + at, chunk_length(n, c));
    }
}

VECTOR_CLONES static void gelu_from_tanh_chunk(float *out, const float *inp, const float *tanh_saved, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + tanh_saved[i]);
}

void gelu_from_tanh(float *out, const float *inp, const float *tanh_saved, size_t n) {
#pragma omp parallel for schedule(static) if (element_chunks(n) > 1)
    for (size_t c = 0; c < element_chunks(n); c++) {
        size_t at = c * ELEMENT_CHUNK;
        gelu_from_tanh_chunk(out + at, inp + at, tanh_saved + at, chunk_length(n, c));
    }
}

VECTOR_CLONES static void gelu_backward_chunk(float *dinp, const float *inp, const float *tanh_saved, const float *dout,
                                              size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanh_saved[i];
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * grad;
    }
}

void gelu_backward(float *dinp, const float *inp, const float *tanh_saved, const float *dout, size_t n) {
#pragma omp parallel for schedule(static) if (element_chunks(n) > 1)
    for (size_t c = 0; c < element_chunks(n); c++) {
        size_t at = c * ELEMENT_CHUNK;
        gelu_backward_chunk(dinp + at, inp + at, tanh_saved + at, dout + at, chunk_length(n, c));
    }
}

void embedding_forward(float *out, const int32_t *tokens, const float *table, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= parallel_min_floats)
    for (int r = 0; r < rows; r++) memcpy(out + (size_t)r * dim, table + (size_t)tokens[r] * dim, sizeof(float) * dim);
}

/* Rows may share a token, so the scatter-add runs by column blocks, each
 * block's rows in order. */
VECTOR_CLONES static void embedding_backward_columns(float *dtable, const int32_t *tokens, const float *dout, int rows,
                                                     int dim, int block) {
    int lo = block * COLUMN_BLOCK, hi = lo + COLUMN_BLOCK < dim ? lo + COLUMN_BLOCK : dim;
    for (int r = 0; r < rows; r++) {
        float *row = dtable + (size_t)tokens[r] * dim;
        const float *g = dout + (size_t)r * dim;
        for (int c = lo; c < hi; c++) row[c] += g[c];
    }
}

void embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int rows, int dim) {
#pragma omp parallel for schedule(static) if ((size_t)rows * dim >= parallel_min_floats)
    for (int block = 0; block < column_blocks(dim); block++)
        embedding_backward_columns(dtable, tokens, dout, rows, dim, block);
}

void rope_tables(float *cos_table, float *sin_table, int max_positions, int dh, double base) {
    rope_tables_from(cos_table, sin_table, 0, max_positions, dh, base);
}

void rope_tables_from(float *cos_table, float *sin_table, long long first, int count, int dh, double base) {
    int half = dh / 2;
    for (int t = 0; t < count; t++)
        for (int j = 0; j < half; j++) {
            double angle = (double)(first + t) * pow(base, -2.0 * j / dh);
            cos_table[(size_t)t * half + j] = (float)cos(angle);
            sin_table[(size_t)t * half + j] = (float)sin(angle);
        }
}

static void rope_rotate(float *x, const float *cos_table, const float *sin_table, int T, int dh, int pos0,
                        float direction) {
    int half = dh / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cos_table + (size_t)(pos0 + t) * half, *s = sin_table + (size_t)(pos0 + t) * half;
        float *u = x + (size_t)t * dh;
        for (int j = 0; j < half; j++) {
            float a = u[2 * j], b = u[2 * j + 1], sn = direction * s[j];
            u[2 * j] = a * c[j] - b * sn;
            u[2 * j + 1] = a * sn + b * c[j];
        }
    }
}

void rope_forward(float *x, const float *cos_table, const float *sin_table, int T, int dh, int pos0) {
    rope_rotate(x, cos_table, sin_table, T, dh, pos0, 1.0f);
}

void rope_backward(float *dx, const float *cos_table, const float *sin_table, int T, int dh, int pos0) {
    rope_rotate(dx, cos_table, sin_table, T, dh, pos0, -1.0f);
}

/* Causal attention is computed in blocks of query rows, each against only the
 * keys it may see, so the masked upper triangle costs no FLOPs (about half
 * of QK^T and PV at T = 256). */
#define ATTENTION_BLOCK 64

static int visible_keys(int first_query, int n_rows, int Tk, int q_pos0, bool causal) {
    if (!causal) return Tk;
    int keys = q_pos0 + first_query + n_rows;
    return keys < Tk ? keys : Tk;
}

VECTOR_CLONES static void softmax_rows(float *probs, int i0, int rows, int Tk, int q_pos0, bool causal) {
    for (int r = 0; r < rows; r++) {
        float *row = probs + (size_t)r * Tk;
        int n_keys = visible_keys(i0 + r, 1, Tk, q_pos0, causal);
        float max = fast_max_lanes(row, n_keys);
        for (int j = 0; j < n_keys; j++) row[j] = fast_exp_nonpositive(row[j] - max);
        float inv = 1.0f / fast_sum_lanes(row, n_keys);
        for (int j = 0; j < n_keys; j++) row[j] *= inv;
        for (int j = n_keys; j < Tk; j++) row[j] = 0.0f;
    }
}

void softmax_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int Tq, int Tk,
                               int dh, int q_pos0, bool causal) {
    float scale = 1.0f / sqrtf((float)dh);
    for (int i0 = 0; i0 < Tq; i0 += ATTENTION_BLOCK) {
        int rows = Tq - i0 < ATTENTION_BLOCK ? Tq - i0 : ATTENTION_BLOCK;
        int keys = visible_keys(i0, rows, Tk, q_pos0, causal);
        float *p = probs + (size_t)i0 * Tk;
        gemm_product(false, true, rows, keys, dh, scale, q + (size_t)i0 * dh, dh, k, dh, 0.0f, p, Tk);
        softmax_rows(p, i0, rows, Tk, q_pos0, causal);
        gemm_product(false, false, rows, dh, keys, 1.0f, p, Tk, v, dh, 0.0f, out + (size_t)i0 * dh, dh);
    }
}

/* dS = P * (dP - rowsum(dP * P)) over the visible keys. */
static void softmax_rows_backward(float *dscores, const float *probs, int rows, int keys, int Tk) {
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * Tk;
        float *ds = dscores + (size_t)r * Tk;
        float dot = 0;
        for (int j = 0; j < keys; j++) dot += ds[j] * p[j];
        for (int j = 0; j < keys; j++) ds[j] = p[j] * (ds[j] - dot);
    }
}

void softmax_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                                const float *k, const float *v, float *scratch, int Tq, int Tk, int dh, bool causal) {
    float scale = 1.0f / sqrtf((float)dh);
    memset(dk, 0, sizeof(float) * (size_t)Tk * dh);
    memset(dv, 0, sizeof(float) * (size_t)Tk * dh);
    /* q positions start at 0 here: the backward runs on training sequences */
    for (int i0 = 0; i0 < Tq; i0 += ATTENTION_BLOCK) {
        int rows = Tq - i0 < ATTENTION_BLOCK ? Tq - i0 : ATTENTION_BLOCK;
        int keys = visible_keys(i0, rows, Tk, 0, causal);
        const float *p = probs + (size_t)i0 * Tk, *dout_rows = dout + (size_t)i0 * dh;
        float *ds = scratch + (size_t)i0 * Tk;
        gemm_product(false, true, rows, keys, dh, 1.0f, dout_rows, dh, v, dh, 0.0f, ds, Tk);
        gemm_product(true, false, keys, dh, rows, 1.0f, p, Tk, dout_rows, dh, 1.0f, dv, dh);
        softmax_rows_backward(ds, p, rows, keys, Tk);
        gemm_product(false, false, rows, dh, keys, scale, ds, Tk, k, dh, 0.0f, dq + (size_t)i0 * dh, dh);
        gemm_product(true, false, keys, dh, rows, scale, ds, Tk, q + (size_t)i0 * dh, dh, 1.0f, dk, dh);
    }
}

VECTOR_CLONES static void cross_entropy_forward_row(float *p, float *loss, int32_t *prediction, int target,
                                                    int n_classes) {
    float max = fast_max_lanes(p, n_classes);
    int argmax = 0;
    while (argmax < n_classes - 1 && p[argmax] != max) argmax++; /* the first maximum */
    /* log-sum-exp form: exact even where p[target] underflows to 0 */
    float target_logit = target >= 0 ? p[target] - max : 0.0f;
    for (int c = 0; c < n_classes; c++) p[c] = fast_exp_nonpositive(p[c] - max);
    double sum = fast_sum_lanes(p, n_classes);
    float inv = (float)(1.0 / sum);
    for (int c = 0; c < n_classes; c++) p[c] *= inv;
    *prediction = argmax;
    *loss = target < 0 ? 0.0f : (float)(log(sum) - (double)target_logit);
}

void cross_entropy_forward(float *probs, float *losses, int32_t *predictions, const int32_t *targets, int rows,
                           int n_classes) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n_classes >= parallel_min_floats)
    for (int r = 0; r < rows; r++)
        cross_entropy_forward_row(probs + (size_t)r * n_classes, &losses[r], &predictions[r], targets[r], n_classes);
}

void cross_entropy_backward(float *probs, const int32_t *targets, int rows, int n_classes, float scale) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n_classes >= parallel_min_floats)
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
