/* Parallel HDF5 on dist.c's communicator (docs/scale.md §7): the one place
 * an MPI communicator reaches HDF5, so that src/parallel/ stays the only
 * folder that calls MPI. Kept apart from dist.h so that HDF5's header stays out of the
 * modules that only need the collectives. */
#ifndef MOMFMM_DIST_HDF5_H
#define MOMFMM_DIST_HDF5_H
#include <hdf5.h>

/* Sets file-access property list `fapl` to MPI-IO over all ranks (a
 * file opened with it is opened by every rank together). 0, or -1. */
int dist_hdf5_mpio(hid_t fapl);
#endif
