"""Tasks of docs/tasks.md §2 beyond chain and copy: `text` (byte-level LM on a corpus
that Debian ships: Python's pydoc topics, package libpython3.11-stdlib) and
`listops` (the LRA generator, and LRA TSV files), with their input errors; and
`momfmm data --show` (docs/cli.md §5) on the chain task's variants: what it prints is
what the chain rules say (periods in their range, fillers uncounted); bad chain keys are
one-line errors naming the file and the key."""
import math
import os
import re

import pytest

from common import load_newest, run, tiny_config, write_config

CORPUS = "/usr/lib/python3.11/pydoc_data/topics.py"
LISTOPS = {"model.vocab_size": 16, "model.causal": False, "model.head": "cls", "model.n_classes": 10,
           "data.task": "listops", "data.seq_len": 64, "data.listops_min_len": 8, "data.listops_max_len": 64,
           "data.listops_max_depth": 3, "train.steps": 10, "train.batch_size": 8, "train.eval_interval": 10}


def final(out_dir):
    ck = load_newest(out_dir, optim=False)
    return {k: ck.eval[k][-1] for k in ("loss", "acc")}, ck.train["loss"]


CHAIN_VARIANTS = {"model.vocab_size": 40, "data.seq_len": 48, "data.chain_len": 4, "data.chain_len_max": 9,
                  "data.chain_noise": 0.2, "data.chain_fillers": 6, "data.eval_chain_len": 12,
                  "data.eval_chain_len_max": 14, "train.batch_size": 4}
SAMPLE = re.compile(r"^sample (\d+) \((step|batch) (\d+), row (\d+)\) \| period (\d+) \| (\d+) of (\d+) targets counted\n"
                    r"  inputs +([\d -]+)\n  targets +([\d -]+)$", re.M)


def chain_row_ok(inputs, targets, L, first_filler):
    """docs/tasks.md §2: chain tokens cycle with period L, fillers at or above first_filler,
    a target is - exactly where the next input is a filler, else that input."""
    chain = [x for x in inputs if x < first_filler]
    cycles = all(chain[i] == chain[i % L] for i in range(len(chain))) and len(set(chain[:L])) == min(L, len(chain))
    marks = all((t == "-") == (nxt >= first_filler) and (t == "-" or int(t) == nxt)
                for t, nxt in zip(targets, inputs[1:]))
    return cycles and marks


def test_data_show(momfmm, workdir, report):
    out = os.path.join(workdir, "data_show")
    cfg = write_config(out + ".ini", tiny_config(out, **CHAIN_VARIANTS))
    first_filler = 40 - 6
    for split, lo, hi, n in (("train", 4, 9, 7), ("eval", 4, 9, 3), ("lengen", 12, 14, 3)):
        r = run([momfmm, "data", cfg, "--show", str(n), "--split", split])
        samples = SAMPLE.findall(r.stdout)
        report.check(f"data --show {n} --split {split}: exit 0, {n} samples", r.returncode == 0 and len(samples) == n,
                     f"rc {r.returncode}, {len(samples)} parsed: {r.stdout[:300]!r} {r.stderr[:200]!r}")
        periods = [int(s[4]) for s in samples]
        report.check(f"data --split {split}: periods in [{lo}, {hi}]", periods and all(lo <= p <= hi for p in periods),
                     f"{periods}")
        rows_ok = all(chain_row_ok([int(x) for x in s[7].split()], s[8].split(), int(s[4]), first_filler)
                      for s in samples)
        report.check(f"data --split {split}: rows follow the chain, fillers uncounted", rows_ok)
        if split == "train":  # sample n is row n mod B of step 1 + n / B, as the run takes them
            places = [(int(s[2]), int(s[3])) for s in samples]
            report.check("data --split train: samples in the order of the run", places == [
                (1 + i // 4, i % 4) for i in range(n)], f"{places}")
    plain = write_config(out + "_plain.ini", tiny_config(out + "_plain"))
    r = run([momfmm, "data", plain, "--split", "lengen"])
    report.check("data --split lengen without data.eval_chain_len: exit 2 naming the key",
                 r.returncode == 2 and "data.eval_chain_len" in r.stderr, f"rc {r.returncode} {r.stderr[:200]!r}")
    r = run([momfmm, "data", plain, "--split", "test"])
    report.check("data --split test: exit 2", r.returncode == 2 and "train, eval or lengen" in r.stderr,
                 f"rc {r.returncode}")


# Bad chain keys (docs/tasks.md §2): each a one-line error naming the file and the key, exit 2,
# from `momfmm data` and `momfmm train` alike (the same config check).
CHAIN_BAD = [({"data.chain_len": 10, "data.chain_len_max": 9}, "data.chain_len_max = 9 is below data.chain_len = 10"),
             ({"data.chain_noise": 0.95}, "data.chain_noise = 0.95 is out of range"),
             ({"data.chain_noise": 0.2, "data.chain_fillers": 64}, "data.chain_fillers = 64 leaves no chain token"),
             ({"model.vocab_size": 64, "data.chain_noise": 0.2, "data.chain_fillers": 60, "data.chain_len": 5},
              "data.chain_len = 5 exceeds the 4 chain tokens"),
             ({"data.eval_chain_len": 12, "data.eval_chain_len_max": 11}, "data.eval_chain_len_max = 11 is below")]


def test_chain_bad_keys(momfmm, workdir, report):
    for i, (keys, want) in enumerate(CHAIN_BAD):
        out = os.path.join(workdir, f"chain_bad{i}")
        cfg = write_config(out + ".ini", tiny_config(out, **keys))
        for command in (["data", cfg, "--show", "1"], ["train", cfg]):
            r = run([momfmm] + command)
            lines = r.stderr.strip().splitlines()
            report.check(f"momfmm {command[0]} with {keys}: exit 2, one line naming the file and '{want}'",
                         r.returncode == 2 and len(lines) == 1 and cfg in lines[0] and want in lines[0]
                         and not os.path.exists(out), f"rc {r.returncode}: {r.stderr[:300]!r}")


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
