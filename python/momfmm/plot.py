"""Figures of one or more momfmm runs, overlaid.

    momfmm_plot.py RUN_OR_CKPT [RUN_OR_CKPT ...] --out DIR [--label NAME ...] [--format png|pdf|svg] [--dpi N]

RUN_OR_CKPT is a run directory (train.out_dir: its metrics.h5, else its newest checkpoint) or
one checkpoint file (docs/files.md §4). Writes into DIR:

  loss.png         train loss (lines) and eval loss (markers) vs step      docs/metrics.md §3
  lr.png           learning rate vs step                                   docs/model.md §1.4
  l_new_l_rep.png  L_new (solid) and L_rep (dashed) vs step               docs/metrics.md §3
  loss_by_k.png    eval loss vs occurrence count k at the last eval        docs/metrics.md §3
  lengen.png       L_rep (solid) and the length eval's L_rep (dashed), chain runs with
                   data.eval_chain_len                                     docs/metrics.md §3
  attention.png    attention read-out vs step: per layer the highest induction (solid) and
                   positional (dashed) score over the heads, eval split and length eval
                                                                           docs/metrics.md §3
  acc.png          eval accuracy vs step (token accuracy; cls: accuracy)   docs/metrics.md §3
  bpb.png          eval bits per byte (/metrics/eval/bpb) vs step, text    docs/tasks.md §2, 3
  gain_r.png       gain_R per block at the last eval (when logged)         docs/metrics.md §3
  gamma.png        momentum gamma per head, per layer (learned or fixed)   docs/model.md §1.2
  bode.png         momentum filter magnitude per head, omega in [0, pi]    docs/model.md §1.2

(with --format pdf or svg the same names end in .pdf / .svg; --dpi sets the raster resolution,
default 150). Runs are told apart by colour and by line style and marker, so that curves that
coincide stay visible; formulas are typeset with matplotlib's mathtext.

A figure whose data no run has is skipped with a note. Prints the files written. A run directory
stands for its newest checkpoint that loads, as for `momfmm inspect` (a damaged newest one is
skipped with a warning). Each figure is written whole, beside its name and renamed over it, never
through a symbolic link or onto a FIFO or device (momfmm.files.output_path). Exit 3 for a missing
or corrupt file (naming it), 2 for a command-line error; one line on stderr.
"""
import functools
import math
import os
import sys

import numpy as np

from momfmm import files, tool
from momfmm.rundir import load_runs

PROG = "momfmm_plot.py"
DPI = 150
FORMATS = ("png", "pdf", "svg")
# What save() writes: set by write_figures (the command line's --format and --dpi).
OUTPUT = {"format": "png", "dpi": DPI}
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@functools.cache
def pyplot():
    """matplotlib.pyplot on the Agg backend, imported at the first figure drawn rather than with
    this module (and once: the backend set once): the results report imports it for its figures'
    names, and a run that draws none (--no-figures, an error, --help) started 0.3 s later for
    pyplot alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def style(i):
    """Line style and marker of the i-th run: with the colour, three cues apart, so that
    runs whose curves coincide (two seeds that agree) still show as two."""
    return {"ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)],
            "markevery": 0.1}


def colors(n):
    cmap = pyplot().get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def series(metrics, key):
    """(step, values) of a 1-D metric, or None when absent or empty."""
    if key not in metrics or "step" not in metrics or len(metrics[key]) == 0:
        return None
    if metrics[key].ndim != 1:
        return None
    return metrics["step"], metrics[key]


def new_axes(title, xlabel, ylabel):
    from matplotlib.ticker import MaxNLocator

    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def output_name(name):
    """name (x.png) with the extension of the chosen --format."""
    return os.path.splitext(name)[0] + "." + OUTPUT["format"]


def save(fig, out_dir, name, written):
    path = os.path.join(out_dir, output_name(name))
    fig.tight_layout()
    try:
        with files.output_path(path) as tmp:
            fig.savefig(tmp, dpi=OUTPUT["dpi"])
    finally:
        pyplot().close(fig)
    written.append(path)


def plot_loss(runs, out_dir, written):
    fig, ax = new_axes("Train loss (lines) and eval loss (markers)", "step", "cross-entropy (nats)")
    drawn = False
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        tr, ev = series(run.train, "loss"), series(run.eval, "loss")
        if tr:
            ax.plot(*tr, color=color, lw=1.2, alpha=0.8, ls=style(i)["ls"], label=f"{run.name} train")
        if ev:
            ax.plot(*ev, color=color, ls="none", marker=style(i)["marker"], ms=5, mfc="none",
                    label=f"{run.name} eval")
        drawn = drawn or bool(tr or ev)
    return finish(fig, ax, drawn, out_dir, "loss.png", written, "no train or eval loss")


def plot_lr(runs, out_dir, written):
    fig, ax = new_axes("Learning rate", "step", "lr")
    drawn = False
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        tr = series(run.train, "lr")
        if tr:
            # markevery as a fraction needs two points (matplotlib indexes the first gap)
            marks = style(i) if len(tr[0]) > 1 else {k: v for k, v in style(i).items() if k != "markevery"}
            ax.plot(*tr, color=color, label=run.name, ms=4, mfc="none", **marks)
            drawn = True
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    return finish(fig, ax, drawn, out_dir, "lr.png", written, "no /metrics/train/lr")


def plot_new_rep(runs, out_dir, written):
    fig, ax = new_axes(r"Eval loss on new ($k = 0$, solid) and repeated ($k \geq 1$, dashed) targets", "step",
                       "cross-entropy (nats)")
    drawn = False
    for run, color in zip(runs, colors(len(runs))):
        new, rep = series(run.eval, "L_new"), series(run.eval, "L_rep")
        if new:
            ax.plot(*new, color=color, marker="o", ms=4, label=f"{run.name} L_new")
        if rep:
            ax.plot(*rep, color=color, ls="--", marker="s", ms=4, label=f"{run.name} L_rep")
        drawn = drawn or bool(new or rep)
    return finish(fig, ax, drawn, out_dir, "l_new_l_rep.png", written, "no L_new / L_rep")


def plot_loss_by_k(runs, out_dir, written):
    fig, ax = new_axes("Eval loss by occurrence count $k$ (last eval)", r"$k$ (15: $k \geq 15$)",
                       "cross-entropy (nats)")
    drawn = False
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        by_k = run.eval.get("loss_by_k")
        if by_k is None or by_k.ndim != 2 or len(by_k) == 0:
            continue
        last = by_k[-1]
        k = np.arange(len(last))
        ok = np.isfinite(last)  # bins no target reached are NaN
        step = int(run.eval["step"][-1]) if "step" in run.eval else run.step
        ax.plot(k[ok], last[ok], color=color, ls=style(i)["ls"], marker=style(i)["marker"], mfc="none",
                label=f"{run.name} (step {step})")
        drawn = drawn or bool(ok.any())
    ax.set_xticks(range(16))
    return finish(fig, ax, drawn, out_dir, "loss_by_k.png", written, "no /metrics/eval/loss_by_k")


def plot_lengen(runs, out_dir, written):
    fig, ax = new_axes("L_rep on the training periods and on the length eval's", "step", "cross-entropy (nats)")
    drawn = False
    for run, color in zip(runs, colors(len(runs))):
        rep, gen = series(run.eval, "L_rep"), finite_series(run.eval, "lengen_L_rep")
        if rep:
            ax.plot(*rep, color=color, marker="o", ms=4, label=f"{run.name} L_rep")
        if gen:
            ax.plot(*gen, color=color, ls="--", marker="s", ms=4, label=f"{run.name} lengen L_rep")
        drawn = drawn or bool(gen)
    return finish(fig, ax, drawn, out_dir, "lengen.png", written, "no lengen_L_rep (data.eval_chain_len)")


def finite_series(metrics, key):
    """series() of a metric with at least one finite value, else None."""
    points = series(metrics, key)
    return points if points and np.isfinite(points[1]).any() else None


def readout(run, prefix):
    """(step, [layers, heads] positional, induction) of a run's attention read-out with this
    column prefix ("" or "lengen_"), or None when it has no finite value."""
    pos, ind = run.eval.get(prefix + "attn_positional"), run.eval.get(prefix + "attn_induction")
    if pos is None or ind is None or pos.ndim != 3 or not len(pos) or not np.isfinite(ind).any():
        return None
    return run.eval["step"], pos, ind


def has_readout(run):
    return readout(run, "") is not None or readout(run, "lengen_") is not None


def plot_attention(runs, out_dir, written):
    have = [r for r in runs if has_readout(r)]
    if not have:
        print("skip attention.png: no run has an attention read-out (chain runs whose two keys differ)")
        return
    fig, axes = pyplot().subplots(len(have), 2, figsize=(11, 2.8 * len(have) + 0.6), squeeze=False)
    for row, run in zip(axes, have):
        for ax, (prefix, where) in zip(row, (("", "eval split"), ("lengen_", "length eval"))):
            ax.set_title(f"{run.name}: {where}", fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel("attention weight")
            ax.grid(True, alpha=0.3)
            r = readout(run, prefix)
            if r is None:
                ax.text(0.5, 0.5, "no query (keys coincide, or no length eval)", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8)
                continue
            steps, pos, ind = r
            with np.errstate(invalid="ignore"):
                for layer, color in zip(range(pos.shape[1]), colors(pos.shape[1])):
                    ax.plot(steps, np.nanmax(ind[:, layer, :], axis=1), color=color, marker="o", ms=3,
                            label=f"layer {layer} induction")
                    ax.plot(steps, np.nanmax(pos[:, layer, :], axis=1), color=color, ls="--", marker="s", ms=3,
                            label=f"layer {layer} positional")
            ax.set_ylim(bottom=-0.02)
            ax.legend(fontsize=7, loc="best")
    fig.suptitle("Attention read-out: highest score over the heads of each layer", fontsize=10)
    save(fig, out_dir, "attention.png", written)


def plot_eval_metric(runs, out_dir, written, name, title, ylabel, pick):
    """One line per run of pick(run): (step, values) of an eval metric, or None."""
    fig, ax = new_axes(title, "step", ylabel)
    drawn = False
    for i, (run, color) in enumerate(zip(runs, colors(len(runs)))):
        points = pick(run)
        if points:
            ax.plot(*points, color=color, ms=4, mfc="none", label=run.name,
                    **{k: v for k, v in style(i).items() if k != "markevery"})
            drawn = True
    return finish(fig, ax, drawn, out_dir, name, written, f"no {ylabel}")


def plot_acc(runs, out_dir, written):
    plot_eval_metric(runs, out_dir, written, "acc.png", "Eval accuracy", "accuracy",
                     lambda run: series(run.eval, "acc"))


def text_bpb(run):
    """(step, bits per byte) of a text-task run's evals: the recorded `bpb` column, which for token
    files counts the bytes their targets decode to; a byte corpus's loss / ln 2 (docs/metrics.md §3)."""
    loss = series(run.eval, "loss")
    if not loss or run.cfg("data.task") != "text":
        return None
    # the recorded column: bits per byte of token files from their tokenizer, NaN without one
    bpb = series(run.eval, "bpb")
    values = bpb[1] if bpb else loss[1] / math.log(2.0)
    ok = np.isfinite(values)
    return (loss[0][ok], values[ok]) if ok.any() else None


def plot_bpb(runs, out_dir, written):
    plot_eval_metric(runs, out_dir, written, "bpb.png",
                     r"Eval bits per byte (text): summed loss / ($\ln 2 \cdot$ bytes of the targets)",
                     "bits per byte", text_bpb)


def plot_gain_r(runs, out_dir, written):
    have = [(r, c) for r, c in zip(runs, colors(len(runs))) if has_gain_r(r)]
    if not have:
        print("skip gain_r.png: no run has a measured /metrics/eval/gain_R")
        return
    fig, ax = new_axes(r"Block gain $\|F(x+\delta) - F(x)\| \,/\, \|\delta\|$ per block (last eval)", "block",
                       r"$\mathrm{gain}_R$")
    width = 0.8 / len(have)
    n_max = 0
    for j, (run, color) in enumerate(have):
        gain = run.eval["gain_R"][-1]
        x = np.arange(len(gain)) + (j - (len(have) - 1) / 2) * width
        ax.bar(x, gain, width, color=color, label=run.name, hatch=("", "//", "..", "xx")[j % 4],
               edgecolor="k", lw=0.5)
        n_max = max(n_max, len(gain))
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    ax.set_xticks(range(n_max))
    finish(fig, ax, True, out_dir, "gain_r.png", written, "")


def gamma_title(run):
    kind = {"learned": "learned", "eval": "learned, last eval", "fixed": "fixed",
            "init": "learnable, initial value"}[run.gamma_source]
    off = "" if run.momentum_on else ", momentum off"
    return f"{run.name}: $\\gamma$ ({kind}{off})"


def runs_with_gamma(runs, figure):
    have = [r for r in runs if r.gamma.size]
    if not have:
        print(f"skip {figure}: no run has model.n_layers / model.n_heads or a gamma")
    return have


def plot_gamma(runs, out_dir, written):
    have = runs_with_gamma(runs, "gamma.png")
    if not have:
        return
    fig, axes = pyplot().subplots(len(have), 1, figsize=(7, 2.6 * len(have) + 0.6), squeeze=False)
    head_colors = colors(max(r.gamma.shape[1] for r in have))
    for ax, run in zip(axes[:, 0], have):
        n_layers, n_heads = run.gamma.shape
        width = 0.8 / n_heads
        for h in range(n_heads):
            x = np.arange(n_layers) + (h - (n_heads - 1) / 2) * width
            ax.bar(x, run.gamma[:, h], width, color=head_colors[h], label=f"head {h}")
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xticks(range(n_layers), [f"layer {i}" for i in range(n_layers)])
        ax.set_ylabel(r"$\gamma$")
        ax.set_title(gamma_title(run), fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out_dir, "gamma.png", written)


def momentum_response(run, omega, gamma):
    """|H(e^{j omega})| of the shear of docs/model.md §1.2, x_hat = x + gamma p + gamma2 a with
    p = D x / (1 - beta z^-1), a = (1 - z^-1) p, D = 1 - z^-1. With beta = gamma2 = 0 (the
    defaults) this is |1 + gamma (1 - e^{-j omega})|: gain 1 at DC, 1 + 2 gamma at Nyquist."""
    beta = run.cfg_float("momentum.beta")
    gamma2 = run.cfg_float("momentum.gamma2")
    zinv = np.exp(-1j * omega)
    p = (1 - zinv) / (1 - beta * zinv)
    return np.abs(1 + gamma * p + gamma2 * (1 - zinv) * p)


def plot_bode(runs, out_dir, written):
    have = runs_with_gamma(runs, "bode.png")
    if not have:
        return
    omega = np.linspace(0.0, np.pi, 256)
    fig, axes = pyplot().subplots(len(have), 1, figsize=(7, 3.0 * len(have) + 0.6), squeeze=False)
    for ax, run in zip(axes[:, 0], have):
        n_layers, n_heads = run.gamma.shape
        layer_colors = colors(n_layers)
        for i in range(n_layers):
            for h in range(n_heads):
                gain = momentum_response(run, omega, run.gamma[i, h])
                ax.plot(omega, gain, color=layer_colors[i], lw=1.0, alpha=0.75, ls=LINE_STYLES[h % 4],
                        label=f"layer {i}, head {h}" if n_layers * n_heads <= 12 else
                        (f"layer {i}" if h == 0 else None))
                ax.plot([np.pi], [gain[-1]], "o", color=layer_colors[i], ms=4)
        ax.plot([0.0], [1.0], "ks", ms=6, label="DC gain 1")
        ax.plot([], [], "o", color="gray", label=r"Nyquist gain $|1 + 2\gamma|$")
        ax.set_xlim(-0.06, np.pi + 0.06)
        ax.set_xticks([0, np.pi / 4, np.pi / 2, 3 * np.pi / 4, np.pi],
                      ["$0$", r"$\pi/4$", r"$\pi/2$", r"$3\pi/4$", r"$\pi$"])
        ax.set_xlabel(r"$\omega$ (rad / position)")
        plain = run.cfg_float("momentum.beta") == 0 and run.cfg_float("momentum.gamma2") == 0
        ax.set_ylabel(r"$|1 + \gamma\,(1 - e^{-i\omega})|$" if plain else
                      r"$|H(e^{i\omega})|$ ($\beta$, $\gamma_2$)")
        db = ax.secondary_yaxis("right", functions=(
            lambda g: 20 * np.log10(np.maximum(np.abs(g), 1e-6)), lambda d: 10 ** (d / 20)))
        db.set_ylabel("dB")
        ax.set_title(f"{gamma_title(run)}: one curve per layer (colour) and head (line style)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    save(fig, out_dir, "bode.png", written)


def finish(fig, ax, drawn, out_dir, name, written, why_skipped):
    if not drawn:
        pyplot().close(fig)
        print(f"skip {name}: {why_skipped} in any run")
        return
    ax.legend(fontsize=8, loc="best")
    save(fig, out_dir, name, written)


def has_points(curves):
    """Whether plot_points draws anything of curves (a curve with a point)."""
    return any(len(c[1]) for c in curves)


def plot_points(path, title, xlabel, ylabel, curves, band=None):
    """One summary figure across runs (the results report's reference-scale section): curves is
    [(label, xs, means, stds or None)], drawn as points with error bars joined by lines;
    band, (low, high, label): a shaded horizontal range in the legend (e.g. a range the
    reference reports). Writes PNG `path` (its directory created) and returns it, or None when
    no curve has a point (has_points)."""
    curves = [c for c in curves if len(c[1])]
    if not curves:
        return None
    fig, ax = new_axes(title, xlabel, ylabel)
    for (label, xs, ys, errs), color in zip(curves, colors(len(curves))):
        ax.errorbar(xs, ys, yerr=errs, color=color, marker="o", ms=5, capsize=3, label=label)
    if band:
        ax.axhspan(band[0], band[1], color="0.85", zorder=0, label=band[2])
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    try:
        with files.output_path(path) as tmp:
            fig.savefig(tmp, dpi=OUTPUT["dpi"])
    finally:
        pyplot().close(fig)
    return path


def write_figures(runs, out_dir, fmt="png", dpi=DPI):
    """Every figure of the runs (momfmm.rundir.Run, labelled by their names) into out_dir, created
    if needed, as fmt (png, pdf or svg) at dpi; prints a note for each figure skipped and returns
    the paths written: those of planned_figures(runs). Raises files.ArgumentError when out_dir
    or a figure's name there is not a directory or regular file, files.RunError when one cannot
    be written."""
    OUTPUT.update(format=fmt, dpi=dpi)
    files.make_directory(out_dir)
    written = []
    for plot, name, fits, why, _ in FIGURES:
        chosen = [run for run in runs if fits(run)]
        if chosen:
            plot(chosen, out_dir, written)
        else:
            print(f"skip {name}: {why}")
    return written


def planned_figures(runs):
    """The file names write_figures(runs, ...) writes, without drawing anything: a figure is
    written when a run it fits has its data."""
    return [name for _, name, fits, _, has_data in FIGURES if any(fits(r) and has_data(r) for r in runs)]


def task_of(run):
    """data.task of a run, or None when the run has no config (every figure may fit)."""
    return run.cfg("data.task") if run.has_config else None


def task_in(*tasks):
    return lambda run: task_of(run) in (None,) + tasks


def has_loss_by_k(run):
    by_k = run.eval.get("loss_by_k")
    return by_k is not None and by_k.ndim == 2 and len(by_k) > 0 and bool(np.isfinite(by_k[-1]).any())


def has_gain_r(run):
    gain = run.eval.get("gain_R")
    # NaN when the eval did not measure it (train.eval_readouts, docs/metrics.md §3)
    return gain is not None and gain.ndim == 2 and len(gain) > 0 and bool(np.isfinite(gain[-1]).any())


# Each figure with the runs it fits (docs/metrics.md §3: the metrics that fit the task):
# occurrence-count losses for the chain task, accuracy for copy and listops, bits per
# byte for text, gamma and the shear's frequency response only where momentum is on; and
# whether a run it fits has the figure's data (the plot draws a run exactly then).
FIGURES = (
    (plot_loss, "loss.png", lambda run: True, "",
     lambda run: bool(series(run.train, "loss") or series(run.eval, "loss"))),
    (plot_lr, "lr.png", lambda run: True, "", lambda run: bool(series(run.train, "lr"))),
    (plot_new_rep, "l_new_l_rep.png", task_in("chain"), "L_new / L_rep fit the chain task only",
     lambda run: bool(series(run.eval, "L_new") or series(run.eval, "L_rep"))),
    (plot_loss_by_k, "loss_by_k.png", task_in("chain"), "loss by k fits the chain task only", has_loss_by_k),
    (plot_lengen, "lengen.png", task_in("chain"), "the length eval fits the chain task only",
     lambda run: bool(finite_series(run.eval, "lengen_L_rep"))),
    (plot_attention, "attention.png", task_in("chain"), "the attention read-out fits the chain task only",
     has_readout),
    (plot_acc, "acc.png", task_in("copy", "listops"), "accuracy fits the copy and listops tasks only",
     lambda run: bool(series(run.eval, "acc"))),
    (plot_bpb, "bpb.png", task_in("text"), "bits per byte fit the text task only", lambda run: bool(text_bpb(run))),
    (plot_gain_r, "gain_r.png", lambda run: True, "", has_gain_r),
    (plot_gamma, "gamma.png", lambda run: run.momentum_on or not run.has_config, "no run has momentum on",
     lambda run: bool(run.gamma.size)),
    (plot_bode, "bode.png", lambda run: run.momentum_on or not run.has_config, "no run has momentum on",
     lambda run: bool(run.gamma.size)),
)


def main(argv=None):
    ap = tool.Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_OR_CKPT",
                    help="run directory, checkpoint file, or metrics.h5")
    ap.add_argument("--out", required=True, metavar="DIR", help="directory for the figures")
    ap.add_argument("--format", choices=FORMATS, default="png", help="file format (default png)")
    ap.add_argument("--dpi", type=int, default=DPI, help=f"raster resolution (default {DPI})")
    ap.add_argument("--label", action="extend", nargs="+", default=[], metavar="NAME",
                    help="names of the runs, in order (default: directory or file names)")
    args = ap.parse_args(argv)
    if args.dpi < 10 or args.dpi > 2400:
        ap.error(f"--dpi {args.dpi}: must be in [10, 2400]")
    return tool.run(PROG, plot_runs, args)


def plot_runs(args):
    """The figures of args.runs into args.out, their paths printed; returns 0. Raises the
    package's errors (momfmm.tool.run turns them into exit 2 or 3)."""
    runs = load_runs(args.runs, args.label)
    files.make_directory(args.out, flag="--out")
    written = write_figures(runs, args.out, args.format, args.dpi)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
