/* docs/metrics.md §3 metrics: L_new, L_rep, loss_by_k, delta_12, acc, exact match. */
#include "data/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"
#include "data/chain.h"

/* Occurrence count k of each target (docs/metrics.md §3): how often the target token
 * appeared among inputs[0..t]. counts_scratch holds vocab_size ints. */
static void metric_occurrence_counts(const int32_t *inputs, const int32_t *targets, int T, int *counts_scratch,
                                     int vocab_size, int *k_out) {
    memset(counts_scratch, 0, sizeof(int) * vocab_size);
    for (int t = 0; t < T; t++) {
        counts_scratch[inputs[t]]++;
        k_out[t] = targets[t] >= 0 ? counts_scratch[targets[t]] : -1;
    }
}

static void accumulate_classification(metric_sums *s, const data_batch *b, const float *losses,
                                      const int32_t *predictions) {
    for (int r = 0; r < b->B; r++) {
        s->loss_sum += losses[r];
        s->count += 1;
        s->correct += predictions[r] == b->labels[r];
    }
    s->exact_sequences = s->correct;
    s->sequences = s->count;
}

void metrics_accumulate(metric_sums *s, const data_batch *b, const float *losses, const int32_t *predictions,
                        bool classification, int vocab_size, int *counts_scratch) {
    if (classification) {
        accumulate_classification(s, b, losses, predictions);
        return;
    }
    int T = b->T;
    int *counts = counts_scratch, *k = counts + vocab_size;
    for (int r = 0; r < b->B; r++) {
        const int32_t *inputs = b->inputs + (size_t)r * T, *targets = b->targets + (size_t)r * T;
        metric_occurrence_counts(inputs, targets, T, counts, vocab_size, k);
        bool exact = true, any = false;
        for (int t = 0; t < T; t++) {
            if (targets[t] < 0) continue;
            double loss = losses[(size_t)r * T + t];
            bool right = predictions[(size_t)r * T + t] == targets[t];
            any = true;
            exact &= right;
            s->loss_sum += loss;
            s->count += 1;
            s->correct += right;
            if (k[t] == 0) {
                s->new_sum += loss;
                s->new_count += 1;
            } else {
                s->rep_sum += loss;
                s->rep_count += 1;
            }
            int bin = k[t] < OCCURRENCE_BINS - 1 ? k[t] : OCCURRENCE_BINS - 1;
            s->by_k_sum[bin] += loss;
            s->by_k_count[bin] += 1;
        }
        if (any) {
            s->sequences += 1;
            s->exact_sequences += exact;
        }
    }
}

void metrics_row_repeats(const int32_t *inputs, const int32_t *targets, const float *losses, int T, int *counts_scratch,
                         int vocab_size, double *sum, double *count) {
    int *k = counts_scratch + vocab_size;
    metric_occurrence_counts(inputs, targets, T, counts_scratch, vocab_size, k);
    for (int t = 0; t < T; t++)
        if (targets[t] >= 0 && k[t] >= 1) *sum += losses[t], *count += 1;
}

static double ratio(double sum, double count) { return count > 0 ? sum / count : 0.0 / 0.0; }

void metrics_finish(const metric_sums *s, metric_values *out) {
    out->loss = ratio(s->loss_sum, s->count);
    out->acc = ratio(s->correct, s->count);
    out->L_new = ratio(s->new_sum, s->new_count);
    out->L_rep = ratio(s->rep_sum, s->rep_count);
    out->exact_match = ratio(s->exact_sequences, s->sequences);
    for (int k = 0; k < OCCURRENCE_BINS; k++) out->loss_by_k[k] = ratio(s->by_k_sum[k], s->by_k_count[k]);
    out->delta_12 = out->loss_by_k[0] - out->loss_by_k[1];
    out->bpb = out->loss / M_LN2;
}

void metric_values_none(metric_values *out) {
    out->loss = out->L_new = out->L_rep = out->delta_12 = out->acc = out->exact_match = out->bpb = NAN;
    for (int k = 0; k < OCCURRENCE_BINS; k++) out->loss_by_k[k] = NAN;
}

const char *metric_text(double value, int digits, char *buf, size_t len) {
    if (isfinite(value)) snprintf(buf, len, "%.*f", digits, value);
    else snprintf(buf, len, "%s", isnan(value) ? "—" : value > 0 ? "inf" : "-inf");
    return buf;
}

void metric_values_format(const metric_values *e, int task, int digits, char *out, size_t len) {
    const struct {
        const char *name;
        double value;
        int task; /* -1: every task */
    } shown[] = {
        {"loss", e->loss, -1},           {"bpb", e->bpb, TASK_TEXT},           {"ppl", exp(e->loss), TASK_TEXT},
        {"acc", e->acc, TASK_COPY},      {"exact", e->exact_match, TASK_COPY}, {"acc", e->acc, TASK_LISTOPS},
        {"L_new", e->L_new, TASK_CHAIN}, {"L_rep", e->L_rep, TASK_CHAIN},      {"delta_12", e->delta_12, TASK_CHAIN}};
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof shown / sizeof shown[0] && n < len; i++) {
        if (shown[i].task >= 0 && shown[i].task != task) continue;
        char value[32];
        n += (size_t)snprintf(out + n, len - n, "%s%s %s", n ? " | " : "", shown[i].name,
                              metric_text(shown[i].value, digits, value, sizeof value));
    }
}

void metric_table_init(metric_table *t) { memset(t, 0, sizeof *t); }

static void metric_table_add_column(metric_table *t, const char *name, int width, bool integer) {
    t->columns = sys_realloc(t->columns, sizeof(metric_column) * (size_t)(t->n_columns + 1));
    metric_column *c = &t->columns[t->n_columns++];
    memset(c, 0, sizeof *c);
    strncpy(c->name, name, sizeof c->name - 1);
    c->width = width;
    c->inner = 1;
    c->integer = integer;
    t->row_width += width;
}

/* A column stored [rows, width] whatever its width (1 included). */
static void metric_table_add_vector_column(metric_table *t, const char *name, int width) {
    metric_table_add_column(t, name, width, false);
    t->columns[t->n_columns - 1].vector = true;
}

/* A column whose rows are [n_rows_inner, inner] matrices. */
static void metric_table_add_matrix_column(metric_table *t, const char *name, int outer, int inner) {
    metric_table_add_column(t, name, outer * inner, false);
    t->columns[t->n_columns - 1].inner = inner;
}

int metric_column_shape(const metric_column *c, long long rows, unsigned long long dims[3]) {
    dims[0] = (unsigned long long)rows;
    if (c->width == 1 && c->inner <= 1 && !c->vector) return 1;
    if (c->inner <= 1) {
        dims[1] = (unsigned long long)c->width;
        return 2;
    }
    dims[1] = (unsigned long long)(c->width / c->inner);
    dims[2] = (unsigned long long)c->inner;
    return 3;
}

void metric_table_append(metric_table *t, const double *row) {
    if (t->n_rows == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 64;
        t->values = sys_realloc(t->values, sizeof(double) * (size_t)(t->capacity * t->row_width));
    }
    memcpy(t->values + t->n_rows * t->row_width, row, sizeof(double) * (size_t)t->row_width);
    t->n_rows++;
}

int metric_table_column_offset(const metric_table *t, const char *name) {
    int offset = 0;
    for (int i = 0; i < t->n_columns; i++) {
        if (strcmp(t->columns[i].name, name) == 0) return offset;
        offset += t->columns[i].width;
    }
    return -1;
}

void metric_table_set(const metric_table *t, double *row, const char *name, const double *values) {
    int offset = 0;
    for (int i = 0; i < t->n_columns; i++) {
        if (strcmp(t->columns[i].name, name) == 0) {
            memcpy(row + offset, values, sizeof(double) * (size_t)t->columns[i].width);
            return;
        }
        offset += t->columns[i].width;
    }
}

void metric_table_free(metric_table *t) {
    free(t->columns);
    free(t->values);
    memset(t, 0, sizeof *t);
}

void metric_tables_standard(metric_table *train, metric_table *eval, int n_layers, int n_heads) {
    metric_table_init(train);
    metric_table_add_column(train, "step", 1, true);
    metric_table_add_column(train, "loss", 1, false);
    metric_table_add_column(train, "lr", 1, false);
    metric_table_add_column(train, "grad_norm", 1, false);
    metric_table_add_column(train, "tokens_per_s", 1, false);
    metric_table_init(eval);
    metric_table_add_column(eval, "step", 1, true);
    metric_table_add_column(eval, "loss", 1, false);
    metric_table_add_column(eval, "L_new", 1, false);
    metric_table_add_column(eval, "L_rep", 1, false);
    metric_table_add_column(eval, "delta_12", 1, false);
    metric_table_add_column(eval, "acc", 1, false);
    metric_table_add_column(eval, "exact_match", 1, false);
    metric_table_add_column(eval, "loss_by_k", OCCURRENCE_BINS, false);
    metric_table_add_column(eval, "gain_R", n_layers, false);
    metric_table_add_column(eval, "gain_R_attn", n_layers, false);
    metric_table_add_matrix_column(eval, "gamma", n_layers, n_heads);
}

void metric_tables_add_task_columns(metric_table *train, metric_table *eval, const config *c) {
    if (c->task == TASK_TEXT) {
        if (train) metric_table_add_column(train, "bpb", 1, false);
        if (eval) metric_table_add_column(eval, "bpb", 1, false);
    }
    if (c->task != TASK_CHAIN || !eval) return;
    /* the length-generalisation eval (NaN without data.eval_chain_len) and
     * the attention read-out (docs/metrics.md §3) */
    static const char *scalars[] = {"lengen_loss", "lengen_L_new", "lengen_L_rep", "lengen_delta_12"};
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) metric_table_add_column(eval, scalars[i], 1, false);
    metric_table_add_column(eval, "lengen_loss_by_k", OCCURRENCE_BINS, false);
    chain_periods p = chain_periods_of(c, false);
    metric_table_add_vector_column(eval, "L_rep_by_period", p.hi - p.lo + 1);
    static const char *heads[] = {"attn_positional", "attn_induction", "lengen_attn_positional",
                                  "lengen_attn_induction"};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        metric_table_add_matrix_column(eval, heads[i], c->n_layers, c->n_heads);
}

/* Column `name` of row `index`, or NaN when the table lacks it. */
static double row_value(const metric_table *t, long long index, const char *name) {
    int offset = metric_table_column_offset(t, name);
    return offset < 0 ? NAN : t->values[index * t->row_width + offset];
}

void metric_values_from_row(const metric_table *eval, long long index, metric_values *out) {
    out->loss = row_value(eval, index, "loss");
    out->L_new = row_value(eval, index, "L_new");
    out->L_rep = row_value(eval, index, "L_rep");
    out->delta_12 = row_value(eval, index, "delta_12");
    out->acc = row_value(eval, index, "acc");
    out->exact_match = row_value(eval, index, "exact_match");
    /* token corpora record NaN where the bytes per token are unknown */
    out->bpb = metric_table_column_offset(eval, "bpb") < 0 ? out->loss / M_LN2 : row_value(eval, index, "bpb");
    int offset = metric_table_column_offset(eval, "loss_by_k");
    for (int k = 0; k < OCCURRENCE_BINS; k++)
        out->loss_by_k[k] = offset < 0 ? NAN : eval->values[index * eval->row_width + offset + k];
}
