"""Markdown table comparing momfmm runs, or the results report of the experiment suite.

    momfmm_report.py RUN_OR_CKPT [RUN_OR_CKPT ...] [--label NAME ...] [--out FILE]
                     [--metrics L_new,L_rep,delta_12,acc,loss] [--digits N]
                     [--group-by KEY | --average-over KEY]
    momfmm_report.py --results [--runs runs/experiments] [--suite FILE] [--out FILE]
                     [--figures DIR | --no-figures] [--allow-empty]

Both modes write Markdown to stdout, or to FILE with --out; nothing else is written unless
asked for (in particular not the repository's RESULTS.md: regenerate it with
`--results --out RESULTS.md`).

RUN_OR_CKPT is a run directory (train.out_dir: its metrics.h5, else its newest checkpoint) or
one checkpoint file (docs/files.md §4). One row per run, sorted by label: attention kind, momentum gamma
(docs/model.md §1.2) and whether it is learned (then the mean learned value), fmm bandwidth and kernels
(docs/model.md §1.3), steps, the final eval metrics chosen with --metrics (docs/metrics.md §3), the best eval loss, the
median train tokens/s, and for `text` runs bits per byte = final eval loss / ln 2.

--group-by KEY (a config key section.key, e.g. momentum.gamma) gives one row per value of KEY,
as GROUP BY does in SQL or pandas: the runs sharing a value are aggregated, numbers becoming
mean ± sample std over them, with their count n and their labels.
--average-over KEY (e.g. train.seed) merges runs whose configs differ only in KEY (and in
train.out_dir and other bookkeeping keys) into one row: mean ± sample std over KEY's values,
with n and the values listed.

--results reads every run of the suite (configs/experiments/suite.list, runs from
tools/run_experiments.sh) and writes its results report and figures: see momfmm.results.cli.

A run directory stands for its newest checkpoint that loads, as for `momfmm inspect` (a damaged
newest one is skipped with a warning; docs/design.md §8.4). --out never writes through a symbolic
link or onto a FIFO, device or one of the runs read (exit 2), and replaces FILE only when the
table is complete (momfmm.files.output_path).

Exit 3 for a missing or corrupt file (naming it), 2 for a command-line error (and for
--results when no run of the suite exists, unless --allow-empty); one line on stderr.
"""
import math
import os
import signal
import sys

import numpy as np

from momfmm import files, tool
from momfmm.fmt import MISSING, config_value, fmt_group, fmt_value, markdown, shortest
from momfmm.rundir import load_runs
from momfmm.results import cli as results
from momfmm.results.errors import UsageError

PROG = "momfmm_report.py"
DEFAULT_METRICS = "L_new,L_rep,delta_12,acc,loss"
# docs/metrics.md §3: a table of text runs only shows what text is read by
# (loss, then bpb and ppl); L_new, L_rep and delta_12 belong to the chain task.
TEXT_METRICS = "loss"
KNOWN_METRICS = {"loss", "L_new", "L_rep", "delta_12", "acc", "exact_match"}
# Keys that say where and how often a run writes, not what it computes: ignored by
# --average-over.
BOOKKEEPING = {"train.out_dir", "train.keep", "train.ckpt_interval", "train.log_interval"}


def momentum_cell(run):
    """Configured gamma (the initial value when learned) and non-default momentum options."""
    if not run.momentum_on:
        return "off"
    parts = [shortest(run.cfg_float("momentum.gamma"))]
    for key, label in (("beta", "β"), ("gamma2", "γ2")):
        value = run.cfg_float(f"momentum.{key}", 0.0)
        if value != 0.0:
            parts.append(f"{label}={shortest(value)}")
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
    return f"bw={config_value(run.cfg('fmm.bandwidth', '5'))} {kernels}"


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
        is_text = run.cfg("data.task") == "text" and loss is not None
        # token files record NaN: their bytes per token are unknown (docs/metrics.md §3)
        bpb = run.final_eval("bpb") if "bpb" in run.eval else (loss / math.log(2) if is_text else None)
        row["bpb"] = bpb if is_text and bpb is not None and math.isfinite(bpb) else None
        row["ppl"] = math.exp(loss) if is_text and math.isfinite(loss) else None
    return row


def config_signature(run, averaged_key):
    """Every (section.key, value) of the run's config except averaged_key and bookkeeping."""
    ignore = BOOKKEEPING | {averaged_key}
    items = []
    for section in sorted(run.config.sections()):
        if section == "dist":
            continue
        for key, value in sorted(run.config.items(section)):
            if f"{section}.{key}" not in ignore:
                items.append((f"{section}.{key}", config_value(value)))
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


def key_value(run, key):
    """KEY's value in the run's config, as shown and compared: the shortest form of a number
    (so 0.2 and 0.20000000000000001 are one value), MISSING when the config lacks the key."""
    value = run.cfg(key)
    return MISSING if value is None else config_value(value)


def value_order(value):
    """Sort key of KEY's values: numbers by value, then other strings, MISSING last."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (2 if value == MISSING else 1, 0.0, value)


def rows_by_value(runs, rows, key):
    """--group-by: [(value, [rows], [labels])], one per distinct value of key, in value order."""
    groups = {}
    for run, row in sorted(zip(runs, rows), key=lambda m: (m[0].name, m[0].path)):
        groups.setdefault(key_value(run, key), []).append((run, row))
    return [(value, [m[1] for m in members], [m[0].name for m in members])
            for value, members in sorted(groups.items(), key=lambda g: value_order(g[0]))]


def rows_averaged_over(runs, rows, key):
    """--average-over: [(label, [rows], [key values])] of runs sharing a config signature
    (all but key), sorted by label."""
    groups = {}
    for run, row in zip(runs, rows):
        groups.setdefault(config_signature(run, key), []).append((run, row))
    out = []
    for members in groups.values():
        members.sort(key=lambda m: (m[0].name, m[0].path))
        names = [m[0].name for m in members]
        out.append((group_label(names), [m[1] for m in members],
                    [key_value(m[0], key) for m in members]))
    return sorted(out, key=lambda g: (g[0], [r["run"] for r in g[1]]))


def build_parser():
    """One parser for both modes, so that `--help` shows --results and its options too."""
    ap = tool.Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     epilog="Both modes print to stdout unless --out FILE is given.")
    ap.add_argument("paths", nargs="*", metavar="RUN_OR_CKPT",
                    help="run directory, checkpoint file, or metrics.h5")
    ap.add_argument("--out", metavar="FILE",
                    help="write the Markdown to FILE instead of stdout (with --results, the "
                         "figures go to FILE's directory/figures unless --figures says otherwise)")
    table = ap.add_argument_group("comparison table of RUN_OR_CKPT ...")
    table.add_argument("--label", action="extend", nargs="+", default=[], metavar="NAME",
                       help="names of the runs, in order (default: directory or file names)")
    table.add_argument("--metrics", default=None,
                       help=f"comma-separated final eval metrics (default {DEFAULT_METRICS}; {TEXT_METRICS} when "
                            "every run is a text run, beside bpb and ppl)")
    table.add_argument("--group-by", metavar="KEY",
                       help="one row per value of config key KEY (section.key, e.g. "
                            "momentum.gamma); runs sharing it: mean ± std")
    table.add_argument("--average-over", metavar="KEY",
                       help="merge runs whose configs differ only in KEY (e.g. train.seed) into "
                            "one row: mean ± std over KEY")
    table.add_argument("--digits", type=tool.integer(0, 17), default=None,
                       help="decimals of the numbers, 0 to 17 (default 4)")
    suite = ap.add_argument_group("--results: the experiment suite's results report (momfmm.results)")
    suite.add_argument("--results", action="store_true",
                       help="report every run of the suite: tables beside the seeds' numbers, "
                            "claims, figures, commands")
    results.add_arguments(suite)
    return ap


TABLE_OPTIONS = ("label", "metrics", "group_by", "average_over", "digits")


def main(argv=None):
    # `momfmm_report.py ... | head` ends quietly, as other command-line tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = build_parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    table_given = [f"--{o.replace('_', '-')}" for o in TABLE_OPTIONS
                   if getattr(args, o) not in (None, [])]
    if args.results:
        if args.paths:
            ap.error(f"--results reads the suite's runs under --runs DIR; it takes no "
                     f"RUN_OR_CKPT ('{args.paths[0]}')")
        if table_given:
            ap.error(f"{table_given[0]} is an option of the comparison table, not of --results")
        return results.run(args, ap)
    results_given = results.options_given(args)
    if results_given:
        ap.error(f"{results_given[0]} is an option of --results")
    if not args.paths:
        ap.error("give one or more RUN_OR_CKPT, or --results")
    try:
        return tool.run(PROG, write_table, args)
    except UsageError as exc:
        ap.error(str(exc))


def write_table(args):
    """The comparison table of args.paths to args.out (stdout if None); returns 0. Raises
    UsageError for options that do not fit, files.ArgumentError for more labels than runs or an
    --out that cannot be written to, RunError for a file that cannot be read."""
    if args.out is not None:  # before reading anything: an --out that would replace a run, or a link
        files.check_output(args.out, args.paths, "--out")
    digits = 4 if args.digits is None else args.digits
    metrics = [m.strip() for m in (args.metrics or "").split(",") if m.strip()]
    if args.metrics is not None and not metrics:
        raise UsageError("--metrics: empty list")
    if args.group_by and args.average_over:
        raise UsageError("--group-by and --average-over exclude each other")
    for option, key in (("--group-by", args.group_by), ("--average-over", args.average_over)):
        if key is not None and (key.count(".") != 1 or not all(key.split("."))):
            raise UsageError(f"{option}: '{key}' is not a section.key config key")
    runs = load_runs(args.paths, args.label)
    if args.metrics is None:
        only_text = all(r.cfg("data.task") == "text" for r in runs)
        metrics = (TEXT_METRICS if only_text else DEFAULT_METRICS).split(",")
    available = KNOWN_METRICS | {k for r in runs for k, v in r.eval.items() if v.ndim == 1}
    unknown = [m for m in metrics if m not in available]
    if unknown:
        raise UsageError(f"--metrics: unknown metric '{unknown[0]}' (known: "
                         f"{', '.join(sorted(KNOWN_METRICS))})")
    with_bpb = any(r.cfg("data.task") == "text" for r in runs)
    rows = [row_of(r, metrics, with_bpb) for r in runs]
    columns = list(rows[0])

    notes = ["metrics: final eval", "best loss: lowest eval loss",
             "tokens/s: median of the train log"]
    if with_bpb:
        notes.append("bpb = eval loss / ln 2 (text task; — for token files); ppl = e^(eval loss)")
    if args.group_by:
        header = [args.group_by, "n", "runs"] + columns[1:]
        body = [[value, str(len(members)), ", ".join(names)]
                + [fmt_group([m[c] for m in members], c, digits) for c in columns[1:]]
                for value, members, names in rows_by_value(runs, rows, args.group_by)]
        notes.append(f"one row per {args.group_by}; mean ± sample std over the runs sharing it")
    elif args.average_over:
        header = columns[:1] + ["n", args.average_over] + columns[1:]
        body = [[label, str(len(members)), ",".join(keys)]
                + [fmt_group([m[c] for m in members], c, digits) for c in columns[1:]]
                for label, members, keys in rows_averaged_over(runs, rows, args.average_over)]
        notes.append(f"mean ± sample std over {args.average_over}")
    else:
        order = sorted(zip(runs, rows), key=lambda m: (m[0].name, m[0].path))
        body = [[fmt_value(row[c], c, digits) for c in columns] for _, row in order]
        header = columns
    text = markdown(header, body) + "\n\n" + "; ".join(notes) + ".\n"
    results.emit(text, args.out, inputs=list(args.paths) + [f for r in runs for f in r.files])
    return 0


if __name__ == "__main__":
    sys.exit(main())
