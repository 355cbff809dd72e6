#!/usr/bin/python3
"""A Markdown table comparing momfmm runs, or the experiment suite's results report: the command
line of momfmm.report (docs/design.md §8.8), run by momfmm_launcher.py. Usage: --help."""
from momfmm_launcher import launch

if __name__ == "__main__":
    launch("report")
