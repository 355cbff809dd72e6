"""The one HDF5 reader of momfmm's Python side (docs/design.md §8.8): the analysis modules
(momfmm.plot, momfmm.report, momfmm.results), the float64 reference model and the tests read every
checkpoint, metrics and token file through it.

Reads the HDF5 files of docs/files.md §4: checkpoints `ckpt_<step 8 digits>.h5` (root attributes,
`/model`, `/metrics/train`, `/metrics/eval`) and, when a run directory has one, the live
`metrics.h5` (same `/metrics/...` datasets, written with HDF5 SWMR). Metric names are those of
docs/metrics.md §3. Every failure to read a file raises RunError with a one-line message naming the
file; the tools' main() turn it into exit code 3, the code of docs/cli.md §5 for a missing, corrupt or
incompatible file.

Run with Debian's /usr/bin/python3 (h5py, numpy).
"""
import configparser
import os
import re
import sys

import h5py
import numpy as np

CHECKPOINT_FORMAT = "momfmm-checkpoint"
CHECKPOINT_NAME = re.compile(r"^ckpt_(\d{8})\.h5$")  # temporaries are ckpt_*.h5.tmp.<pid>
METRICS_NAME = "metrics.h5"
EXIT_BAD_FILE = 3


class RunError(Exception):
    """A run's file is missing, corrupt or incompatible; str() is the one-line message."""


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


class Checkpoint:
    """Everything a checkpoint file holds (docs/files.md §4), as numpy arrays.

    path     the file read
    attrs    {name: value} of the root attributes (strings decoded)
    config   configparser.ConfigParser of `config_ini`
    step     int(attrs["step"])
    params   {name: array} of /model (names as docs/files.md §4, e.g. "blocks/0/attn/qkv/weight")
    optim_m, optim_v  {name: array} of /optim/m and /optim/v (empty when absent or not read)
    buffers  {name: array} of /buffers, e.g. "blocks/0/attn/prev_q"
    train, eval  {key: array} of /metrics/train and /metrics/eval
    """

    def __init__(self, path):
        self.path = path
        self.attrs = {}
        self.config = config_parser()
        self.step = 0
        self.params, self.optim_m, self.optim_v, self.buffers = {}, {}, {}, {}
        self.train, self.eval = {}, {}

    def datasets(self):
        """{full HDF5 path: array} of every tensor read ("model/...", "optim/m/...", ...)."""
        out = {}
        for prefix, group in (("model", self.params), ("optim/m", self.optim_m),
                              ("optim/v", self.optim_v), ("buffers", self.buffers)):
            out.update({f"{prefix}/{k}": v for k, v in group.items()})
        return out


def read_tensor_group(f, group):
    """{relative name: array} of every dataset below `group` (empty when absent)."""
    out = {}
    if group in f:
        f[group].visititems(lambda n, o: out.__setitem__(n, np.asarray(o[()]))
                            if isinstance(o, h5py.Dataset) else None)
    return out


def load_checkpoint(path, optim=True, metrics=True):
    """Reads a checkpoint into a Checkpoint; raises RunError naming the file."""
    ck = Checkpoint(path)
    with open_h5(path) as f:
        try:
            ck.attrs = root_attributes(f)
            fmt = _attr_text(f.attrs.get("format", CHECKPOINT_FORMAT))
            if fmt != CHECKPOINT_FORMAT:
                raise RunError(f"{path}: format is '{fmt}', not '{CHECKPOINT_FORMAT}'")
            if "config_ini" in f.attrs:
                ck.config.read_string(_attr_text(f.attrs["config_ini"]))
            ck.step = int(f.attrs.get("step", 0))
            ck.params = read_tensor_group(f, "model")
            ck.buffers = read_tensor_group(f, "buffers")
            if optim:
                ck.optim_m = read_tensor_group(f, "optim/m")
                ck.optim_v = read_tensor_group(f, "optim/v")
        except (OSError, KeyError, ValueError, configparser.Error) as exc:
            raise RunError(f"{path}: corrupt checkpoint ({str(exc).splitlines()[0]})") from None
        if metrics:
            ck.train, ck.eval = read_metrics(f, path)
    return ck


def load_tokens(path):
    """(inputs [B, T], targets [B, T], labels [B] or None) of a token file (docs/files.md §4:
    datasets inputs, targets and, for the cls head, labels), as int64 numpy arrays; raises
    RunError naming the file."""
    with open_h5(path) as f:
        try:
            inputs = np.asarray(f["inputs"][()], dtype=np.int64)
            targets = np.asarray(f["targets"][()], dtype=np.int64)
            labels = np.asarray(f["labels"][()], dtype=np.int64) if "labels" in f else None
        except (OSError, KeyError, ValueError) as exc:
            raise RunError(f"{path}: not a token file ({str(exc).splitlines()[0]})") from None
    return inputs, targets, labels


def newest_checkpoint(directory):
    """Path of the checkpoint with the highest step in directory, or None."""
    best = None
    for entry in os.listdir(directory):
        match = CHECKPOINT_NAME.match(entry)
        if match and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), entry)
    return os.path.join(directory, best[1]) if best else None


def open_h5(path):
    """Opens an HDF5 file read-only: SWMR first (a live metrics.h5), then a normal open, then
    without file locking (a file another process holds open for writing)."""
    if not os.path.exists(path):
        raise RunError(f"{path}: no such file or directory")
    if not os.path.isfile(path):
        raise RunError(f"{path}: not a regular file")
    errors = []
    for kwargs in ({"libver": "latest", "swmr": True}, {}, {"locking": False}):
        try:
            return h5py.File(path, "r", **kwargs)
        except (OSError, ValueError, TypeError) as exc:
            errors.append(exc)
    reason = str(errors[1]).splitlines()[0] if len(errors) > 1 else str(errors[0])
    raise RunError(f"{path}: not a readable HDF5 file ({reason})")


_ESCAPES = {ord("n"): b"\n", ord("t"): b"\t", ord("r"): b"\r", ord("\\"): b"\\", ord('"'): b'"',
            ord(";"): b";", ord("#"): b"#"}


def unquote_ini_value(value):
    """A config_ini value as momfmm reads it (docs/config.md §6, escaping): a value that starts
    with '"' is quoted, with the escapes \\n \\t \\r \\\\ \\" \\; \\# and \\xNN; any other value is
    verbatim. Bytes that are not UTF-8 come back as surrogate escapes, so os.fsencode() gives the
    path's bytes. Raises ValueError for a malformed quoted value."""
    if not value.startswith('"'):
        return value
    raw, out, i = value.encode("utf-8", "surrogateescape"), bytearray(), 1
    while i < len(raw) and raw[i] != ord('"'):
        if raw[i] != ord("\\"):
            out.append(raw[i])
            i += 1
            continue
        e = raw[i + 1] if i + 1 < len(raw) else None
        if e in _ESCAPES:
            out += _ESCAPES[e]
            i += 2
        elif e == ord("x") and re.fullmatch(rb"[0-9a-fA-F]{2}", raw[i + 2:i + 4]) and raw[i + 2:i + 4] != b"00":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError(f"bad escape in the quoted value {value!r}")
    if i >= len(raw) or raw[i + 1:].strip(b" \t"):
        raise ValueError(f"bad quoted value {value!r}")
    return out.decode("utf-8", "surrogateescape")


class _IniValues(configparser.Interpolation):
    """configparser's hook on every get: decodes quoted values (unquote_ini_value)."""

    def before_get(self, parser, section, option, value, defaults):
        return unquote_ini_value(value)


def config_parser():
    """A ConfigParser that reads config_ini as momfmm does: no interpolation ('%' is a
    character), quoted values decoded."""
    return configparser.ConfigParser(interpolation=_IniValues())


def _attr_text(value):
    """A string attribute as str: variable-length (str), fixed-length (bytes), or a
    one-element array of either."""
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _is_text(value):
    return isinstance(value, bytes) or (isinstance(value, np.ndarray) and value.size == 1
                                        and value.dtype.kind in "SU")


def root_attributes(f):
    """{name: value} of an open file's root attributes, strings (of any HDF5 storage) as str."""
    return {k: (_attr_text(v) if _is_text(v) else v) for k, v in f.attrs.items()}


def read_metric_group(group):
    """{key: numpy array} of the datasets in a /metrics/<split> group. Arrays that share the
    per-entry first axis are cut to the shortest, so a SWMR file read mid-append stays aligned."""
    out = {}
    for key, obj in group.items():
        if isinstance(obj, h5py.Dataset) and obj.ndim >= 1:
            out[key] = np.asarray(obj[()])
    if out:
        n = min(len(v) for v in out.values())
        out = {k: v[:n] for k, v in out.items()}
    return out


def read_metrics(f, path):
    try:
        train = read_metric_group(f["metrics/train"]) if "metrics/train" in f else {}
        evals = read_metric_group(f["metrics/eval"]) if "metrics/eval" in f else {}
    except (OSError, KeyError, ValueError) as exc:
        raise RunError(f"{path}: cannot read /metrics ({exc})") from None
    return train, evals


def read_checkpoint(run, path):
    """Fills run from a checkpoint: attributes, config, learned gamma and its metrics."""
    with open_h5(path) as f:
        try:
            fmt = _attr_text(f.attrs.get("format", CHECKPOINT_FORMAT))
            if fmt != CHECKPOINT_FORMAT:
                raise RunError(f"{path}: format is '{fmt}', not '{CHECKPOINT_FORMAT}'")
            if "config_ini" not in f.attrs:
                raise RunError(f"{path}: no config_ini attribute (not a momfmm checkpoint)")
            try:
                run.config.read_string(_attr_text(f.attrs["config_ini"]))
            except configparser.Error as exc:
                msg = str(exc).splitlines()[0]
                raise RunError(f"{path}: config_ini attribute is not valid INI ({msg})") from None
            run.step = run.ckpt_step = int(f.attrs.get("step", 0))
            run.attrs = root_attributes(f)
            gammas = []
            i = 0
            while f"model/blocks/{i}/attn/momentum_gamma" in f:
                gammas.append(np.asarray(f[f"model/blocks/{i}/attn/momentum_gamma"][()], float))
                i += 1
        except (OSError, KeyError, ValueError) as exc:
            raise RunError(f"{path}: corrupt checkpoint ({exc})") from None
        run.train, run.eval = read_metrics(f, path)
    run.files.append(path)
    if gammas:
        run.gamma, run.gamma_source = np.vstack(gammas), "learned"


def read_live_metrics(run, path):
    """Replaces run's metrics with those of a live metrics.h5 (newer than any checkpoint)."""
    with open_h5(path) as f:
        if len(run.config.sections()) == 0 and "config_ini" in f.attrs:
            try:
                run.config.read_string(_attr_text(f.attrs["config_ini"]))
            except configparser.Error:
                pass
        train, evals = read_metrics(f, path)
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


def load_run(path, label=None):
    """Loads a run directory (its metrics.h5 when present for the metrics, and its newest
    checkpoint for the config and the learned gamma) or one HDF5 file (a checkpoint, or a
    metrics.h5 next to checkpoints). Raises RunError."""
    run = Run(label or default_name(path), path)
    if os.path.isdir(path):
        ckpt = newest_checkpoint(path)
        live = os.path.join(path, METRICS_NAME)
        live = live if os.path.exists(live) else None
        if ckpt is None and live is None:
            raise RunError(f"{path}: no {METRICS_NAME} and no ckpt_<step>.h5 in this directory")
    elif not os.path.exists(path):
        raise RunError(f"{path}: no such file or directory")
    elif os.path.basename(path) == METRICS_NAME:
        live, ckpt = path, newest_checkpoint(os.path.dirname(os.path.abspath(path)))
    else:
        live, ckpt = None, path
    if ckpt is not None:
        read_checkpoint(run, ckpt)
    if live is not None:
        read_live_metrics(run, live)
    if not run.config.sections():
        print(f"note: {path}: no config (no checkpoint yet, no config_ini attribute): "
              "config columns and gamma figures are left out", file=sys.stderr)
    resolve_gamma(run)
    return run


def load_runs(paths, labels=None):
    """load_run for every path with its --label (missing labels default to names). Raises
    ValueError when there are more labels than paths, RunError when a file cannot be read; the
    tools' main() turn them into exit 2 and exit 3 (EXIT_BAD_FILE)."""
    labels = list(labels or [])
    if len(labels) > len(paths):
        raise ValueError(f"{len(labels)} --label values for {len(paths)} runs")
    labels += [None] * (len(paths) - len(labels))
    return [load_run(p, l) for p, l in zip(paths, labels)]
