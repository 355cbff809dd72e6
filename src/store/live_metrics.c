/* Live metrics file with HDF5 SWMR; see live_metrics.h. Every column is a
 * chunked dataset with an unlimited first dimension: SWMR allows appending
 * (H5Dset_extent) but not creating objects, so all datasets exist before
 * H5Fstart_swmr_write. */
#include "store/live_metrics.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/sys.h"
#include "hdf5/h5util.h"
#include "hdf5/h5writer.h"
#include "store/checkpoint.h"

#define MAX_COLUMNS 32

typedef struct {
    hid_t datasets[MAX_COLUMNS];
    long long rows_written;
    /* one column's new rows on their way to the file: kept between appends
     * and grown only for more rows than before, so that logging a step
     * allocates nothing of ours (docs/design.md §8.10) */
    double *block;
    size_t block_capacity;
} live_table;

struct live_metrics {
    hid_t file;
    live_table train, eval;
    char path[CONFIG_PATH_MAX + 32]; /* named when an append fails */
};

static hid_t create_column(hid_t file, const char *group, const metric_column *col) {
    char name[128];
    snprintf(name, sizeof name, "/metrics/%s/%s", group, col->name);
    unsigned long long shape[3];
    int ndim = metric_column_shape(col, 0, shape);
    hsize_t dims[3] = {0, shape[1], shape[2]}, maxdims[3] = {H5S_UNLIMITED, shape[1], shape[2]};
    hsize_t chunk[3] = {256, shape[1], shape[2]};
    hid_t space = H5Screate_simple(ndim, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, ndim, chunk);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t type = col->integer ? H5T_STD_I64LE : H5T_IEEE_F64LE;
    hid_t dset = H5Dcreate2(file, name, type, space, lcpl, dcpl, H5P_DEFAULT);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    H5Sclose(space);
    return dset;
}

static int create_table(hid_t file, const char *group, const metric_table *t, live_table *lt) {
    if (t->n_columns > MAX_COLUMNS) return -1;
    for (int c = 0; c < t->n_columns; c++) {
        lt->datasets[c] = create_column(file, group, &t->columns[c]);
        if (lt->datasets[c] < 0) return -1;
    }
    lt->rows_written = 0;
    return 0;
}

/* Appends rows [lt->rows_written, t->n_rows) of every column. */
static int append_rows(live_table *lt, const metric_table *t) {
    long long first = lt->rows_written, count = t->n_rows - first;
    if (count <= 0) return 0;
    size_t needed = (size_t)(count * t->row_width);
    if (needed > lt->block_capacity) {
        free(lt->block);
        lt->block_capacity = 2 * needed;
        lt->block = sys_calloc(lt->block_capacity, sizeof(double));
    }
    double *block = lt->block;
    int offset = 0, status = 0;
    for (int c = 0; c < t->n_columns && status >= 0; c++) {
        const metric_column *col = &t->columns[c];
        for (long long r = 0; r < count; r++)
            for (int j = 0; j < col->width; j++)
                block[r * col->width + j] = t->values[(first + r) * t->row_width + offset + j];
        unsigned long long shape[3];
        int ndim = metric_column_shape(col, first + count, shape);
        hsize_t size[3] = {shape[0], shape[1], shape[2]};
        hsize_t start[3] = {(hsize_t)first, 0, 0}, extent[3] = {(hsize_t)count, shape[1], shape[2]};
        hid_t dset = lt->datasets[c];
        status = H5Dset_extent(dset, size);
        hid_t file_space = H5Dget_space(dset), mem_space = H5Screate_simple(ndim, extent, NULL);
        H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, extent, NULL);
        if (status >= 0 && col->integer) {
            long long *ints = (long long *)block;
            for (long long r = 0; r < count; r++) ints[r] = (long long)block[r];
            status = H5Dwrite(dset, H5T_NATIVE_LLONG, mem_space, file_space, H5P_DEFAULT, ints);
        } else if (status >= 0) {
            status = H5Dwrite(dset, H5T_NATIVE_DOUBLE, mem_space, file_space, H5P_DEFAULT, block);
        }
        if (status >= 0) status = H5Dflush(dset);
        H5Sclose(mem_space);
        H5Sclose(file_space);
        offset += col->width;
    }
    if (status < 0) return -1;
    lt->rows_written = t->n_rows;
    return 0;
}

live_metrics *live_metrics_open(const char *dir, const char *config_ini, const metric_table *train,
                                const metric_table *eval, status *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    live_metrics *lm = sys_calloc(1, sizeof *lm);
    char *path = lm->path;
    snprintf(path, sizeof lm->path, "%s/metrics.h5", dir);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST); /* SWMR needs the latest format */
    /* replaced in place, but never through a symbolic link or onto a FIFO (docs/files.md §4) */
    status created;
    lm->file = h5writer_create_checked(path, SYS_REPLACE, fapl, NULL, &created);
    H5Pclose(fapl);
    if (lm->file < 0) {
        status_fail(err, EXIT_BAD_FILE, "%s", created.message);
        live_metrics_close(lm);
        return NULL;
    }
    bool ok = lm->file >= 0 && h5util_write_string_attr(lm->file, "config_ini", config_ini) >= 0 &&
              create_table(lm->file, "train", train, &lm->train) == 0 &&
              create_table(lm->file, "eval", eval, &lm->eval) == 0 && append_rows(&lm->train, train) == 0 &&
              append_rows(&lm->eval, eval) == 0 && H5Fstart_swmr_write(lm->file) >= 0;
    if (!ok) {
        status_fail(err, EXIT_BAD_FILE, "%s: cannot create the live metrics file (disk full, or beyond ulimit -f?)",
                    path);
        live_metrics_close(lm);
        return NULL;
    }
    return lm;
}

int live_metrics_append(live_metrics *lm, const metric_table *train, const metric_table *eval, status *err) {
    if (append_rows(&lm->train, train) != 0 || append_rows(&lm->eval, eval) != 0)
        return status_fail(err, EXIT_BAD_FILE, "%s: append failed (disk full, or beyond ulimit -f?)", lm->path);
    return 0;
}

static void free_blocks(live_metrics *lm) {
    free(lm->train.block);
    free(lm->eval.block);
}

void live_metrics_abandon(live_metrics *lm) {
    free_blocks(lm);
    free(lm);
}

static void close_table(live_table *lt, int n) {
    for (int c = 0; c < n; c++)
        if (lt->datasets[c] > 0) H5Dclose(lt->datasets[c]);
}

void live_metrics_close(live_metrics *lm) {
    if (!lm) return;
    close_table(&lm->train, MAX_COLUMNS);
    close_table(&lm->eval, MAX_COLUMNS);
    if (lm->file >= 0) H5Fclose(lm->file);
    free_blocks(lm);
    free(lm);
}
