"""The one HDF5 reader of momfmm's Python side (docs/design.md §8.8): the analysis modules
(momfmm.plot, momfmm.report, momfmm.results), momfmm.pt, the float64 reference model and the
tests read every checkpoint, metrics and token file through it.

Reads the HDF5 files of docs/files.md §4 with the checks of the binary's reader (src/hdf5/h5reader.c,
src/store/checkpoint.c), so that a file the binary refuses is refused here too, with a one-line
RunError naming the file and what is wrong: only regular files, opened through momfmm.h5reader
(hard links only, every declared size bounded before it is read); the root attributes (format,
format_version 1, step, tokens_seen, world_size, skipped_steps, init_from, gemm_engines,
momfmm_version: types, single values, ranges); config_ini passing the binary's config checks
(momfmm.config); the tensors of the config's name table with their exact shapes, finite (and
/optim/v non-negative); and no other tensor under /model, /buffers or /optim. The metric tables
(/metrics/train, /metrics/eval) have the columns of the config's task and model (momfmm.config).
/buffers is read (and must be exactly the config's) only when momentum is on, as the binary
reads it.
The tools' main() turn a RunError into exit code 3 (docs/cli.md §5).

A run directory as the tools see it (its newest checkpoint that loads, its live metrics) is
momfmm.rundir's, which reads its files through this module. Run with Debian's /usr/bin/python3
(h5py, numpy).
"""
import configparser
import math

import h5py
import numpy as np

from momfmm import config as settings
from momfmm import schema
from momfmm.config import ConfigError
from momfmm.files import RunError, check_input, is_locked, list_checkpoints
from momfmm.h5reader import Reader, memory_available

CHECKPOINT_FORMAT = "momfmm-checkpoint"
FORMAT_VERSION = 1
METRICS_NAME = "metrics.h5"
# Bounds on what a file may declare before anything is read for it (src/store/checkpoint.c,
# src/store/token_input.c).
MAX_METRIC_ROWS = 1 << 26
INT_MAX = (1 << 31) - 1
GEMM_CLASSES = ("forward", "backward_data", "backward_weight")
GEMM_ENGINES = ("openblas", "onednn-f32", "avx512-f32")


# ---------------------------------------------------------------- kinds (src/hdf5/h5kind.c)
# Which of momfmm's files a file is, by the mark each writer always puts in it (docs/files.md §4,
# another of momfmm's files), in the order tried: a checkpoint also holds config_ini and /metrics.
KIND_NAMES = {
    "checkpoint": "a checkpoint",
    "metrics": "a run's live metrics (metrics.h5)",
    "grads": "a gradient file (momfmm loss --grads)",
    "logits": "a logits file (momfmm logits --out)",
    "loss_tokens": "a token file of /inputs and /targets (momfmm loss)",
    "tokens": "a token file of /tokens (momfmm logits, data.path)",
}


def _is_kind(r, kind):
    if kind == "checkpoint":
        return r.has_attr("format") or r.exists("/model")
    if kind == "metrics":
        return not _is_kind(r, "checkpoint") and (r.has_attr("config_ini") or r.exists("/metrics"))
    return r.exists({"grads": "/grads", "logits": "/logits", "loss_tokens": "/inputs", "tokens": "/tokens"}[kind])


def kind_of(r):
    """The kind of the file open in Reader r (a key of KIND_NAMES), or None: none of ours."""
    return next((k for k in KIND_NAMES if _is_kind(r, k)), None)


def require_kind(r, wanted):
    """Fails "<path>: <its kind>, not <wanted>" when the file lacks the mark of `wanted` and holds
    another kind's; returns otherwise (the reader then names what is missing)."""
    if not _is_kind(r, wanted):
        kind = kind_of(r)
        if kind is not None:
            r.fail(f"{KIND_NAMES[kind]}, not {KIND_NAMES[wanted]}")


# ---------------------------------------------------------------- checkpoints (src/store/checkpoint.c)
class Checkpoint:
    """Everything a checkpoint file holds (docs/files.md §4), checked as the binary checks it.

    path     the file read
    attrs    {name: value} of the root attributes (strings as str, integers as int)
    settings momfmm.config.Config of `config_ini` (typed values, defaults filled in)
    config   configparser.ConfigParser of `config_ini` (config_parser(): values as written)
    step     the `step` attribute
    params   {name: float32 array} of /model, the config's name table in order ("tok_emb",
             "blocks/0/attn/qkv/weight", ...)
    buffers  {name: float32 array} of /buffers when momentum is on, e.g. "blocks/0/attn/prev_q"
    optim_m, optim_v  {name: float32 array} of /optim/m and /optim/v (empty when not read)
    train, eval  {key: array} of the /metrics/train and /metrics/eval columns the file has
    """

    def __init__(self, path):
        self.path = path
        self.attrs = {}
        self.settings = settings.Config()
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


def read_config(r, origin="config_ini"):
    """(Config, INI text) of a file's config_ini: the binary's parse, checks and data path."""
    text = r.attr_string("config_ini")
    try:
        c = settings.parse(text, origin).check(origin).resolve_data_path(origin)
    except ConfigError as exc:
        r.fail(str(exc))
    return c, text


def _read_attributes(r):
    """The root attributes of a checkpoint, checked (src/store/checkpoint.c read_config_body)."""
    fmt = r.attr_string("format")
    if fmt != CHECKPOINT_FORMAT:
        r.fail(f"format is '{fmt[:63]}', expected '{CHECKPOINT_FORMAT}'")
    attrs = {"format": fmt}
    version = r.attr_int("format_version")
    if not 1 <= version <= FORMAT_VERSION:
        r.fail(f"format_version {version} is not supported (this build reads 1..{FORMAT_VERSION})")
    attrs["format_version"] = version
    for name in ("step", "tokens_seen", "world_size"):
        attrs[name] = r.attr_int(name)
    if attrs["step"] < 0:
        r.fail(f"step = {attrs['step']} is negative")
    if attrs["tokens_seen"] < 0:
        r.fail(f"tokens_seen = {attrs['tokens_seen']} is negative")
    if not 1 <= attrs["world_size"] <= INT_MAX:
        r.fail(f"world_size = {attrs['world_size']} is not a number of ranks")
    attrs["skipped_steps"] = r.attr_int("skipped_steps") if r.has_attr("skipped_steps") else 0
    if attrs["skipped_steps"] < 0:
        r.fail(f"skipped_steps = {attrs['skipped_steps']} is negative")
    if attrs["skipped_steps"] > attrs["step"]:
        r.fail(f"skipped_steps = {attrs['skipped_steps']} exceeds step = {attrs['step']}")
    if r.has_attr("init_from"):
        attrs["init_from"] = r.attr_string("init_from")
    if r.has_attr("gemm_engines"):
        engines = r.attr_string("gemm_engines")
        if not _gemm_engines_ok(engines):
            r.fail("gemm_engines is not a list of class=engine (forward=openblas,...)")
        attrs["gemm_engines"] = engines
    if r.has_attr("momfmm_version"):
        attrs["momfmm_version"] = r.attr_string("momfmm_version")
    return attrs


def _gemm_engines_ok(text):
    """gemm_class_engines_parse: forward=E,backward_data=E,backward_weight=E, E openblas,
    onednn-f32 or avx512-f32, and shorter than the 128 bytes the C side keeps."""
    parts = text.split(",")
    return (len(text.encode("utf-8", "surrogateescape")) < 128 and len(parts) == len(GEMM_CLASSES)
            and all(p.partition("=")[0] == c and p.partition("=")[1] == "=" and p.partition("=")[2] in GEMM_ENGINES
                    for p, c in zip(parts, GEMM_CLASSES)))


def _check_model_fits(r, c):
    need, available = 4.0 * schema.model_floats(c), memory_available()
    if available > 0 and need > available:
        r.fail(f"config_ini describes a model of {need / 1e9:.3g} GB (model.d_model = {c.get('model.d_model')}, "
               f"model.vocab_size = {c.get('model.vocab_size')}, model.n_layers = {c.get('model.n_layers')}), "
               f"more than the {available / 1e9:.3g} GB of memory available")


def _read_tensors(r, group, table, nonnegative=False):
    """{name: float32 array} of group/<name> for the (name, shape) table: exact shapes, finite
    values (and none negative with `nonnegative`); nothing else below the group."""
    out = {}
    for name, shape in table:
        full = f"{group}/{name}"
        x = r.read_checked(full, shape, np.float32)
        bad = ~np.isfinite(x) | ((x < 0) if nonnegative else False)
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            value = float(x.reshape(-1)[i])
            why = ("a checkpoint of non-finite values is refused" if not math.isfinite(value)
                   else "a negative second moment (AdamW takes its square root)")
            r.fail(f"{full}[{i}] = {value:g}: {why}")
        out[name] = x
    r.unexpected(group, {name for name, _ in table})
    return out


def _read_buffers(r, c):
    out = {}
    for name, shape in schema.buffer_tensors(c):
        full = f"/buffers/{name}"
        x = r.read_checked(full, shape, np.float32)
        if not np.isfinite(x).all():
            r.fail(f"{full} holds {float(x.reshape(-1)[np.flatnonzero(~np.isfinite(x))[0]]):g}: a checkpoint of "
                   "non-finite values is refused")
        out[name] = x
    r.unexpected("/buffers", {name for name, _ in schema.buffer_tensors(c)})
    return out


STEP_COLUMN_MAX = float(2**53)  # train.steps' limit, exact as a double


def read_metric_table(r, group, columns, live=False):
    """{name: array} of a /metrics/<split> group (src/store/checkpoint.c read_metric_table): rows are
    those of the first column (step, 1-D) in a checkpoint, those every column holds in a live
    metrics.h5; each column [rows, ...] as the config makes it; the columns added after
    format_version 1 may be missing (absent from the result). A missing group is an empty
    history ({})."""
    if not r.exists(group):
        return {}
    present = [col for col in columns
               if not (schema.added_later(col.name) and not r.exists(f"{group}/{col.name}"))]
    rows = None
    for i, col in enumerate(present if live else present[:1]):
        name = f"{group}/{col.name}"
        dset = r.open_dataset(name)
        if i == 0 and len(dset.shape) != 1:
            r.fail(f"{name} is not 1-D")
        r.checked_elements(name, dset)
        n = int(dset.shape[0]) if len(dset.shape) else 0
        rows = n if rows is None else min(rows, n)
    rows = rows or 0
    width = sum(max(1, math.prod(col.row)) for col in columns)
    need, available = 8.0 * rows * (width + 1), memory_available()
    if rows > MAX_METRIC_ROWS or (available > 0 and 2 * need > available):
        r.fail(f"{group} declares {rows} rows ({need / 1e9:.3g} GB as a table): more than {MAX_METRIC_ROWS} rows "
               f"or than the {available / 1e9:.3g} GB of memory available")
    out = {}
    for col in present:
        data = r.read_checked(f"{group}/{col.name}", (rows,) + col.row, np.float64, more_rows=live)
        if col.integer:
            # a step column holds steps, 0 ... 2^53, as the binary checks (src/store/checkpoint.c):
            # anything else would not convert back to the integer it stands for
            bad = np.flatnonzero(~((data >= 0) & (data <= STEP_COLUMN_MAX)))
            if bad.size:
                r.fail(f"{group}/{col.name}[{bad[0]}] = {data.flat[bad[0]]!r} is not a step (0 ... 2^53)")
        out[col.name] = data.astype(np.int64) if col.integer else data
    return out


def _read_checkpoint(path, model=True, optim=False, metrics=False):
    """A Checkpoint with what `momfmm eval` reads (attributes, config, /model, /buffers) and, as
    asked, /optim (train --resume) and /metrics (inspect). Raises RunError."""
    ck = Checkpoint(path)
    with Reader(path, "checkpoint") as r:
        require_kind(r, "checkpoint")
        ck.attrs = _read_attributes(r)
        c, text = read_config(r)
        _check_model_fits(r, c)
        ck.attrs["config_ini"] = text
        ck.settings, ck.step = c, ck.attrs["step"]
        ck.config.read_dict(c.raw)
        if model:
            ck.params = _read_tensors(r, "/model", schema.model_tensors(c))
            if c.momentum_on:  # as the binary, which reads /buffers only then
                ck.buffers = _read_buffers(r, c)
        if optim:
            table = schema.model_tensors(c)
            ck.optim_m = _read_tensors(r, "/optim/m", table)
            ck.optim_v = _read_tensors(r, "/optim/v", table, nonnegative=True)
        if metrics:
            ck.train = read_metric_table(r, "/metrics/train", schema.metric_columns(c, "train"))
            ck.eval = read_metric_table(r, "/metrics/eval", schema.metric_columns(c, "eval"))
    return ck


def load_checkpoint(path, optim=True, metrics=True):
    """Reads a checkpoint into a Checkpoint, with the checks of the binary's reader (what eval
    reads, and /optim as --resume reads it, /metrics as inspect does); raises RunError naming
    the file."""
    return _read_checkpoint(path, model=True, optim=optim, metrics=metrics)


def load_tokens(path, config=None):
    """(inputs [B, T], targets [B, T], labels [B] or None) of a token file (docs/files.md §4:
    datasets inputs, targets and, for the cls head, labels), as int64 numpy arrays, checked as
    `momfmm loss` checks it: /inputs a non-empty [B, T] of integers, /targets and /labels of
    integers with the shapes [B, T] and [B]; with the model's Config `config` also T within its
    positions, ids in [0, V), targets in [-1, V) counting at least one position (lm) or labels in
    [0, n_classes) (cls). Raises RunError naming the file."""
    with Reader(path, "token file") as r:
        require_kind(r, "loss_tokens")
        dset = r.open_dataset("/inputs")
        dims = tuple(int(d) for d in dset.shape)
        if len(dims) != 2 or dims[0] == 0 or dims[1] == 0:
            r.fail("/inputs must be a non-empty [B, T] int32 array")
        c = config
        if c is not None and dims[1] > c.positions:
            r.fail(f"/inputs has T = {dims[1]}, longer than the model's {c.positions} positions")
        r.require_integer("/inputs", dset)
        r.checked_elements("/inputs", dset)
        if dims[0] > INT_MAX:
            r.fail(f"/inputs has B = {dims[0]} rows, more than {INT_MAX}")
        r.require_integer("/targets", r.open_dataset("/targets"))
        cls = c is not None and c.get("model.head") == "cls"
        want_labels = cls or (c is None and r.exists("/labels"))
        if want_labels and r.exists("/labels"):
            r.require_integer("/labels", r.open_dataset("/labels"))
        inputs = r.read_checked("/inputs", dims, np.int64)
        targets = r.read_checked("/targets", dims, np.int64)
        labels = r.read_checked("/labels", dims[:1], np.int64) if want_labels else None
        if c is not None:
            V = c.get("model.vocab_size")
            _check_range(r, "/inputs", inputs, 0, V)
            if cls:
                _check_range(r, "/labels", labels, 0, c.get("model.n_classes"))
            else:
                _check_range(r, "/targets", targets, -1, V)
                if not (targets >= 0).any():
                    r.fail("/targets counts no position (every target is -1): there is no loss to compute")
    return inputs, targets, labels


def _check_range(r, name, x, lo, hi):
    bad = np.flatnonzero((x.reshape(-1) < lo) | (x.reshape(-1) >= hi))
    if len(bad):
        r.fail(f"{name}[{int(bad[0])}] = {int(x.reshape(-1)[bad[0]])} is outside [{lo}, {hi})")


def open_h5(path, what="file"):
    """An h5py.File of `path` opened read-only (SWMR first, for a live file), for files the
    readers above do not know (gradient and logits files of the tests): a regular file only
    (files.check_input), a RunError naming it otherwise."""
    check_input(path, what)
    for kwargs in ({"libver": "latest", "swmr": True}, {}):
        try:
            return h5py.File(path, "r", **kwargs)
        except (OSError, ValueError):
            continue
    if is_locked(path):
        raise RunError(f"{path}: cannot open {what}: locked by another process that has it open for writing")
    raise RunError(f"{path}: not a readable HDF5 file")


def read_tensor_group(f, group):
    """{relative name: array} of every dataset below `group` of an open file (empty when absent),
    unchecked: for gradient and logits files, not checkpoints (load_checkpoint)."""
    out = {}
    if group in f:
        f[group].visititems(lambda n, o: out.__setitem__(n, np.asarray(o[()]))
                            if isinstance(o, h5py.Dataset) else None)
    return out


def newest_checkpoint(directory):
    """Path of the checkpoint with the highest step in directory (momfmm.files.list_checkpoints),
    or None; whether it loads is not looked at (load_run skips one that does not)."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def unquote_ini_value(value):
    """momfmm.config.unquote: a config_ini value as momfmm reads it (docs/config.md §6)."""
    return settings.unquote(value)


class _IniValues(configparser.Interpolation):
    """configparser's hook on every get: decodes quoted values (momfmm.config.unquote)."""

    def before_get(self, parser, section, option, value, defaults):
        return settings.unquote(value)


def config_parser():
    """A ConfigParser that gives config_ini values as momfmm reads them: no interpolation ('%' is
    a character), quoted values decoded. The readers fill it with the values the binary's parser
    found (momfmm.config.parse), not with configparser's own syntax."""
    return configparser.ConfigParser(interpolation=_IniValues())


def root_attributes(f):
    """{name: value} of an open h5py file's root attributes, strings (of any HDF5 storage) as str."""
    out = {}
    for k, v in f.attrs.items():
        if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "SU":
            v = v.reshape(-1)[0]
        out[k] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out


def read_metrics_file(path):
    """(Config, train, eval) of a live metrics.h5, checked as `momfmm inspect` checks it: no
    `format` attribute and no /model (a checkpoint is not a metrics file), a valid config_ini, a
    /metrics group, the columns of the config's tables (the rows every column holds: the writer
    extends one column after another). Raises RunError."""
    with Reader(path, "metrics file", swmr=True) as r:
        require_kind(r, "metrics")  # a checkpoint, also one that lost its format attribute, is not one
        c, _ = read_config(r)
        if not r.exists("/metrics"):
            r.fail("no /metrics group: the metric tables are missing")
        train = read_metric_table(r, "/metrics/train", schema.metric_columns(c, "train"), live=True)
        evals = read_metric_table(r, "/metrics/eval", schema.metric_columns(c, "eval"), live=True)
    return c, train, evals
