/* HDF5 files of docs/files.md §4, read: the file format only (names,
 * listing, pruning and temporary names are the store's, docs/design.md
 * §8.4). Reads check every attribute, dataset and shape and return
 * EXIT_BAD_FILE naming the file and what is wrong. Writing the same layout
 * is checkpoint_write.c's. */
#include "store/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/build_info.h"
#include "base/status.h"
#include "base/sys.h"
#include "hdf5/h5kind.h"
#include "hdf5/h5reader.h"
#include "hdf5/h5util.h"
#include "hdf5/h5writer.h"
#include "kernels/gemm.h"

/* ---- reading (through the hostile-file reader, h5reader.h) ------------ */

/* The root attribute config_ini, parsed and checked. */
static void read_config_ini(h5reader *r, config *c) {
    char *ini = h5reader_attr_string(r, "config_ini");
    status st;
    config_defaults(c);
    /* data.resolved_path: what the run read, whatever the current directory */
    int bad = config_load_string(c, ini, "config_ini", &st) != 0 || config_check(c, "config_ini", &st) != 0 ||
              config_resolve_data_path(c, true, &st) != 0;
    free(ini);
    if (bad) h5reader_fail(r, "%s", st.message);
}

/* The floats of the model a config describes: its parameters (the layout
 * model_create builds) and RoPE tables, in double for the size checks. */
static double model_floats(const config *c) {
    double positions = c->max_seq_len > c->seq_len ? c->max_seq_len : c->seq_len;
    return (double)model_param_count(c) + positions * config_head_dim(c);
}

/* A config from a file whose model (times `copies`: 4 with gradients and
 * moments) cannot fit in memory is a bad file, refused before allocating. */
static void check_model_fits(h5reader *r, const config *c, int copies) {
    double bytes = 4.0 * copies * model_floats(c), available = sys_memory_available();
    if (available > 0 && bytes > available)
        h5reader_fail(r,
                      "config_ini describes a model of %.3g GB (model.d_model = %d, model.vocab_size = %d, "
                      "model.n_layers = %d), more than the %.3g GB of memory available",
                      bytes / 1e9, c->d_model, c->vocab_size, c->n_layers, available / 1e9);
}

static void read_config_body(h5reader *r, config *c, checkpoint_info *info) {
    h5kind_require(r, H5KIND_CHECKPOINT);
    char *format = h5reader_attr_string(r, "format");
    bool ours = strcmp(format, CHECKPOINT_FORMAT) == 0;
    if (!ours) {
        char shown[64];
        snprintf(shown, sizeof shown, "%s", format);
        free(format);
        h5reader_fail(r, "format is '%s', expected '%s'", shown, CHECKPOINT_FORMAT);
    }
    free(format);
    long long version = h5reader_attr_int(r, "format_version");
    if (version < 1 || version > CHECKPOINT_FORMAT_VERSION)
        h5reader_fail(r, "format_version %lld is not supported (this build reads 1..%d)", version,
                      CHECKPOINT_FORMAT_VERSION);
    info->step = h5reader_attr_int(r, "step");
    info->tokens_seen = h5reader_attr_int(r, "tokens_seen");
    long long world_size = h5reader_attr_int(r, "world_size");
    if (info->step < 0) h5reader_fail(r, "step = %lld is negative", info->step);
    if (info->tokens_seen < 0) h5reader_fail(r, "tokens_seen = %lld is negative", info->tokens_seen);
    if (world_size < 1 || world_size > INT_MAX)
        h5reader_fail(r, "world_size = %lld is not a number of ranks", world_size);
    info->world_size = (int)world_size;
    /* added later (docs/files.md §4): absent means none skipped */
    info->skipped_steps = H5Aexists(r->file, "skipped_steps") > 0 ? h5reader_attr_int(r, "skipped_steps") : 0;
    if (info->skipped_steps < 0) h5reader_fail(r, "skipped_steps = %lld is negative", info->skipped_steps);
    /* every skipped step is a step: more would overflow the count past step's limit */
    if (info->skipped_steps > info->step)
        h5reader_fail(r, "skipped_steps = %lld exceeds step = %lld", info->skipped_steps, info->step);
    info->init_from[0] = '\0';
    if (H5Aexists(r->file, "init_from") > 0) {
        char *init_from = h5reader_attr_string(r, "init_from");
        snprintf(info->init_from, sizeof info->init_from, "%s", init_from);
        free(init_from);
    }
    info->gemm_engines[0] = '\0';
    if (H5Aexists(r->file, "gemm_engines") > 0) { /* added later: train.gemm = auto's choices */
        char *engines = h5reader_attr_string(r, "gemm_engines");
        gemm_engine parsed[GEMM_CLASSES];
        bool ok = strlen(engines) < sizeof info->gemm_engines && gemm_class_engines_parse(engines, parsed);
        if (ok) snprintf(info->gemm_engines, sizeof info->gemm_engines, "%s", engines);
        free(engines);
        if (!ok) h5reader_fail(r, "gemm_engines is not a list of class=engine (forward=openblas,...)");
    }
    info->written_by[0] = '\0';
    if (H5Aexists(r->file, "momfmm_version") > 0) {
        char *written_by = h5reader_attr_string(r, "momfmm_version");
        snprintf(info->written_by, sizeof info->written_by, "%s", written_by);
        free(written_by);
        /* shown by inspect: a file's control characters stay out of the terminal */
        for (char *ch = info->written_by; *ch; ch++)
            if ((unsigned char)*ch < 0x20 || *ch == 0x7f) *ch = '?';
    }
    read_config_ini(r, c);
    check_model_fits(r, c, 1);
}

/* Values a checkpoint may not hold (docs/files.md §4, hostile files): any
 * non-finite value, and with `nonnegative` (AdamW's second moments, whose
 * square root the update takes) a negative one. Flat elements [first,
 * first + count) of the model's tensors, base[0] being element `first`. */
static void check_values(h5reader *r, const char *group, const model *m, const float *base, size_t first, size_t count,
                         bool nonnegative) {
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        size_t a = e->offset > first ? e->offset : first, end = e->offset + e->numel;
        size_t b = end < first + count ? end : first + count;
        for (size_t k = a; k < b; k++) {
            float x = base[k - first];
            if (isfinite(x) && !(nonnegative && x < 0)) continue;
            h5reader_fail(r, "%s/%s[%zu] = %g: %s", group, e->name, k - e->offset, x,
                          isfinite(x) ? "a negative second moment (AdamW takes its square root)"
                                      : "a checkpoint of non-finite values is refused");
        }
    }
}

static void read_tensors(h5reader *r, const char *group, const model *m, float *base) {
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        char name[256];
        snprintf(name, sizeof name, "%s/%s", group, e->name);
        hsize_t dims[2] = {(hsize_t)e->shape[0], (hsize_t)e->shape[1]};
        h5reader_read_checked(r, name, H5T_NATIVE_FLOAT, e->ndim, dims, base + e->offset);
    }
}

/* The moments of the model's range only: whole tensors as read_tensors,
 * a tensor cut by the range as a hyperslab of its flat elements. */
static void read_moments(h5reader *r, const char *group, const model *m, float *base) {
    size_t first = m->moment_first, last = first + m->moment_count;
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        size_t a = e->offset > first ? e->offset : first, end = e->offset + e->numel, b = end < last ? end : last;
        if (a >= b) continue;
        char name[256];
        snprintf(name, sizeof name, "%s/%s", group, e->name);
        hsize_t dims[2] = {(hsize_t)e->shape[0], (hsize_t)e->shape[1]};
        if (b - a == e->numel) {
            h5reader_read_checked(r, name, H5T_NATIVE_FLOAT, e->ndim, dims, base + (a - first));
            continue;
        }
        hid_t dset = h5reader_open_checked(r, name, e->ndim, dims);
        hid_t file_space = H5Dget_space(dset);
        h5util_select_flat_range(file_space, e->ndim, dims, a - e->offset, b - e->offset);
        hsize_t n = b - a;
        hid_t mem_space = H5Screate_simple(1, &n, NULL);
        herr_t ok = H5Dread(dset, H5T_NATIVE_FLOAT, mem_space, file_space, H5P_DEFAULT, base + (a - first));
        H5Sclose(mem_space);
        H5Sclose(file_space);
        H5Dclose(dset);
        if (ok < 0) h5reader_fail(r, "cannot read %s (corrupt or wrong type)", name);
    }
}

static void read_buffers(h5reader *r, model *m) {
    for (int l = 0; l < m->L; l++)
        for (int which = 0; which < 2; which++) {
            char name[128];
            snprintf(name, sizeof name, "/buffers/blocks/%d/attn/%s", l, which ? "prev_k" : "prev_q");
            hsize_t dims[2] = {(hsize_t)m->H, (hsize_t)m->dh};
            h5reader_read_checked(r, name, H5T_NATIVE_FLOAT, 2, dims,
                                  m->buffers + (size_t)(l * 2 + which) * m->H * m->dh);
        }
}

/* A text checkpoint written before /metrics/<table>/bpb existed (docs/files.md §4):
 * the column follows from the loss, bits per byte = loss / ln 2. */
static void derive_bpb(metric_table *t, long long rows, int offset) {
    int loss = metric_table_column_offset(t, "loss");
    for (long long i = 0; i < rows && loss >= 0; i++)
        t->values[i * t->row_width + offset] = t->values[i * t->row_width + loss] / M_LN2;
}

/* Columns added to /metrics after format_version 1 was fixed (docs/files.md §4):
 * a file written before them lacks them: gain_R_attn, the chain's lengen_*,
 * attn_* and L_rep_by_period read as NaN there, bpb follows from the loss (derive_bpb). */
static bool column_added_later(const char *name) {
    return strcmp(name, "gain_R_attn") == 0 || strcmp(name, "bpb") == 0 || strncmp(name, "lengen_", 7) == 0 ||
           strncmp(name, "attn_", 5) == 0 || strcmp(name, "L_rep_by_period") == 0;
}

/* Rows of a table: those of its first column in a checkpoint; in a live
 * file, where the writer extends one column after another (live_metrics.c),
 * the rows that every column holds already. */
static long long table_rows(h5reader *r, const char *group, const metric_table *t, bool live) {
    long long rows = -1;
    for (int c = 0; c < (live ? t->n_columns : 1); c++) {
        char name[128];
        snprintf(name, sizeof name, "%s/%s", group, t->columns[c].name);
        if (column_added_later(t->columns[c].name) && !h5reader_exists(r, name)) continue;
        hsize_t dims[H5S_MAX_RANK] = {0};
        int ndim;
        hid_t dset = h5reader_open_dataset(r, name, &ndim, dims);
        if (c == 0 && ndim != 1) h5reader_fail(r, "%s is not 1-D", name);
        /* rows the file really stores, before row_width times them is allocated */
        h5reader_checked_elements(r, name, dset, ndim, dims);
        H5Dclose(dset);
        if (rows < 0 || (long long)dims[0] < rows) rows = (long long)dims[0];
    }
    return rows;
}

/* Rows of a metric table: one per log interval, so 2^26 is a run of at
 * least 67 million steps, far beyond any; the bound keeps a hostile file's
 * table (2^31 declared rows) from taking a large allocation and seconds. */
#define MAX_METRIC_ROWS ((long long)1 << 26)
#define MAX_STEP 9007199254740992.0 /* 2^53 */

/* A missing group means an empty history (e.g. a step-0 checkpoint). */
static void read_metric_table(h5reader *r, const char *group, metric_table *t, bool live) {
    t->n_rows = 0;
    if (!h5reader_exists(r, group)) return;
    char name[128];
    long long rows = table_rows(r, group, t, live);
    /* the table holds rows x row_width doubles: refused before allocating when they cannot fit */
    double bytes = 8.0 * (double)rows * (t->row_width + 1), available = sys_memory_available();
    if (rows > MAX_METRIC_ROWS || (available > 0 && 2 * bytes > available))
        h5reader_fail(r,
                      "%s declares %lld rows (%.3g GB as a table): more than %lld rows or than the %.3g GB of memory "
                      "available",
                      group, rows, bytes / 1e9, (long long)MAX_METRIC_ROWS, available / 1e9);
    double *column = sys_calloc((size_t)rows * (size_t)t->row_width + 1, sizeof(double));
    double *row = sys_calloc((size_t)t->row_width, sizeof(double));
    int offset = 0;
    for (int c = 0; c < t->n_columns; c++) {
        const metric_column *col = &t->columns[c];
        snprintf(name, sizeof name, "%s/%s", group, col->name);
        if (!strcmp(col->name, "bpb") && !h5reader_exists(r, name)) {
            derive_bpb(t, rows, offset);
            offset += col->width;
            continue;
        }
        unsigned long long shape[3];
        int ndim_want = metric_column_shape(col, rows, shape);
        hsize_t want[3] = {shape[0], shape[1], shape[2]};
        if (column_added_later(col->name) && !h5reader_exists(r, name))
            for (size_t i = 0; i < (size_t)rows * col->width; i++) column[i] = NAN;
        else h5reader_read_leading_rows(r, name, live, ndim_want, want, column);
        /* a step column holds steps, 0 ... 2^53 (train.steps' limit, exact
         * as doubles): anything else would overflow where it is converted
         * back to an integer (printed by inspect, written on resume) */
        for (long long i = 0; col->integer && i < rows; i++)
            if (!(column[i] >= 0 && column[i] <= MAX_STEP))
                h5reader_fail(r, "%s[%lld] = %.17g is not a step (0 ... 2^53)", name, i, column[i]);
        for (long long i = 0; i < rows; i++) {
            if (c == 0) metric_table_append(t, row);
            for (int j = 0; j < col->width; j++) t->values[i * t->row_width + offset + j] = column[i * col->width + j];
        }
        offset += col->width;
    }
    free(column);
    free(row);
}

typedef struct {
    config *c;
    checkpoint_info *info;
    model *m;
    bool optimizer;
    metric_table *train, *eval;
    unsigned char *tokenizer_bytes; /* /tokenizer being read, freed by the entry point after a failure */
    tokenizer *tok;                 /* where a /tokenizer goes (checkpoint_read_tokenizer), or NULL */
    /* the names /model (and /optim/m|v) and /buffers may hold, sorted; freed by the entry point */
    const char **tensor_names, **buffer_names;
    char *buffer_text;
    int n_tensors, n_buffers;
} read_request;

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first of the sorted names[0, n) that is not below `key`. */
static int lower_bound(const char **names, int n, const char *key) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(names[mid], key) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

typedef struct {
    const char **names;
    int n;
} name_set;

/* A name a group may hold below it: one of its tensors, or a group on the
 * way to one ("blocks", "blocks/0/attn"). */
static bool tensor_or_group(const char *name, void *ctx) {
    const name_set *set = ctx;
    int at = lower_bound(set->names, set->n, name);
    if (at < set->n && strcmp(set->names[at], name) == 0) return true;
    char group[512];
    int len = snprintf(group, sizeof group, "%s/", name);
    at = lower_bound(set->names, set->n, group);
    return len < (int)sizeof group && at < set->n && strncmp(set->names[at], group, (size_t)len) == 0;
}

/* Nothing in the file beyond what config_ini implies (docs/files.md §4):
 * no /model/blocks/<L>, no fmm_blend in a softmax model, no momentum_gamma
 * that is not learned, no head of the other kind, no momentum buffers of a
 * model without momentum; /optim/m and /optim/v likewise where a run
 * resumes. A file whose config names fewer layers than it stores would
 * otherwise load as the smaller model. */
static void check_nothing_else(h5reader *r, const model *m, read_request *q) {
    const config *c = &m->cfg;
    q->tensor_names = sys_calloc((size_t)m->n_entries, sizeof(char *));
    for (int i = 0; i < m->n_entries; i++) q->tensor_names[q->n_tensors++] = m->entries[i].name;
    qsort(q->tensor_names, (size_t)q->n_tensors, sizeof(char *), compare_strings);
    int buffers = m->momentum ? 2 * m->L : 0;
    q->buffer_names = sys_calloc((size_t)buffers + 1, sizeof(char *));
    q->buffer_text = sys_calloc((size_t)buffers + 1, 48);
    for (int i = 0; i < buffers; i++) {
        char *name = q->buffer_text + (size_t)i * 48;
        snprintf(name, 48, "blocks/%d/attn/%s", i / 2, i % 2 ? "prev_k" : "prev_q");
        q->buffer_names[q->n_buffers++] = name;
    }
    qsort(q->buffer_names, (size_t)q->n_buffers, sizeof(char *), compare_strings);
    char what[256];
    snprintf(what, sizeof what,
             "a tensor of the model config_ini describes (model.n_layers = %d, attention.kind = %s, "
             "momentum.learn_gamma = %s, model.head = %s)",
             c->n_layers, c->attention == ATTENTION_FMM ? "fmm" : "softmax", c->learn_gamma ? "true" : "false",
             c->head == HEAD_CLS ? "cls" : "lm");
    name_set tensors = {q->tensor_names, q->n_tensors}, buffers_set = {q->buffer_names, q->n_buffers};
    h5reader_only_names(r, "/model", tensor_or_group, &tensors, what);
    if (q->optimizer) {
        h5reader_only_names(r, "/optim/m", tensor_or_group, &tensors, what);
        h5reader_only_names(r, "/optim/v", tensor_or_group, &tensors, what);
    }
    snprintf(what, sizeof what,
             "a momentum buffer of the model config_ini describes (momentum %s, model.n_layers = %d)",
             m->momentum ? "on" : "off", c->n_layers);
    h5reader_only_names(r, "/buffers", tensor_or_group, &buffers_set, what);
}

static void free_names(read_request *q) {
    free(q->tensor_names);
    free(q->buffer_names);
    free(q->buffer_text);
}

/* /tokenizer (docs/files.md §4): when present, the whole sentencepiece model
 * that config_ini's data.tokenizer_checksum records (tokenizer_from_bytes
 * parses it to the end), into q->tok when asked for. */
static void read_tokenizer(h5reader *r, const config *c, read_request *q) {
    if (!h5reader_exists(r, "/tokenizer")) return;
    if (!c->tokenizer[0]) h5reader_fail(r, "/tokenizer is present, but config_ini names no data.tokenizer");
    int ndim;
    hsize_t dims[H5S_MAX_RANK];
    hid_t dset = h5reader_open_dataset(r, "/tokenizer", &ndim, dims);
    h5reader_require_integer(r, "/tokenizer", dset);
    H5Dclose(dset);
    if (ndim != 1 || dims[0] == 0 || dims[0] >= ((hsize_t)64 << 20))
        h5reader_fail(r, "/tokenizer must hold the bytes of a sentencepiece model (1-D, below 64 MiB)");
    q->tokenizer_bytes = sys_calloc((size_t)dims[0], 1);
    h5reader_read_checked(r, "/tokenizer", H5T_NATIVE_UCHAR, 1, dims, q->tokenizer_bytes);
    tokenizer t;
    status st;
    unsigned char *bytes = q->tokenizer_bytes;
    q->tokenizer_bytes = NULL; /* tokenizer_from_bytes owns them now */
    if (tokenizer_from_bytes(&t, bytes, (size_t)dims[0], "/tokenizer", &st) != 0) h5reader_fail(r, "%s", st.message);
    char now[17];
    tokenizer_checksum_text(t.checksum, now);
    if (c->tokenizer_checksum[0] && strcmp(now, c->tokenizer_checksum) != 0) {
        tokenizer_free(&t);
        h5reader_fail(r, "/tokenizer has checksum %s, but config_ini records data.tokenizer_checksum = %s", now,
                      c->tokenizer_checksum);
    }
    if (q->tok) *q->tok = t;
    else tokenizer_free(&t);
}

static void config_body(h5reader *r, void *ctx) {
    read_request *q = ctx;
    read_config_body(r, q->c, q->info);
}

static void state_body(h5reader *r, void *ctx) {
    read_request *q = ctx;
    model *m = q->m;
    read_tensors(r, "/model", m, m->params);
    check_nothing_else(r, m, q);
    check_values(r, "/model", m, m->params, 0, m->n_params, false);
    if (m->momentum) {
        read_buffers(r, m);
        for (size_t i = 0; i < m->n_buffer; i++)
            if (!isfinite(m->buffers[i]))
                h5reader_fail(r, "/buffers/blocks/%zu/attn/%s holds %g: a checkpoint of non-finite values is refused",
                              i / (2 * (size_t)m->H * m->dh), (i / ((size_t)m->H * m->dh)) % 2 ? "prev_k" : "prev_q",
                              m->buffers[i]);
    }
    if (q->optimizer) {
        read_moments(r, "/optim/m", m, m->adam_m);
        read_moments(r, "/optim/v", m, m->adam_v);
        check_values(r, "/optim/m", m, m->adam_m, m->moment_first, m->moment_count, false);
        check_values(r, "/optim/v", m, m->adam_v, m->moment_first, m->moment_count, true);
    }
    if (q->train) read_metric_table(r, "/metrics/train", q->train, false);
    if (q->eval) read_metric_table(r, "/metrics/eval", q->eval, false);
    read_tokenizer(r, &m->cfg, q);
}

int checkpoint_read_config(const char *path, config *c, checkpoint_info *info, status *err) {
    read_request q = {.c = c, .info = info};
    return h5reader_run(path, "checkpoint", config_body, &q, err);
}

int checkpoint_read_state(const char *path, model *m, bool optimizer, metric_table *train, metric_table *eval,
                          status *err) {
    read_request q = {.m = m, .optimizer = optimizer, .train = train, .eval = eval};
    int rc = h5reader_run(path, "checkpoint", state_body, &q, err);
    free(q.tokenizer_bytes);
    free_names(&q);
    model_params_changed(m);
    return rc;
}

static void tokenizer_body(h5reader *r, void *ctx) {
    read_request *q = ctx;
    h5kind_require(r, H5KIND_CHECKPOINT);
    read_config_ini(r, q->c);
    read_tokenizer(r, q->c, q);
}

int checkpoint_read_tokenizer(const char *path, tokenizer *t, status *err) {
    config c;
    memset(t, 0, sizeof *t);
    read_request q = {.c = &c, .tok = t};
    int rc = h5reader_run(path, "checkpoint", tokenizer_body, &q, err);
    free(q.tokenizer_bytes);
    return rc;
}

static void metrics_body(h5reader *r, void *ctx) {
    read_request *q = ctx;
    h5kind_require(r, H5KIND_CHECKPOINT);
    read_metric_table(r, "/metrics/train", q->train, false);
    read_metric_table(r, "/metrics/eval", q->eval, false);
}

int checkpoint_read_metrics(const char *path, metric_table *train, metric_table *eval, status *err) {
    read_request q = {.train = train, .eval = eval};
    return h5reader_run(path, "checkpoint", metrics_body, &q, err);
}

int checkpoint_load_model(const char *path, model *m, bool training, status *err) {
    config c;
    checkpoint_info info;
    int rc = checkpoint_read_config(path, &c, &info, err);
    if (rc != 0) return rc;
    double bytes = 16.0 * model_floats(&c), available = sys_memory_available();
    if (training && available > 0 && bytes > available)
        return status_fail(err, EXIT_BAD_FILE,
                           "%s: config_ini describes a model needing %.3g GB with gradients "
                           "and moments, more than the %.3g GB available",
                           path, bytes / 1e9, available / 1e9);
    rc = training ? model_create(m, &c, err) : model_create_for_inference(m, &c, err);
    if (rc == 0) rc = checkpoint_read_state(path, m, false, NULL, NULL, err);
    if (rc != 0) model_free(m);
    return rc;
}

/* metrics.h5 (live_metrics.h): config_ini and /metrics/{train,eval}. */
static void metrics_file_body(h5reader *r, void *ctx) {
    read_request *q = ctx;
    /* a checkpoint, also one that lost its format attribute, is not a metrics file */
    h5kind_require(r, H5KIND_METRICS);
    read_config_ini(r, q->c);
    if (!h5reader_exists(r, "/metrics")) h5reader_fail(r, "no /metrics group: the metric tables are missing");
    metric_tables_standard(q->train, q->eval, q->c->n_layers, q->c->n_heads);
    metric_tables_add_task_columns(q->train, q->eval, q->c);
    read_metric_table(r, "/metrics/train", q->train, true);
    read_metric_table(r, "/metrics/eval", q->eval, true);
}

int checkpoint_read_metrics_file(const char *path, config *c, metric_table *train, metric_table *eval, status *err) {
    metric_table_init(train);
    metric_table_init(eval);
    read_request q = {.c = c, .train = train, .eval = eval};
    status ignored;
    return h5reader_run_into(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, "metrics file", metrics_file_body, &q,
                             err ? err : &ignored);
}
