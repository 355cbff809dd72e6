/* The token files that `loss` and `logits` read (token_input.h; docs/files.md
 * §4), through the hostile-file reader: every check of one file shape is
 * written once and serves both commands. */
#include "store/token_input.h"

#include <hdf5.h>
#include <limits.h>
#include <stdlib.h>

#include "base/sys.h"
#include "hdf5/h5kind.h"
#include "hdf5/h5reader.h"

/* Every id of x [n] (rows of T) in [lo, hi), else the first one that is not,
 * by offset, row and position. */
static void check_ids(h5reader *r, const char *name, const int32_t *x, size_t n, int T, int lo, int hi,
                      const char *range) {
    for (size_t i = 0; i < n; i++)
        if (x[i] < lo || x[i] >= hi)
            h5reader_fail(r, "%s at offset %zu (row %zu, position %zu) holds %d, outside %s [%d, %d)", name, i,
                          i / (size_t)T, i % (size_t)T, x[i], range, lo, hi);
}

/* What a rows x length input would make the command allocate (`what`, of
 * `bytes`), refused before anything is allocated when the machine has not
 * that much memory available. */
static void check_fits(h5reader *r, const char *name, hsize_t rows, hsize_t length, double bytes, const char *what) {
    double available = sys_memory_available();
    if (available > 0 && bytes > available)
        h5reader_fail(r, "%s of %llu x %llu tokens needs %.3g GB of %s, more than the %.3g GB available", name,
                      (unsigned long long)rows, (unsigned long long)length, bytes / 1e9, what, available / 1e9);
}

/* T of a row against the model's positions. */
static void check_length(h5reader *r, const char *name, hsize_t length, int max_T) {
    if (length > (hsize_t)max_T)
        h5reader_fail(r,
                      "%s has T = %llu tokens per row, longer than the model's %d positions "
                      "(model.max_seq_len, else data.seq_len)",
                      name, (unsigned long long)length, max_T);
}

/* ---- the `loss` command's batch */

typedef struct {
    const model *m;
    data_batch *b;
} batch_request;

static void batch_body(h5reader *r, void *ctx) {
    batch_request *q = ctx;
    const model *m = q->m;
    hsize_t dims[H5S_MAX_RANK] = {0};
    int ndim;
    h5kind_require(r, H5KIND_LOSS_TOKENS);
    hid_t inputs = h5reader_open_dataset(r, "/inputs", &ndim, dims);
    if (ndim != 2 || dims[0] == 0 || dims[1] == 0) h5reader_fail(r, "/inputs must be a non-empty [B, T] int32 array");
    check_length(r, "/inputs", dims[1], m->rope_positions);
    h5reader_require_integer(r, "/inputs", inputs);
    h5reader_checked_elements(r, "/inputs", inputs, ndim, dims);
    H5Dclose(inputs);
    if (dims[0] > INT_MAX)
        h5reader_fail(r, "/inputs has B = %llu rows, more than %d", (unsigned long long)dims[0], INT_MAX);
    check_fits(r, "/inputs", dims[0], dims[1], (double)model_activation_bytes(m, (int)dims[0], (int)dims[1]),
               "activations");
    hsize_t other[H5S_MAX_RANK];
    hid_t targets = h5reader_open_dataset(r, "/targets", &ndim, other);
    h5reader_require_integer(r, "/targets", targets);
    H5Dclose(targets);
    if (m->cfg.head == HEAD_CLS && h5reader_exists(r, "/labels")) {
        hid_t labels = h5reader_open_dataset(r, "/labels", &ndim, other);
        h5reader_require_integer(r, "/labels", labels);
        H5Dclose(labels);
    }
    data_batch *b = q->b;
    data_batch_alloc(b, (int)dims[0], (int)dims[1]);
    size_t n = (size_t)b->B * b->T;
    h5reader_read_checked(r, "/inputs", H5T_NATIVE_INT32, 2, dims, b->inputs);
    h5reader_read_checked(r, "/targets", H5T_NATIVE_INT32, 2, dims, b->targets);
    check_ids(r, "/inputs", b->inputs, n, b->T, 0, m->V, "the vocabulary");
    if (m->cfg.head == HEAD_CLS) {
        hsize_t label_dims[1] = {dims[0]};
        h5reader_read_checked(r, "/labels", H5T_NATIVE_INT32, 1, label_dims, b->labels);
        check_ids(r, "/labels", b->labels, (size_t)b->B, 1, 0, m->n_out, "the classes");
    } else {
        check_ids(r, "/targets", b->targets, n, b->T, -1, m->V, "the targets' range");
        size_t counted = 0;
        for (size_t i = 0; i < n; i++) counted += b->targets[i] >= 0;
        if (counted == 0)
            h5reader_fail(r, "/targets counts no position (every target is -1): there is no loss to compute");
    }
}

int token_input_read_batch(const char *path, const model *m, data_batch *b, status *err) {
    batch_request q = {m, b};
    return h5reader_run(path, "token file", batch_body, &q, err);
}

/* ---- the `logits` command's ids */

typedef struct {
    int vocab, max_T, out_width;
    bool per_position;
    token_input_ids *out;
} ids_request;

/* uint16 or int32, as the token files of docs/tasks.md §2 hold them. */
static void require_token_type(h5reader *r, hid_t dset) {
    h5reader_require_integer(r, "/tokens", dset);
    hid_t type = H5Dget_type(dset);
    size_t width = H5Tget_size(type);
    H5T_sign_t sign = H5Tget_sign(type);
    H5Tclose(type);
    if (!(width == 2 && sign == H5T_SGN_NONE) && !(width == 4 && sign == H5T_SGN_2))
        h5reader_fail(r, "/tokens must be uint16 or int32, not a %s %zu-byte integer",
                      sign == H5T_SGN_NONE ? "unsigned" : "signed", width);
}

/* [B, T] from the dataset's shape, refused before anything is allocated. */
static void ids_shape(h5reader *r, const ids_request *q, int ndim, const hsize_t *dims, int *B, int *T) {
    if (ndim != 1 && ndim != 2) h5reader_fail(r, "/tokens must be [T] or [B, T], it has %d dimensions", ndim);
    hsize_t rows = ndim == 2 ? dims[0] : 1, length = dims[ndim - 1];
    if (rows == 0 || length == 0) h5reader_fail(r, "/tokens is empty");
    check_length(r, "/tokens", length, q->max_T);
    if (rows > INT_MAX / length) h5reader_fail(r, "/tokens has %llu rows, too many", (unsigned long long)rows);
    check_fits(r, "/tokens", rows, length, 4.0 * (double)rows * (double)(q->per_position ? length : 1) * q->out_width,
               "logits");
    *B = (int)rows;
    *T = (int)length;
}

static void ids_body(h5reader *r, void *ctx) {
    ids_request *q = ctx;
    hsize_t dims[H5S_MAX_RANK] = {0};
    int ndim, B, T;
    h5kind_require(r, H5KIND_TOKENS);
    hid_t dset = h5reader_open_dataset(r, "/tokens", &ndim, dims);
    require_token_type(r, dset);
    H5Dclose(dset);
    ids_shape(r, q, ndim, dims, &B, &T);
    int32_t *ids = sys_calloc((size_t)B * T, sizeof(int32_t));
    q->out->ids = ids; /* freed by the caller, also after a failure */
    h5reader_read_checked(r, "/tokens", H5T_NATIVE_INT32, ndim, dims, ids);
    check_ids(r, "/tokens", ids, (size_t)B * T, T, 0, q->vocab, "the vocabulary");
    q->out->B = B;
    q->out->T = T;
}

int token_input_read_ids(const char *path, int vocab, int max_T, int out_width, bool per_position, token_input_ids *out,
                         status *err) {
    *out = (token_input_ids){0};
    ids_request q = {vocab, max_T, out_width, per_position, out};
    int rc = h5reader_run(path, "token file", ids_body, &q, err);
    if (rc != 0) {
        free(out->ids);
        *out = (token_input_ids){0};
    }
    return rc;
}
