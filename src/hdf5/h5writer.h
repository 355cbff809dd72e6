/* Writing HDF5 files atomically (docs/design.md §8.4), by one process alone
 * or by all ranks together through parallel HDF5 (docs/scale.md §7): the
 * counterpart of h5reader.h. What goes into a file is the caller's
 * (checkpoint.c); this module owns the file's life: the temporary name,
 * MPI-IO, agreement on failures, flush, fsync, rename. */
#ifndef MOMFMM_H5WRITER_H
#define MOMFMM_H5WRITER_H
#include <hdf5.h>
#include <stdbool.h>

#include "base/status.h"
#include "base/sys.h"

/* A file being written. Together, every rank holds one and takes part in
 * every dataset and attribute (collective in parallel HDF5); the leader
 * (rank 0) writes the data nobody else does. Alone, the one writer leads. */
typedef struct {
    hid_t file, dxpl;
    int fd; /* the leader's descriptor of the temporary (fsync, checks), else -1 */
    bool together, leader;
} h5writer;

/* How a file is written: by one process alone; by all ranks together with
 * independent data transfers; or together with collective ones (MPI-IO
 * collective buffering). Metadata is collective whenever together. */
typedef enum { H5WRITER_ALONE, H5WRITER_TOGETHER, H5WRITER_COLLECTIVE } h5writer_mode;

/* Together, all writers return -1 when any failed (so that none goes on to
 * the next collective call alone and waits forever); alone, status. */
herr_t h5writer_agree(const h5writer *w, herr_t status);

/* Creates dataset `name` of dims (row-major, ndim <= 3) and writes its
 * flat elements [lo, hi) from data (which holds element lo first); a
 * writer with lo == hi writes nothing but takes part. Partial ranges need
 * ndim 1 or 2. Agreed (h5writer_agree). */
herr_t h5writer_range(const h5writer *w, const char *name, hid_t mem_type, hid_t file_type, int ndim,
                      const hsize_t *dims, hsize_t lo, hsize_t hi, const void *data);
/* A dataset the leader writes whole. */
herr_t h5writer_dataset(const h5writer *w, const char *name, hid_t mem_type, hid_t file_type, int ndim,
                        const hsize_t *dims, const void *data);

/* Fills the file; returns 0, or -1 after a failure (agreed). */
typedef herr_t (*h5writer_body)(const h5writer *w, const void *ctx);

/* H5Fcreate of `path` opened first by sys_open_file (`how`: SYS_CREATE for
 * a new file, SYS_REPLACE to empty a regular one; docs/files.md §4): never
 * through a symbolic link or onto a FIFO or device. HDF5 creates it through
 * the descriptor's /proc name, so that nothing swapped in at `path` is
 * written; without /proc it takes the path and the result is checked to be
 * the same file. Returns the file, and with `fd` the descriptor (which the
 * caller closes after H5Fclose); or -1 with err naming the path. */
hid_t h5writer_create_checked(const char *path, sys_open_how how, hid_t fapl, int *fd, status *err);

/* Creates `path` through `tmp` (a name in the same directory, the same on
 * every writer together): body fills it, then flush, close, fsync, rename,
 * directory fsync (by the leader, after every writer has closed the file).
 * Returns 0, or EXIT_BAD_FILE with a message naming the file; together,
 * every writer returns the leader's outcome. On a failure the previous
 * file under `path`, if any, is left as it was. */
int h5writer_run(const char *path, const char *tmp, h5writer_mode mode, h5writer_body body, const void *ctx,
                 status *err);
#endif
