"""What the results report (momfmm.results) shares between its sections: the report's context
(where figures and links go, the commands that rerun a run) and the figures of a table's runs
(docs/design.md §8.8)."""
import contextlib
import copy
import io
import os
import re
import shlex
import sys

from momfmm import plot
from momfmm.suite import PROG, ROOT, attention_label, setting, target_steps

ENV_PREFIX = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1"
SUITE = os.path.join(ROOT, "configs", "experiments", "suite.list")


class Context:
    def __init__(self, args, entries):
        self.args = args
        self.entries = entries
        self.runs = args.runs
        # Figure links are relative to the report's directory (the current one on stdout).
        self.out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        self.figures = args.figures
        self.runner_flags = runner_flags(args.runs, args.suite)

    def reproduce(self, group):
        flags = self.runner_flags
        return f"`tools/run_experiments.sh{flags} --only '{group.only_regex()}'`"

    def mpirun_command(self, e):
        np_ = e.world_size or 2
        config = e.config
        if "--full" in self.runner_flags:
            big = re.sub(r"\.ini$", "_full.ini", config)
            if os.path.exists(os.path.join(ROOT, big)):
                config = big
        sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in e.sets)
        extra = ""
        if e.run is not None and e.run.has_config:
            steps = target_steps(e)
            try:
                base = int(setting(e, "train.steps", "0"))
            except ValueError:
                base = steps
            if steps and steps != base and "--full" not in self.runner_flags:
                extra = f" --set train.steps={steps}"
        out = os.path.join(self.runs, e.name)
        return (f"{ENV_PREFIX} mpirun --oversubscribe -np {np_} build/momfmm train {config} {sets}{extra} "
                f"--set train.out_dir={out} --resume auto")

    def rel(self, path):
        return os.path.relpath(path, self.out_dir)


def runner_flags(runs, suite=SUITE):
    """tools/run_experiments.sh's options that make runs under `runs` from `suite`, so the
    commands the report prints rerun exactly these runs."""
    norm = os.path.normpath(runs)
    flags = ""
    base = os.path.basename(norm)
    if base.startswith("experiments_full"):
        flags += " --full"
    m = re.search(r"_x([0-9.]+)$", base)
    if m:
        flags += f" --steps-scale {m.group(1)}"
    default = "runs/experiments_full" if "--full" in flags else "runs/experiments"
    if m:
        default += f"_x{m.group(1)}"
    if norm != os.path.normpath(default):
        flags += f" --runs {shlex.quote(runs)}"
    if os.path.realpath(suite) != os.path.realpath(SUITE):
        flags += f" --suite {shlex.quote(root_relative(suite))}"
    return flags


def root_relative(path):
    """path as tools/run_experiments.sh reads it: relative to the repository root (where the
    runner changes first) when inside it, else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, ROOT)
    return full if rel.startswith("..") else rel


# ---------------------------------------------------------------- figures
def plot_runs(ctx, name, pairs):
    """momfmm.plot's figures of [(label, entry)] (entries with runs) into figures/name; returns
    the list of PNG paths written. The runs are those already loaded, renamed to the labels."""
    pairs = [(label, e) for label, e in pairs if e is not None and e.run is not None]
    if not pairs or ctx.args.no_figures or ctx.figures is None:
        return []
    runs = []
    for label, e in pairs:
        run = copy.copy(e.run)
        run.name = label
        runs.append(run)
    try:
        # momfmm.plot notes each figure it skips on stdout; RESULTS.md's log does not show them.
        with contextlib.redirect_stdout(io.StringIO()):
            return plot.write_figures(runs, os.path.join(ctx.figures, name))
    except (OSError, ValueError) as exc:
        print(f"{PROG}: warning: momfmm_plot.py for {name} failed: {exc}", file=sys.stderr)
        return []


def figure_links(ctx, paths, wanted):
    """Markdown links to the `wanted` [(file name, caption)] among the figures momfmm_plot.py
    just wrote (paths); the others it wrote are removed, so the figures directory holds only
    what RESULTS.md shows."""
    by_name = {os.path.basename(p): p for p in paths if p}
    links = []
    for fname, caption in wanted:
        if fname in by_name:
            links.append(f"![{caption}]({ctx.rel(by_name.pop(fname))})")
    for unused in by_name.values():
        os.remove(unused)
    return links


def append_links(out, links):
    if links:
        out += ["\n".join(links), ""]


def variant_figures(ctx, out, name, groups, wanted):
    """momfmm_plot.py's figures of a table whose rows are attention variants (seed 1 of each
    row); links to the `wanted` ones go into out."""
    pairs = [(attention_label(g.first), first_seed(g)) for g in groups]
    append_links(out, figure_links(ctx, plot_runs(ctx, name, pairs), wanted))


def first_seed(group):
    for e in group.members:
        if e.run is not None:
            return e
    return None
