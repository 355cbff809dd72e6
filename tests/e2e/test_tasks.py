"""Tasks of docs/tasks.md §2 beyond chain and copy: `text` (byte-level LM on a corpus
that Debian ships: Python's pydoc topics, package libpython3.11-stdlib) and
`listops` (the LRA generator, and LRA TSV files), with their input errors."""
import math
import os

import pytest

from common import load_newest, run, tiny_config, write_config

CORPUS = "/usr/lib/python3.11/pydoc_data/topics.py"
LISTOPS = {"model.vocab_size": 16, "model.causal": False, "model.head": "cls", "model.n_classes": 10,
           "data.task": "listops", "data.seq_len": 64, "data.listops_min_len": 8, "data.listops_max_len": 64,
           "data.listops_max_depth": 3, "train.steps": 10, "train.batch_size": 8, "train.eval_interval": 10}


def final(out_dir):
    ck = load_newest(out_dir, optim=False)
    return {k: ck.eval[k][-1] for k in ("loss", "acc")}, ck.train["loss"]


def test_text(momfmm, workdir, report):
    out = os.path.join(workdir, "text")
    cfg = write_config(out + ".ini", tiny_config(out, **{
        "model.vocab_size": 256, "data.task": "text", "data.path": CORPUS, "data.seq_len": 32,
        "data.eval_fraction": 0.05, "train.steps": 60, "train.batch_size": 8, "train.eval_interval": 60}))
    r = run([momfmm, "train", cfg])
    assert r.returncode == 0, f"text: trains on {CORPUS}: {r.stderr}"
    metrics, losses = final(out)
    bpb = metrics["loss"] / math.log(2)
    report.check("text: eval bits per byte below uniform (8)", bpb < 6.5, f"{bpb:.3f} bits/byte")
    report.check("text: train loss falls", losses[-1] < losses[0] - 0.5, f"{losses[0]:.3f} -> {losses[-1]:.3f}")


@pytest.mark.parametrize("kind", ("softmax", "fmm"))
def test_listops_generator(momfmm, workdir, kind):
    out = os.path.join(workdir, "listops_" + kind)
    cfg = write_config(out + ".ini", tiny_config(out, **LISTOPS, **{"attention.kind": kind}))
    r = run([momfmm, "train", cfg])
    ok = r.returncode == 0
    if ok:
        metrics, _ = final(out)
        ok = 0 <= metrics["acc"] <= 1 and math.isfinite(metrics["loss"])
    assert ok, f"listops generator, {kind} attention, cls head: {r.stderr}"


def test_listops_tsv(momfmm, workdir):
    tsv = os.path.join(workdir, "listops.tsv")
    with open(tsv, "w") as f:
        f.write("Source\tTarget\n")
        for i in range(40):
            f.write(f"( ( [MAX {i % 10} 3 ) [MIN 4 {9 - i % 10} ] ] )\t{max(i % 10, 3, min(4, 9 - i % 10))}\n")
    out = os.path.join(workdir, "listops_tsv")
    cfg = write_config(out + ".ini", tiny_config(out, **LISTOPS, **{"data.path": tsv, "data.eval_fraction": 0.25}))
    r = run([momfmm, "train", cfg])
    assert r.returncode == 0, f"listops from an LRA TSV file: {r.stderr}"


def test_input_errors(momfmm, workdir, report):
    w = workdir
    out = os.path.join(w, "listops_errors")
    bad = os.path.join(w, "bad.tsv")
    with open(bad, "w") as f:
        f.write("Source\tTarget\n[MAX 1 2 ] 2\n")
    cfg = write_config(os.path.join(w, "bad.ini"), tiny_config(out, **LISTOPS, **{"data.path": bad}))
    r = run([momfmm, "train", cfg])
    report.check("TSV row without a tab: exit 3 naming file and line", r.returncode == 3 and "bad.tsv:2" in r.stderr,
                 r.stderr.strip())
    short = os.path.join(w, "short.txt")
    with open(short, "w") as f:
        f.write("too short")
    cfg = write_config(os.path.join(w, "short.ini"), tiny_config(out, **{
        "model.vocab_size": 256, "data.task": "text", "data.path": short}))
    r = run([momfmm, "train", cfg])
    report.check("text file too short: exit 3", r.returncode == 3 and "short.txt" in r.stderr, r.stderr.strip())
    cfg = write_config(os.path.join(w, "missing.ini"), tiny_config(out, **{
        "model.vocab_size": 256, "data.task": "text", "data.path": os.path.join(w, "nope.txt")}))
    r = run([momfmm, "train", cfg])
    report.check("text file missing: exit 3", r.returncode == 3 and "nope.txt" in r.stderr, r.stderr.strip())
