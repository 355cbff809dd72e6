"""The files the Python tools read and write, and the names in a run directory (docs/files.md §4;
docs/design.md §8.8). Imports nothing of the package, so every module may use it:

- the errors a tool's main() turns into one line and an exit code (docs/cli.md §5): RunError, a
  missing, corrupt or incompatible file (exit 3, EXIT_BAD_FILE); ArgumentError, a value or
  argument of the user's that does not fit (exit 2, EXIT_USAGE);
- checkpoint names: checkpoint_step parses a name, list_checkpoints lists and orders a run
  directory's checkpoints by step, numerically: the one place that decides what a checkpoint's
  name is;
- input: open_input opens a file for reading without blocking (O_NONBLOCK) and refuses anything
  but a regular file (a FIFO, device, socket or directory) by the opened descriptor; read_input
  reads one whole;
- output: output_path gives the path to write a new file's content to, in a private directory
  beside it, renamed over the destination when done: never written through a symbolic link or
  into a FIFO or device, never left half-written; write_bytes and write_text use it.
"""
import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile

EXIT_USAGE = 2
EXIT_BAD_FILE = 3


def escape_controls(text):
    """A message with its control bytes as \\xNN (src/base/status.c status_escape_controls): one line,
    and no terminal escape sequence from a file's bytes."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)


class RunError(Exception):
    """A file is missing, corrupt or incompatible (exit 3); str() is the one-line message,
    naming the file."""


class ArgumentError(Exception):
    """A value or argument given by the user does not fit (exit 2); str() is the one-line
    message, naming it."""


# ---------------------------------------------------------------- checkpoint names
CHECKPOINT_DIGITS = 8          # the step is zero-padded to 8 digits: ckpt_%08lld.h5
STEP_MAX = (1 << 63) - 1       # a step is a 64-bit signed integer (the `step` attribute)
_CHECKPOINT = re.compile(r"ckpt_([0-9]{8,19})\.h5", re.ASCII)


def checkpoint_name(step):
    """The file name of the checkpoint of `step` (docs/files.md §4): ckpt_<step>.h5, the step in
    decimal, zero-padded to 8 digits (ckpt_00000600.h5; ckpt_100000000.h5 past 10^8)."""
    return f"ckpt_{step:0{CHECKPOINT_DIGITS}d}.h5"


def checkpoint_step(name):
    """The step a file name stands for, or None when it is not a checkpoint's name. A name is a
    checkpoint's exactly when it is checkpoint_name(step) of a step in [0, 2^63 - 1]: "ckpt_",
    the step's ASCII digits zero-padded to 8 (at least 8 digits, no zero before a 9th one),
    ".h5". So ckpt_00000100.h5 is step 100 and ckpt_123456789.h5 step 123456789, while
    ckpt_100.h5, ckpt_000000100.h5, ckpt_-1.h5, ckpt_+0000001.h5, ckpt_1e3.h5, ckpt_0000001a.h5,
    digits other than ASCII 0-9, a step above 2^63 - 1 (20 digits or more), other case
    (CKPT_..., .H5) and the temporaries ckpt_<step>.h5.tmp.<pid> are not checkpoints."""
    match = _CHECKPOINT.fullmatch(name)
    if not match:
        return None
    step = int(match.group(1))
    return step if step <= STEP_MAX and checkpoint_name(step) == name else None


def list_checkpoints(directory):
    """[(step, path)] of the checkpoint names in `directory` (checkpoint_step), oldest first:
    ordered by step as a number. Entries are listed whatever they are (a FIFO under a checkpoint's
    name is listed, and refused when read). Raises RunError when the directory cannot be listed."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise RunError(f"{directory}: cannot list the directory: {exc.strerror}") from None
    found = [(checkpoint_step(n), n) for n in names]
    return [(step, os.path.join(directory, n)) for step, n in sorted(f for f in found if f[0] is not None)]


# ---------------------------------------------------------------- input
def kind_of(mode):
    """What a file that is not a regular file is, for messages."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def open_input(path, what="file"):
    """`path` opened for reading (a binary file object) when it is a regular file; else RunError
    naming it. Never blocks and never opens a device: stat first; then open with O_NONBLOCK (a FIFO
    swapped in cannot block the open) and fstat the descriptor (what was opened is what is read)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise RunError(f"{path}: cannot open {what}: not a regular file but {kind_of(st.st_mode)}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise RunError(f"{path}: cannot open {what}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunError(f"{path}: cannot open {what}: not a regular file but {kind_of(st.st_mode)}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_input(path, what="file"):
    """The os.stat_result of `path` when open_input accepts it (for readers that open the path
    themselves, as h5py does); else RunError."""
    with open_input(path, what) as f:
        return os.fstat(f.fileno())


def read_input(path, what="file", limit=None):
    """The bytes of the regular file `path` (open_input); RunError naming it when it cannot be
    read or holds more than `limit` bytes."""
    with open_input(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise RunError(f"{path}: {size} bytes, more than the {limit} a {what} may hold")
        try:
            return f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            raise RunError(f"{path}: cannot read {what}: {exc.strerror}") from None


def is_locked(path):
    """Whether another process holds `path` open for writing with HDF5's file lock (an flock;
    src/hdf5/h5reader.c h5reader_is_locked). Only a regular file is opened (stat, then fstat of
    the descriptor, as open_input): a FIFO or device under a checkpoint's name is not locked."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# ---------------------------------------------------------------- output
def check_output(path, inputs=(), flag=None):
    """Refuses (ArgumentError, exit 2) an output path that is a symbolic link, exists and is not a
    regular file, or is one of `inputs` (the same file); `flag` (e.g. "--out") prefixes the
    message. A missing or regular file passes."""
    named = f"{flag} {path}" if flag else path
    if path == "":
        raise ArgumentError(f"{flag + ': ' if flag else ''}an empty path names no file")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ArgumentError(f"{named}: cannot check the output: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ArgumentError(f"{named}: a symbolic link: outputs are not written through one "
                            "(name the file itself, or remove the link)")
    if not stat.S_ISREG(st.st_mode):
        raise ArgumentError(f"{named}: exists and is not a regular file but {kind_of(st.st_mode)}")
    for source in inputs:
        try:
            other = os.stat(source)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            raise ArgumentError(f"{named}: is the input {source}; choose another file")


def make_directory(path, flag=None):
    """Creates the directory `path` with its parents; ArgumentError (exit 2) when it exists and is
    not a directory, RunError (exit 3) when it cannot be created."""
    named = f"{flag} {path}" if flag else path
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ArgumentError(f"{named}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RunError(f"{named}: cannot create the directory: {exc.strerror}") from None


@contextlib.contextmanager
def output_path(path, inputs=(), flag=None):
    """The path to write the new content of `path` to, renamed over `path` when the block ends
    without an error (and removed when it does not):

        with output_path("out/figure.png") as tmp:
            fig.savefig(tmp)

    Before: check_output (a symbolic link, a FIFO, device or directory, or an input is refused,
    ArgumentError) and the parent directory is created. The content goes to a file in a fresh
    private directory beside `path` (tempfile.mkdtemp: a new name, mode 0700), so no link or FIFO
    can be put in its way; the rename replaces a regular file atomically, and at worst a link
    that appeared meanwhile, never what it points to. An OSError while writing or renaming is a
    RunError naming `path` (exit 3: a full disk, no permission)."""
    check_output(path, inputs, flag)
    parent = os.path.dirname(os.path.abspath(path))
    make_directory(parent)
    try:
        scratch = tempfile.mkdtemp(prefix=f".{os.path.basename(path)[:64]}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise RunError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        tmp = os.path.join(scratch, os.path.basename(path))
        try:
            yield tmp
        except OSError as exc:
            raise RunError(f"{path}: cannot write: {exc.strerror or exc}") from None
        check_output(path, inputs, flag)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise RunError(f"{path}: cannot write: {exc.strerror}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_bytes(path, data, inputs=(), flag=None):
    """Writes `data` to `path` through output_path."""
    with output_path(path, inputs, flag) as tmp:
        with open(tmp, "xb") as f:
            f.write(data)
    return path


def write_text(path, text, inputs=(), flag=None):
    """Writes `text` (UTF-8) to `path` through output_path."""
    return write_bytes(path, text.encode("utf-8", "surrogateescape"), inputs, flag)
