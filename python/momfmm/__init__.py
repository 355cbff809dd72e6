"""momfmm's Python side: the one HDF5 reader (momfmm.h5) and the analysis modules built on it.

Importable with PYTHONPATH=<repo>/python, or installed (pip install ., pyproject.toml; or
cmake --install, under share/momfmm/python). Run with Debian's
/usr/bin/python3 (h5py, numpy; torch for the reference model and momfmm.pt, matplotlib for plots,
scipy for the results report).

Modules (docs/design.md §8.8), each importing only those listed before it:
  files    errors, checkpoint names, inputs opened without blocking, outputs never through a link
  config   a config as the binary reads it: syntax, key table, checks, tensor and metric names
  tool     the tools' one-line errors and exit codes (docs/cli.md §5)
  h5       the HDF5 reader, with the binary's checks: checkpoints, metrics.h5, token files
           (docs/files.md §4)
  fmt      Markdown tables and their cells (values, mean ± std over a group)
  plot     figures of runs (tools/momfmm_plot.py, momfmm-plot)
  digest   results digests: a finished run's report data as committed JSON (results/experiments/)
  results  RESULTS.md from the experiment suite: a subpackage (its __init__ lists its modules)
  report   Markdown table comparing runs, and --results (tools/momfmm_report.py, momfmm-report)
  sampling the sampler of `momfmm generate` and rng.h's counter generator, in Python
  pt       a checkpoint as a PyTorch nn.Module: load, save, export, loss, generate, sampled as
           `momfmm generate` (needs torch)
  tokenizer  momfmm-tokenize (tools/momfmm_tokenize.py): sentencepiece models and token files
  torch    the deprecated old name of pt (warns), kept for one release
This file imports none of them, so `import momfmm.h5` loads neither matplotlib nor the rest.
"""
