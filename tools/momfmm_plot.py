#!/usr/bin/python3
"""Figures of one or more momfmm runs, overlaid: the command line of momfmm.plot
(docs/design.md §8.8), run by momfmm_launcher.py. Usage: --help."""
from momfmm_launcher import launch

if __name__ == "__main__":
    launch("plot")
