/* Evaluation (docs/metrics.md §3; docs/design.md §8.5); see eval.h. */
#include "eval/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"
#include "data/chain.h"
#include "eval/readouts.h"
#include "kernels/kernels.h"
#include "model/stream.h"
#include "parallel/context.h"
#include "parallel/dist.h"

void eval_result_init(eval_result *r, const model *m) {
    memset(r, 0, sizeof *r);
    size_t LH = (size_t)m->L * m->H;
    r->heads = (int)LH;
    r->gain_R = sys_calloc((size_t)m->L * 2 + 5 * LH, sizeof(double));
    r->gain_R_attn = r->gain_R + m->L;
    r->gamma = r->gain_R_attn + m->L;
    r->attn = r->gamma + LH;
    r->length_attn = r->attn + 2 * LH;
    for (size_t i = 0; i < 4 * LH; i++) r->attn[i] = NAN; /* until a chain eval measures them */
    metric_values_none(&r->length_metrics);
    chain_periods p = chain_periods_of(&m->cfg, false);
    r->n_periods = p.hi - p.lo + 1;
    r->L_rep_by_period = sys_calloc((size_t)r->n_periods, sizeof(double));
    for (int i = 0; i < r->n_periods; i++) r->L_rep_by_period[i] = NAN;
}

void eval_result_free(eval_result *r) {
    free(r->gain_R);
    free(r->L_rep_by_period);
    memset(r, 0, sizeof *r);
}

void eval_readouts(const model *m, eval_result *r) { readouts_gammas(m, r->gamma); }

/* Streams the batch's rows in segments; returns the largest difference from
 * the full forward's logits and fills losses/predictions from the streamed
 * logits. -1 with err on a failure. */
static double stream_batch(model *m, const data_batch *b, int segment, const float *full_logits, float *losses,
                           int32_t *predictions, status *err) {
    int T = b->T, S = b->B, V = m->V;
    stream_state st;
    if (stream_create(&st, m, S, T, segment, err) != 0) return -1;
    float *seg_logits = sys_calloc((size_t)S * segment * V, sizeof(float));
    int32_t *tokens = sys_calloc((size_t)S * segment, sizeof(int32_t));
    float *probs = sys_calloc((size_t)V, sizeof(float));
    double max_diff = 0;
    for (int pos = 0; pos < T && max_diff >= 0; pos += segment) {
        int n = T - pos < segment ? T - pos : segment;
        for (int s = 0; s < S; s++)
            memcpy(tokens + (size_t)s * n, b->inputs + (size_t)s * T + pos, sizeof(int32_t) * n);
        if (stream_forward(m, &st, tokens, n, seg_logits, err) != 0) {
            max_diff = -1;
            break;
        }
        for (int s = 0; s < S; s++)
            for (int r = 0; r < n; r++) {
                size_t at = (size_t)s * T + pos + r;
                const float *mine = seg_logits + ((size_t)s * n + r) * V, *full = full_logits + at * V;
                for (int v = 0; v < V; v++) max_diff = fmax(max_diff, fabs((double)mine[v] - full[v]));
                memcpy(probs, mine, sizeof(float) * V);
                cross_entropy_forward(probs, losses + at, predictions + at, b->targets + at, 1, V);
            }
    }
    free(seg_logits), free(tokens), free(probs);
    stream_free(&st);
    return max_diff;
}

/* Running sums of one evaluation, reduced over ranks at the end. */
typedef struct {
    metric_sums full, streamed, length; /* length: the length-generalisation eval */
    /* [2][2LH + 1]: attention read-out sums of the eval split, then of the
     * length eval (readouts_attention_scores) */
    double *scores;
    /* [2][n_periods]: L_rep sums, then counts, by the sample's period (chain) */
    double *by_period;
    const data_source *data;
    int batch; /* the eval batch being summed */
    /* [2L + 1]: gain ratio sums per block, the row count, then the attention
     * sublayer's ratio sums per layer (gain_R_attn) */
    double *gains;
    float *losses; /* [B*T] streamed losses, or a context group's gathered ones */
    int32_t *predictions;
    float *gathered; /* a context group's: this rank's losses and predictions, then every rank's */
    int *counts;     /* [V + T]: the occurrence counts of metrics_accumulate and L_rep by period */
    readouts_scratch readouts;
    double max_diff;
    double target_bytes; /* of the counted targets (data_target_bytes), for bpb */
} eval_sums;

struct evaluator {
    eval_result result;
    int stream_segment;
    eval_sums sums; /* its buffers, carved from memory; its sums zero (eval_sums_start) */
    size_t n_sums;  /* the doubles summed over ranks, zeroed by each evaluate: scores, by_period, gains */
    void *memory;
};

/* The evaluator's buffers, in elements (evaluator_bytes). Whole rows (B x
 * seq_len): a context group gathers its shards' losses into them; the
 * block gains' copies only where whole sequences are on a rank. */
typedef struct {
    size_t scores, by_period, gains; /* the doubles reduced over ranks (eval_sums) */
    size_t norms, rows, gathered, copies, counts;
} eval_sizes;

static eval_sizes eval_sizes_of(const model *m, const data_shard *shard) {
    int LH = m->L * m->H, micro = config_micro_rows(&m->cfg, shard->batch.B);
    chain_periods p = chain_periods_of(&m->cfg, false);
    bool cut = shard->cut.chunks > 1, gains = config_eval_readouts(&m->cfg) && !cut;
    eval_sizes s = {.rows = (size_t)shard->batch.B * shard->cut.T_seq, .norms = (size_t)micro};
    s.scores = 2 * (2 * (size_t)LH + 1), s.by_period = 2 * (size_t)(p.hi - p.lo + 1), s.gains = 2 * (size_t)m->L + 1;
    s.gathered = cut ? (1 + (size_t)context_size()) * 2 * s.rows : 0;
    s.copies = readouts_scratch_floats(m, micro, shard->batch.T, gains);
    s.counts = (size_t)m->V + shard->cut.T_seq;
    return s;
}

size_t evaluator_bytes(const model *m, const data_shard *shard) {
    eval_sizes s = eval_sizes_of(m, shard);
    return sizeof(double) * (s.scores + s.by_period + s.gains + s.norms) +
           sizeof(float) * (s.rows + s.gathered + s.copies) + sizeof(int32_t) * s.rows + sizeof(int) * s.counts;
}

evaluator *evaluator_create(model *m, const data_shard *shard, int stream_segment, status *err) {
    if (stream_segment > 0 && stream_check(m, shard->batch.T, err) != 0) return NULL;
    evaluator *ev = sys_calloc(1, sizeof *ev);
    eval_result_init(&ev->result, m);
    ev->stream_segment = stream_segment;
    eval_sizes s = eval_sizes_of(m, shard);
    ev->memory = sys_calloc(evaluator_bytes(m, shard), 1);
    eval_sums *e = &ev->sums; /* doubles, then floats, then 32-bit integers: each aligned */
    e->scores = ev->memory;
    e->by_period = e->scores + s.scores;
    e->gains = e->by_period + s.by_period;
    ev->n_sums = s.scores + s.by_period + s.gains;
    e->readouts.delta_norms = e->scores + ev->n_sums;
    e->losses = (float *)(e->readouts.delta_norms + s.norms);
    e->gathered = s.gathered ? e->losses + s.rows : NULL;
    e->readouts.copies = e->losses + s.rows + s.gathered;
    e->predictions = (int32_t *)(e->readouts.copies + s.copies);
    e->counts = e->readouts.tokens = (int *)(e->predictions + s.rows);
    return ev;
}

void evaluator_free(evaluator *ev) {
    if (!ev) return;
    eval_result_free(&ev->result);
    free(ev->memory);
    free(ev);
}

const eval_result *evaluator_result(const evaluator *ev) { return &ev->result; }

/* Rows [first, first + rows) of b as a batch of their own (no copy). */
static data_batch rows_of(const data_batch *b, int first, int rows) {
    size_t at = (size_t)first * b->T;
    return (data_batch){rows, b->T, b->inputs + at, b->targets + at, b->labels ? b->labels + first : NULL};
}

/* L_rep of each row into its period's bin (docs/metrics.md §3), the period
 * as data_fill drew it. */
static void add_rep_by_period(const model *m, const data_batch *v, const float *losses, long long first_row,
                              eval_sums *e) {
    chain_periods p = chain_periods_of(&m->cfg, false);
    int n = p.hi - p.lo + 1, T = v->T;
    for (int r = 0; r < v->B; r++) {
        int bin = data_sample_period(e->data, SPLIT_EVAL, e->batch, first_row + r) - p.lo;
        size_t at = (size_t)r * T;
        metrics_row_repeats(v->inputs + at, v->targets + at, losses + at, T, e->counts, m->V, &e->by_period[bin],
                            &e->by_period[n + bin]);
    }
}

/* A context group's rows (docs/design.md §8.12): every rank's losses and
 * predictions of rows v gathered into whole rows (B x seq_len floats each,
 * small beside the activations), so that the metrics that count over a
 * whole sequence (occurrences, exact match) run unchanged, on the group's
 * first rank alone. lm only: a cls row's loss is already the sequence's. */
static void gather_rows(const model *m, const data_batch *v, eval_sums *e) {
    const context_cut *cut = &m->cut;
    int C = context_size(), T = cut->T_seq, most = 0;
    for (int c = 0; c < C; c++) {
        context_cut other = context_cut_of(T, C, c, cut->n == 2);
        most = other.total > most ? other.total : most;
    }
    size_t per_rank = 2 * (size_t)v->B * most;
    float *mine = e->gathered, *all = mine + per_rank;
    for (int r = 0; r < v->B; r++)
        for (int t = 0; t < v->T; t++) {
            mine[(size_t)r * most + t] = m->acts.losses[(size_t)r * v->T + t];
            mine[(size_t)(v->B + r) * most + t] = (float)m->acts.predictions[(size_t)r * v->T + t];
        }
    context_allgather(mine, all, per_rank, "eval losses all-gather");
    for (int c = 0; c < C; c++) {
        context_cut other = context_cut_of(T, C, c, cut->n == 2);
        const float *from = all + c * per_rank;
        for (int r = 0; r < v->B; r++)
            for (int k = 0, at = 0; k < other.n; at += other.len[k], k++)
                for (int t = 0; t < other.len[k]; t++) {
                    size_t to = (size_t)r * T + other.start[k] + t;
                    e->losses[to] = from[(size_t)r * most + at + t];
                    e->predictions[to] = (int32_t)from[(size_t)(v->B + r) * most + at + t];
                }
    }
}

/* One forward of rows v (global sample index first_row onwards) into the
 * sums; gain_R's random directions are keyed by sample, so the rows may
 * come in any grouping. `whole`: v's whole rows when v holds a context
 * group's shard of them, else NULL. */
static int evaluate_rows(model *m, const data_source *data, const data_batch *v, const data_batch *whole,
                         long long first_row, uint64_t seed, int segment, eval_sums *e, status *err) {
    model_forward(m, v->inputs, v->targets, v->labels, v->B, v->T, false);
    bool cls = m->cfg.head == HEAD_CLS, counts = !whole || context_rank() == 0;
    const data_batch *rows = whole ? whole : v;
    const float *losses = m->acts.losses;
    const int32_t *predictions = m->acts.predictions;
    if (whole && !cls) {
        gather_rows(m, v, e);
        losses = e->losses, predictions = e->predictions;
    }
    if (!counts) return 0; /* the group's first rank counts its sequences */
    metrics_accumulate(&e->full, rows, losses, predictions, cls, m->V, e->counts);
    e->target_bytes += data_target_bytes(data, rows->targets, (size_t)rows->B * rows->T);
    /* before the block gains: their perturbed forwards replace the losses and the saved attention state */
    if (m->cfg.task == TASK_CHAIN) add_rep_by_period(m, rows, losses, first_row, e);
    if (whole) return 0; /* the read-outs and the streamed eval need whole sequences on a rank */
    if (m->cfg.task == TASK_CHAIN)
        readouts_attention_scores(m, v->inputs, v->targets, v->B, v->T, m->cfg.chain_len, e->scores, &e->readouts);
    if (config_eval_readouts(&m->cfg))
        readouts_block_gains(m, v->B, v->T, seed, first_row, e->gains, e->gains + m->L + 1, &e->readouts);
    e->gains[m->L] += v->B;
    if (segment <= 0) return 0;
    /* readouts_block_gains leaves the forward's logits as they were */
    double diff = stream_batch(m, v, segment, m->acts.logits, e->losses, e->predictions, err);
    if (diff < 0) return err->code;
    e->max_diff = fmax(e->max_diff, diff);
    metrics_accumulate(&e->streamed, v, e->losses, e->predictions, false, m->V, e->counts);
    return 0;
}

/* Eval batch i of this rank's shard, in forwards of train.micro_batch rows
 * as training takes them (docs/scale.md §7), so that evaluating needs no
 * more activation memory than a training step. */
static int evaluate_batch(model *m, data_shard *shard, int i, int segment, eval_sums *e, status *err) {
    data_batch *b = &shard->batch;
    bool cut = shard->cut.chunks > 1;
    if (data_shard_fill(shard, SPLIT_EVAL, i, cut, err) != 0) return err->code;
    e->data = shard->data;
    e->batch = i;
    int rows = config_micro_rows(&m->cfg, b->B), rc = 0;
    for (int first = 0; first < b->B && rc == 0; first += rows) {
        int n = b->B - first < rows ? b->B - first : rows;
        data_batch v = rows_of(b, first, n), whole = cut ? rows_of(&shard->full, first, n) : v;
        rc = evaluate_rows(m, shard->data, &v, cut ? &whole : NULL, shard->first + first,
                           (uint64_t)m->cfg.seed + (uint64_t)i, segment, e, err);
    }
    return rc;
}

/* Batch i of the length-generalisation eval (docs/tasks.md §2: split 2,
 * periods data.eval_chain_len .. eval_chain_len_max): loss metrics and the
 * attention read-out only. */
static int evaluate_length_batch(model *m, data_shard *shard, int i, eval_sums *e, status *err) {
    data_batch *b = &shard->batch;
    bool cut = shard->cut.chunks > 1;
    if (data_shard_fill(shard, SPLIT_LENGTH, i, cut, err) != 0) return err->code;
    int rows = config_micro_rows(&m->cfg, b->B), LH = m->L * m->H;
    for (int first = 0; first < b->B; first += rows) {
        int n = b->B - first < rows ? b->B - first : rows;
        data_batch v = rows_of(b, first, n);
        model_forward(m, v.inputs, v.targets, v.labels, v.B, v.T, false);
        if (!cut) {
            metrics_accumulate(&e->length, &v, m->acts.losses, m->acts.predictions, false, m->V, e->counts);
            readouts_attention_scores(m, v.inputs, v.targets, v.B, v.T, m->cfg.chain_len, e->scores + 2 * LH + 1,
                                      &e->readouts);
            continue;
        }
        data_batch whole = rows_of(&shard->full, first, n); /* a context group's: see evaluate_rows */
        gather_rows(m, &v, e);
        if (context_rank() == 0)
            metrics_accumulate(&e->length, &whole, e->losses, e->predictions, false, m->V, e->counts);
    }
    return 0;
}

/* Positional and induction means from the summed weights and the query count
 * (docs/metrics.md §3); NaN where no query counted. */
static void finish_scores(const double *sums, int LH, double *out) {
    for (int i = 0; i < 2 * LH; i++) out[i] = sums[2 * LH] > 0 ? sums[i] / sums[2 * LH] : NAN;
}

static bool length_eval_on(const model *m) { return m->cfg.task == TASK_CHAIN && m->cfg.eval_chain_len > 0; }

/* Zero sums on the evaluator's buffers: evaluate sums into a copy of ev->sums,
 * whose own scalars stay the zeros of evaluator_create; the doubles reduced
 * over ranks are zeroed here (the rows are written before they are read). */
static eval_sums eval_sums_start(const evaluator *ev) {
    memset(ev->sums.scores, 0, sizeof(double) * ev->n_sums);
    return ev->sums;
}

/* Every rank's sums into the result (collective). */
static void finish_result(const model *m, const data_shard *shard, bool streamed, eval_sums *e, eval_result *r) {
    int LH = m->L * m->H;
    dist_sum_doubles((double *)&e->full, (int)METRIC_SUMS_DOUBLES);
    metrics_finish(&e->full, &r->metrics);
    dist_sum_doubles(e->scores, 2 * (2 * LH + 1));
    if (m->cfg.task == TASK_CHAIN) {
        finish_scores(e->scores, LH, r->attn);
        dist_sum_doubles(e->by_period, 2 * r->n_periods);
        for (int p = 0; p < r->n_periods; p++)
            r->L_rep_by_period[p] =
                e->by_period[r->n_periods + p] > 0 ? e->by_period[p] / e->by_period[r->n_periods + p] : NAN;
    }
    r->length_eval = length_eval_on(m);
    if (r->length_eval) {
        dist_sum_doubles((double *)&e->length, (int)METRIC_SUMS_DOUBLES);
        metrics_finish(&e->length, &r->length_metrics);
        finish_scores(e->scores + 2 * LH + 1, LH, r->length_attn);
    }
    /* bits per byte from the bytes the evaluated targets stand for (docs/metrics.md §3) */
    dist_sum_doubles(&e->target_bytes, 1);
    r->metrics.bpb = e->full.loss_sum / (M_LN2 * e->target_bytes);
    dist_sum_doubles(e->gains, 2 * m->L + 1);
    /* without the read-outs (train.eval_readouts) gain_R is NaN: not measured */
    r->gains_measured = config_eval_readouts(&m->cfg) && shard->cut.chunks == 1; /* whole sequences only */
    double rows = r->gains_measured ? e->gains[m->L] : NAN;
    for (int l = 0; l < m->L; l++) r->gain_R[l] = e->gains[l] / rows;
    for (int l = 0; l < m->L; l++) r->gain_R_attn[l] = e->gains[m->L + 1 + l] / rows;
    eval_readouts(m, r);
    r->streamed = streamed;
    if (!streamed) return;
    dist_sum_doubles((double *)&e->streamed, (int)METRIC_SUMS_DOUBLES);
    metrics_finish(&e->streamed, &r->stream_metrics);
    r->stream_metrics.bpb = e->streamed.loss_sum / (M_LN2 * e->target_bytes);
    r->stream_max_diff = dist_max_double(e->max_diff);
}

int evaluate(evaluator *ev, model *m, data_shard *shard, status *err) {
    int stream_segment = ev->stream_segment, rc = 0;
    eval_sums e = eval_sums_start(ev);
    m->keep_logits = stream_segment > 0;
    for (int i = 0; i < m->cfg.eval_batches && rc == 0; i++) {
        rc = evaluate_batch(m, shard, i, stream_segment, &e, err);
        if (rc == 0 && length_eval_on(m)) rc = evaluate_length_batch(m, shard, i, &e, err);
    }
    m->keep_logits = false;
    if (rc == 0) finish_result(m, shard, stream_segment > 0, &e, &ev->result);
    return rc;
}

void eval_result_row(const eval_result *r, long long step, const metric_table *eval_log, double *row) {
    const metric_values *e = &r->metrics;
    const struct {
        const char *name;
        double value;
    } scalars[] = {{"step", (double)step},
                   {"loss", e->loss},
                   {"L_new", e->L_new},
                   {"L_rep", e->L_rep},
                   {"delta_12", e->delta_12},
                   {"acc", e->acc},
                   {"exact_match", e->exact_match}};
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++)
        metric_table_set(eval_log, row, scalars[i].name, &scalars[i].value);
    metric_table_set(eval_log, row, "loss_by_k", e->loss_by_k);
    metric_table_set(eval_log, row, "bpb", &e->bpb);
    metric_table_set(eval_log, row, "gain_R", r->gain_R);
    metric_table_set(eval_log, row, "gain_R_attn", r->gain_R_attn);
    metric_table_set(eval_log, row, "gamma", r->gamma);
    /* the chain task's columns (metric_tables_add_task_columns); other tables lack them */
    const metric_values *g = &r->length_metrics;
    const struct {
        const char *name;
        const double *values;
    } chain[] = {{"lengen_loss", &g->loss},
                 {"lengen_L_new", &g->L_new},
                 {"lengen_L_rep", &g->L_rep},
                 {"lengen_delta_12", &g->delta_12},
                 {"lengen_loss_by_k", g->loss_by_k},
                 {"L_rep_by_period", r->L_rep_by_period},
                 {"attn_positional", r->attn},
                 {"attn_induction", r->attn + r->heads},
                 {"lengen_attn_positional", r->length_attn},
                 {"lengen_attn_induction", r->length_attn + r->heads}};
    for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++)
        metric_table_set(eval_log, row, chain[i].name, chain[i].values);
}
