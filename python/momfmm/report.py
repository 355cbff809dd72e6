"""Markdown table comparing momfmm runs, or the whole RESULTS.md of the experiment suite.

    momfmm_report.py RUN_OR_CKPT [RUN_OR_CKPT ...] [--label NAME ...]
                     [--metrics L_new,L_rep,delta_12,acc,loss] [--group-by KEY] [--digits N]
    momfmm_report.py --results [--runs runs/experiments] [--out RESULTS.md] [--figures figures/]
                     [--suite configs/experiments/suite.list] [--no-figures]

--results reads every run of the suite (configs/experiments/suite.list, runs from
tools/run_experiments.sh) and writes RESULTS.md and its figures: see momfmm.results.

RUN_OR_CKPT is a run directory (train.out_dir: its metrics.h5, else its newest checkpoint) or
one checkpoint file (SPEC 4). One row per run, sorted by label: attention kind, momentum gamma
(SPEC 1.2) and whether it is learned (then the mean learned value), fmm bandwidth and kernels
(SPEC 1.3), steps, the final eval metrics chosen with --metrics (SPEC 3), the best eval loss, the
median train tokens/s, and for `text` runs bits per byte = final eval loss / ln 2.

--group-by KEY (e.g. train.seed) merges runs whose configs differ only in KEY (and in
train.out_dir and other bookkeeping keys) into one row: numbers become mean ± sample std over
the group, with the group size n and the KEY values listed.

Exit 3 for a missing or corrupt file (naming it), 2 for a command-line error.
"""
import argparse
import math
import os
import signal
import sys

import numpy as np

from momfmm import results
from momfmm.fmt import MISSING, fmt_group, fmt_value, markdown
from momfmm.h5 import load_runs_or_exit

PROG = "momfmm_report.py"
DEFAULT_METRICS = "L_new,L_rep,delta_12,acc,loss"
KNOWN_METRICS = {"loss", "L_new", "L_rep", "delta_12", "acc", "exact_match"}
# Keys that say where and how often a run writes, not what it computes: ignored by --group-by.
BOOKKEEPING = {"train.out_dir", "train.keep", "train.ckpt_interval", "train.log_interval"}


def momentum_cell(run):
    """Configured gamma (the initial value when learned) and non-default momentum options."""
    if not run.momentum_on:
        return "off"
    parts = [f"{run.cfg_float('momentum.gamma'):g}"]
    for key, default, fmt in (("beta", 0.0, "β={:g}"), ("gamma2", 0.0, "γ2={:g}")):
        value = run.cfg_float(f"momentum.{key}", default)
        if value != default:
            parts.append(fmt.format(value))
    if run.cfg("momentum.apply_to", "qk") != "qk":
        parts.append("q only")
    if run.cfg("momentum.placement", "post_rope") != "post_rope":
        parts.append(run.cfg("momentum.placement"))
    if not run.cfg_bool("momentum.anchor", True):
        parts.append("unanchored")
    return " ".join(parts)


def fmm_cell(run):
    if run.cfg("attention.kind", "softmax") != "fmm":
        return None
    kernels = run.cfg("fmm.kernels", "elu").strip() or "none"
    return f"bw={run.cfg('fmm.bandwidth', '5')} {kernels}"


def row_of(run, metrics, with_bpb):
    """{column: value} for one run; values are str, int, float or None (missing)."""
    row = {
        "run": run.name,
        "attention": run.cfg("attention.kind", "softmax"),
        "fmm": fmm_cell(run),
        "γ": momentum_cell(run),
        "learned γ (mean)": (float(np.mean(run.gamma))
                             if run.learn_gamma and run.gamma.size else None),
        "steps": run.step,
    }
    if not run.has_config:  # a live metrics.h5 before the first checkpoint
        row.update({"attention": None, "fmm": None, "γ": None, "learned γ (mean)": None})
    for name in metrics:
        row[name] = run.final_eval(name)
    losses = run.eval.get("loss")
    finite = losses[np.isfinite(losses)] if losses is not None and losses.ndim == 1 else []
    row["best loss"] = float(np.min(finite)) if len(finite) else None
    tps = run.train.get("tokens_per_s")
    row["tokens/s"] = float(np.median(tps)) if tps is not None and len(tps) else None
    if with_bpb:
        loss = run.final_eval("loss")
        is_text = run.cfg("data.task") == "text"
        row["bpb"] = loss / math.log(2) if is_text and loss is not None else None
    return row


def config_signature(run, group_key):
    """Every (section.key, value) of the run's config except group_key and bookkeeping."""
    ignore = BOOKKEEPING | {group_key}
    items = []
    for section in sorted(run.config.sections()):
        if section == "dist":
            continue
        for key, value in sorted(run.config.items(section)):
            if f"{section}.{key}" not in ignore:
                items.append((f"{section}.{key}", value.strip()))
    return tuple(items)


def group_label(names):
    """The members' shared label, or their common prefix and suffix around '*' (s1_a, s2_a ->
    s*_a)."""
    if len(set(names)) == 1:
        return names[0]
    prefix = os.path.commonprefix(names)
    rests = [n[len(prefix):][::-1] for n in names]
    suffix = os.path.commonprefix(rests)[::-1]
    return f"{prefix}*{suffix}"


def group_rows(runs, rows, key):
    """[(label, [rows], [key values])] of runs sharing a config signature, sorted by label."""
    groups = {}
    for run, row in zip(runs, rows):
        groups.setdefault(config_signature(run, key), []).append((run, row))
    out = []
    for members in groups.values():
        members.sort(key=lambda m: (m[0].name, m[0].path))
        names = [m[0].name for m in members]
        out.append((group_label(names), [m[1] for m in members],
                    [m[0].cfg(key, MISSING) for m in members]))
    return sorted(out, key=lambda g: (g[0], [r["run"] for r in g[1]]))


def main(argv=None):
    # `momfmm_report.py ... | head` ends quietly, as other command-line tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = sys.argv[1:] if argv is None else argv
    if "--results" in argv:
        return results.main([a for a in argv if a != "--results"])
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_OR_CKPT",
                    help="run directory, checkpoint file, or metrics.h5")
    ap.add_argument("--label", action="extend", nargs="+", default=[], metavar="NAME",
                    help="names of the runs, in order (default: directory or file names)")
    ap.add_argument("--metrics", default=DEFAULT_METRICS,
                    help=f"comma-separated final eval metrics (default {DEFAULT_METRICS})")
    ap.add_argument("--group-by", metavar="KEY",
                    help="config key (section.key) to aggregate over, e.g. train.seed")
    ap.add_argument("--digits", type=int, default=4, help="decimals of the numbers (default 4)")
    args = ap.parse_args(argv)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        ap.error("--metrics: empty list")
    if args.group_by is not None and (args.group_by.count(".") != 1 or
                                      not all(args.group_by.split("."))):
        ap.error(f"--group-by: '{args.group_by}' is not a section.key config key")
    runs = load_runs_or_exit(args.runs, args.label, PROG)
    available = KNOWN_METRICS | {k for r in runs for k, v in r.eval.items() if v.ndim == 1}
    unknown = [m for m in metrics if m not in available]
    if unknown:
        ap.error(f"--metrics: unknown metric '{unknown[0]}' (known: "
                 f"{', '.join(sorted(KNOWN_METRICS))})")
    with_bpb = any(r.cfg("data.task") == "text" for r in runs)
    rows = [row_of(r, metrics, with_bpb) for r in runs]
    columns = list(rows[0])

    if args.group_by is None:
        order = sorted(zip(runs, rows), key=lambda m: (m[0].name, m[0].path))
        body = [[fmt_value(row[c], c, args.digits) for c in columns] for _, row in order]
        header = columns
    else:
        header = columns[:1] + ["n", args.group_by] + columns[1:]
        body = []
        for label, members, keys in group_rows(runs, rows, args.group_by):
            cells = [fmt_group([m[c] for m in members], c, args.digits) for c in columns[1:]]
            body.append([label, str(len(members)), ",".join(keys)] + cells)
    print(markdown(header, body))
    print()
    notes = ["metrics: final eval", "best loss: lowest eval loss",
             "tokens/s: median of the train log"]
    if with_bpb:
        notes.append("bpb = eval loss / ln 2 (text task)")
    if args.group_by:
        notes.append(f"mean ± sample std over {args.group_by}")
    print("; ".join(notes) + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
