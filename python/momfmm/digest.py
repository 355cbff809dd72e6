"""Results digests: what the results report reads of one run, as one small JSON file
(docs/design.md §8.8, "Results digests").

A suite that takes longer than one session runs on machines that do not keep `runs/` (it is
never committed). `momfmm_report.py --results --save-digests` writes, for every finished run,
`results/experiments/<NAME>.json`: the config, the step, the root attributes, the per-head γ,
every /metrics/eval table, the /metrics/train columns the report and its figures use, and the
wall time train.log recorded. Committed, they let a later session on another machine report
the runs it did not make itself: the report reads a run's digest when its directory is
missing, or when the directory holds a run that has not reached the digest's step.

A digest is read with the same care as an HDF5 file: anything malformed raises RunError with
a one-line message naming the file.
"""
import configparser
import io
import json
import math
import os

import numpy as np

from momfmm import files
from momfmm.files import RunError
from momfmm.rundir import Run

FORMAT = "momfmm-run-digest"
VERSION = 1
# /metrics/train columns the report and its figures read (momfmm.report, momfmm.plot); the
# rest (grad_norm, ...) stay in the run's HDF5 files. Every /metrics/eval table is kept.
TRAIN_KEYS = ("step", "loss", "lr", "tokens_per_s")
MAX_BYTES = 64 << 20  # a 1500-step run's digest is about 10 KB; anything this large is not one


def _plain(value):
    """A root attribute as JSON: numbers and strings as they are, arrays as lists."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value if isinstance(value, (str, int, float, bool, list)) else str(value)


def _column(values, digits=None):
    """A metric table as nested lists; train columns rounded to `digits` significant digits
    (float32's precision is about 7): they are figures, not numbers a table quotes."""
    out = np.asarray(values).tolist()
    if digits is None:
        return out

    def rnd(x):
        return float(f"{x:.{digits}g}") if isinstance(x, float) and math.isfinite(x) else x
    return [rnd(x) for x in out]


def digest_of(run, wall_s=None, wall_unlogged=0):
    """The digest of a loaded run (momfmm.rundir.Run) as a JSON-ready dict."""
    ini = io.StringIO()
    run.config.write(ini)
    return {
        "format": FORMAT, "version": VERSION, "name": run.name,
        "config_ini": ini.getvalue(), "step": int(run.step),
        "ckpt_step": None if run.ckpt_step is None else int(run.ckpt_step),
        "attrs": {k: _plain(v) for k, v in sorted(run.attrs.items())},
        "gamma": np.asarray(run.gamma, float).tolist(), "gamma_source": run.gamma_source,
        "train": {k: _column(run.train[k], None if k == "step" else 7) for k in TRAIN_KEYS if k in run.train},
        "eval": {k: _column(v) for k, v in sorted(run.eval.items())},
        "wall_s": wall_s, "wall_unlogged": int(wall_unlogged or 0),
    }


def write_digest(path, run, wall_s=None, wall_unlogged=0):
    """Writes run's digest to path atomically (momfmm.files.output_path: written beside it, then
    renamed over it), so an interrupted save leaves the previous digest or none, never half of
    one, and never writes through a symbolic link. Raises files.RunError or files.ArgumentError
    naming the file when it cannot be written."""
    text = json.dumps(digest_of(run, wall_s, wall_unlogged), separators=(",", ":"), sort_keys=True)
    files.write_text(path, text + "\n")


def _table(path, split, key, value):
    if not isinstance(value, list):
        raise RunError(f"{path}: {split}.{key} is not a list")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise RunError(f"{path}: {split}.{key} is not a table of numbers") from None
    if arr.ndim < 1:
        raise RunError(f"{path}: {split}.{key} is not a table of numbers")
    if key != "step":
        return arr
    if not (np.isfinite(arr).all() and (arr == np.round(arr)).all() and (abs(arr) < 2.0**62).all()):
        raise RunError(f"{path}: {split}.step is not a table of whole numbers")
    return arr.astype(np.int64)


def _tables(path, d, split):
    group = d.get(split, {})
    if not isinstance(group, dict):
        raise RunError(f"{path}: {split} is not an object")
    out = {k: _table(path, split, k, v) for k, v in group.items()}
    if out and len({len(v) for v in out.values()}) != 1:
        raise RunError(f"{path}: {split} columns differ in length")
    return out


def _number(path, d, key, kind, optional=False):
    value = d.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or kind is int and value != int(value):
        raise RunError(f"{path}: {key} is {json.dumps(value)}, not a non-negative number")
    return kind(value)


def read_digest(path, name=None):
    """(Run, wall_s, wall_unlogged) from a digest file. Raises RunError."""
    data = files.read_input(path, "digest", limit=MAX_BYTES)  # a FIFO would block a plain read
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RunError(f"{path}: not a readable digest ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise RunError(f"{path}: not a {FORMAT} file")
    if d.get("version") != VERSION:
        raise RunError(f"{path}: digest version {json.dumps(d.get('version'))}, this reader knows {VERSION}")
    run = Run(name or d.get("name") or os.path.splitext(os.path.basename(path))[0], path)
    if not isinstance(d.get("config_ini"), str):
        raise RunError(f"{path}: config_ini is not text")
    try:
        run.config.read_string(d["config_ini"])
    except configparser.Error as exc:
        raise RunError(f"{path}: config_ini is not valid INI ({str(exc).splitlines()[0]})") from None
    run.step = _number(path, d, "step", int)
    run.ckpt_step = _number(path, d, "ckpt_step", int, optional=True)
    if not isinstance(d.get("attrs", {}), dict) or not isinstance(d.get("gamma_source", ""), str):
        raise RunError(f"{path}: attrs or gamma_source malformed")
    run.attrs = dict(d.get("attrs", {}))
    run.gamma_source = d.get("gamma_source") or "fixed"
    try:
        gamma = np.asarray(d.get("gamma", []), float)
    except (TypeError, ValueError):
        gamma = None
    if gamma is None or gamma.size and gamma.ndim != 2:
        raise RunError(f"{path}: gamma is not a layers x heads table of numbers")
    run.gamma = gamma if gamma.size else np.zeros((0, 0))
    run.train, run.eval = _tables(path, d, "train"), _tables(path, d, "eval")
    run.files.append(path)
    wall_s = _number(path, d, "wall_s", int, optional=True)
    return run, wall_s, _number(path, d, "wall_unlogged", int, optional=True) or 0
