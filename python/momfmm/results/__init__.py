"""RESULTS.md from the experiment suite (`momfmm_report.py --results`; docs/design.md §8.8).

Modules, each importing only those listed before it (and momfmm.h5, momfmm.fmt, momfmm.digest,
momfmm.plot):
  errors           ReportError, UsageError: what the library raises, the entry points report
  suite            the suite list configs/experiments/suite.list: lines, settings, labels
  runs             each line's run (run directory or results digest), groups over seeds
  stats            the tests of a difference of means: Welch's t-test, the older 2-s.e. rule
  claims           Claim (a dataclass with a Verdict) and the rules that judge one
  reference        the reproduced works' published numbers ("the reference")
  context          what the report's sections share: links, the commands that rerun a run
  figures          the figures of a table's runs (momfmm.plot) and their links
  chain            the chain task's report at one L, for both scales
  fmm              the FMM reference's sections: copy task and ListOps
  text             the byte-level text section
  energy_ratio     R per layer vs γ at the reference's scale
  reference_scale  the momentum reference's claims at its own configuration
  recall           the chain claims again on chain tasks that need content (period per sample, fillers)
  document         RESULTS.md: the opening, the claims section, the sections, the commands
  cli              the command line: options, defaults, main()
This file imports none of them.
"""
