"""The figures of a results table's runs (momfmm.plot, tools/momfmm_plot.py) and the Markdown
links to them (docs/design.md §8.8)."""
import contextlib
import copy
import io
import os
import sys

from momfmm import plot
from momfmm.results.suite import PROG, attention_label


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
