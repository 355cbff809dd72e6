/* The atomic, optionally collective HDF5 writer (docs/design.md §8.4,
 * docs/scale.md §7); see h5writer.h. */
#include "hdf5/h5writer.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/sys.h"
#include "hdf5/h5util.h"
#include "parallel/dist.h"
#include "parallel/dist_hdf5.h"

herr_t h5writer_agree(const h5writer *w, herr_t status) {
    return w->together ? (dist_any(status < 0) ? -1 : 0) : status;
}

void h5util_select_flat_range(hid_t space, int ndim, const hsize_t *dims, hsize_t begin, hsize_t end) {
    hsize_t total = 1;
    for (int i = 0; i < ndim; i++) total *= dims[i];
    if (begin >= end) {
        H5Sselect_none(space);
        return;
    }
    if (begin == 0 && end == total) {
        H5Sselect_all(space);
        return;
    }
    if (ndim == 1) {
        hsize_t start = begin, count = end - begin;
        H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &count, NULL);
        return;
    }
    hsize_t cols = dims[1], r0 = begin / cols, c0 = begin % cols, r1 = (end - 1) / cols, c1 = (end - 1) % cols;
    hsize_t start[2] = {r0, c0}, count[2] = {1, r0 == r1 ? c1 - c0 + 1 : cols - c0};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL);
    if (r0 == r1) return;
    if (r1 > r0 + 1) {
        hsize_t mid_start[2] = {r0 + 1, 0}, mid_count[2] = {r1 - r0 - 1, cols};
        H5Sselect_hyperslab(space, H5S_SELECT_OR, mid_start, NULL, mid_count, NULL);
    }
    hsize_t last_start[2] = {r1, 0}, last_count[2] = {1, c1 + 1};
    H5Sselect_hyperslab(space, H5S_SELECT_OR, last_start, NULL, last_count, NULL);
}

herr_t h5writer_range(const h5writer *w, const char *name, hid_t mem_type, hid_t file_type, int ndim,
                      const hsize_t *dims, hsize_t lo, hsize_t hi, const void *data) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER); /* every element gets written: no fill pass */
    hid_t space = H5Screate_simple(ndim, dims, NULL);
    hid_t dset = H5Dcreate2(w->file, name, file_type, space, lcpl, dcpl, H5P_DEFAULT);
    herr_t status = dset < 0 ? -1 : 0;
    if (dset >= 0 && H5Sget_simple_extent_npoints(space) > 0) { /* an empty table has nothing to write */
        hsize_t n = hi > lo ? hi - lo : 1;
        hid_t mem = H5Screate_simple(1, &n, NULL);
        if (hi <= lo) H5Sselect_none(mem);
        h5util_select_flat_range(space, ndim, dims, lo, hi);
        status = H5Dwrite(dset, mem_type, mem, space, w->dxpl, data);
        H5Sclose(mem);
    }
    if (dset >= 0) H5Dclose(dset);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
    return h5writer_agree(w, status);
}

herr_t h5writer_dataset(const h5writer *w, const char *name, hid_t mem_type, hid_t file_type, int ndim,
                        const hsize_t *dims, const void *data) {
    hsize_t total = 1;
    for (int i = 0; i < ndim; i++) total *= dims[i];
    return h5writer_range(w, name, mem_type, file_type, ndim, dims, 0, w->leader ? total : 0, data);
}

herr_t h5util_write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t status = attr < 0 ? -1 : H5Awrite(attr, mem_type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return status;
}

herr_t h5util_write_string_attr(hid_t obj, const char *name, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    herr_t status = h5util_write_attr(obj, name, type, type, &value);
    H5Tclose(type);
    return status;
}

hid_t h5writer_create_checked(const char *path, sys_open_how how, hid_t fapl, int *fd, status *err) {
    int opened = sys_open_file(path, how, NULL, err);
    if (opened < 0) return -1;
    char by_descriptor[64];
    const char *name = sys_descriptor_path(opened, by_descriptor, sizeof by_descriptor);
    hid_t file = H5Fcreate(name ? name : path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    int cause = errno;
    /* without /proc HDF5 opened the path: it must still be the file checked */
    if (file >= 0 && !name && !sys_same_file(opened, path)) {
        H5Fclose(file);
        file = -1;
        status_fail(err, EXIT_BAD_FILE, "%s: replaced by another file while it was being created: refused", path);
    } else if (file < 0) {
        status_fail(err, EXIT_BAD_FILE, "%s: cannot create (%s)", path, strerror(cause));
    }
    /* a new file that HDF5 could not create (a full disk) is not left behind */
    if (file < 0 && how == SYS_CREATE && sys_same_file(opened, path)) unlink(path);
    if (file >= 0 && fd) *fd = opened;
    else close(opened);
    return file;
}

/* The leader's temporary after a failure: emptied through its own
 * descriptor first, because the HDF5 handle of a failed write is abandoned
 * open (below) and would keep the unlinked file's blocks allocated until
 * the process exits: a full disk stays full, and the retry after freeing
 * older checkpoints (store.c) would fail again. Removed only while the name
 * is still the file created. */
static void discard_temporary(const h5writer *w, const char *tmp) {
    if (!w->leader || w->fd < 0) return;
    bool emptied = ftruncate(w->fd, 0) == 0; /* best effort: nothing else frees the blocks */
    (void)emptied;
    if (sys_same_file(w->fd, tmp)) unlink(tmp);
}

/* fsyncs the written file (the descriptor the leader created it with),
 * renames it over the target, fsyncs the directory: after a crash, `path`
 * holds the old file or the new one. The temporary must still be the file
 * created, and the target absent or a regular file: a symbolic link there
 * is the user's pointer elsewhere, not a file to replace (docs/files.md §4). */
static int publish(const h5writer *w, const char *tmp, const char *path, status *err) {
    if (fsync(w->fd) != 0) return status_fail(err, EXIT_BAD_FILE, "%s: fsync failed: %s", tmp, strerror(errno));
    if (!sys_same_file(w->fd, tmp))
        return status_fail(err, EXIT_BAD_FILE, "%s: replaced by another file during the write: not published", tmp);
    if (sys_check_replaceable(path, err) != 0) return -1;
    if (rename(tmp, path) != 0)
        return status_fail(err, EXIT_BAD_FILE, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    char *copy = strdup(path);
    int dir = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (dir >= 0) {
        fsync(dir);
        close(dir);
    }
    return 0;
}

/* The temporary, by the leader: a new regular file (sys_open_file's
 * SYS_CREATE: O_EXCL | O_NOFOLLOW, never over anything, a link included),
 * after removing a leftover of the same name (a crashed process of the same
 * pid; unlink removes a link, never its target). Alone, HDF5 creates the
 * file through that descriptor (h5writer_create_checked). Together, every
 * rank then opens the name through MPI-IO, and the leader checks that it
 * is still the file it created: someone with write access to the directory
 * could swap it in between (docs/files.md §4, the residual race). Together:
 * metadata operations are collective; data transfers independent by
 * default: a rank's part of a tensor is one contiguous byte range of the
 * file, which leaves collective buffering nothing to merge on one node, and
 * its extra exchange made checkpoints slower here (docs/scale.md §7: 1.8 s
 * vs 1.4 s for 303 MB at np = 4); a parallel file system may favour the
 * collective mode (dist.collective_io). */
static hid_t create_file(h5writer *w, h5writer_mode mode, const char *tmp, status *err) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), file = -1;
    if (w->leader) unlink(tmp);
    if (!w->together) {
        file = h5writer_create_checked(tmp, SYS_CREATE, fapl, &w->fd, err);
        H5Pclose(fapl);
        return file;
    }
    w->dxpl = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(w->dxpl, mode == H5WRITER_COLLECTIVE ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
    if (w->leader) w->fd = sys_open_file(tmp, SYS_CREATE, NULL, err);
    if (h5writer_agree(w, w->leader && w->fd < 0 ? -1 : 0) < 0) {
        H5Pclose(fapl);
        if (!w->leader) status_fail(err, EXIT_BAD_FILE, "%s: rank 0 could not create it", tmp);
        return -1;
    }
    if (dist_hdf5_mpio(fapl) == 0) file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    int cause = errno;
    H5Pclose(fapl);
    /* a failed create is abandoned, as a failed write (below) */
    if (h5writer_agree(w, file < 0 ? -1 : 0) < 0) {
        status_fail(err, EXIT_BAD_FILE, "%s: cannot create (%s)", tmp, strerror(cause));
        return -1;
    }
    if (h5writer_agree(w, w->leader && !sys_same_file(w->fd, tmp) ? -1 : 0) >= 0) return file;
    H5Fclose(file); /* collective: every rank holds it */
    status_fail(err, EXIT_BAD_FILE, "%s: replaced by another file while it was being created: refused", tmp);
    return -1;
}

/* A file whose writing or flushing failed (a full disk) is abandoned, not
 * closed: HDF5 1.10.8 frees a file whose H5Fclose fails yet keeps it
 * registered and crashes at exit (HDFFV-11052); main() calls H5dont_atexit
 * and starts HDF5 before MPI (so that parallel HDF5 does not close it at
 * MPI_Finalize either), and the operating system frees the handle. */
static int write_and_publish(const char *path, const char *tmp, h5writer *w, h5writer_mode mode, h5writer_body body,
                             const void *ctx, status *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our messages name the problem */
    w->file = create_file(w, mode, tmp, err);
    if (w->file < 0) {
        discard_temporary(w, tmp); /* a full disk may have left it created and empty */
        return EXIT_BAD_FILE;
    }
    herr_t written = body(w, ctx);
    if (written >= 0) written = h5writer_agree(w, H5Fflush(w->file, H5F_SCOPE_GLOBAL));
    if (written >= 0) written = h5writer_agree(w, H5Fclose(w->file));
    if (written < 0) {
        discard_temporary(w, tmp);
        double limit = sys_file_size_limit(); /* SIGXFSZ is caught: the write fails with EFBIG */
        if (limit >= 0)
            return status_fail(err, EXIT_BAD_FILE,
                               "%s: writing failed (disk full, I/O error, or beyond the file size limit of %.0f "
                               "bytes, ulimit -f)",
                               path, limit);
        return status_fail(err, EXIT_BAD_FILE, "%s: writing failed (disk full or I/O error)", path);
    }
    int rc = 0;
    if (w->leader && publish(w, tmp, path, err) != 0) {
        discard_temporary(w, tmp);
        rc = EXIT_BAD_FILE;
    }
    if (h5writer_agree(w, rc != 0 ? -1 : 0) < 0 && rc == 0)
        rc = status_fail(err, EXIT_BAD_FILE, "%s: rank 0 could not publish the file", path);
    return rc;
}

int h5writer_run(const char *path, const char *tmp, h5writer_mode mode, h5writer_body body, const void *ctx,
                 status *err) {
    bool together = mode != H5WRITER_ALONE;
    h5writer w = {
        .file = -1, .fd = -1, .dxpl = H5P_DEFAULT, .together = together, .leader = !together || dist_rank() == 0};
    int rc = write_and_publish(path, tmp, &w, mode, body, ctx, err);
    if (w.dxpl != H5P_DEFAULT) H5Pclose(w.dxpl);
    if (w.fd >= 0) close(w.fd);
    return rc;
}
