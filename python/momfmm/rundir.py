"""A run as the tools see it (docs/design.md §8.8): a run directory, a checkpoint or a live
metrics.h5, loaded into a Run (config, step, train and eval tables, per-head gamma) for
momfmm.plot, momfmm.report, momfmm.digest and momfmm.results. Every file is read through
momfmm.h5, with its checks: a read failure is a RunError naming the file.

A run directory stands for its newest checkpoint that loads (list_checkpoints orders the names,
momfmm.files): a damaged newest one is skipped with a warning, as `momfmm inspect` and `eval`
skip it, unless another process holds it open for writing. Its live `metrics.h5` (written with
HDF5 SWMR) gives the metrics when it reads. Run with Debian's /usr/bin/python3 (h5py, numpy).
"""
import os
import sys

import numpy as np

from momfmm.files import ArgumentError, RunError, escape_controls, is_locked, list_checkpoints
from momfmm.h5 import METRICS_NAME, config_parser, load_checkpoint, read_metrics_file


class Run:
    """One run as the tools see it.

    name      label given with --label, else the run directory's name (or parent/file name)
    path      the path the user gave
    config    configparser.ConfigParser of the checkpoint's `config_ini` (empty if none)
    step      the latest step known (checkpoint attribute, or last logged step)
    ckpt_step the step of the checkpoint read, None without one
    train     {key: 1-D numpy array} of /metrics/train (docs/metrics.md §3: step, loss, lr, ...)
    eval      {key: numpy array} of /metrics/eval (loss_by_k [n, 16], gain_R, gamma, ...)
    gamma     [n_layers, n_heads] float64 momentum gamma per layer and head (docs/model.md §1.2)
    gamma_source  "learned" (/model), "eval" (/metrics/eval/gamma), "fixed" (config),
                  or "init" (learnable but no trained value found: the config's initial value)
    files     the HDF5 files read
    attrs     {name: value} of the checkpoint's root attributes (strings decoded; empty without
              a checkpoint), e.g. world_size
    """

    def __init__(self, name, path):
        self.name = name
        self.path = path
        self.config = config_parser()
        self.step = 0
        self.ckpt_step = None
        self.train = {}
        self.eval = {}
        self.gamma = np.zeros((0, 0))
        self.gamma_source = "fixed"
        self.files = []
        self.attrs = {}

    def cfg(self, key, default=None):
        """Config value of "section.key" as a string, or default."""
        section, name = key.split(".", 1)
        return self.config.get(section, name, fallback=default)

    def cfg_float(self, key, default=0.0):
        value = self.cfg(key)
        try:
            return float(value) if value not in (None, "") else default
        except ValueError:
            return default

    def cfg_bool(self, key, default=False):
        value = self.cfg(key)
        if value in (None, ""):
            return default
        return value.strip().lower() in ("1", "true", "yes", "on")

    @property
    def has_config(self):
        return bool(self.config.sections())

    @property
    def learn_gamma(self):
        return self.cfg_bool("momentum.learn_gamma")

    @property
    def momentum_on(self):
        return (self.learn_gamma or self.cfg_float("momentum.gamma") != 0.0
                or self.gamma_source in ("learned", "eval"))

    def final_eval(self, key):
        """Last value of a 1-D /metrics/eval dataset, or None when absent or empty."""
        values = self.eval.get(key)
        if values is None or values.ndim != 1 or len(values) == 0:
            return None
        return float(values[-1])


def read_checkpoint(run, path):
    """Fills run from a checkpoint read as `momfmm inspect` reads it (attributes, config, /model,
    /buffers, /metrics): its config, step, learned gamma and metric tables. Raises RunError."""
    ck = load_checkpoint(path, optim=False, metrics=True)
    run.config = ck.config
    run.step = run.ckpt_step = ck.step
    run.attrs = dict(ck.attrs)
    run.train, run.eval = ck.train, ck.eval
    run.files.append(path)
    L = ck.settings.get("model.n_layers")
    gammas = [ck.params.get(f"blocks/{i}/attn/momentum_gamma") for i in range(L)]
    if all(g is not None for g in gammas) and gammas:
        run.gamma, run.gamma_source = np.vstack([np.asarray(g, float) for g in gammas]), "learned"


def read_live_metrics(run, path):
    """Replaces run's metrics with those of a live metrics.h5 (newer than any checkpoint)."""
    c, train, evals = read_metrics_file(path)
    if not run.has_config:
        run.config.read_dict(c.raw)
    run.files.append(path)
    if train or evals:
        run.train, run.eval = train, evals
    for metrics in (run.train, run.eval):
        if "step" in metrics and len(metrics["step"]):
            run.step = max(run.step, int(metrics["step"][-1]))


def resolve_gamma(run):
    """Per-layer per-head gamma (docs/model.md §1.2): learned values from /model; the last row of
    /metrics/eval/gamma when it is newer than the checkpoint or /model has none; else the
    config's momentum.gamma for every head."""
    n_layers = int(run.cfg_float("model.n_layers", 0))
    n_heads = int(run.cfg_float("model.n_heads", 0))
    history = run.eval.get("gamma")
    learnable = run.learn_gamma or not run.has_config
    if learnable and history is not None and history.ndim == 3 and len(history):
        eval_steps = run.eval.get("step")
        newer = (run.ckpt_step is None or eval_steps is not None and len(eval_steps)
                 and int(eval_steps[-1]) > run.ckpt_step)
        if run.gamma_source != "learned" or newer:
            run.gamma, run.gamma_source = np.asarray(history[-1], float), "eval"
    if run.gamma_source in ("learned", "eval"):
        return
    run.gamma = np.full((n_layers, n_heads), run.cfg_float("momentum.gamma"))
    run.gamma_source = "init" if run.learn_gamma else "fixed"


def default_name(path):
    path = os.path.normpath(path)
    if os.path.isdir(path):
        return os.path.basename(os.path.abspath(path))
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return f"{parent}/{os.path.basename(path)}" if parent else os.path.basename(path)


def warn(message):
    print(escape_controls(f"warning: {message}"), file=sys.stderr)


def read_newest_checkpoint(run, directory, required=True):
    """Fills run from the newest checkpoint of `directory` that loads, as `momfmm inspect DIR` and
    `eval DIR` choose it (src/store/store.c store_load_newest): one that does not load is skipped with
    a warning, unless another process holds it open for writing (then RunError: not falling back
    to an older state without a word). Returns the path read, or None when the directory holds
    no checkpoint; RunError when it holds some and none loads (with `required`; else a warning
    and None)."""
    found = list_checkpoints(directory)
    for _, path in reversed(found):
        try:
            read_checkpoint(run, path)
            return path
        except RunError as exc:
            if is_locked(path):
                raise RunError(f"{exc}; not falling back to an older checkpoint") from None
            warn(f"skipping checkpoint that does not load: {exc}")
    if found and required:
        raise RunError(f"{directory}: no checkpoint in this run directory loads (see the warnings above)")
    return None


def load_run(path, label=None):
    """Loads a run directory (its newest checkpoint that loads, for the config, learned gamma and
    metrics, and its metrics.h5 when that reads, for the newest metrics), or one HDF5 file (a
    checkpoint, or a metrics.h5 next to checkpoints). Raises RunError."""
    run = Run(label or default_name(path), path)
    if os.path.isdir(path):
        live = os.path.join(path, METRICS_NAME)
        live = live if os.path.lexists(live) else None
        ckpt = read_newest_checkpoint(run, path)
        if ckpt is None and live is None:
            raise RunError(f"{path}: no {METRICS_NAME} and no ckpt_<step>.h5 in this directory")
        if live is not None:
            try:
                read_live_metrics(run, live)
            except RunError as exc:
                if ckpt is None:
                    raise
                warn(f"{exc}; the metrics are the checkpoint's")
    elif not os.path.lexists(path):
        raise RunError(f"{path}: no such file or directory")
    elif os.path.basename(path) == METRICS_NAME:
        read_newest_checkpoint(run, os.path.dirname(os.path.abspath(path)), required=False)
        read_live_metrics(run, path)
    else:
        read_checkpoint(run, path)
    if not run.config.sections():
        print(f"note: {path}: no config (no checkpoint yet, no config_ini attribute): "
              "config columns and gamma figures are left out", file=sys.stderr)
    resolve_gamma(run)
    return run


def load_runs(paths, labels=None):
    """load_run for every path with its --label (missing labels default to names). Raises
    ArgumentError (exit 2) when there are more labels than paths, RunError when a file cannot be
    read (exit 3, EXIT_BAD_FILE)."""
    labels = list(labels or [])
    if len(labels) > len(paths):
        raise ArgumentError(f"{len(labels)} --label values for {len(paths)} runs")
    labels += [None] * (len(paths) - len(labels))
    return [load_run(p, l) for p, l in zip(paths, labels)]
