/* `momfmm --version` (docs/cli.md §5): this program's version and git
 * revision, and the MPI, OpenBLAS and HDF5 it was built with and runs with. */
#ifndef MOMFMM_VERSION_H
#define MOMFMM_VERSION_H

/* Prints the version lines on stdout; needs neither MPI nor a file. */
void version_print(void);
#endif
