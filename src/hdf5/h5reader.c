/* The hostile-file reader (docs/files.md §4, hostile files; docs/design.md
 * §8.4); see h5reader.h. */
#include "hdf5/h5reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "base/status.h"
#include "base/sys.h"

_Noreturn void h5reader_fail(h5reader *r, const char *fmt, ...) {
    int used = snprintf(r->err->message, sizeof r->err->message, "%s: ", r->path);
    va_list args;
    va_start(args, fmt);
    if (used >= 0 && (size_t)used < sizeof r->err->message)
        vsnprintf(r->err->message + used, sizeof r->err->message - (size_t)used, fmt, args);
    va_end(args);
    status_escape_controls(r->err->message, sizeof r->err->message);
    longjmp(r->on_error, 1);
}

/* HDF5's hook before it follows an external link: never (docs/files.md §4,
 * hostile files). h5reader_exists refuses such links by name first; this
 * is the backstop for any path the checks missed. */
static herr_t refuse_external_link(const char *parent_file, const char *parent_group, const char *target_file,
                                   const char *target_object, unsigned *flags, hid_t fapl, void *data) {
    (void)parent_file, (void)parent_group, (void)target_file, (void)target_object, (void)flags, (void)fapl;
    (void)data;
    return -1;
}

bool h5reader_is_locked(const char *path) {
    status ignored;
    int fd = sys_open_file(path, SYS_READ, NULL, &ignored);
    if (fd < 0) return false;
    /* HDF5 1.10 locks with flock: a writer holds LOCK_EX, readers LOCK_SH */
    bool locked = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return locked;
}

/* Why a file HDF5 does not recognise is not one, from its first bytes: a
 * config or a text corpus given in a checkpoint's place reads "a text
 * file", not "corrupt". */
static const char *not_hdf5_reason(int fd) {
    char head[4096];
    ssize_t got = pread(fd, head, sizeof head, 0);
    if (got == 0) return "an empty file, not an HDF5 file";
    if (got > 0 && !memchr(head, '\0', (size_t)got)) return "a text file, not an HDF5 file";
    return "not an HDF5 file (truncated or corrupt, or another format)";
}

static void reader_open(h5reader *r, const char *what) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* failures come back as messages, not HDF5 error stacks */
    /* a FIFO or a device would block the open or read forever (docs/files.md §4):
     * HDF5 opens the file checked here, by its /proc name when there is one */
    status opened;
    int fd = sys_open_file(r->path, SYS_READ, what, &opened);
    const char *why = strstr(opened.message, ": cannot "); /* after the path, which h5reader_fail adds */
    if (fd < 0) h5reader_fail(r, "%s", why ? why + 2 : opened.message);
    char by_descriptor[64];
    const char *name = sys_descriptor_path(fd, by_descriptor, sizeof by_descriptor);
    if (!name) name = r->path;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    H5Pset_elink_cb(fapl, refuse_external_link, NULL);
    bool hdf5 = H5Fis_hdf5(name) > 0;
    if (hdf5) r->file = H5Fopen(name, r->open_flags, fapl);
    /* the other mode second (docs/files.md §4, another of momfmm's files): a
     * file in the old format (no SWMR) opens only without the flag, and a
     * live one (a run writing its metrics.h5) only with it, so a live file
     * given in another kind's place is named by its kind, not "corrupt?" */
    if (hdf5 && r->file < 0) r->file = H5Fopen(name, r->open_flags ^ H5F_ACC_SWMR_READ, fapl);
    H5Pclose(fapl);
    const char *not_hdf5 = hdf5 ? NULL : not_hdf5_reason(fd);
    close(fd); /* HDF5 holds its own descriptor of the file */
    if (not_hdf5) h5reader_fail(r, "%s", not_hdf5);
    if (r->file < 0 && h5reader_is_locked(r->path))
        h5reader_fail(r,
                      "cannot open %s: locked by another process that has it open for writing (HDF5 file locking); "
                      "close that program or wait for it, then try again",
                      what);
    if (r->file < 0) h5reader_fail(r, "cannot open %s as HDF5 (corrupt?)", what);
}

/* Bounds on what a file may declare before anything is allocated for it
 * (docs/files.md §4, hostile input): a string attribute, and a dataset's
 * elements (2^31, the int counts of the model and the batch). */
#define MAX_ATTR_STRING ((size_t)1 << 26)
#define MAX_DATASET_ELEMENTS ((unsigned long long)1 << 31)
/* A compressed dataset may expand at most this much (float data compresses
 * a few-fold; zeros a thousandfold), unless it is small. */
#define MAX_FILTER_RATIO 256
#define MAX_FILTERED_BYTES_FREE ((unsigned long long)16 << 20)

bool h5reader_exists(h5reader *r, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s", name);
    /* each prefix "/a", "/a/b", ... : H5Lexists and H5Lget_info look at the
     * last link without following it, so an external link is seen before
     * HDF5 would open its target (a FIFO would block it forever) */
    for (char *p = path + (path[0] == '/');; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (H5Lexists(r->file, path, H5P_DEFAULT) <= 0) return false;
        H5L_info_t info;
        if (H5Lget_info(r->file, path, &info, H5P_DEFAULT) < 0) h5reader_fail(r, "cannot read the link %s", path);
        if (info.type != H5L_TYPE_HARD)
            h5reader_fail(r, "%s is %s link: links are refused (copy the object into the file, e.g. with h5copy)", path,
                          info.type == H5L_TYPE_EXTERNAL ? "an external"
                          : info.type == H5L_TYPE_SOFT   ? "a soft"
                                                         : "a user-defined");
        if (!saved) return true;
        *p = saved;
    }
}

typedef struct {
    h5reader_name_filter allowed;
    void *ctx;
    char first[512]; /* the first name refused, "" while none is */
    H5L_type_t type;
} name_walk;

/* H5Lvisit's callback: may not jump (HDF5 is inside its iteration), so it
 * records the first refused name and stops the walk. */
static herr_t visit_name(hid_t group, const char *name, const H5L_info_t *info, void *ctx) {
    (void)group;
    name_walk *w = ctx;
    if (info->type == H5L_TYPE_HARD && w->allowed(name, w->ctx)) return 0;
    snprintf(w->first, sizeof w->first, "%s", name);
    w->type = info->type;
    return 1;
}

void h5reader_only_names(h5reader *r, const char *group, h5reader_name_filter allowed, void *ctx, const char *what) {
    if (!h5reader_exists(r, group)) return;
    hid_t g = H5Gopen2(r->file, group, H5P_DEFAULT);
    if (g < 0) h5reader_fail(r, "%s is not a group", group);
    /* hard links to groups are followed, once each; soft and external links are reported, never followed */
    name_walk w = {.allowed = allowed, .ctx = ctx};
    herr_t walked = H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, visit_name, &w);
    H5Gclose(g);
    if (w.first[0] && w.type != H5L_TYPE_HARD)
        h5reader_fail(r, "%s/%s is %s link: links are refused", group, w.first,
                      w.type == H5L_TYPE_EXTERNAL ? "an external"
                      : w.type == H5L_TYPE_SOFT   ? "a soft"
                                                  : "a user-defined");
    if (w.first[0]) h5reader_fail(r, "%s/%s is not %s: the tensors and config_ini disagree", group, w.first, what);
    if (walked < 0) h5reader_fail(r, "cannot list %s (corrupt?)", group);
}

/* Root attribute `name`, which must exist and hold one value (a scalar
 * dataspace): an array in its place would overflow the one value read. */
static hid_t h5reader_open_scalar_attr(h5reader *r, const char *name) {
    if (H5Aexists(r->file, name) <= 0) h5reader_fail(r, "missing root attribute '%s'", name);
    hid_t attr = H5Aopen(r->file, name, H5P_DEFAULT);
    if (attr < 0) h5reader_fail(r, "cannot open attribute '%s'", name);
    hid_t space = H5Aget_space(attr);
    H5S_class_t kind = H5Sget_simple_extent_type(space);
    H5Sclose(space);
    if (kind != H5S_SCALAR) h5reader_fail(r, "attribute '%s' must be a single value (scalar), not an array", name);
    return attr;
}

/* Reads a string attribute, variable- or fixed-length. Caller frees. */
char *h5reader_attr_string(h5reader *r, const char *name) {
    hid_t attr = h5reader_open_scalar_attr(r, name);
    hid_t type = H5Aget_type(attr);
    if (H5Tget_class(type) != H5T_STRING) h5reader_fail(r, "attribute '%s' is not a string", name);
    hid_t mem = H5Tcopy(H5T_C_S1);
    /* HDF5 will not convert between ASCII and UTF-8: read in the file's charset */
    H5Tset_cset(mem, H5Tget_cset(type));
    char *result = NULL;
    if (H5Tis_variable_str(type) > 0) {
        char *value = NULL;
        H5Tset_size(mem, H5T_VARIABLE);
        if (H5Aread(attr, mem, &value) < 0 || !value) h5reader_fail(r, "cannot read attribute '%s'", name);
        result = strdup(value);
        H5free_memory(value);
    } else {
        size_t size = H5Tget_size(type);
        if (size == 0 || size > MAX_ATTR_STRING)
            h5reader_fail(r, "attribute '%s' has an implausible size %zu", name, size);
        /* NULLPAD in memory: the bytes as stored (a NULLTERM conversion would
         * silently stop at an embedded NUL) */
        H5Tset_size(mem, size);
        H5Tset_strpad(mem, H5T_STR_NULLPAD);
        result = sys_calloc(size + 2, 1);
        if (H5Aread(attr, mem, result) < 0) h5reader_fail(r, "cannot read attribute '%s'", name);
        /* a NUL is padding only at the end: inside, it would cut the text short */
        size_t used = strlen(result);
        for (size_t i = used; i < size; i++)
            if (result[i]) {
                free(result);
                h5reader_fail(r, "attribute '%s' holds a NUL byte at offset %zu (text cannot)", name, used);
            }
    }
    H5Tclose(mem);
    H5Tclose(type);
    H5Aclose(attr);
    return result;
}

long long h5reader_attr_int(h5reader *r, const char *name) {
    long long value = 0;
    hid_t attr = h5reader_open_scalar_attr(r, name);
    hid_t type = H5Aget_type(attr);
    if (H5Tget_class(type) != H5T_INTEGER || H5Aread(attr, H5T_NATIVE_LLONG, &value) < 0)
        h5reader_fail(r, "attribute '%s' is not an integer", name);
    H5Tclose(type);
    H5Aclose(attr);
    return value;
}

/* "[a, b, ...]" */
static void h5reader_format_shape(char *out, size_t len, int ndim, const hsize_t *dims) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    if (used < len) snprintf(out + used, len - used, "]");
}

/* Rank and dims of dataset `name`; fails if it is missing. */
hid_t h5reader_open_dataset(h5reader *r, const char *name, int *ndim, hsize_t *dims) {
    if (!h5reader_exists(r, name)) h5reader_fail(r, "missing dataset %s", name);
    hid_t dset = H5Dopen2(r->file, name, H5P_DEFAULT);
    if (dset < 0) h5reader_fail(r, "%s is not a dataset", name);
    /* data outside this file (external raw storage, a virtual dataset's
     * sources) would be read without the checks this file gets */
    hid_t dcpl = H5Dget_create_plist(dset);
    int external = dcpl >= 0 ? H5Pget_external_count(dcpl) : 0;
    H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    if (dcpl >= 0) H5Pclose(dcpl);
    if (external != 0) h5reader_fail(r, "%s keeps its data in external files: refused (external storage)", name);
    if (layout == H5D_VIRTUAL) h5reader_fail(r, "%s is a virtual dataset (data from other files): refused", name);
    hid_t space = H5Dget_space(dset);
    *ndim = H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    if (*ndim < 0) h5reader_fail(r, "%s has no readable shape", name);
    return dset;
}

/* The elements dataset `name` declares, overflow-checked and bounded; then
 * that the file stores them: a dataset without filters must hold all its
 * bytes (unallocated chunks would be read as fill values, and a declared
 * shape of 10^9 rows in a small file must not become an allocation). */
unsigned long long h5reader_checked_elements(h5reader *r, const char *name, hid_t dset, int ndim, const hsize_t *dims) {
    unsigned long long n = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, (unsigned long long)dims[i], &n) || n > MAX_DATASET_ELEMENTS)
            h5reader_fail(r, "%s declares more than %llu elements", name, MAX_DATASET_ELEMENTS);
    hid_t type = H5Dget_type(dset), dcpl = H5Dget_create_plist(dset);
    unsigned long long bytes = n * H5Tget_size(type), stored = H5Dget_storage_size(dset);
    int filters = dcpl >= 0 ? H5Pget_nfilters(dcpl) : 0;
    H5Pclose(dcpl);
    H5Tclose(type);
    if (n > 0 && (filters == 0 ? stored < bytes : stored == 0))
        h5reader_fail(r, "%s declares %llu elements (%llu bytes) but the file stores %llu bytes of it", name, n, bytes,
                      stored);
    /* compressed: what decompression would make of the bytes stored,
     * bounded before anything is decompressed (a "zip bomb" of metric rows) */
    if (filters > 0 && bytes > MAX_FILTERED_BYTES_FREE && bytes / MAX_FILTER_RATIO > stored)
        h5reader_fail(r,
                      "%s is compressed %llu-fold (%llu bytes stored for %llu declared): more than %d-fold "
                      "above %d MiB is refused",
                      name, bytes / (stored ? stored : 1), stored, bytes, MAX_FILTER_RATIO,
                      (int)(MAX_FILTERED_BYTES_FREE >> 20));
    double available = sys_memory_available();
    if (available > 0 && (double)bytes > available)
        h5reader_fail(r, "%s declares %llu elements (%.3g GB), more than the %.3g GB of memory available", name, n,
                      (double)bytes / 1e9, available / 1e9);
    return n;
}

/* Token ids, labels and step counters are integers: a float dataset would
 * be truncated silently by the conversion. */
void h5reader_require_integer(h5reader *r, const char *name, hid_t dset) {
    hid_t type = H5Dget_type(dset);
    H5T_class_t kind = H5Tget_class(type);
    H5Tclose(type);
    static const char *names[] = {"integer",  "float",     "time", "string",          "bitfield", "opaque",
                                  "compound", "reference", "enum", "variable-length", "array"};
    if (kind != H5T_INTEGER)
        h5reader_fail(r, "%s must hold integers, not %s values", name,
                      kind >= 0 && kind < (int)(sizeof names / sizeof names[0]) ? names[kind] : "unknown");
}

/* The same, where with more_rows the dataset may hold more than dims[0]
 * rows (a live file that a run keeps appending to). */
static hid_t h5reader_open_checked_rows(h5reader *r, const char *name, int ndim, const hsize_t *dims, bool more_rows) {
    hsize_t got[H5S_MAX_RANK] = {0};
    int got_ndim;
    hid_t dset = h5reader_open_dataset(r, name, &got_ndim, got);
    bool same = got_ndim == ndim && (more_rows ? got[0] >= dims[0] : got[0] == dims[0]);
    for (int i = 1; same && i < ndim; i++) same = got[i] == dims[i];
    if (!same) {
        char want[64], have[64];
        h5reader_format_shape(want, sizeof want, ndim, dims);
        h5reader_format_shape(have, sizeof have, got_ndim, got);
        h5reader_fail(r, "%s has shape %s, expected %s", name, have, want);
    }
    h5reader_checked_elements(r, name, dset, got_ndim, got);
    return dset;
}

hid_t h5reader_open_checked(h5reader *r, const char *name, int ndim, const hsize_t *dims) {
    return h5reader_open_checked_rows(r, name, ndim, dims, false);
}

void h5reader_read_leading_rows(h5reader *r, const char *name, bool more_rows, int ndim, const hsize_t *dims,
                                double *out) {
    hid_t dset = h5reader_open_checked_rows(r, name, ndim, dims, more_rows);
    hid_t file_space = H5Dget_space(dset), mem_space = H5Screate_simple(ndim, dims, NULL);
    hsize_t start[H5S_MAX_RANK] = {0};
    herr_t status = H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, dims, NULL);
    if (status >= 0 && dims[0] > 0) status = H5Dread(dset, H5T_NATIVE_DOUBLE, mem_space, file_space, H5P_DEFAULT, out);
    H5Sclose(mem_space);
    H5Sclose(file_space);
    if (status < 0) h5reader_fail(r, "cannot read %s (corrupt or wrong type)", name);
    H5Dclose(dset);
}

void h5reader_read_checked(h5reader *r, const char *name, hid_t mem_type, int ndim, const hsize_t *dims, void *out) {
    hid_t dset = h5reader_open_checked(r, name, ndim, dims);
    if (H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
        h5reader_fail(r, "cannot read %s (corrupt or wrong type)", name);
    H5Dclose(dset);
}

int h5reader_run_into(const char *path, unsigned open_flags, const char *what, h5reader_body body, void *ctx,
                      status *err) {
    status_clear(err);
    /* on the heap: a local changed after setjmp would be indeterminate after longjmp */
    h5reader *r = sys_calloc(1, sizeof *r);
    r->path = path;
    r->open_flags = open_flags;
    r->file = -1;
    r->err = err;
    if (setjmp(r->on_error) == 0) {
        reader_open(r, what);
        body(r, ctx);
    } else {
        err->code = EXIT_BAD_FILE;
    }
    if (r->file >= 0) H5Fclose(r->file);
    free(r);
    return err->code;
}

int h5reader_run(const char *path, const char *what, h5reader_body body, void *ctx, status *err) {
    status ignored;
    return h5reader_run_into(path, H5F_ACC_RDONLY, what, body, ctx, err ? err : &ignored);
}
