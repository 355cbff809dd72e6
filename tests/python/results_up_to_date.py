#!/usr/bin/python3
"""RESULTS.md is what the committed results digests give (CTest results_up_to_date).

    PYTHONPATH=python /usr/bin/python3 tests/python/results_up_to_date.py [--workdir DIR]

Writes the results report again from results/experiments/*.json alone, in a scratch directory
laid out as the repository root (an empty runs/experiments, results/ the repository's), with the
command RESULTS.md names, but --no-figures (the links do not depend on it), and compares it
with the committed RESULTS.md byte for byte. Exit 0 when they are the same; else 1, with a
unified diff and the command that regenerates RESULTS.md and figures/ (commit both). The report
carries no date or commit, so the same digests give the same file.
"""
import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGENERATE = "/usr/bin/python3 tools/momfmm_report.py --results --out RESULTS.md"
MAX_DIFF_LINES = 200


def regenerate(work):
    """The report from the committed digests, written in `work`; returns its text."""
    os.makedirs(os.path.join(work, "runs", "experiments"))  # empty: no local run enters the report
    os.symlink(os.path.join(ROOT, "results"), os.path.join(work, "results"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "momfmm_report.py"), "--results",
                        "--no-figures", "--out", "RESULTS.md"], cwd=work, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"results_up_to_date: the report failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    with open(os.path.join(work, "RESULTS.md"), encoding="utf-8") as f:
        return f.read()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", help="scratch directory (emptied first; default a temporary one)")
    args = ap.parse_args(argv)
    if args.workdir:
        shutil.rmtree(args.workdir, ignore_errors=True)
        os.makedirs(args.workdir)
        fresh = regenerate(args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="results_up_to_date_") as work:
            fresh = regenerate(work)
    with open(os.path.join(ROOT, "RESULTS.md"), encoding="utf-8") as f:
        committed = f.read()
    if fresh == committed:
        print(f"results_up_to_date: RESULTS.md is the report of the {len(os.listdir(os.path.join(ROOT, 'results', 'experiments')))} "
              "committed digests")
        return 0
    diff = list(difflib.unified_diff(committed.splitlines(keepends=True), fresh.splitlines(keepends=True),
                                     "RESULTS.md (committed)", "RESULTS.md (from results/experiments)"))
    sys.stdout.writelines(diff[:MAX_DIFF_LINES])
    if len(diff) > MAX_DIFF_LINES:
        print(f"... {len(diff) - MAX_DIFF_LINES} more diff lines")
    print(f"\nresults_up_to_date: RESULTS.md differs from the report of results/experiments/; from the repository "
          f"root, `{REGENERATE}` writes it and figures/ again (commit both)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
