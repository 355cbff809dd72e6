#!/usr/bin/python3
"""Markdown table comparing momfmm runs, or the results report of the experiment suite.

The command-line entry point of momfmm.report (python/momfmm/report.py; docs/design.md §8.8).

Usage and options: `momfmm_report.py --help`. The package is taken from this source tree
(tools/../python) when it is there, else from the installed momfmm.
"""
import os
import sys

# Bootstrap: an entry point finds its package; the package itself never touches sys.path.
SOURCE_PACKAGES = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "python")
if os.path.isdir(os.path.join(SOURCE_PACKAGES, "momfmm")):
    sys.path.insert(0, SOURCE_PACKAGES)
from momfmm import report  # noqa: E402

if __name__ == "__main__":
    sys.exit(report.main())
