/* Small HDF5 helpers shared by the checkpoint and live-metrics writers. */
#ifndef MOMFMM_H5UTIL_H
#define MOMFMM_H5UTIL_H
#include <hdf5.h>

/* A variable-length UTF-8 string attribute, which h5py reads back as str. */
herr_t h5_write_string_attr(hid_t obj, const char *name, const char *value);
#endif
