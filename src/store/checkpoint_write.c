/* HDF5 files of docs/files.md §4, written: the layout checkpoint.c reads
 * (names and temporary names are the store's, docs/design.md §8.4). Writes
 * go to the temporary name the caller gives, flushed, fsync'ed and renamed,
 * so a crash never leaves half a file under a checkpoint's name. */
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
#include "hdf5/h5reader.h"
#include "hdf5/h5util.h"
#include "hdf5/h5writer.h"
#include "kernels/gemm.h"

/* ---- writing (through the atomic, optionally collective writer, h5writer.h) */

/* The flat elements [first, last) of the parameter and moment tensors this
 * writer writes: alone all, together its ZeRO-1 slice (docs/scale.md §7). */
static void writer_range(const h5writer *w, const model *m, size_t *first, size_t *last) {
    *first = w->together ? m->moment_first : 0;
    *last = w->together ? m->moment_first + m->moment_count : m->n_params;
}

/* One dataset per parameter under group, from the flat buffer `base`
 * whose element 0 is flat element `base_first` (0 for parameters and
 * gradients, the slice's first element for ZeRO-1 moments): each writer
 * writes the part of each tensor inside its range. */
static herr_t write_tensors(const h5writer *w, const char *group, const model *m, const float *base,
                            size_t base_first) {
    size_t first, last;
    writer_range(w, m, &first, &last);
    for (int i = 0; i < m->n_entries; i++) {
        const model_param *e = &m->entries[i];
        char name[256];
        snprintf(name, sizeof name, "%s/%s", group, e->name);
        hsize_t dims[2] = {(hsize_t)e->shape[0], (hsize_t)e->shape[1]};
        size_t a = e->offset > first ? e->offset : first, end = e->offset + e->numel, b = end < last ? end : last;
        if (a >= b) a = b = e->offset; /* the tensor lies outside this writer's range */
        if (h5writer_range(w, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, e->ndim, dims, a - e->offset, b - e->offset,
                           base + (a > base_first ? a - base_first : 0)) < 0)
            return -1;
    }
    return 0;
}

static herr_t write_buffers(const h5writer *w, const model *m) {
    for (int l = 0; l < m->L; l++)
        for (int which = 0; which < 2; which++) {
            char name[128];
            snprintf(name, sizeof name, "/buffers/blocks/%d/attn/%s", l, which ? "prev_k" : "prev_q");
            hsize_t dims[2] = {(hsize_t)m->H, (hsize_t)m->dh};
            const float *data = m->buffers + (size_t)(l * 2 + which) * m->H * m->dh;
            if (h5writer_dataset(w, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, 2, dims, data) < 0) return -1;
        }
    return 0;
}

static herr_t write_metric_table(const h5writer *w, const char *group, const metric_table *t) {
    size_t rows = (size_t)t->n_rows;
    double *column = sys_calloc(rows * (size_t)t->row_width + 1, sizeof(double));
    herr_t status = 0;
    int offset = 0;
    for (int c = 0; c < t->n_columns && status >= 0; c++) {
        const metric_column *col = &t->columns[c];
        for (size_t r = 0; r < rows; r++)
            for (int j = 0; j < col->width; j++) column[r * col->width + j] = t->values[r * t->row_width + offset + j];
        char name[128];
        snprintf(name, sizeof name, "%s/%s", group, col->name);
        unsigned long long shape[3];
        int ndim = metric_column_shape(col, (long long)rows, shape);
        hsize_t dims[3] = {shape[0], shape[1], shape[2]};
        if (col->integer) {
            long long *ints = (long long *)column;
            for (size_t r = 0; r < rows; r++) ints[r] = (long long)column[r];
            status = h5writer_dataset(w, name, H5T_NATIVE_LLONG, H5T_STD_I64LE, ndim, dims, ints);
        } else {
            status = h5writer_dataset(w, name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, ndim, dims, column);
        }
        offset += col->width;
    }
    free(column);
    return status;
}

/* Attributes are written by every writer with the same values (collective
 * in parallel HDF5). */
static herr_t write_root_attributes(const h5writer *w, const model *m, const checkpoint_info *info) {
    int version = CHECKPOINT_FORMAT_VERSION;
    char *ini = config_to_ini(&m->cfg);
    herr_t status = 0;
    hid_t file = w->file;
    status |= h5util_write_string_attr(file, "format", CHECKPOINT_FORMAT);
    status |= h5util_write_attr(file, "format_version", H5T_NATIVE_INT, H5T_STD_I32LE, &version);
    status |= h5util_write_attr(file, "step", H5T_NATIVE_LLONG, H5T_STD_I64LE, &info->step);
    status |= h5util_write_attr(file, "tokens_seen", H5T_NATIVE_LLONG, H5T_STD_I64LE, &info->tokens_seen);
    status |= h5util_write_attr(file, "world_size", H5T_NATIVE_INT, H5T_STD_I32LE, &info->world_size);
    status |= h5util_write_attr(file, "skipped_steps", H5T_NATIVE_LLONG, H5T_STD_I64LE, &info->skipped_steps);
    status |= h5util_write_string_attr(file, "config_ini", ini);
    if (info->init_from[0]) status |= h5util_write_string_attr(file, "init_from", info->init_from);
    if (info->gemm_engines[0]) status |= h5util_write_string_attr(file, "gemm_engines", info->gemm_engines);
    status |= h5util_write_string_attr(file, "momfmm_version", build_description());
    free(ini);
    return h5writer_agree(w, status < 0 ? -1 : 0);
}

typedef struct {
    const model *m;
    const checkpoint_info *info;
    const metric_table *train, *eval;
} checkpoint_content;

static herr_t write_checkpoint_content(const h5writer *w, const void *ctx) {
    const checkpoint_content *c = ctx;
    const model *m = c->m;
    if (write_root_attributes(w, m, c->info) < 0) return -1;
    if (write_tensors(w, "/model", m, m->params, 0) < 0) return -1;
    if (write_tensors(w, "/optim/m", m, m->adam_m, m->moment_first) < 0) return -1;
    if (write_tensors(w, "/optim/v", m, m->adam_v, m->moment_first) < 0) return -1;
    if (m->momentum && write_buffers(w, m) < 0) return -1;
    if (c->train && write_metric_table(w, "/metrics/train", c->train) < 0) return -1;
    if (c->eval && write_metric_table(w, "/metrics/eval", c->eval) < 0) return -1;
    hsize_t bytes[1] = {c->info->tokenizer_size};
    if (bytes[0] &&
        h5writer_dataset(w, "/tokenizer", H5T_NATIVE_UCHAR, H5T_STD_U8LE, 1, bytes, c->info->tokenizer_model) < 0)
        return -1;
    return 0;
}

/* HDF5's object header, link and B-tree entries of one dataset, about (a
 * 10,656-parameter checkpoint of 80 datasets takes 74 KB beyond its data). */
#define DATASET_OVERHEAD_BYTES 1024.0

double checkpoint_size_estimate(const model *m, const checkpoint_info *info, const metric_table *train,
                                const metric_table *eval) {
    double tensors = 3.0 * m->n_entries + (m->momentum ? 2.0 * m->L : 0.0), bytes = 0;
    bytes += 4.0 * (3.0 * (double)m->n_params + (m->momentum ? (double)m->n_buffer : 0.0));
    const metric_table *tables[] = {train, eval};
    for (int i = 0; i < 2; i++)
        if (tables[i]) {
            bytes += 8.0 * (double)tables[i]->n_rows * tables[i]->row_width;
            tensors += tables[i]->n_columns;
        }
    char *ini = config_to_ini(&m->cfg);
    bytes += (double)info->tokenizer_size + (double)strlen(ini);
    free(ini);
    return bytes + DATASET_OVERHEAD_BYTES * tensors;
}

int checkpoint_write(const char *path, const char *tmp, const model *m, const checkpoint_info *info,
                     const metric_table *train, const metric_table *eval, h5writer_mode writers, status *err) {
    if (writers == H5WRITER_ALONE && m->moment_count != m->n_params)
        return status_fail(err, EXIT_BAD_FILE,
                           "%s: this rank holds only a ZeRO-1 slice of the moments: the ranks "
                           "must write it together",
                           path);
    checkpoint_content content = {m, info, train, eval};
    return h5writer_run(path, tmp, writers, write_checkpoint_content, &content, err);
}

typedef struct {
    const model *m;
    double loss;
} grads_content;

static herr_t write_grads_content(const h5writer *w, const void *ctx) {
    const grads_content *c = ctx;
    if (h5writer_agree(w, h5util_write_attr(w->file, "loss", H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &c->loss)) < 0)
        return -1;
    return write_tensors(w, "/grads", c->m, c->m->grads, 0);
}

int checkpoint_write_grads(const char *path, const char *tmp, const model *m, double loss, status *err) {
    grads_content content = {m, loss};
    return h5writer_run(path, tmp, H5WRITER_ALONE, write_grads_content, &content, err);
}
