/* The token and logits files of `momfmm logits` (docs/cli.md §5, docs/files.md
 * §4); see logits_file.h. Read through the hostile-file reader, written
 * through the atomic writer. */
#include "store/logits_file.h"

#include <hdf5.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/build_info.h"
#include "base/sys.h"
#include "hdf5/h5reader.h"
#include "hdf5/h5util.h"
#include "hdf5/h5writer.h"

typedef struct {
    int vocab, max_T, out_width;
    bool per_position;
    logits_file_tokens *out;
} tokens_request;

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
static void token_shape(h5reader *r, const tokens_request *q, int ndim, const hsize_t *dims, int *B, int *T) {
    if (ndim != 1 && ndim != 2) h5reader_fail(r, "/tokens must be [T] or [B, T], it has %d dimensions", ndim);
    hsize_t rows = ndim == 2 ? dims[0] : 1, length = dims[ndim - 1];
    if (rows == 0 || length == 0) h5reader_fail(r, "/tokens is empty");
    if (length > (hsize_t)q->max_T)
        h5reader_fail(r,
                      "/tokens has T = %llu tokens per row, longer than the model's %d positions "
                      "(model.max_seq_len, else data.seq_len)",
                      (unsigned long long)length, q->max_T);
    if (rows > INT_MAX / length) h5reader_fail(r, "/tokens has %llu rows, too many", (unsigned long long)rows);
    double bytes = 4.0 * (double)rows * (double)(q->per_position ? length : 1) * q->out_width;
    double available = sys_memory_available();
    if (available > 0 && bytes > available)
        h5reader_fail(r, "/tokens of %llu x %llu needs %.3g GB of logits, more than the %.3g GB available",
                      (unsigned long long)rows, (unsigned long long)length, bytes / 1e9, available / 1e9);
    *B = (int)rows;
    *T = (int)length;
}

static void tokens_body(h5reader *r, void *ctx) {
    tokens_request *q = ctx;
    hsize_t dims[H5S_MAX_RANK] = {0};
    int ndim, B, T;
    hid_t dset = h5reader_open_dataset(r, "/tokens", &ndim, dims);
    require_token_type(r, dset);
    H5Dclose(dset);
    token_shape(r, q, ndim, dims, &B, &T);
    int32_t *ids = sys_calloc((size_t)B * T, sizeof(int32_t));
    q->out->ids = ids; /* freed by the caller, also after a failure */
    h5reader_read_checked(r, "/tokens", H5T_NATIVE_INT32, ndim, dims, ids);
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= q->vocab)
            h5reader_fail(r, "/tokens at offset %zu (row %zu, position %zu) holds %d, outside the vocabulary [0, %d)",
                          i, i / (size_t)T, i % (size_t)T, ids[i], q->vocab);
    q->out->B = B;
    q->out->T = T;
}

int logits_file_read_tokens(const char *path, int vocab, int max_T, int out_width, bool per_position,
                            logits_file_tokens *out, status *err) {
    *out = (logits_file_tokens){0};
    tokens_request q = {vocab, max_T, out_width, per_position, out};
    int rc = h5reader_run(path, "token file", tokens_body, &q, err);
    if (rc != 0) {
        free(out->ids);
        *out = (logits_file_tokens){0};
    }
    return rc;
}

typedef struct {
    const float *logits;
    int ndim;
    hsize_t dims[3];
    const logits_file_source *source;
} logits_content;

static herr_t write_logits_content(const h5writer *w, const void *ctx) {
    const logits_content *c = ctx;
    hid_t file = w->file;
    herr_t st = 0;
    st |= h5util_write_string_attr(file, "checkpoint", c->source->checkpoint);
    st |= h5util_write_attr(file, "step", H5T_NATIVE_LLONG, H5T_STD_I64LE, &c->source->step);
    st |= h5util_write_attr(file, "tokens_seen", H5T_NATIVE_LLONG, H5T_STD_I64LE, &c->source->tokens_seen);
    st |= h5util_write_string_attr(file, "momfmm_version", build_description());
    if (h5writer_agree(w, st < 0 ? -1 : 0) < 0) return -1;
    return h5writer_dataset(w, "/logits", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, c->ndim, c->dims, c->logits);
}

int logits_file_write(const char *path, const char *tmp, const float *logits, int ndim, int B, int T, int width,
                      const logits_file_source *source, status *err) {
    logits_content c = {logits, ndim, {(hsize_t)B, ndim == 3 ? (hsize_t)T : (hsize_t)width, (hsize_t)width}, source};
    return h5writer_run(path, tmp, H5WRITER_ALONE, write_logits_content, &c, err);
}
