"""What the hostile-input modules share (test_fuzz.py, test_fuzz_files.py;
docs/files.md §4): a tiny trained checkpoint with its config and a good token
file, the exit-code assertion and the copy-and-mutate helpers for HDF5 files."""
import os
import shutil

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
