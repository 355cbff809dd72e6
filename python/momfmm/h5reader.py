"""The hostile-file reader of momfmm's Python side (docs/design.md §8.8), as src/hdf5/h5reader.c
is the binary's: an HDF5 file open for reading where every link on the way to an object is a
hard link (no external, soft or user-defined link, no external raw storage, no virtual dataset),
every declared size is bounded before it is read (2^31 elements, the bytes stored, a compressed
dataset's expansion, the memory available) and every failure is a RunError naming the file.
momfmm.h5 reads momfmm's files (checkpoints, metrics, tokens) through it.
"""
import h5py
import numpy as np

from momfmm.files import RunError, check_input, escape_controls, is_locked

# Bounds on what a file may declare before anything is read for it (src/hdf5/h5reader.c).
MAX_ATTR_STRING = 1 << 26
MAX_DATASET_ELEMENTS = 1 << 31
MAX_FILTER_RATIO = 256
MAX_FILTERED_BYTES_FREE = 16 << 20
NUL = b"\0"


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
def _not_hdf5_reason(path):
    """Why a file HDF5 does not recognise is not one, from its first bytes (src/hdf5/h5reader.c):
    a config given in a checkpoint's place reads "a text file", not "corrupt"."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        head = b"\0"  # unreadable now: the generic reason, as the binary gives it
    if not head:
        return "an empty file, not an HDF5 file"
    if b"\0" not in head:
        return "a text file, not an HDF5 file"
    return "not an HDF5 file (truncated or corrupt, or another format)"


class Reader:
    """An HDF5 file open for reading with the checks of src/hdf5/h5reader.c; every failure raises
    RunError "<path>: <what is wrong>". Use as a context manager."""

    def __init__(self, path, what="checkpoint", swmr=False):
        self.path = path
        check_input(path, what)
        if not h5py.is_hdf5(path):
            self.fail(_not_hdf5_reason(path))
        self.f = None
        # the other mode second, as h5reader.c: an old file opens only without SWMR, a live one
        # (a run writing metrics.h5) only with it, and a live file in another kind's place is
        # then named by its kind, not "corrupt?"
        live = {"libver": "latest", "swmr": True}
        for kwargs in ([live, {}] if swmr else [{}, live]):
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
            self.fail(f"{name} has shape {shape_text(got)}, expected {shape_text(shape)}")
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


def shape_text(dims):
    return "[" + ", ".join(str(d) for d in dims) + "]"
