/* Reading HDF5 files that may be hostile (docs/files.md §4, hostile files):
 * every attribute and dataset is checked for existence, rank, shape, type
 * and size before anything is read or allocated, and only regular files are
 * opened. Used by the checkpoint, token and metrics readers (checkpoint.c). */
#ifndef MOMFMM_H5READER_H
#define MOMFMM_H5READER_H
#include <hdf5.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* A read in progress. Any problem formats a message and jumps back to the
 * entry point (h5reader_run), which closes the file: files are opened with
 * H5F_CLOSE_STRONG, so closing the file releases every object still open in
 * it. This keeps each helper a straight line of checks. */
typedef struct {
    const char *path;
    unsigned open_flags; /* H5F_ACC_RDONLY, with H5F_ACC_SWMR_READ for a live file */
    hid_t file;
    status *err;
    jmp_buf on_error;
} h5reader;

/* Formats "<path>: <message>" into the status and jumps back to h5reader_run. */
_Noreturn void h5reader_fail(h5reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether the object `name` ("/a/b") exists, every link on the way a hard
 * link: a soft, external or user-defined link fails (docs/files.md §4). */
bool h5reader_exists(h5reader *r, const char *name);
/* Fails naming the first object below `group` (any depth, e.g.
 * "blocks/2/ln1/weight") whose name relative to it `allowed` refuses, or
 * that a link other than a hard one reaches; `what` completes "... is not
 * <what>" in the message. Nothing when the group is absent. */
typedef bool (*h5reader_name_filter)(const char *name, void *ctx);
void h5reader_only_names(h5reader *r, const char *group, h5reader_name_filter allowed, void *ctx, const char *what);
/* Whether another process holds an HDF5 write lock on `path` (an flock). */
bool h5reader_is_locked(const char *path);
/* A string attribute, variable- or fixed-length (at most 64 MiB); caller frees. */
char *h5reader_attr_string(h5reader *r, const char *name);
long long h5reader_attr_int(h5reader *r, const char *name);
/* Dataset `name` with its rank and dims; fails when it is missing. */
hid_t h5reader_open_dataset(h5reader *r, const char *name, int *ndim, hsize_t *dims);
/* The elements a dataset declares, overflow-checked, bounded, stored in the
 * file and fitting in memory. */
unsigned long long h5reader_checked_elements(h5reader *r, const char *name, hid_t dset, int ndim, const hsize_t *dims);
/* Fails unless the dataset holds integers. */
void h5reader_require_integer(h5reader *r, const char *name, hid_t dset);
/* The dataset `name`, whose shape must be ndim x dims (h5reader_checked_elements too). */
hid_t h5reader_open_checked(h5reader *r, const char *name, int ndim, const hsize_t *dims);
void h5reader_read_checked(h5reader *r, const char *name, hid_t mem_type, int ndim, const hsize_t *dims, void *out);
/* The first dims[0] rows, as doubles, of a dataset whose other dimensions
 * are dims[1..]: all of its rows unless `more_rows` (h5reader_open_checked_rows). */
void h5reader_read_leading_rows(h5reader *r, const char *name, bool more_rows, int ndim, const hsize_t *dims,
                                double *out);

/* Opens `path` (open_flags: H5F_ACC_RDONLY, with H5F_ACC_SWMR_READ for a
 * live file; `what` names it in messages) and runs body(r, ctx); 0, or
 * EXIT_BAD_FILE with the message in err (which may be NULL for
 * h5reader_run). */
typedef void (*h5reader_body)(h5reader *r, void *ctx);
int h5reader_run_into(const char *path, unsigned open_flags, const char *what, h5reader_body body, void *ctx,
                      status *err);
int h5reader_run(const char *path, const char *what, h5reader_body body, void *ctx, status *err);
#endif
