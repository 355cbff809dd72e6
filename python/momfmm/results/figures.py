"""The figures of the results report (momfmm.plot, tools/momfmm_plot.py) and the Markdown links
to them (docs/design.md §8.8).

A link depends on the runs' data only, not on whether the figures are written this time
(--no-figures, or stdout without --figures): RESULTS.md written without figures is the same
text as with them.
"""
import contextlib
import copy
import io
import os
import sys

from momfmm import files, plot
from momfmm.results.suite import PROG, attention_label


def labelled_runs(pairs):
    """The runs of [(label, entry)] (entries with a run), copied and renamed to the labels."""
    runs = []
    for label, e in pairs:
        if e is not None and e.run is not None:
            run = copy.copy(e.run)
            run.name = label
            runs.append(run)
    return runs


def run_figures(ctx, name, pairs, wanted):
    """Links to the `wanted` [(file name, caption)] among momfmm.plot's figures of [(label,
    entry)], in figures/name. When the report writes figures, it writes them there first and
    removes the ones not wanted, so the figures directory holds only what RESULTS.md shows."""
    runs = labelled_runs(pairs)
    if not runs:
        return []
    directory = os.path.join(ctx.figure_dir, name)
    if ctx.write_figures:
        try:
            # momfmm.plot notes each figure it skips on stdout; RESULTS.md's log does not show them.
            with contextlib.redirect_stdout(io.StringIO()):
                written = plot.write_figures(runs, directory)
        except (OSError, ValueError, files.RunError, files.ArgumentError) as exc:
            print(f"{PROG}: warning: momfmm_plot.py for {name} failed: {exc}", file=sys.stderr)
            written = []
        keep = {fname for fname, _ in wanted}
        for path in written:
            if os.path.basename(path) not in keep:
                os.remove(path)
    planned = set(plot.planned_figures(runs))
    return [f"![{caption}]({ctx.rel(os.path.join(directory, fname))})" for fname, caption in wanted
            if fname in planned]


def summary_figure(ctx, name, caption, title, xlabel, ylabel, curves, band=None):
    """Markdown lines linking figures/name, momfmm.plot.plot_points' figure of curves (written
    when the report writes figures); none when no curve has a point."""
    if not plot.has_points(curves):
        return []
    path = os.path.join(ctx.figure_dir, name)
    if ctx.write_figures:
        plot.plot_points(path, title, xlabel, ylabel, curves, band=band)
    return [f"![{caption}]({ctx.rel(path)})", ""]


def append_links(out, links):
    if links:
        out += ["\n".join(links), ""]


def variant_figures(ctx, out, name, groups, wanted):
    """The figures of a table whose rows are attention variants (seed 1 of each row); links to
    the `wanted` ones go into out."""
    pairs = [(attention_label(g.first), first_seed(g)) for g in groups]
    append_links(out, run_figures(ctx, name, pairs, wanted))


def first_seed(group):
    for e in group.members:
        if e.run is not None:
            return e
    return None
