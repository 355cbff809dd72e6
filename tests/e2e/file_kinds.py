"""One file of each of momfmm's HDF5 kinds, and what each is called where another kind is
expected (docs/files.md §4, another of momfmm's files), for test_bad_input and
test_bad_input_mpi. The names are written out here, not imported from momfmm.h5, so that the
binary's and the Python reader's texts are both checked against the docs'."""
import os

import h5py
import numpy as np

from common import run, tiny_config, write_config, write_tokens

KIND_NAMES = {
    "checkpoint": "a checkpoint",
    "metrics": "a run's live metrics (metrics.h5)",
    "grads": "a gradient file (momfmm loss --grads)",
    "logits": "a logits file (momfmm logits --out)",
    "loss_tokens": "a token file of /inputs and /targets (momfmm loss)",
    "tokens": "a token file of /tokens (momfmm logits, data.path)",
}


def make_kinds(momfmm, d):
    """(ini, {kind: path}): one file of each kind of KIND_NAMES in directory d, and the config of
    the two-step run that wrote the checkpoint and metrics file."""
    ini = write_config(os.path.join(d, "kinds.ini"), tiny_config(os.path.join(d, "run"), **{"train.steps": 2}))
    r = run([momfmm, "train", ini])
    assert r.returncode == 0, r.stderr
    files = {"checkpoint": os.path.join(d, "run", "ckpt_00000002.h5"), "metrics": os.path.join(d, "run", "metrics.h5"),
             "loss_tokens": write_tokens(os.path.join(d, "loss.h5"), np.ones((2, 8)), np.ones((2, 8))),
             "grads": os.path.join(d, "grads.h5"), "logits": os.path.join(d, "logits.h5"),
             "tokens": os.path.join(d, "ids.h5")}
    with h5py.File(files["tokens"], "w") as f:
        f["tokens"] = np.arange(8, dtype=np.int32)
    for args in (["loss", files["checkpoint"], files["loss_tokens"], "--grads", files["grads"]],
                 ["logits", files["checkpoint"], files["tokens"], "--out", files["logits"]]):
        r = run([momfmm] + args)
        assert r.returncode == 0, r.stderr
    return ini, files
