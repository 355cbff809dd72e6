/* Momentum-seed read-outs; see readouts.h. */
#include "eval/readouts.h"

#include <complex.h>
#include <math.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "kernels/gemm.h"

static double row_norm(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* Sum over the rows of ||y'_b - y_b|| / ||delta_b||, with y = (after - before) when
 * before is given (a sublayer without its residual path) and y = after otherwise. */
static void add_row_ratios(const float *after, const float *after_saved, const float *before, const float *before_saved,
                           const double *delta_norms, int B, size_t row, double *ratio_sum) {
    for (int b = 0; b < B; b++) {
        double diff = 0;
        for (size_t i = b * row; i < (b + 1) * row; i++) {
            double d = (double)after[i] - after_saved[i];
            if (before) d -= (double)before[i] - before_saved[i];
            diff += d * d;
        }
        if (delta_norms[b] > 0) *ratio_sum += sqrt(diff) / delta_norms[b];
    }
}

/* gain_R perturbs a block's input by 1e-3 of its norm (docs/metrics.md §3):
 * below bf16's resolution (8 significant bits, 4e-3 relative), so with the
 * bf16 engine the ratio would measure rounding, not the block. Those
 * forwards, and the unperturbed one they are compared with, run in fp32 on
 * OpenBLAS, attention's products in fp32 too (fmm_settings.bf16), whatever
 * the precision; the fp32 engines run as they are. */
static bool needs_fp32_forward(void) {
    gemm_ctx *engine = gemm_default();
    return engine && gemm_ctx_engine(engine) == GEMM_ONEDNN_BF16;
}

/* Whether the bf16 engine may run the model's products: train.precision = bf16,
 * or an engine already chosen (sizing the copies before the engine runs). */
static bool may_need_fp32_forward(const model *m) { return m->cfg.precision == PRECISION_BF16 || needs_fp32_forward(); }

size_t readouts_scratch_floats(const model *m, int B, int T, bool gains) {
    return gains ? (may_need_fp32_forward(m) ? 5 : 3) * (size_t)B * T * m->d : 0;
}

void readouts_block_gains(model *m, int B, int T, uint64_t seed, long long first_row, double *ratio_sums,
                          double *attn_ratio_sums, const readouts_scratch *scratch) {
    model_activations *a = &m->acts;
    size_t row = (size_t)T * m->d, bt_d = (size_t)B * row;
    gemm_ctx *engine = gemm_default();
    bool fp32 = needs_fp32_forward();
    float *saved_in = scratch->copies, *saved_out = saved_in + bt_d, *saved_mid = saved_out + bt_d;
    /* the unperturbed outputs the ratios compare with: the forward's own, or fp32 ones */
    float *base_out = fp32 ? saved_mid + bt_d : saved_out, *base_mid = fp32 ? base_out + bt_d : saved_mid;
    double *delta_norms = scratch->delta_norms;
    bool attention_bf16 = m->fmm.bf16;
    if (fp32) gemm_set_default(NULL), m->fmm.bf16 = false; /* cblas_sgemm, fp32 (gemm.h) */
    for (int l = 0; l < m->L; l++) {
        /* with train.recompute = block, block l's mid is remade first (docs/scale.md §7) */
        model_block_restore(m, l, B, T);
        float *in = a->residual + l * bt_d, *out = a->residual + (l + 1) * bt_d, *mid = model_block_mid(m, l, B, T);
        memcpy(saved_in, in, sizeof(float) * bt_d);
        memcpy(saved_out, out, sizeof(float) * bt_d);
        memcpy(saved_mid, mid, sizeof(float) * bt_d);
        if (fp32) {
            model_block_forward(m, l, B, T, false);
            memcpy(base_out, out, sizeof(float) * bt_d);
            memcpy(base_mid, mid, sizeof(float) * bt_d);
        }
        for (int b = 0; b < B; b++) {
            float *x = in + b * row;
            /* keyed by the global sample index, as the samples are: the same
             * delta for the same row at any rank count (docs/metrics.md §3) */
            uint64_t key = rng_key(seed, 0x6A1, (uint64_t)l, (uint64_t)(first_row + b));
            double target = 1e-3 * row_norm(x, row), norm = 0;
            for (size_t i = 0; i < row; i++) norm += pow(rng_normal(key, i), 2);
            double scale = target / sqrt(norm);
            for (size_t i = 0; i < row; i++) x[i] += (float)(scale * rng_normal(key, i));
            /* the norm of what was actually added, after float rounding */
            double added = 0;
            for (size_t i = 0; i < row; i++) {
                double dx = (double)x[i] - saved_in[b * row + i];
                added += dx * dx;
            }
            delta_norms[b] = sqrt(added);
        }
        model_block_forward(m, l, B, T, false);
        add_row_ratios(out, base_out, NULL, NULL, delta_norms, B, row, &ratio_sums[l]);
        /* mid = x + A(LN1(x)): the attention sublayer alone is mid - x (docs/metrics.md §3) */
        if (attn_ratio_sums) add_row_ratios(mid, base_mid, in, saved_in, delta_norms, B, row, &attn_ratio_sums[l]);
        memcpy(in, saved_in, sizeof(float) * bt_d);
        memcpy(out, saved_out, sizeof(float) * bt_d);
        memcpy(mid, saved_mid, sizeof(float) * bt_d);
    }
    if (fp32) gemm_set_default(engine), m->fmm.bf16 = attention_bf16;
}

/* prev[t]: the latest s < t with inputs[s] == inputs[t], or -1; last[V] is scratch. */
static void previous_occurrences(const int32_t *inputs, int T, int V, int *last, int *prev) {
    for (int v = 0; v < V; v++) last[v] = -1;
    for (int t = 0; t < T; t++) {
        prev[t] = last[inputs[t]];
        last[inputs[t]] = t;
    }
}

/* Block by block, since with train.recompute = block only one block's
 * attention state is kept and model_block_restore remakes the others'
 * (docs/scale.md §7); each (block, head) sum adds its queries in the same
 * order either way. */
void readouts_attention_scores(model *m, const int32_t *inputs, const int32_t *targets, int B, int T, int period,
                               double *sums, const readouts_scratch *scratch) {
    int LH = m->L * m->H;
    int *last = scratch->tokens, *prev = last + m->V;
    for (int l = 0; l < m->L; l++) {
        model_block_restore(m, l, B, T);
        attention_layer view = model_attention_layer(m, l, false);
        attention_saved saved = model_attention_saved(m, l, B, T);
        for (int b = 0; b < B; b++) {
            const int32_t *x = inputs + (size_t)b * T, *y = targets + (size_t)b * T;
            previous_occurrences(x, T, m->V, last, prev);
            for (int i = 0; i < T; i++) {
                /* the queries where the two keys exist and differ: where they
                 * coincide (a fixed period without fillers) no score can tell
                 * them apart (docs/metrics.md §3) */
                int positional = i - (period - 1), induction = prev[i] + 1;
                if (y[i] < 0 || prev[i] < 0 || positional < 0 || positional == induction) continue;
                if (l == 0) sums[2 * LH] += 1;
                for (int h = 0; h < m->H; h++) {
                    sums[l * m->H + h] += attention_weight(&view, &saved, b, h, T, i, positional);
                    sums[LH + l * m->H + h] += attention_weight(&view, &saved, b, h, T, i, induction);
                }
            }
        }
    }
}

void readouts_gammas(const model *m, double *out) {
    for (int l = 0; l < m->L; l++)
        for (int h = 0; h < m->H; h++) {
            const float *learned = m->w.blocks[l].momentum_gamma;
            out[l * m->H + h] = !m->momentum ? 0.0 : learned ? learned[h] : m->cfg.gamma;
        }
}

double readouts_filter_gain(double omega, double gamma, double beta, double gamma2) {
    double complex z_inv = cexp(-I * omega);
    double complex diff = 1.0 - z_inv;
    return cabs(1.0 + (gamma + gamma2 * diff) * diff / (1.0 - beta * z_inv));
}
