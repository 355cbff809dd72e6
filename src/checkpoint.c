/* HDF5 files of SPEC 4. Writes go to a temporary name that is flushed,
 * fsync'ed and renamed, so a crash never leaves half a file under a
 * checkpoint's name; reads check every attribute, dataset and shape and
 * exit 3 naming the file and what is wrong. */
#include "momfmm/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "momfmm/common.h"

/* HDF5 prints its error stack by default; our messages name the problem. */
static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* ---- writing ------------------------------------------------------------ */

static herr_t write_dataset(hid_t file, const char *name, hid_t mem_type, hid_t file_type, int ndim,
                            const hsize_t *dims, const void *data) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = H5Screate_simple(ndim, dims, NULL);
    hid_t dset = H5Dcreate2(file, name, file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    herr_t status = dset < 0 ? -1 : H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    if (dset >= 0) H5Dclose(dset);
    H5Sclose(space);
    H5Pclose(lcpl);
    return status;
}

static herr_t write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t status = attr < 0 ? -1 : H5Awrite(attr, mem_type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return status;
}

/* Variable-length UTF-8, which h5py reads back as str. */
static herr_t write_attr_string(hid_t obj, const char *name, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    herr_t status = write_attr(obj, name, type, type, &value);
    H5Tclose(type);
    return status;
}

static herr_t write_tensors(hid_t file, const char *group, const model *m, const float *base) {
    for (int i = 0; i < m->n_entries; i++) {
        const param_entry *e = &m->entries[i];
        char name[256];
        snprintf(name, sizeof name, "%s/%s", group, e->name);
        hsize_t dims[2] = {(hsize_t)e->shape[0], (hsize_t)e->shape[1]};
        if (write_dataset(file, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, e->ndim, dims, base + e->offset) < 0)
            return -1;
    }
    return 0;
}

static herr_t write_buffers(hid_t file, const model *m) {
    for (int l = 0; l < m->L; l++)
        for (int which = 0; which < 2; which++) {
            char name[128];
            snprintf(name, sizeof name, "/buffers/blocks/%d/attn/%s", l, which ? "prev_k" : "prev_q");
            hsize_t dims[2] = {(hsize_t)m->H, (hsize_t)m->dh};
            const float *data = m->buffers + (size_t)(l * 2 + which) * m->H * m->dh;
            if (write_dataset(file, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, 2, dims, data) < 0) return -1;
        }
    return 0;
}

static herr_t write_metric_table(hid_t file, const char *group, const metric_table *t) {
    size_t rows = (size_t)t->n_rows;
    double *column = xcalloc(rows * OCCURRENCE_BINS + rows + 1, sizeof(double));
    herr_t status = 0;
    int offset = 0;
    for (int c = 0; c < t->n_columns && status >= 0; c++) {
        const metric_column *col = &t->columns[c];
        for (size_t r = 0; r < rows; r++)
            for (int j = 0; j < col->width; j++)
                column[r * col->width + j] = t->values[r * t->row_width + offset + j];
        char name[128];
        snprintf(name, sizeof name, "%s/%s", group, col->name);
        hsize_t dims[2] = {rows, (hsize_t)col->width};
        int ndim = col->width > 1 ? 2 : 1;
        if (col->integer) {
            long long *ints = (long long *)column;
            for (size_t r = 0; r < rows; r++) ints[r] = (long long)column[r];
            status = write_dataset(file, name, H5T_NATIVE_LLONG, H5T_STD_I64LE, ndim, dims, ints);
        } else {
            status = write_dataset(file, name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, ndim, dims, column);
        }
        offset += col->width;
    }
    free(column);
    return status;
}

static herr_t write_root_attributes(hid_t file, const model *m, const checkpoint_info *info) {
    int version = CHECKPOINT_FORMAT_VERSION;
    char *ini = config_to_ini(&m->cfg);
    herr_t status = 0;
    status |= write_attr_string(file, "format", CHECKPOINT_FORMAT);
    status |= write_attr(file, "format_version", H5T_NATIVE_INT, H5T_STD_I32LE, &version);
    status |= write_attr(file, "step", H5T_NATIVE_LLONG, H5T_STD_I64LE, &info->step);
    status |= write_attr(file, "tokens_seen", H5T_NATIVE_LLONG, H5T_STD_I64LE, &info->tokens_seen);
    status |= write_attr(file, "world_size", H5T_NATIVE_INT, H5T_STD_I32LE, &info->world_size);
    status |= write_attr_string(file, "config_ini", ini);
    free(ini);
    return status < 0 ? -1 : 0;
}

/* fsync the file, rename it over the target, fsync the directory. */
static int publish(const char *tmp, const char *path, char *err, size_t err_len) {
    int fd = open(tmp, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        snprintf(err, err_len, "%s: fsync failed: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        snprintf(err, err_len, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
        return -1;
    }
    char *copy = strdup(path);
    int dir = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (dir >= 0) {
        fsync(dir);
        close(dir);
    }
    return 0;
}

typedef herr_t (*content_writer)(hid_t file, const void *ctx);

/* Creates `path` through a temporary file; `write` fills it. */
static int write_atomically(const char *path, content_writer write, const void *ctx, char *err, size_t err_len) {
    quiet_hdf5();
    char tmp[CONFIG_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    hid_t file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        snprintf(err, err_len, "%s: cannot create file (%s)", tmp, strerror(errno));
        return -1;
    }
    herr_t status = write(file, ctx);
    if (status >= 0) status = H5Fflush(file, H5F_SCOPE_GLOBAL);
    if (H5Fclose(file) < 0) status = -1;
    if (status < 0) {
        snprintf(err, err_len, "%s: writing failed (disk full or I/O error)", path);
        unlink(tmp);
        return -1;
    }
    if (publish(tmp, path, err, err_len) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

typedef struct {
    const model *m;
    const checkpoint_info *info;
    const metric_table *train, *eval;
} checkpoint_content;

static herr_t write_checkpoint_content(hid_t file, const void *ctx) {
    const checkpoint_content *c = ctx;
    if (write_root_attributes(file, c->m, c->info) < 0) return -1;
    if (write_tensors(file, "/model", c->m, c->m->params) < 0) return -1;
    if (write_tensors(file, "/optim/m", c->m, c->m->adam_m) < 0) return -1;
    if (write_tensors(file, "/optim/v", c->m, c->m->adam_v) < 0) return -1;
    if (c->m->momentum && write_buffers(file, c->m) < 0) return -1;
    if (c->train && write_metric_table(file, "/metrics/train", c->train) < 0) return -1;
    if (c->eval && write_metric_table(file, "/metrics/eval", c->eval) < 0) return -1;
    return 0;
}

int checkpoint_write(const char *path, const model *m, const checkpoint_info *info, const metric_table *train,
                     const metric_table *eval, char *err, size_t err_len) {
    checkpoint_content content = {m, info, train, eval};
    return write_atomically(path, write_checkpoint_content, &content, err, err_len);
}

typedef struct {
    const model *m;
    double loss;
} grads_content;

static herr_t write_grads_content(hid_t file, const void *ctx) {
    const grads_content *c = ctx;
    if (write_attr(file, "loss", H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &c->loss) < 0) return -1;
    return write_tensors(file, "/grads", c->m, c->m->grads);
}

int grads_write(const char *path, const model *m, double loss, char *err, size_t err_len) {
    grads_content content = {m, loss};
    return write_atomically(path, write_grads_content, &content, err, err_len);
}

/* ---- reading ------------------------------------------------------------ */

static hid_t open_for_reading(const char *path, const char *what) {
    quiet_hdf5();
    if (access(path, R_OK) != 0) fail(EXIT_BAD_FILE, "%s: cannot open %s: %s", path, what, strerror(errno));
    if (H5Fis_hdf5(path) <= 0) fail(EXIT_BAD_FILE, "%s: not an HDF5 file (or truncated/corrupt)", path);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) fail(EXIT_BAD_FILE, "%s: cannot open %s as HDF5 (corrupt?)", path, what);
    return file;
}

/* Reads a string attribute, variable- or fixed-length. Caller frees. */
static char *read_attr_string(hid_t obj, const char *path, const char *name) {
    if (H5Aexists(obj, name) <= 0) fail(EXIT_BAD_FILE, "%s: missing root attribute '%s'", path, name);
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(attr);
    char *result = NULL;
    if (H5Tget_class(type) != H5T_STRING) fail(EXIT_BAD_FILE, "%s: attribute '%s' is not a string", path, name);
    hid_t mem = H5Tcopy(H5T_C_S1);
    /* HDF5 will not convert between ASCII and UTF-8: read in the file's charset */
    H5Tset_cset(mem, H5Tget_cset(type));
    if (H5Tis_variable_str(type) > 0) {
        char *value = NULL;
        H5Tset_size(mem, H5T_VARIABLE);
        if (H5Aread(attr, mem, &value) < 0 || !value) fail(EXIT_BAD_FILE, "%s: cannot read attribute '%s'", path, name);
        result = strdup(value);
        H5free_memory(value);
    } else {
        size_t size = H5Tget_size(type);
        H5Tset_size(mem, size + 1);
        result = xcalloc(size + 2, 1);
        if (H5Aread(attr, mem, result) < 0) fail(EXIT_BAD_FILE, "%s: cannot read attribute '%s'", path, name);
    }
    H5Tclose(mem);
    H5Tclose(type);
    H5Aclose(attr);
    return result;
}

static long long read_attr_int(hid_t obj, const char *path, const char *name) {
    if (H5Aexists(obj, name) <= 0) fail(EXIT_BAD_FILE, "%s: missing root attribute '%s'", path, name);
    long long value = 0;
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(attr);
    if (H5Tget_class(type) != H5T_INTEGER || H5Aread(attr, H5T_NATIVE_LLONG, &value) < 0)
        fail(EXIT_BAD_FILE, "%s: attribute '%s' is not an integer", path, name);
    H5Tclose(type);
    H5Aclose(attr);
    return value;
}

static void format_shape(char *out, size_t len, int ndim, const hsize_t *dims) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    if (used < len) snprintf(out + used, len - used, "]");
}

/* Opens dataset `name` and checks its rank and dims (a 1-D [n] also matches
 * dims {n, 1} with ndim 1). Returns the dataset. */
static hid_t open_checked(hid_t file, const char *path, const char *name, int ndim, const hsize_t *dims) {
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) fail(EXIT_BAD_FILE, "%s: missing dataset %s", path, name);
    hid_t dset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dset < 0) fail(EXIT_BAD_FILE, "%s: %s is not a dataset", path, name);
    hid_t space = H5Dget_space(dset);
    hsize_t got[8] = {0};
    int got_ndim = H5Sget_simple_extent_dims(space, got, NULL);
    H5Sclose(space);
    bool same = got_ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = got[i] == dims[i];
    if (!same) {
        char want[64], have[64];
        format_shape(want, sizeof want, ndim, dims);
        format_shape(have, sizeof have, got_ndim, got);
        fail(EXIT_BAD_FILE, "%s: %s has shape %s, expected %s", path, name, have, want);
    }
    return dset;
}

static void read_checked(hid_t file, const char *path, const char *name, hid_t mem_type, int ndim,
                         const hsize_t *dims, void *out) {
    hid_t dset = open_checked(file, path, name, ndim, dims);
    if (H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
        fail(EXIT_BAD_FILE, "%s: cannot read %s (corrupt or wrong type)", path, name);
    H5Dclose(dset);
}

void checkpoint_read_config(const char *path, config *c, checkpoint_info *info) {
    hid_t file = open_for_reading(path, "checkpoint");
    char *format = read_attr_string(file, path, "format");
    if (strcmp(format, CHECKPOINT_FORMAT) != 0)
        fail(EXIT_BAD_FILE, "%s: format is '%s', expected '%s'", path, format, CHECKPOINT_FORMAT);
    free(format);
    long long version = read_attr_int(file, path, "format_version");
    if (version < 1 || version > CHECKPOINT_FORMAT_VERSION)
        fail(EXIT_BAD_FILE, "%s: format_version %lld is not supported (this build reads 1..%d)", path, version,
             CHECKPOINT_FORMAT_VERSION);
    info->step = read_attr_int(file, path, "step");
    info->tokens_seen = read_attr_int(file, path, "tokens_seen");
    info->world_size = (int)read_attr_int(file, path, "world_size");
    char *ini = read_attr_string(file, path, "config_ini");
    H5Fclose(file);
    char origin[CONFIG_PATH_MAX + 32], err[512];
    snprintf(origin, sizeof origin, "%s:config_ini", path);
    config_defaults(c);
    if (config_load_string(c, ini, origin, err, sizeof err) != 0) fail(EXIT_BAD_FILE, "%s", err);
    free(ini);
    config_validate(c, origin, EXIT_BAD_FILE);
}

static void read_tensors(hid_t file, const char *path, const char *group, const model *m, float *base) {
    for (int i = 0; i < m->n_entries; i++) {
        const param_entry *e = &m->entries[i];
        char name[256];
        snprintf(name, sizeof name, "%s/%s", group, e->name);
        hsize_t dims[2] = {(hsize_t)e->shape[0], (hsize_t)e->shape[1]};
        read_checked(file, path, name, H5T_NATIVE_FLOAT, e->ndim, dims, base + e->offset);
    }
}

static void read_buffers(hid_t file, const char *path, model *m) {
    for (int l = 0; l < m->L; l++)
        for (int which = 0; which < 2; which++) {
            char name[128];
            snprintf(name, sizeof name, "/buffers/blocks/%d/attn/%s", l, which ? "prev_k" : "prev_q");
            hsize_t dims[2] = {(hsize_t)m->H, (hsize_t)m->dh};
            read_checked(file, path, name, H5T_NATIVE_FLOAT, 2, dims,
                         m->buffers + (size_t)(l * 2 + which) * m->H * m->dh);
        }
}

static long long metric_rows(hid_t file, const char *path, const char *group, const metric_table *t) {
    char name[128];
    snprintf(name, sizeof name, "%s/%s", group, t->columns[0].name);
    if (H5Lexists(file, group, H5P_DEFAULT) <= 0 || H5Lexists(file, name, H5P_DEFAULT) <= 0) return 0;
    hid_t dset = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t space = H5Dget_space(dset);
    hsize_t dims[2] = {0, 0};
    if (H5Sget_simple_extent_dims(space, dims, NULL) != 1) fail(EXIT_BAD_FILE, "%s: %s is not 1-D", path, name);
    H5Sclose(space);
    H5Dclose(dset);
    return (long long)dims[0];
}

static void read_metric_table(hid_t file, const char *path, const char *group, metric_table *t) {
    long long rows = metric_rows(file, path, group, t);
    double *column = xcalloc((size_t)rows * OCCURRENCE_BINS + 1, sizeof(double));
    double *table = xcalloc((size_t)rows * t->row_width + 1, sizeof(double));
    int offset = 0;
    for (int c = 0; c < t->n_columns && rows > 0; c++) {
        const metric_column *col = &t->columns[c];
        char name[128];
        snprintf(name, sizeof name, "%s/%s", group, col->name);
        hsize_t dims[2] = {(hsize_t)rows, (hsize_t)col->width};
        read_checked(file, path, name, H5T_NATIVE_DOUBLE, col->width > 1 ? 2 : 1, dims, column);
        for (long long r = 0; r < rows; r++)
            for (int j = 0; j < col->width; j++) table[r * t->row_width + offset + j] = column[r * col->width + j];
        offset += col->width;
    }
    t->n_rows = 0;
    for (long long r = 0; r < rows; r++) metric_table_append(t, table + r * t->row_width);
    free(column);
    free(table);
}

void checkpoint_read_state(const char *path, model *m, bool optimizer, metric_table *train, metric_table *eval) {
    hid_t file = open_for_reading(path, "checkpoint");
    read_tensors(file, path, "/model", m, m->params);
    if (m->momentum) read_buffers(file, path, m);
    if (optimizer) {
        read_tensors(file, path, "/optim/m", m, m->adam_m);
        read_tensors(file, path, "/optim/v", m, m->adam_v);
    }
    if (train) read_metric_table(file, path, "/metrics/train", train);
    if (eval) read_metric_table(file, path, "/metrics/eval", eval);
    H5Fclose(file);
}

static void check_token_range(const char *path, const char *name, const int32_t *x, size_t n, int lo, int hi) {
    for (size_t i = 0; i < n; i++)
        if (x[i] < lo || x[i] >= hi)
            fail(EXIT_BAD_FILE, "%s: %s[%zu] = %d is outside [%d, %d)", path, name, i, x[i], lo, hi);
}

void tokens_read(const char *path, const model *m, batch *b) {
    hid_t file = open_for_reading(path, "token file");
    if (H5Lexists(file, "/inputs", H5P_DEFAULT) <= 0) fail(EXIT_BAD_FILE, "%s: missing dataset /inputs", path);
    hid_t dset = H5Dopen2(file, "/inputs", H5P_DEFAULT);
    hid_t space = H5Dget_space(dset);
    hsize_t dims[2] = {0, 0};
    int ndim = H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    H5Dclose(dset);
    if (ndim != 2 || dims[0] == 0 || dims[1] == 0)
        fail(EXIT_BAD_FILE, "%s: /inputs must be a non-empty [B, T] int32 array", path);
    if ((int)dims[1] > m->rope_positions)
        fail(EXIT_BAD_FILE, "%s: /inputs has T = %llu, longer than the model's %d positions", path,
             (unsigned long long)dims[1], m->rope_positions);
    batch_alloc(b, (int)dims[0], (int)dims[1]);
    size_t n = (size_t)b->B * b->T;
    read_checked(file, path, "/inputs", H5T_NATIVE_INT32, 2, dims, b->inputs);
    read_checked(file, path, "/targets", H5T_NATIVE_INT32, 2, dims, b->targets);
    check_token_range(path, "/inputs", b->inputs, n, 0, m->V);
    if (m->cfg.head == HEAD_CLS) {
        hsize_t label_dims[1] = {dims[0]};
        read_checked(file, path, "/labels", H5T_NATIVE_INT32, 1, label_dims, b->labels);
        check_token_range(path, "/labels", b->labels, (size_t)b->B, 0, m->n_out);
    } else {
        check_token_range(path, "/targets", b->targets, n, -1, m->V);
    }
    H5Fclose(file);
}
