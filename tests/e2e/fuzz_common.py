"""What the hostile-input modules share (test_fuzz.py, test_fuzz_files.py,
test_checkpoint_files.py; docs/files.md §4): a tiny trained checkpoint with its
config and a good token file, the exit-code assertion, the copy-and-mutate
helpers for HDF5 files, and the Python readers' verdict on the same files
(docs/design.md §8.8: momfmm.pt.load refuses exactly what `momfmm eval` refuses, the
report tool exactly what `momfmm inspect` refuses, momfmm.h5.load_tokens what
`momfmm loss` refuses)."""
import contextlib
import io
import os
import shutil
import signal
import time

import h5py
import numpy as np
import pytest

from common import run, write_tokens

TIMEOUT_S = 60
TINY = """[model]
vocab_size = 32
d_model = 32
n_heads = 4
n_layers = 1
d_ff = 64
[momentum]
gamma = 0.2
[data]
seq_len = 16
chain_len = 5
[train]
steps = 4
batch_size = 4
log_interval = 1
eval_interval = 0
eval_batches = 1
ckpt_interval = 1
keep = 2
out_dir = {out}
"""
# the commands that read a checkpoint
COMMANDS = [("inspect",), ("eval",), ("generate", "--prompt", "1,2")]
# damage to /metrics only: loss, eval and generate do not read it (docs/files.md §4)
METRICS = " (metrics)"
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error", "ERROR: LeakSanitizer")


def assert_refused(r, what, codes=(2, 3)):
    for mark in SANITIZER_MARKS:
        assert mark not in r.stderr, f"{what}: sanitizer report:\n{r.stderr[-2000:]}"
    assert r.returncode in codes, (f"{what}: exit {r.returncode}, expected {codes}: "
                                   f"{(r.stderr or r.stdout)[-600:]}")
    assert r.stderr.strip(), f"{what}: no message"


@pytest.fixture(scope="module")
def base(momfmm, workdir):
    """A trained tiny checkpoint (with metrics), its config and a good token file."""
    d = os.path.join(workdir, "base")
    os.makedirs(d, exist_ok=True)
    ini = os.path.join(d, "tiny.ini")
    with open(ini, "w") as f:
        f.write(TINY.format(out=os.path.join(d, "run")))
    r = run([momfmm, "train", ini, "--set", "train.steps=2", "--set", "train.eval_interval=1"], timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    ck = os.path.join(d, "run", "ckpt_00000002.h5")
    tok = os.path.join(d, "tok.h5")
    write_tokens(tok, np.ones((2, 8)), np.ones((2, 8)))
    return d, ini, ck, tok


# ---- generators: each returns a description and mutates a copy in place ----

def replace_dataset(path, make):
    def mutate(f):
        del f[path]
        make(f, path)
    return mutate


def mutated_copy(src, dst, mutate):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        mutate(f)


# ---- the Python readers on the binary's hostile files ----

# the Python reader of each binary command: momfmm.pt.load reads what eval reads (attributes,
# config, /model, /buffers), the report tool what inspect reads (and /metrics)
PYTHON_READER = {"eval": "momfmm.pt.load", "inspect": "momfmm_report.py", "generate": "momfmm.pt.load"}


def python_verdicts(path):
    """{"momfmm.pt.load": code, "momfmm_report.py": code} for a checkpoint file: 0 when the Python
    reader reads it, 3 when it refuses it (files.RunError; the report tool's exit code, its main()
    run in this process). Any other exception is a bug of the reader and fails the test."""
    import momfmm.pt as mt
    from momfmm import files, report
    out = {}
    try:
        mt.load(path)
        out["momfmm.pt.load"] = 0
    except files.RunError:
        out["momfmm.pt.load"] = 3
    err = io.StringIO()
    sigpipe = signal.getsignal(signal.SIGPIPE)  # main() restores SIGPIPE's default, for `| head`
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            out["momfmm_report.py"] = report.main([path])
    finally:
        signal.signal(signal.SIGPIPE, sigpipe)
    lines = err.getvalue().strip().splitlines()
    assert out["momfmm_report.py"] == 0 or (len(lines) == 1 and path in lines[0]), \
        f"momfmm_report.py {path}: not one line naming the file: {err.getvalue()[-600:]!r}"
    return out


def verdict_mismatches(what, path, binary):
    """The Python readers against the binary's exit codes {command: code} on one file: a list of
    "what: reader reads/refuses, momfmm command refuses/reads" for every disagreement."""
    python = python_verdicts(path)
    out = []
    for command, code in binary.items():
        reader = PYTHON_READER.get(command)
        if reader is None:
            continue
        if (python[reader] != 0) != (code != 0) or python[reader] not in (0, 3):
            out.append(f"{what}: {reader} exits {python[reader]}, momfmm {command} exits {code}")
    return out


def tokens_mismatch(what, path, ckpt, code):
    """momfmm.h5.load_tokens with the model of `ckpt` against `momfmm loss ckpt path`'s exit
    code: None when both read or both refuse, else the disagreement."""
    from momfmm import files, h5
    settings = h5.load_checkpoint(ckpt, optim=False, metrics=False).settings
    try:
        h5.load_tokens(path, settings)
        python = 0
    except files.RunError:
        python = 3
    return None if (python != 0) == (code != 0) else f"{what}: load_tokens exits {python}, momfmm loss exits {code}"


def timed(momfmm, args, timeout=TIMEOUT_S, **kw):
    start = time.time()
    r = run([momfmm, *args], timeout=timeout, **kw)
    return r, time.time() - start


def refused(report, what, r, seconds, code, *needles, within=20):
    """A named check: exit `code` within `within` s, one line naming every needle, no sanitizer report."""
    msg = r.stderr.strip()
    lines = [l for l in msg.splitlines() if l.startswith("momfmm:")]
    ok = (r.returncode == code and seconds < within and all(n in msg for n in needles) and len(lines) == 1
          and not any(mark in r.stderr for mark in SANITIZER_MARKS))
    report.check(what, ok, f"rc {r.returncode} (want {code}) in {seconds:.1f} s: {msg[-400:]!r}")


# A text-task config (data.path, train.out_dir to fill in).
TEXT = """[model]
vocab_size = 256
d_model = 32
n_heads = 4
n_layers = 1
d_ff = 64
[data]
task = text
seq_len = 32
path = {path}
[train]
steps = 2
batch_size = 4
log_interval = 1
eval_interval = 2
eval_batches = 1
out_dir = {out}
"""
