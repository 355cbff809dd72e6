/* Metrics of docs/metrics.md §3 and the in-memory history that checkpoints store under
 * /metrics (docs/files.md §4). Sums and counts are kept apart so that data-parallel
 * ranks reduce them exactly (one MPI_Allreduce of the whole struct). */
#ifndef MOMFMM_METRICS_H
#define MOMFMM_METRICS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/data.h"

#define OCCURRENCE_BINS 16

typedef struct {
    double loss_sum, count, correct;
    double new_sum, new_count, rep_sum, rep_count;
    double by_k_sum[OCCURRENCE_BINS], by_k_count[OCCURRENCE_BINS];
    double exact_sequences, sequences;
} metric_sums;
#define METRIC_SUMS_DOUBLES (sizeof(metric_sums) / sizeof(double))

typedef struct {
    double loss, L_new, L_rep, delta_12, acc, exact_match;
    double loss_by_k[OCCURRENCE_BINS];
    double bpb; /* bits per predicted byte, loss / ln 2 (docs/metrics.md §3, text) */
} metric_values;

/* Every field NaN: metrics of an eval that did not run. */
void metric_values_none(metric_values *out);

/* "1.234" with `digits` decimals, or "—" for a value with no data (an empty
 * bin is NaN in the tables, docs/metrics.md §3; never printed as nan). */
const char *metric_text(double value, int digits, char *buf, size_t len);
/* The metrics a task is read by (docs/metrics.md §3), as "loss 1.2345 | bpb 1.7811":
 * text loss and bits per byte; copy accuracy and exact match; listops
 * accuracy; chain L_new, L_rep, delta_12. */
void metric_values_format(const metric_values *e, int task, int digits, char *out, size_t len);

/* L_rep's sum and count of one row (targets with k >= 1) added into *sum,
 * *count: the chain task's L_rep by period (docs/metrics.md §3).
 * counts_scratch holds vocab_size + T ints. */
void metrics_row_repeats(const int32_t *inputs, const int32_t *targets, const float *losses, int T, int *counts_scratch,
                         int vocab_size, double *sum, double *count);

/* Adds a batch: lm uses per-target losses and predictions; cls per row.
 * counts_scratch holds vocab_size + b->T ints (lm). */
void metrics_accumulate(metric_sums *s, const data_batch *b, const float *losses, const int32_t *predictions,
                        bool classification, int vocab_size, int *counts_scratch);
void metrics_finish(const metric_sums *s, metric_values *out);

/* A growing table of columns, one row per logged step or eval. */
typedef struct {
    char name[32];
    int width;    /* values per row: 1, 16 for loss_by_k, n_layers * n_heads for gamma */
    int inner;    /* > 1: each row is a [width / inner, inner] matrix */
    bool integer; /* stored as int64 (step) */
    bool vector;  /* [rows, width] even when width is 1 (a per-period column) */
} metric_column;

/* HDF5 shape of a column holding `rows` rows: [rows] (width 1), [rows,
 * width] (or a vector column) or [rows, width / inner, inner]. Returns the rank. */
int metric_column_shape(const metric_column *c, long long rows, unsigned long long dims[3]);

typedef struct {
    metric_column *columns;
    int n_columns, row_width;
    long long n_rows, capacity;
    double *values; /* [n_rows][row_width] */
} metric_table;

void metric_table_init(metric_table *t);
void metric_table_append(metric_table *t, const double *row);
/* Column offset within a row, or -1. */
int metric_table_column_offset(const metric_table *t, const char *name);
/* Copies the column's width of values into its place in `row` (the one
 * place that maps names to row positions; a name not in t is ignored). */
void metric_table_set(const metric_table *t, double *row, const char *name, const double *values);
void metric_table_free(metric_table *t);

/* The train and eval tables with the columns of docs/metrics.md §3, docs/files.md §4; eval also has
 * gain_R [n, n_layers] and the per-head momentum gamma [n, n_layers, n_heads]. */
void metric_tables_standard(metric_table *train, metric_table *eval, int n_layers, int n_heads);
/* Adds the columns of the task (docs/files.md §4): `bpb` to both tables for
 * text; for chain, to eval, the length-generalisation eval's loss metrics
 * (lengen_*), L_rep by period (one per period of [chain_len,
 * chain_len_max]) and the attention read-out per head (attn_positional,
 * attn_induction and their lengen_ twins, [n_layers, n_heads]). Called after
 * metric_tables_standard; either table may be NULL. */
void metric_tables_add_task_columns(metric_table *train, metric_table *eval, const config *c);
/* The metric_values of row `index` of an eval table (fields it lacks are NaN). */
void metric_values_from_row(const metric_table *eval, long long index, metric_values *out);
#endif
