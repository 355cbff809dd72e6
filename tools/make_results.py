#!/usr/bin/python3
"""RESULTS.md from the experiment suite's HDF5 files.

    make_results.py [--runs runs/experiments] [--out RESULTS.md] [--figures figures/]
                    [--suite configs/experiments/suite.list] [--no-figures]

Reads every run of configs/experiments/suite.list (run directory RUNS/NAME: its metrics.h5
and newest checkpoint, through momfmm_h5.load_run), groups the runs of one configuration
(suite lines that differ only in train.seed: mean ± sample std over the seeds), and writes
one Markdown file with, per family of the suite (momentum seed: chain L = 10 and L = 30;
FMM seed: copy at T = 128, 256, 512, ListOps; text):

  * tables of the final eval metrics (SPEC 3) beside the seed's numbers where the seed
    gives them, with the command that reproduces each row;
  * figures: tools/momfmm_plot.py per table (one seed per configuration) into --figures,
    plus accuracy-vs-step figures drawn here (momfmm_plot.py has none);
  * a claims section: each claim of the seeds, tested on the numbers ("held" / "did not
    hold", with the values), and the exact commands of every run.

A run that is missing is a row saying "not run"; a run that stopped early shows the step it
reached. Works on any subset of the suite. Paths in the suite are relative to the
repository root. Exit 0 when the file was written, 2 for a command-line or suite error.

Run with Debian's /usr/bin/python3 (h5py, numpy, matplotlib).
"""
import argparse
import configparser
import datetime
import math
import os
import re
import shlex
import subprocess
import sys
import warnings

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
from momfmm_h5 import RunError, load_run  # noqa: E402

PROG = "make_results.py"
PLOT = os.path.join(TOOLS, "momfmm_plot.py")
LN2 = math.log(2.0)
NOT_RUN = "not run"
ENV_PREFIX = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1"

# The seeds' published numbers, as quoted in the issue. Keys: chain length L -> row -> metric.
# Only numbers the seed text gives are here; every other "seed" cell is "—".
SEED_MOMENTUM = {
    30: {"baseline": {"L_new": 6.9860, "L_rep": 1.7451, "delta_12": 4.6262},
         "momentum": {"L_new": 7.0202, "L_rep": 0.8288, "delta_12": 5.7893}},
    10: {"baseline": {"L_rep": 1.2785},
         "momentum": {"L_rep": 1.2262}},
}
# FMM seed (FMMformer): its abstract's Long Range Arena average over five tasks. Its per-task
# ListOps and copy-task numbers were not in the material this tool was written from: add them
# here (variant label -> value) to show them beside ours.
SEED_FMM_LRA_AVERAGE = {"softmax": 58.70, "FMMformer": 60.74}
SEED_LISTOPS_ACC = {}   # e.g. {"softmax": 0.371, "FMM (band 5, 2 kernels)": ...}
SEED_COPY_ACC = {}      # {(T, variant label): accuracy}

NOISE_SE = 2.0          # a difference below NOISE_SE standard errors is "within seed noise"
SAME_TOL = 0.02         # "about unchanged": relative difference within 2 %
CLOSE_ACC = 0.05        # "matches": accuracy within 0.05
CLOSE_BPB = 0.05        # "matches": bits per byte within 0.05


# ---------------------------------------------------------------- the suite
class Entry:
    """One suite line: NAME CONFIG [--set section.key=value ...]."""

    def __init__(self, name, config, sets, lineno, text):
        self.name, self.config, self.sets, self.lineno, self.text = name, config, sets, lineno, text
        self.run = None       # momfmm_h5.Run, when the run directory has files
        self.error = None     # why the run could not be read
        self.world_size = None
        self.wall_s = None    # wall time from train.log ("# exit 0 after N s"), if logged

    @property
    def key(self):
        """The configuration: config file and overrides without train.seed."""
        return (self.config, tuple((k, v) for k, v in self.sets if k != "train.seed"))

    @property
    def seed(self):
        for k, v in self.sets:
            if k == "train.seed":
                return v
        return None


def parse_suite(path):
    entries, names = [], {}
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            if len(words) < 2:
                raise SystemExit(f"{PROG}: error: {path}:{lineno}: expected 'NAME CONFIG [--set k=v ...]'")
            name, config, rest = words[0], words[1], words[2:]
            if name in names:
                raise SystemExit(f"{PROG}: error: {path}:{lineno}: run name '{name}' repeats line {names[name]}")
            names[name] = lineno
            sets = []
            for i in range(0, len(rest), 2):
                if rest[i] != "--set" or i + 1 >= len(rest) or "=" not in rest[i + 1] or "." not in rest[i + 1].split("=")[0]:
                    raise SystemExit(f"{PROG}: error: {path}:{lineno}: expected '--set section.key=value' at '{rest[i]}'")
                k, v = rest[i + 1].split("=", 1)
                sets.append((k, v))
            entries.append(Entry(name, config, sets, lineno, line))
    return entries


_config_cache = {}


def base_config(path):
    if path not in _config_cache:
        cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
        full = os.path.join(ROOT, path)
        if os.path.exists(full):
            cp.read(full)
        _config_cache[path] = cp
    return _config_cache[path]


def setting(entry, key, default=""):
    """Value of section.key for a suite line: its override, else its config file's value,
    else default."""
    for k, v in entry.sets:
        if k == key:
            return v
    section, name = key.split(".", 1)
    return base_config(entry.config).get(section, name, fallback=default).strip()


def family_of(entry):
    base = os.path.basename(entry.config)
    base = re.sub(r"(_full)?\.ini$", "", base)
    m = re.match(r"chain_L(\d+)$", base)
    if m:
        return ("chain", int(m.group(1)))
    m = re.match(r"copy_T(\d+)$", base)
    if m:
        return ("copy", int(m.group(1)))
    if base.startswith("listops"):
        return ("listops", None)
    if base.startswith("text"):
        return ("text", None)
    return ("other", base)


def attention_label(entry):
    """softmax / linear / band only / FMM 1 kernel / FMM 2 kernels, + momentum."""
    kind = setting(entry, "attention.kind", "softmax")
    gamma = float(setting(entry, "momentum.gamma", "0") or 0)
    if kind == "fmm":
        bw = int(setting(entry, "fmm.bandwidth", "5") or 0)
        kernels = [k for k in setting(entry, "fmm.kernels", "elu").split(",") if k.strip()]
        if bw == 0:
            label = f"linear ({','.join(kernels)})"
        elif not kernels:
            label = f"band only (band {bw})"
        else:
            label = f"FMM (band {bw}, {len(kernels)} kernel{'s' if len(kernels) > 1 else ''}: {','.join(kernels)})"
    else:
        label = "softmax"
    if gamma != 0:
        label = ("momentum-" + label if kind == "fmm" else "momentum softmax") + f", γ={gamma:g}"
    return label


def momentum_label(entry):
    gamma = float(setting(entry, "momentum.gamma", "0") or 0)
    parts = [f"γ={gamma:g}"]
    if setting(entry, "momentum.anchor", "true").lower() in ("false", "0", "no", "off"):
        parts.append("unanchored")
    if setting(entry, "momentum.placement", "post_rope") == "pre_rope":
        parts.append("pre_rope")
    return ", ".join(parts)


# ---------------------------------------------------------------- loading
def load_entries(entries, runs_dir):
    for e in entries:
        path = os.path.join(runs_dir, e.name)
        if not os.path.isdir(path):
            continue
        try:
            e.run = load_run(path, label=e.name)
        except RunError as exc:
            if any(f.endswith(".h5") for f in os.listdir(path)):
                e.error = str(exc)
                print(f"{PROG}: warning: {exc}", file=sys.stderr)
            continue
        for f in e.run.files:
            if os.path.basename(f).startswith("ckpt_"):
                try:
                    import h5py
                    with h5py.File(f, "r") as h:
                        e.world_size = int(h.attrs.get("world_size", 0)) or None
                except OSError:
                    pass
        log = os.path.join(path, "train.log")
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                for line in f:
                    m = re.match(r"# exit 0 after (\d+) s", line)
                    if m:  # one line per start of the run (resumed runs have several)
                        e.wall_s = (e.wall_s or 0) + int(m.group(1))


# SPEC 6 defaults of the keys that tell the suite's variants apart.
SPEC_DEFAULTS = {"attention.kind": "softmax", "momentum.gamma": "0", "momentum.learn_gamma": "false",
                 "momentum.beta": "0", "momentum.gamma2": "0", "momentum.apply_to": "qk",
                 "momentum.placement": "post_rope", "momentum.anchor": "true"}


def _same(a, b):
    a, b = (a or "").strip(), (b or "").strip()
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return a.lower() == b.lower()


def _show(v):
    v = (v or "").strip()
    try:
        return f"{float(v):g}"
    except ValueError:
        return v or "(empty)"


def mismatches(e):
    """Keys where the run's stored config differs from its suite line (a stale run directory,
    or a run made with extra overrides): the line's overrides and the config file's
    model, attention, momentum, fmm and data keys."""
    if e.run is None or not e.run.has_config:
        return []
    keys = [k for k, _ in e.sets]
    cp = base_config(e.config)
    for section in ("model", "attention", "momentum", "fmm", "data"):
        if cp.has_section(section):
            keys += [f"{section}.{k}" for k in cp.options(section) if f"{section}.{k}" not in keys]
    keys += [k for k in SPEC_DEFAULTS if k not in keys]
    out = []
    for key in keys:
        want, have = setting(e, key, SPEC_DEFAULTS.get(key, "")), e.run.cfg(key)
        if have is not None and not _same(want, have):
            out.append(f"{key} {_show(have)} vs {_show(want)}")
    return out


def target_steps(e):
    if e.run is not None and e.run.has_config:
        try:
            return int(float(e.run.cfg("train.steps", "0")))
        except ValueError:
            pass
    try:
        return int(setting(e, "train.steps", "0"))
    except ValueError:
        return 0


def complete(e):
    return e.run is not None and e.run.step >= target_steps(e) > 0


def final(e, key):
    """Final eval value of a metric for one run (bpb derived from loss), None if absent."""
    if e.run is None:
        return None
    if key == "bpb":
        v = e.run.final_eval("loss")
        return None if v is None else v / LN2
    return e.run.final_eval(key)


def values(members, key):
    out = []
    for e in members:
        v = final(e, key)
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def mean_std(vals):
    if not vals:
        return None, None
    arr = np.asarray(vals, float)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)


def fmt_num(v, digits=4):
    if v is None:
        return "—"
    if not math.isfinite(v):
        return "nan"
    return f"{v:.{digits}f}"


def fmt_ms(vals, digits=4):
    if not vals:
        return "—"
    m, s = mean_std(vals)
    if len(vals) == 1:
        return fmt_num(m, digits)
    return f"{fmt_num(m, digits)} ± {fmt_num(s, digits)}"


# ---------------------------------------------------------------- groups
class Group:
    def __init__(self, members):
        self.members = members
        self.first = members[0]

    @property
    def ran(self):
        return [e for e in self.members if e.run is not None]

    def vals(self, key):
        return values(self.ran, key)

    def cell(self, key, digits=4):
        if not self.ran:
            return NOT_RUN
        return fmt_ms(self.vals(key), digits)

    def mean(self, key):
        return mean_std(self.vals(key))[0]

    def status(self):
        """'3/3', or 'not run', or '2/3 (1 partial: step 150/400)'."""
        n = len(self.members)
        ran = self.ran
        if not ran:
            errors = [e for e in self.members if e.error]
            return NOT_RUN + (f" ({errors[0].error})" if errors else "")
        done = [e for e in ran if complete(e)]
        text = f"{len(done)}/{n}"
        bad = [e for e in self.members if e.error]
        if bad:
            text += "; unreadable: " + ", ".join(f"{e.name} ({e.error})" for e in bad)
        odd = [(e, mismatches(e)) for e in ran]
        odd = [(e, m) for e, m in odd if m]
        if odd:
            text += "; ⚠ run differs from its suite line: " + ", ".join(
                f"{e.name} ({'; '.join(m[:3])}{'; …' if len(m) > 3 else ''})" for e, m in odd)
        partial = [e for e in ran if not complete(e)]
        if partial:
            text += "; partial: " + ", ".join(f"{e.name} at step {e.run.step}/{target_steps(e)}" for e in partial)
        return text

    def steps(self):
        steps = sorted({e.run.step for e in self.ran})
        return "/".join(map(str, steps)) if steps else "—"

    def only_regex(self):
        names = [e.name for e in self.members]
        stems = {re.sub(r"_s\d+$", "", n) for n in names}
        if len(stems) == 1 and all(re.search(r"_s\d+$", n) for n in names) and len(names) > 1:
            return f"^{re.escape(stems.pop())}_s[0-9]+$"
        if len(names) == 1:
            return f"^{re.escape(names[0])}$"
        return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def group_entries(entries):
    groups, order = {}, []
    for e in entries:
        if e.key not in groups:
            groups[e.key] = []
            order.append(e.key)
        groups[e.key].append(e)
    return [Group(groups[k]) for k in order]


# ---------------------------------------------------------------- markdown helpers
def table(header, rows):
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|"] + [line(r) for r in rows])


class Context:
    def __init__(self, args, entries):
        self.args = args
        self.entries = entries
        self.runs = args.runs
        self.out_dir = os.path.dirname(os.path.abspath(args.out))
        self.figures = args.figures
        self.runner_flags = runner_flags(args.runs)

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


def runner_flags(runs):
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
    return flags


# ---------------------------------------------------------------- figures
def plot_runs(ctx, name, pairs):
    """momfmm_plot.py over [(label, entry)] (entries with runs) into figures/name; returns the
    list of PNG paths written."""
    pairs = [(label, e) for label, e in pairs if e is not None and e.run is not None]
    if not pairs or ctx.args.no_figures:
        return []
    out = os.path.join(ctx.figures, name)
    cmd = [sys.executable, PLOT] + [os.path.join(ctx.runs, e.name) for _, e in pairs] + ["--out", out, "--label"] + [
        label for label, _ in pairs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{PROG}: warning: momfmm_plot.py for {name} failed: {r.stderr.strip()}", file=sys.stderr)
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip().endswith(".png")]


def plot_metric(ctx, name, pairs, key, ylabel, title, transform=None):
    """metric-vs-step figure (momfmm_plot.py has no accuracy figure): one line per run."""
    pairs = [(label, e) for label, e in pairs if e is not None and e.run is not None
             and key in e.run.eval and "step" in e.run.eval and len(e.run.eval[key])]
    if not pairs or ctx.args.no_figures:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, e) in enumerate(pairs):
        y = np.asarray(e.run.eval[key], float)
        if transform:
            y = transform(y)
        ax.plot(e.run.eval["step"], y, marker="o", ms=4, color=plt.get_cmap("tab10")(i % 10), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    os.makedirs(os.path.join(ctx.figures, name), exist_ok=True)
    path = os.path.join(ctx.figures, name, f"{key if not transform else 'bpb'}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure_links(ctx, paths, wanted):
    by_name = {os.path.basename(p): p for p in paths if p}
    links = []
    for fname, caption in wanted:
        if fname in by_name:
            links.append(f"![{caption}]({ctx.rel(by_name[fname])})")
    return links


def first_seed(group):
    for e in group.members:
        if e.run is not None:
            return e
    return None


# ---------------------------------------------------------------- sections
def chain_section(ctx, L, groups, out, claims):
    out.append(f"### Chain task, L = {L}\n")
    cfgs = sorted({g.first.config for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}; overrides per row below. Final eval of each run "
               "(SPEC 3), mean ± sample std over the seeds.\n")
    plain = {}
    for g in groups:
        e = g.first
        anchored = setting(e, "momentum.anchor", "true").lower() not in ("false", "0", "no", "off")
        post = setting(e, "momentum.placement", "post_rope") == "post_rope"
        gamma = float(setting(e, "momentum.gamma", "0") or 0)
        g.gamma, g.ablation = gamma, ("" if anchored and post else ("unanchored" if not anchored else "pre_rope"))
        if not g.ablation:
            plain[gamma] = g
    seed = SEED_MOMENTUM.get(L, {})
    base, mom = plain.get(0.0), plain.get(0.2)

    # main table
    out.append(f"**γ = 0 (baseline) vs γ = 0.2 (momentum), L = {L}** — ours beside the seed's table\n")
    rows = []
    for label, g, srow in (("baseline γ=0", base, seed.get("baseline", {})),
                           ("momentum γ=0.2", mom, seed.get("momentum", {}))):
        if g is None:
            rows.append([label, "no suite line"] + ["—"] * 8)
            continue
        rows.append([label, g.status(), g.steps(),
                     g.cell("L_new"), fmt_num(srow.get("L_new")),
                     g.cell("L_rep"), fmt_num(srow.get("L_rep")),
                     g.cell("delta_12"), fmt_num(srow.get("delta_12")),
                     ctx.reproduce(g)])
    out.append(table(["row", "runs done", "steps", "L_new (ours)", "L_new (seed)", "L_rep (ours)", "L_rep (seed)",
                      "Δ1→2 (ours)", "Δ1→2 (seed)", "reproduce"], rows))
    out.append("")

    # ablations
    abl = [g for g in groups if g.ablation]
    if abl or mom is not None:
        out.append(f"**Ablations at γ = 0.2, L = {L}**: unanchored first difference (`momentum.anchor = false`) "
                   "and shear before RoPE (`momentum.placement = pre_rope`)\n")
        rows = []
        for g in ([base, mom] if base else [mom]) + abl:
            if g is None:
                continue
            rows.append([momentum_label(g.first) + ("" if g.ablation or g.gamma == 0 else ", anchored, post_rope"),
                         g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"), g.cell("loss"),
                         ctx.reproduce(g)])
        out.append(table(["variant", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
        out.append("")

    # gamma sweep
    sweep = [plain[k] for k in sorted(plain)]
    out.append(f"**γ sweep, L = {L}** (anchored, post_rope)\n")
    rows = [[f"{g.gamma:g}", g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"), g.cell("loss"),
             ctx.reproduce(g)] for g in sweep]
    out.append(table(["γ", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
    out.append("")

    # loss by k
    shown = [g for g in ([base, mom] + abl) if g is not None]
    kmax = 0
    per = []
    for g in shown:
        rows_k = [e.run.eval["loss_by_k"][-1] for e in g.ran
                  if "loss_by_k" in e.run.eval and e.run.eval["loss_by_k"].ndim == 2 and len(e.run.eval["loss_by_k"])]
        if rows_k:
            arr = np.asarray(rows_k, float)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # bins no target reached stay NaN
                m = np.nanmean(arr, axis=0)
            finite = np.where(np.isfinite(m))[0]
            if len(finite):
                kmax = max(kmax, int(finite[-1]))
            per.append((g, m))
        else:
            per.append((g, None))
    kmax = min(max(kmax, 3), 15)
    out.append(f"**Eval loss by occurrence count k, L = {L}** (last eval, mean over seeds; `loss_by_k`; "
               "k = 15 holds k ≥ 15; — = no target with that k)\n")
    rows = []
    for g, m in per:
        label = momentum_label(g.first)
        if m is None:
            rows.append([label] + [NOT_RUN if not g.ran else "—"] * (kmax + 1))
        else:
            rows.append([label] + [fmt_num(float(v), 3) if math.isfinite(v) else "—" for v in m[:kmax + 1]])
    out.append(table(["variant"] + [f"k={k}" for k in range(kmax + 1)], rows))
    out.append("")

    # figures
    main = plot_runs(ctx, f"chain_L{L}_main", [(f"{momentum_label(g.first)} {e.name.rsplit('_', 1)[-1]}", e)
                                               for g in (base, mom) if g for e in g.members])
    ablf = plot_runs(ctx, f"chain_L{L}_ablations", [(momentum_label(g.first), first_seed(g)) for g in shown])
    swf = plot_runs(ctx, f"chain_L{L}_sweep", [(momentum_label(g.first), first_seed(g)) for g in sweep])
    links = figure_links(ctx, main, [("l_new_l_rep.png", f"L={L}: L_new and L_rep vs step, γ=0 vs γ=0.2, all seeds"),
                                     ("loss_by_k.png", f"L={L}: loss by k, γ=0 vs γ=0.2")])
    links += figure_links(ctx, ablf, [("l_new_l_rep.png", f"L={L}: ablations, L_new and L_rep vs step"),
                                      ("loss_by_k.png", f"L={L}: ablations, loss by k")])
    links += figure_links(ctx, swf, [("l_new_l_rep.png", f"L={L}: γ sweep, L_new and L_rep vs step"),
                                     ("loss.png", f"L={L}: γ sweep, loss"),
                                     ("bode.png", f"L={L}: γ sweep, momentum filter response")])
    if links:
        out.append("Figures (tools/momfmm_plot.py; the sweep and ablation figures show seed 1 of each row):\n")
        out.append("\n".join(links))
        out.append("")

    # claims
    sl = seed.get("baseline", {}), seed.get("momentum", {})

    def seeds_text(metric):
        a, b = sl[1].get(metric), sl[0].get(metric)
        return f"seed: {a:.4f} vs {b:.4f}" if a is not None and b is not None else "seed gives no number"
    claims.append(less_claim(f"γ=0.2 lowers L_rep at L={L} ({seeds_text('L_rep')})", mom, base, "L_rep"))
    if "delta_12" in sl[1]:
        claims.append(less_claim(f"γ=0.2 raises Δ1→2 at L={L} ({seeds_text('delta_12')})", base, mom, "delta_12",
                                 flip=True))
    if "L_new" in sl[1]:
        claims.append(same_claim(f"γ=0.2 leaves L_new about unchanged at L={L} ({seeds_text('L_new')}; "
                                 f"tolerance {SAME_TOL:.0%} relative)", mom, base, "L_new"))
    unanch = next((g for g in abl if g.ablation == "unanchored"), None)
    pre = next((g for g in abl if g.ablation == "pre_rope"), None)
    claims.append(less_claim(f"anchoring matters at L={L}: anchored γ=0.2 has lower L_rep than unanchored "
                             "(SPEC 1.2: the unanchored variant is kinematically inconsistent)", mom, unanch, "L_rep"))
    claims.append(less_claim(f"Placement Corollary at L={L}: shearing after RoPE (post_rope) gives lower L_rep than "
                             "before it (pre_rope), at γ=0.2", mom, pre, "L_rep"))
    ran = [(g.mean("L_rep"), g.gamma) for g in sweep if g.mean("L_rep") is not None]
    if ran:
        best = min(ran)
        claims.append(("observation", f"γ sweep at L={L}: lowest mean L_rep at γ={best[1]:g} ({best[0]:.4f}); "
                       + ", ".join(f"γ={gm:g}: {v:.4f}" for v, gm in sorted(ran, key=lambda t: t[1]))))


def fmt_pair(vals):
    m, s = mean_std(vals)
    return fmt_num(m) + (f" ± {fmt_num(s)}" if len(vals) > 1 else "") + f" (n={len(vals)})"


def less_claim(text, ga, gb, metric, flip=False):
    """Claim: mean metric of ga < mean of gb (flip: the claim is stated as gb > ga, which is
    the same test; values are printed as claimed-side first)."""
    if ga is None or gb is None:
        return ("not run", f"{text}: not run (no suite line)")
    a, b = ga.vals(metric), gb.vals(metric)
    if not a or not b:
        return ("not run", f"{text}: not run yet")
    ma, mb = mean_std(a)[0], mean_std(b)[0]
    held = ma < mb
    note, noisy = noise_note(a, b)
    first, second = (b, a) if flip else (a, b)
    if noisy:
        verdict = "within noise"
        shown = (f"**not shown**: the means go {'the claimed way' if held else 'the other way'}, "
                 "but by less than the seed-to-seed noise")
    else:
        verdict = "held" if held else "did not hold"
        shown = f"**{verdict}**"
    return (verdict, f"{text}: {shown} ({fmt_pair(first)} vs {fmt_pair(second)}){note}")


def same_claim(text, ga, gb, metric):
    if ga is None or gb is None:
        return ("not run", f"{text}: not run (no suite line)")
    a, b = ga.vals(metric), gb.vals(metric)
    if not a or not b:
        return ("not run", f"{text}: not run yet")
    ma, mb = mean_std(a)[0], mean_std(b)[0]
    rel = abs(ma - mb) / max(abs(mb), 1e-12)
    verdict = "held" if rel <= SAME_TOL else "did not hold"
    return (verdict, f"{text}: **{verdict}** ({fmt_pair(a)} vs {fmt_pair(b)}, {rel:.1%} apart)")


def close_claim(text, ga, gb, metric, tol):
    if ga is None or gb is None:
        return ("not run", f"{text}: not run (no suite line)")
    a, b = ga.vals(metric), gb.vals(metric)
    if not a or not b:
        return ("not run", f"{text}: not run yet")
    d = mean_std(a)[0] - mean_std(b)[0]
    verdict = "held" if abs(d) <= tol else "did not hold"
    return (verdict, f"{text}: **{verdict}** ({fmt_pair(a)} vs {fmt_pair(b)}, difference {d:+.4f})")


def noise_note(a, b):
    """(note, within_noise): the difference of means against NOISE_SE standard errors."""
    if len(a) < 2 or len(b) < 2:
        return " — single seed on at least one side, no spread to judge noise", False
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    diff = abs(np.mean(a) - np.mean(b))
    if diff < NOISE_SE * se:
        return f" — |Δ| = {diff:.4f} < {NOISE_SE:g} s.e. = {NOISE_SE * se:.4f}", True
    return f" — beyond seed noise (|Δ| = {diff:.4f} ≥ {NOISE_SE:g} s.e. = {NOISE_SE * se:.4f})", False


VARIANT_ORDER = ["softmax", "linear", "band only", "FMM (band 5, 1 kernel", "FMM (band 5, 2 kernels",
                 "momentum softmax", "momentum-FMM"]


def variant_rank(label):
    for i, prefix in enumerate(VARIANT_ORDER):
        if label.startswith(prefix):
            return i
    return len(VARIANT_ORDER)


def find(groups, prefix):
    for g in groups:
        if attention_label(g.first).startswith(prefix):
            return g
    return None


def copy_section(ctx, by_T, out, claims):
    out.append("### Copy task (FMM seed)\n")
    cfgs = sorted({g.first.config for gs in by_T.values() for g in gs})
    out.append(f"Configs: {', '.join(f'`{c}`' for c in cfgs)}. Accuracy = token accuracy over the separator and "
               "the copied symbols (SPEC 3; chance ≈ 0.1), exact = whole-sequence exact match. Final eval, mean ± "
               "sample std over seeds.\n")
    Ts = sorted(by_T)
    variants = []
    for T in Ts:
        for g in by_T[T]:
            lab = attention_label(g.first)
            if lab not in variants:
                variants.append(lab)
    variants.sort(key=variant_rank)
    lookup = {(T, attention_label(g.first)): g for T in Ts for g in by_T[T]}
    rows = []
    for lab in variants:
        row = [lab]
        for T in Ts:
            g = lookup.get((T, lab))
            row.append(g.cell("acc") if g else "no suite line")
            if SEED_COPY_ACC:
                row.append(fmt_num(SEED_COPY_ACC.get((T, lab))))
        rows.append(row)
    header = ["variant"]
    for T in Ts:
        header.append(f"acc T={T}")
        if SEED_COPY_ACC:
            header.append(f"seed T={T}")
    out.append("**Final accuracy per sequence length**\n")
    out.append(table(header, rows))
    out.append("")
    for T in Ts:
        groups = sorted(by_T[T], key=lambda g: variant_rank(attention_label(g.first)))
        steps = sorted({int(s) for g in groups for e in g.ran for s in e.run.eval.get("step", [])})
        if len(steps) > 6:
            idx = np.linspace(0, len(steps) - 1, 6).round().astype(int)
            steps = [steps[i] for i in sorted(set(idx))]
        out.append(f"**T = {T}: accuracy / loss at each eval step** (mean over seeds)\n")
        rows = []
        for g in groups:
            row = [attention_label(g.first), g.status()]
            for s in steps:
                accs, losses = [], []
                for e in g.ran:
                    st = list(map(int, e.run.eval.get("step", [])))
                    if s in st:
                        i = st.index(s)
                        for key, acc in (("acc", accs), ("loss", losses)):
                            if key in e.run.eval and math.isfinite(float(e.run.eval[key][i])):
                                acc.append(float(e.run.eval[key][i]))
                row.append(f"{np.mean(accs):.3f} / {np.mean(losses):.3f}" if accs and losses else
                           (NOT_RUN if not g.ran else "—"))
            row += [g.cell("exact_match", 3), ctx.reproduce(g)]
            rows.append(row)
        out.append(table(["variant", "runs done"] + [f"step {s}" for s in steps] + ["exact (final)", "reproduce"],
                         rows))
        out.append("")
        pairs = [(attention_label(g.first), first_seed(g)) for g in groups]
        figs = plot_runs(ctx, f"copy_T{T}", pairs)
        acc = plot_metric(ctx, f"copy_T{T}", pairs, "acc", "token accuracy", f"Copy task, T = {T}: eval accuracy")
        links = figure_links(ctx, figs + [acc], [("acc.png", f"copy T={T}: accuracy vs step"),
                                                 ("loss.png", f"copy T={T}: loss vs step")])
        if links:
            out.append("\n".join(links))
            out.append("")
        fmm2 = find(groups, "FMM (band 5, 2 kernels")
        fmm1 = find(groups, "FMM (band 5, 1 kernel")
        lin, band, soft = find(groups, "linear"), find(groups, "band only"), find(groups, "softmax")
        claims.append(less_claim(f"copy T={T}: FMM (band + 2 kernels) is more accurate than linear attention",
                                 lin, fmm2, "acc", flip=True))
        claims.append(less_claim(f"copy T={T}: FMM (band + 2 kernels) is more accurate than band only",
                                 band, fmm2, "acc", flip=True))
        claims.append(less_claim(f"copy T={T}: 2 far-field kernels are more accurate than 1", fmm1, fmm2, "acc",
                                 flip=True))
        claims.append(close_claim(f"copy T={T}: FMM (2 kernels) matches softmax (accuracy within {CLOSE_ACC})",
                                  fmm2, soft, "acc", CLOSE_ACC))


def listops_section(ctx, groups, out, claims):
    out.append("### ListOps (FMM seed; LRA generator)\n")
    cfgs = sorted({g.first.config for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}. Accuracy of the cls head over the eval batches "
               f"(10 classes). Final eval, mean ± sample std over seeds. The seed reports Long Range Arena averages "
               f"over five tasks (softmax {SEED_FMM_LRA_AVERAGE['softmax']:.2f} %, FMMformer "
               f"{SEED_FMM_LRA_AVERAGE['FMMformer']:.2f} %); its ListOps column is not quoted here"
               + (" (see the seed column)" if SEED_LISTOPS_ACC else "") + ".\n")
    groups = sorted(groups, key=lambda g: variant_rank(attention_label(g.first)))
    rows = []
    for g in groups:
        lab = attention_label(g.first)
        row = [lab, g.status(), g.steps(), g.cell("acc"), g.cell("loss")]
        if SEED_LISTOPS_ACC:
            row.append(fmt_num(SEED_LISTOPS_ACC.get(lab)))
        rows.append(row + [ctx.reproduce(g)])
    header = ["variant", "runs done", "steps", "accuracy", "loss"] + (["seed acc"] if SEED_LISTOPS_ACC else []) + [
        "reproduce"]
    out.append(table(header, rows))
    out.append("")
    pairs = [(attention_label(g.first), first_seed(g)) for g in groups]
    figs = plot_runs(ctx, "listops", pairs)
    acc = plot_metric(ctx, "listops", pairs, "acc", "accuracy", "ListOps: eval accuracy")
    links = figure_links(ctx, figs + [acc], [("acc.png", "ListOps: accuracy vs step"),
                                             ("loss.png", "ListOps: loss vs step")])
    if links:
        out.append("\n".join(links))
        out.append("")
    soft = find(groups, "softmax")
    fmm = find(groups, "FMM (band 5, 2 kernels")
    mfmm = find(groups, "momentum-FMM")
    claims.append(less_claim("ListOps: FMM (band 5, 2 kernels) is more accurate than softmax (the seed's LRA claim)",
                             soft, fmm, "acc", flip=True))
    claims.append(less_claim("ListOps: momentum-FMM is more accurate than FMM", fmm, mfmm, "acc", flip=True))


def text_section(ctx, groups, out, claims):
    out.append("### Text: bytes of Python's pydoc topics\n")
    cfgs = sorted({g.first.config for g in groups})
    paths = sorted({setting(g.first, "data.path") for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}; corpus {', '.join(f'`{p}`' for p in paths)} "
               "(Debian package libpython3.11-stdlib), last 5 % = eval split. Bits per byte = final eval loss / ln 2, "
               "all rows at equal steps; mean ± sample std over seeds.\n")
    groups = sorted(groups, key=lambda g: variant_rank(attention_label(g.first)))
    rows = [[attention_label(g.first), g.status(), g.steps(), g.cell("bpb"), g.cell("loss"), g.cell("acc"),
             ctx.reproduce(g)] for g in groups]
    out.append(table(["variant", "runs done", "steps", "bits per byte", "loss (nats)", "byte accuracy", "reproduce"],
                     rows))
    out.append("")
    pairs = [(attention_label(g.first), first_seed(g)) for g in groups]
    figs = plot_runs(ctx, "text", pairs)
    bpb = plot_metric(ctx, "text", pairs, "loss", "bits per byte", "Text: eval bits per byte",
                      transform=lambda y: y / LN2)
    links = figure_links(ctx, figs + [bpb], [("bpb.png", "text: eval bits per byte vs step"),
                                             ("loss.png", "text: loss vs step"),
                                             ("bode.png", "text: momentum filter response")])
    if links:
        out.append("\n".join(links))
        out.append("")
    soft = find(groups, "softmax")
    fmm = find(groups, "FMM (band 5, 2 kernels")
    mom = find(groups, "momentum softmax")
    mfmm = find(groups, "momentum-FMM")
    claims.append(close_claim(f"text: FMM matches softmax (bits per byte within {CLOSE_BPB})", fmm, soft, "bpb",
                              CLOSE_BPB))
    claims.append(less_claim("text: momentum lowers bits per byte (softmax)", mom, soft, "bpb"))
    claims.append(less_claim("text: momentum lowers bits per byte (FMM)", mfmm, fmm, "bpb"))


# ---------------------------------------------------------------- main
def git_commit():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/experiments", help="parent of the run directories (default runs/experiments)")
    ap.add_argument("--out", default="RESULTS.md", help="Markdown file to write (default RESULTS.md)")
    ap.add_argument("--figures", default="figures", help="directory for the figures (default figures/)")
    ap.add_argument("--suite", default=os.path.join(ROOT, "configs", "experiments", "suite.list"),
                    help="suite list (default configs/experiments/suite.list)")
    ap.add_argument("--no-figures", action="store_true", help="skip the figures")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.suite):
        ap.error(f"--suite {args.suite}: no such file")
    entries = parse_suite(args.suite)
    if not os.path.isdir(args.runs):
        print(f"{PROG}: note: {args.runs}: no such directory; every row will say '{NOT_RUN}'", file=sys.stderr)
    load_entries(entries, args.runs)
    ctx = Context(args, entries)

    fams = {}
    for g in group_entries(entries):
        fams.setdefault(family_of(g.first), []).append(g)

    body, claims = [], []
    chain = sorted(k for k in fams if k[0] == "chain")
    if chain:
        body.append("## Momentum seed: chain task\n")
        body.append("The seed's claim: momentum attention (q, k sheared by their velocity, γ = 0.2) learns the "
                    "repeated chain (in-context recall, L_rep) better than softmax attention without momentum, "
                    "leaving L_new unchanged and widening the drop from the first to the second occurrence "
                    "(Δ1→2 = loss_by_k[0] − loss_by_k[1]).\n")
        for key in chain:
            chain_section(ctx, key[1], fams[key], body, claims)
    copies = {k[1]: fams[k] for k in fams if k[0] == "copy"}
    if copies or fams.get(("listops", None)):
        body.append("## FMM seed: copy task and ListOps\n")
        body.append("The seed's claim (FMMformer): a banded softmax near field plus a low-rank linear far field "
                    "keeps the accuracy of softmax attention at linear cost, where linear attention alone and a "
                    "band alone fall short; two far-field kernels do better than one.\n")
    if copies:
        copy_section(ctx, copies, body, claims)
    if ("listops", None) in fams:
        listops_section(ctx, fams[("listops", None)], body, claims)
    if ("text", None) in fams:
        body.append("## Text (both seeds)\n")
        text_section(ctx, fams[("text", None)], body, claims)

    n_ran = sum(1 for e in entries if e.run is not None)
    n_done = sum(1 for e in entries if complete(e))
    worlds = sorted({e.world_size for e in entries if e.world_size})
    walls = {}
    for e in entries:
        if e.wall_s is not None:
            fam = family_of(e)[0]
            walls[fam] = walls.get(fam, 0) + e.wall_s
    head = [
        "# RESULTS: the seeds' claims, run on momfmm",
        "",
        f"Generated by `tools/make_results.py` from the HDF5 files under `{args.runs}` "
        f"({datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, commit {git_commit()}); do not edit by hand. "
        f"Suite: `{os.path.relpath(args.suite, ROOT)}`, {len(entries)} runs: {n_done} finished, "
        f"{n_ran - n_done} partial, {len(entries) - n_ran} not run.",
        "",
        f"Ranks per run: {', '.join(map(str, worlds)) if worlds else 'unknown'}. "
        + ("Measured wall time (train.log): " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(walls.items()))
           + f", total {sum(walls.values()) / 60:.1f} min. " if walls else "")
        + "Every table's numbers are the final eval of each run (SPEC 3). To rerun everything: "
        f"`tools/run_experiments.sh{ctx.runner_flags}`, then `/usr/bin/python3 tools/make_results.py"
        f"{' --runs ' + shlex.quote(args.runs) if os.path.normpath(args.runs) != 'runs/experiments' else ''}`. "
        "The sizes here are for a 2-core machine; `configs/experiments/README.md` compares them with the seeds'.",
        "",
    ]
    kinds = ("held", "did not hold", "within noise", "not run")
    verdicts = [c for c in claims if c[0] in kinds]
    summary = {v: sum(1 for c in verdicts if c[0] == v) for v in kinds}
    claim_lines = ["## Claims: held or not", "",
                   f"Computed from the tables below: {summary['held']} held, {summary['did not hold']} did not hold, "
                   f"{summary['within noise']} not shown (difference within seed noise), {summary['not run']} could not "
                   "be judged (runs missing). A claim \"held\" when the means (over seeds) move the claimed way by more "
                   f"than {NOISE_SE:g} standard errors of the difference of means (where both sides have several seeds; "
                   "with a single seed the direction alone decides, and the line says so), \"did not hold\" when they "
                   "move the other way by as much; thresholds of \"matches\" and \"about unchanged\" claims are in "
                   "the claim.", ""]
    claim_lines += [f"- {c[1]}" for c in verdicts]
    obs = [c for c in claims if c[0] == "observation"]
    if obs:
        claim_lines += ["", "Observations (no seed claim attached):", ""] + [f"- {c[1]}" for c in obs]
    claim_lines.append("")

    commands = ["## Commands of every run", "",
                "Each row's `reproduce` command runs its suite lines through `tools/run_experiments.sh`; these are "
                "the exact commands it runs (from the repository root).", "", "<details><summary>"
                f"{len(entries)} commands</summary>", "", "```sh"]
    commands += [ctx.mpirun_command(e) for e in entries]
    commands += ["```", "", "</details>", ""]

    text = "\n".join(head + claim_lines + body + commands)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {n_done} finished, {n_ran - n_done} partial, {len(entries) - n_ran} not run; "
          f"claims {summary['held']} held, {summary['did not hold']} did not hold, "
          f"{summary['within noise']} within noise, {summary['not run']} not judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
