"""The one HDF5 reader of momfmm's Python side (docs/design.md §8.8): the analysis modules
(momfmm.plot, momfmm.report, momfmm.results), momfmm.pt, the float64 reference model and the
tests read every checkpoint, metrics and token file through it.

Reads the HDF5 files of docs/files.md §4 with the checks of the binary's reader (src/hdf5/h5reader.c,
src/store/checkpoint.c), so that a file the binary refuses is refused here too, with a one-line
RunError naming the file and what is wrong: only regular files; every link on the way to an
object a hard link (no external, soft or user-defined link, no external raw storage, no virtual
dataset); every declared size bounded before it is read (2^31 elements, the bytes stored, a
compressed dataset's expansion, the memory available); the root attributes (format,
format_version 1, step, tokens_seen, world_size, skipped_steps, init_from, gemm_engines,
momfmm_version: types, single values, ranges); config_ini passing the binary's config checks
(momfmm.config); the tensors of the config's name table with their exact shapes, finite (and
/optim/v non-negative); and no other tensor under /model, /buffers or /optim. The metric tables
(/metrics/train, /metrics/eval) have the columns of the config's task and model (momfmm.config).
/buffers is read (and must be exactly the config's) only when momentum is on, as the binary
reads it.
The tools' main() turn a RunError into exit code 3 (docs/cli.md §5).

A run directory stands for its newest checkpoint that loads (list_checkpoints orders the names,
momfmm.files): a damaged newest one is skipped with a warning, as `momfmm inspect` and `eval`
skip it, unless another process holds it open for writing. Its live `metrics.h5` (written with
HDF5 SWMR) gives the metrics when it reads. Run with Debian's /usr/bin/python3 (h5py, numpy).
"""
import configparser
import math
import os
import sys

import h5py
import numpy as np

from momfmm import config as settings
from momfmm.config import ConfigError
from momfmm.files import (EXIT_BAD_FILE, ArgumentError, RunError, check_input, escape_controls,  # noqa: F401
                          is_locked, list_checkpoints)

CHECKPOINT_FORMAT = "momfmm-checkpoint"
FORMAT_VERSION = 1
METRICS_NAME = "metrics.h5"
# Bounds on what a file may declare before anything is read for it (src/hdf5/h5reader.c).
MAX_ATTR_STRING = 1 << 26
MAX_DATASET_ELEMENTS = 1 << 31
MAX_FILTER_RATIO = 256
MAX_FILTERED_BYTES_FREE = 16 << 20
MAX_METRIC_ROWS = 1 << 26
INT_MAX = (1 << 31) - 1
NUL = b"\0"
GEMM_CLASSES = ("forward", "backward_data", "backward_weight")
GEMM_ENGINES = ("openblas", "onednn-f32", "avx512-f32")


# ---------------------------------------------------------------- the memory available
def _proc_bytes(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return -1.0


def memory_available():
    """Bytes a reader may allocate (src/base/sys.c sys_memory_available): MemAvailable, bounded by
    what ulimit -v and -d leave; 0 when unknown."""
    import resource
    available = max(_proc_bytes("/proc/meminfo", "MemAvailable"), 0.0)
    left = -1.0
    for limit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            rest = float(soft) - max(_proc_bytes("/proc/self/status", used), 0.0)
            left = rest if left < 0 or rest < left else left
    if left >= 0:
        left = max(left, 0.0)
        if available == 0 or left < available:
            available = left if left > 0 else 1.0
    return available


# ---------------------------------------------------------------- the hostile-file reader
class Reader:
    """An HDF5 file open for reading with the checks of src/hdf5/h5reader.c; every failure raises
    RunError "<path>: <what is wrong>". Use as a context manager."""

    def __init__(self, path, what="checkpoint", swmr=False):
        self.path = path
        check_input(path, what)
        if not h5py.is_hdf5(path):
            self.fail("not an HDF5 file (empty, truncated or corrupt)")
        self.f = None
        for kwargs in ([{"libver": "latest", "swmr": True}] if swmr else []) + [{}]:
            try:
                self.f = h5py.File(path, "r", **kwargs)
                break
            except (OSError, ValueError):
                continue
        if self.f is None:
            if is_locked(path):
                self.fail(f"cannot open {what}: locked by another process that has it open for writing (HDF5 "
                          "file locking); close that program or wait for it, then try again")
            self.fail(f"cannot open {what} as HDF5 (corrupt?)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.f is not None:
            try:
                self.f.close()
            except (OSError, ValueError):
                pass
            self.f = None

    def fail(self, message):
        raise RunError(escape_controls(f"{self.path}: {message}"))

    # ------------------------------------------------------------ links and objects
    def exists(self, name):
        """Whether `name` exists; every link on the way there must be a hard link (an external
        link is seen before HDF5 would follow it)."""
        parts = [p for p in name.split("/") if p]
        prefix = ""
        for part in parts:
            prefix += "/" + part
            key = prefix.encode("utf-8", "surrogateescape")
            try:
                if not self.f.id.links.exists(key):
                    return False
                kind = self.f.id.links.get_info(key).type
            except (KeyError, ValueError, RuntimeError, OSError):
                return False
            if kind != h5py.h5l.TYPE_HARD:
                what = {h5py.h5l.TYPE_EXTERNAL: "an external", h5py.h5l.TYPE_SOFT: "a soft"}.get(kind, "a user-defined")
                self.fail(f"{prefix} is {what} link: links are refused (copy the object into the file, e.g. with "
                          "h5copy)")
        return True

    def open_dataset(self, name):
        if not self.exists(name):
            self.fail(f"missing dataset {name}")
        try:
            obj = self.f[name]
        except (KeyError, ValueError, OSError):
            self.fail(f"{name} is not a dataset")
        if not isinstance(obj, h5py.Dataset):
            self.fail(f"{name} is not a dataset")
        try:
            dcpl = obj.id.get_create_plist()
            external, layout = dcpl.get_external_count(), dcpl.get_layout()
        except (OSError, ValueError, RuntimeError):
            external, layout = 0, None
        if external:
            self.fail(f"{name} keeps its data in external files: refused (external storage)")
        if layout == h5py.h5d.VIRTUAL:
            self.fail(f"{name} is a virtual dataset (data from other files): refused")
        if obj.shape is None:
            self.fail(f"{name} has no readable shape")
        return obj

    def checked_elements(self, name, dset):
        """The elements `dset` declares, bounded (2^31), stored (all of them without filters),
        not expanding more than 256-fold above 16 MiB, within the memory available."""
        n = 1
        for d in dset.shape:
            n *= int(d)
            if n > MAX_DATASET_ELEMENTS:
                self.fail(f"{name} declares more than {MAX_DATASET_ELEMENTS} elements")
        try:
            nbytes = n * dset.id.get_type().get_size()
            stored = dset.id.get_storage_size()
            filters = dset.id.get_create_plist().get_nfilters()
        except (OSError, ValueError, RuntimeError):
            self.fail(f"cannot read {name} (corrupt or wrong type)")
        if n > 0 and (stored < nbytes if filters == 0 else stored == 0):
            self.fail(f"{name} declares {n} elements ({nbytes} bytes) but the file stores {stored} bytes of it")
        if filters > 0 and nbytes > MAX_FILTERED_BYTES_FREE and nbytes // MAX_FILTER_RATIO > stored:
            self.fail(f"{name} is compressed {nbytes // max(stored, 1)}-fold ({stored} bytes stored for {nbytes} "
                      f"declared): more than {MAX_FILTER_RATIO}-fold above {MAX_FILTERED_BYTES_FREE >> 20} MiB "
                      "is refused")
        available = memory_available()
        if available > 0 and nbytes > available:
            self.fail(f"{name} declares {n} elements ({nbytes / 1e9:.3g} GB), more than the "
                      f"{available / 1e9:.3g} GB of memory available")
        return n

    def type_class(self, dset):
        try:
            return dset.id.get_type().get_class()
        except (OSError, ValueError, RuntimeError):
            return None

    def require_integer(self, name, dset):
        kind = self.type_class(dset)
        if kind != h5py.h5t.INTEGER:
            names = {h5py.h5t.FLOAT: "float", h5py.h5t.STRING: "string", h5py.h5t.COMPOUND: "compound",
                     h5py.h5t.ENUM: "enum", h5py.h5t.OPAQUE: "opaque", h5py.h5t.BITFIELD: "bitfield",
                     h5py.h5t.ARRAY: "array", h5py.h5t.VLEN: "variable-length", h5py.h5t.REFERENCE: "reference"}
            self.fail(f"{name} must hold integers, not {names.get(kind, 'unknown')} values")

    def open_checked(self, name, shape, more_rows=False):
        dset = self.open_dataset(name)
        got = tuple(int(d) for d in dset.shape)
        same = len(got) == len(shape) and (got[0] >= shape[0] if more_rows else got[0] == shape[0]) \
            and got[1:] == tuple(shape[1:]) if shape else got == ()
        if not same:
            self.fail(f"{name} has shape {_shape(got)}, expected {_shape(shape)}")
        self.checked_elements(name, dset)
        return dset

    def read_checked(self, name, shape, dtype, more_rows=False):
        """The dataset `name` of exactly `shape` (its leading shape[0] rows with more_rows), read
        as `dtype` the way HDF5 converts: integers and floats convert, anything else is refused."""
        dset = self.open_checked(name, shape, more_rows)
        if self.type_class(dset) not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT):
            self.fail(f"cannot read {name} (corrupt or wrong type)")
        try:
            data = dset[:shape[0]] if more_rows else dset[()]
            with np.errstate(over="ignore", invalid="ignore"):
                return np.asarray(data).astype(dtype)
        except (OSError, ValueError, TypeError, RuntimeError):
            self.fail(f"cannot read {name} (corrupt or wrong type)")

    # ------------------------------------------------------------ attributes
    def has_attr(self, name):
        try:
            return h5py.h5a.exists(self.f.id, name.encode())
        except (OSError, ValueError, RuntimeError):
            return False

    def _scalar_attr(self, name):
        if not self.has_attr(name):
            self.fail(f"missing root attribute '{name}'")
        try:
            attr = h5py.h5a.open(self.f.id, name.encode())
            kind = attr.get_space().get_simple_extent_type()
            tclass = attr.get_type().get_class()
        except (OSError, ValueError, RuntimeError):
            self.fail(f"cannot open attribute '{name}'")
        if kind != h5py.h5s.SCALAR:
            self.fail(f"attribute '{name}' must be a single value (scalar), not an array")
        return attr, tclass

    def attr_string(self, name):
        """A string attribute, variable- or fixed-length, as str (bytes that are not UTF-8 as
        surrogate escapes); a fixed-length one may hold NUL bytes only as padding at its end."""
        attr, tclass = self._scalar_attr(name)
        if tclass != h5py.h5t.STRING:
            self.fail(f"attribute '{name}' is not a string")
        tid = attr.get_type()
        variable = tid.is_variable_str()
        if not variable:
            size = tid.get_size()
            if size == 0 or size > MAX_ATTR_STRING:
                self.fail(f"attribute '{name}' has an implausible size {size}")
        try:
            value = self.f.attrs[name]
        except (OSError, ValueError, TypeError, UnicodeDecodeError, RuntimeError):
            self.fail(f"cannot read attribute '{name}'")
        if isinstance(value, np.ndarray):
            value = value.reshape(-1)[0] if value.size else b""
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        if variable:
            raw = raw.split(b"\0", 1)[0]  # read as a C string
        elif b"\0" in raw:
            self.fail(f"attribute '{name}' holds a NUL byte at offset {raw.index(NUL)} (text cannot)")
        return raw.decode("utf-8", "surrogateescape")

    def attr_int(self, name):
        _, tclass = self._scalar_attr(name)
        if tclass != h5py.h5t.INTEGER:
            self.fail(f"attribute '{name}' is not an integer")
        try:
            value = int(np.asarray(self.f.attrs[name]).reshape(-1)[0])
        except (OSError, ValueError, TypeError, IndexError, RuntimeError):
            self.fail(f"attribute '{name}' is not an integer")
        return min(max(value, -(1 << 63)), (1 << 63) - 1)  # converted to long long, saturating

    # ------------------------------------------------------------ groups
    def unexpected(self, group, expected):
        """Refuses any object below `group` other than the datasets `expected` (names relative
        to group) and the groups on the way to them, in name order; links are not followed."""
        if self.exists(group):
            self._walk(group, group, expected)

    def _walk(self, group, path, expected):
        try:
            names = sorted(self.f[path].keys())
        except (OSError, ValueError, KeyError, AttributeError):
            self.fail(f"cannot read the group {path}")
        for child in names:
            full = f"{path}/{child}"
            self.exists(full)
            rel = full[len(group) + 1:]
            obj = self.f.get(full)
            if isinstance(obj, h5py.Group) and any(e.startswith(rel + "/") for e in expected):
                self._walk(group, full, expected)
            elif not (isinstance(obj, h5py.Dataset) and rel in expected):
                self.fail(f"{full}: not a tensor of config_ini's model (a checkpoint of another model?)")


def _shape(dims):
    return "[" + ", ".join(str(d) for d in dims) + "]"


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
    need, available = 4.0 * settings.model_floats(c), memory_available()
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
    for name, shape in settings.buffer_tensors(c):
        full = f"/buffers/{name}"
        x = r.read_checked(full, shape, np.float32)
        if not np.isfinite(x).all():
            r.fail(f"{full} holds {float(x.reshape(-1)[np.flatnonzero(~np.isfinite(x))[0]]):g}: a checkpoint of "
                   "non-finite values is refused")
        out[name] = x
    r.unexpected("/buffers", {name for name, _ in settings.buffer_tensors(c)})
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
               if not (settings.added_later(col.name) and not r.exists(f"{group}/{col.name}"))]
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
        ck.attrs = _read_attributes(r)
        c, text = read_config(r)
        _check_model_fits(r, c)
        ck.attrs["config_ini"] = text
        ck.settings, ck.step = c, ck.attrs["step"]
        ck.config.read_dict(c.raw)
        if model:
            ck.params = _read_tensors(r, "/model", settings.model_tensors(c))
            if c.momentum_on:  # as the binary, which reads /buffers only then
                ck.buffers = _read_buffers(r, c)
        if optim:
            table = settings.model_tensors(c)
            ck.optim_m = _read_tensors(r, "/optim/m", table)
            ck.optim_v = _read_tensors(r, "/optim/v", table, nonnegative=True)
        if metrics:
            ck.train = read_metric_table(r, "/metrics/train", settings.metric_columns(c, "train"))
            ck.eval = read_metric_table(r, "/metrics/eval", settings.metric_columns(c, "eval"))
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


# ---------------------------------------------------------------- runs for the tools
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
    ck = _read_checkpoint(path, model=True, metrics=True)
    run.config = ck.config
    run.step = run.ckpt_step = ck.step
    run.attrs = dict(ck.attrs)
    run.train, run.eval = ck.train, ck.eval
    run.files.append(path)
    L = ck.settings.get("model.n_layers")
    gammas = [ck.params.get(f"blocks/{i}/attn/momentum_gamma") for i in range(L)]
    if all(g is not None for g in gammas) and gammas:
        run.gamma, run.gamma_source = np.vstack([np.asarray(g, float) for g in gammas]), "learned"


def read_metrics_file(path):
    """(Config, train, eval) of a live metrics.h5, checked as `momfmm inspect` checks it: no
    `format` attribute and no /model (a checkpoint is not a metrics file), a valid config_ini, a
    /metrics group, the columns of the config's tables (the rows every column holds: the writer
    extends one column after another). Raises RunError."""
    with Reader(path, "metrics file", swmr=True) as r:
        if r.has_attr("format"):
            r.fail("has a root attribute 'format': not a metrics file")
        if r.exists("/model"):
            r.fail("has a /model group: not a metrics file")
        c, _ = read_config(r)
        if not r.exists("/metrics"):
            r.fail("no /metrics group: not a metrics file")
        train = read_metric_table(r, "/metrics/train", settings.metric_columns(c, "train"), live=True)
        evals = read_metric_table(r, "/metrics/eval", settings.metric_columns(c, "eval"), live=True)
    return c, train, evals


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
