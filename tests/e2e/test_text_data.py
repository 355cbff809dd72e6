"""Text corpora of docs/tasks.md §2 and gain_R of docs/metrics.md §3 through the
momfmm binary: `data.path` as a directory or a comma-separated list, refused
inputs (exit 3 naming the path, no hang on a FIFO), the same losses at 1 and
2 ranks on a multi-document corpus, and the same gain_R at 1, 2 and 3 ranks.

Run with MOMFMM_BIN=<build>/momfmm /usr/bin/python3 -m pytest <this file>;
MPIEXEC names mpirun if it is not on PATH."""
import os
import random
import re
import stat

import h5py
import numpy as np
import pytest
from momfmm.h5 import newest_checkpoint

from common import MPIRUN, run, write_config


def mpirun(np_):
    return MPIRUN + ["-np", str(np_)]


def write_ini(path, out_dir, data_path, **overrides):
    """A tiny byte-level model on data_path; overrides as section_key=value."""
    sections = {
        "model": {"vocab_size": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64},
        "data": {"task": "text", "seq_len": 32, "path": data_path, "eval_fraction": 0.3},
        "train": {"steps": 6, "batch_size": 6, "lr": 3e-3, "warmup": 1, "log_interval": 1, "eval_interval": 6,
                  "eval_batches": 2, "out_dir": out_dir},
    }
    for key, value in overrides.items():
        section, name = key.split("_", 1)
        sections[section][name] = value
    return write_config(str(path), sections)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """docs/: five documents of 1-3 kB (two in a sub-directory) and a hidden file."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(5)
    words = ["the", "momentum", "of", "a", "field", "is", "multipole", "attention", "and", "token", "\n"]
    docs = root / "docs"
    (docs / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt", "sub/d.txt", "e.txt"):
        (docs / name).write_text(" ".join(rng.choice(words) for _ in range(rng.randint(200, 500))))
    (docs / ".hidden").write_text("never read " * 100)
    return docs


def test_directory_corpus_trains(momfmm, corpus, tmp_path):
    out = tmp_path / "out"
    r = run([momfmm, "train", write_ini(tmp_path / "t.ini", str(out), str(corpus))])
    assert r.returncode == 0, r.stderr
    with h5py.File(newest_checkpoint(out), "r") as f:
        assert np.isfinite(f["metrics/eval/loss"][-1])


def test_comma_list_trains(momfmm, corpus, tmp_path):
    spec = ",".join(str(corpus / n) for n in ("a.txt", "sub", "e.txt"))
    r = run([momfmm, "train", write_ini(tmp_path / "t.ini", str(tmp_path / "out"), spec)])
    assert r.returncode == 0, r.stderr


def refused(momfmm, tmp_path, data_path):
    r = run([momfmm, "train", write_ini(tmp_path / "bad.ini", str(tmp_path / "out"), data_path)], timeout=60)
    return r.returncode, r.stderr


def test_missing_file_exit_3(momfmm, tmp_path):
    code, err = refused(momfmm, tmp_path, str(tmp_path / "nope.txt"))
    assert code == 3 and "nope.txt" in err, err


def test_empty_file_exit_3(momfmm, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    code, err = refused(momfmm, tmp_path, str(tmp_path / "empty.txt"))
    assert code == 3 and "empty.txt" in err and "empty" in err, err


def test_fifo_exit_3_without_blocking(momfmm, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    code, err = refused(momfmm, tmp_path, str(tmp_path / "pipe"))
    assert code == 3 and "pipe" in err and "not a regular file" in err, err


def test_empty_directory_exit_3(momfmm, tmp_path):
    (tmp_path / "hollow").mkdir()
    (tmp_path / "hollow" / ".only_hidden").write_text("x" * 1000)
    code, err = refused(momfmm, tmp_path, str(tmp_path / "hollow"))
    assert code == 3 and "hollow" in err, err


def test_missing_item_of_a_list_exit_3(momfmm, corpus, tmp_path):
    code, err = refused(momfmm, tmp_path, f"{corpus / 'a.txt'},{tmp_path / 'gone.txt'}")
    assert code == 3 and "gone.txt" in err, err


def test_unreadable_file_exit_3(momfmm, corpus, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files without read permission")
    locked = tmp_path / "locked.txt"
    locked.write_text("x" * 1000)
    locked.chmod(0)
    code, err = refused(momfmm, tmp_path, f"{corpus},{locked}")
    locked.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert code == 3 and "locked.txt" in err, err


def test_same_losses_at_1_and_2_ranks(momfmm, corpus, tmp_path):
    losses = {}
    for np_ in (1, 2):
        out = tmp_path / f"np{np_}"
        r = run(mpirun(np_) + [momfmm, "train", write_ini(tmp_path / f"np{np_}.ini", str(out), str(corpus))])
        assert r.returncode == 0, r.stderr
        with h5py.File(newest_checkpoint(out), "r") as f:
            losses[np_] = (f["metrics/train/loss"][()], f["metrics/eval/loss"][()])
    np.testing.assert_allclose(losses[2][0], losses[1][0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(losses[2][1], losses[1][1], rtol=0, atol=1e-5)


def test_gain_r_independent_of_rank_count(momfmm, corpus, tmp_path):
    out = tmp_path / "out"
    r = run([momfmm, "train", write_ini(tmp_path / "t.ini", str(out), str(corpus), train_eval_readouts="true")])
    assert r.returncode == 0, r.stderr
    checkpoint = newest_checkpoint(out)
    gains = {}
    for np_ in (1, 2, 3):
        r = run(mpirun(np_) + [momfmm, "eval", checkpoint])
        assert r.returncode == 0, r.stderr
        line = re.search(r"^gain_R((?: [-+0-9.eE]+)+)$", r.stdout, re.M)
        assert line, r.stdout
        gains[np_] = np.array(line.group(1).split(), dtype=float)
    for np_ in (2, 3):
        np.testing.assert_allclose(gains[np_], gains[1], rtol=0, atol=2e-4, err_msg=f"gain_R at np = {np_} vs np = 1")
    with h5py.File(checkpoint, "r") as f:  # the logged eval of the run at np = 1
        np.testing.assert_allclose(f["metrics/eval/gain_R"][-1], gains[1], atol=1e-4)
