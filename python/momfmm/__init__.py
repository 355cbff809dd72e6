"""momfmm's Python side: the one HDF5 reader (momfmm.h5) and the analysis modules built on it.

Importable with PYTHONPATH=<repo>/python or from an installed prefix. Run with Debian's
/usr/bin/python3 (h5py, numpy; torch for the reference model, matplotlib for plots).

Modules (docs/design.md §8.8), each importing only those listed before it:
  h5       the HDF5 reader: checkpoints, metrics.h5, token files (docs/files.md §4)
  fmt      Markdown tables and their cells (values, mean ± std over a group)
  plot     figures of runs (tools/momfmm_plot.py)
  digest   results digests: a finished run's report data as committed JSON (results/experiments/)
  suite    the experiment suite list, its runs, groups over seeds and claim tests
  results_context  what the results report's sections share: links, commands, figures
  chain_report  the chain task's per-L tables: L_rep per eval step, loss by k
  seed_scale  RESULTS.md's seed-scale section (chain L = 10-40, R vs gamma, text gamma sweep)
  results  RESULTS.md from the suite (tools/momfmm_report.py --results)
  report   Markdown table comparing runs (tools/momfmm_report.py)
  torch    a checkpoint as a PyTorch nn.Module: load, export, loss, generate (needs torch)
This file imports none of them, so `import momfmm.h5` loads neither matplotlib nor the rest.
"""
