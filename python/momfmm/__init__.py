"""momfmm's Python side: the one HDF5 reader (momfmm.h5) and the analysis modules built on it.

Importable with PYTHONPATH=<repo>/python or from an installed prefix. Run with Debian's
/usr/bin/python3 (h5py, numpy; torch for the reference model, matplotlib for plots).
"""
