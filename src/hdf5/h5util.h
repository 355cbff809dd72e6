/* Small HDF5 helpers shared by the checkpoint reader and writer and the
 * live-metrics writer. */
#ifndef MOMFMM_H5UTIL_H
#define MOMFMM_H5UTIL_H
#include <hdf5.h>

/* A scalar attribute of obj; 0 or -1. */
herr_t h5util_write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value);
/* A variable-length UTF-8 string attribute, which h5py reads back as str. */
herr_t h5util_write_string_attr(hid_t obj, const char *name, const char *value);
/* Selects flat elements [begin, end) of a row-major space of dims: none,
 * all, or (ndim 1 or 2) a partial first row, whole rows and a partial last
 * row, as a union of hyperslabs (a ZeRO-1 slice of a tensor, docs/scale.md §7). */
void h5util_select_flat_range(hid_t space, int ndim, const hsize_t *dims, hsize_t begin, hsize_t end);
#endif
