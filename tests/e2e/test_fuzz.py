"""Hostile input (docs/files.md §4, docs/cli.md §5): a seeded generator of
malformed checkpoints, token files and configs run against `loss`, `eval`,
`inspect`, `generate` and `train --resume`. Every case must end within its timeout
in exit 2 or 3: never a signal, never 0, never a sanitizer report (this module
runs in the ASan/UBSan build too). Plus the divergence guard (weights whose
products overflow → exit 4, the newest finite checkpoint kept, and at step 1 of a run
from step 0 not called a divergence; on_nonfinite = skip counts), the run
lock (a second concurrent run exits 2), and the overwrite refusals.

Classes of malformed checkpoints: array attributes in place of scalars,
attributes of the wrong type, negative step/tokens_seen/world_size, missing or
reshaped or float-typed tensors, declared-but-unstored datasets (10^9 rows of
metrics), a model too large for memory in config_ini, a FIFO. Token files:
huge declared shapes with small chunks (the element count overflows int), float
ids, wrong rank, ids out of range, declared-but-unstored rows. Configs: values
out of range, unknown keys, duplicates. Each malformed checkpoint and token file
goes to the Python readers too, which refuse it as the binary does
(fuzz_common.verdict_mismatches: momfmm.pt.load as eval, the report tool as
inspect; momfmm.h5.load_tokens as loss).

The later classes of hostile files are test_fuzz_files.py; the shared tiny
checkpoint and helpers are fuzz_common.py."""
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from common import run
from fuzz_common import (COMMANDS, METRICS, TIMEOUT_S, TINY, assert_refused, base, mutated_copy,  # noqa: F401 (base: a fixture)
                         python_verdicts, replace_dataset, tokens_mismatch, verdict_mismatches)

SEED = 16


# ---- generators: each returns a description and mutates a copy in place ----

def set_attr(name, value):
    def mutate(f):
        if name in f.attrs:
            del f.attrs[name]
        f.attrs[name] = value
    return f"attribute {name} = {value!r}", mutate


def del_attr(name):
    def mutate(f):
        del f.attrs[name]
    return f"no attribute {name}", mutate


def checkpoint_cases(rng):
    cases = [
        set_attr("format_version", np.array([1, 1], dtype="i4")),
        set_attr("format", np.array([b"momfmm-checkpoint", b"x"])),
        set_attr("step", np.array([1, 2, 3], dtype="i8")),
        set_attr("config_ini", np.array([b"[model]", b"d_model = 8"])),
        set_attr("step", np.int64(-5)),
        set_attr("tokens_seen", np.int64(-1)),
        set_attr("world_size", np.int32(0)),
        set_attr("world_size", np.int64(2**40)),
        set_attr("step", "five"),
        set_attr("format_version", np.float64(1.0)),
        set_attr("format_version", np.int32(99)),
        set_attr("format", "not-momfmm"),
        set_attr("config_ini", "[model]\nd_model = 65536\nvocab_size = 16777216\nn_heads = 4\n"),
        set_attr("config_ini", "[model]\nd_model = 7\n"),
        set_attr("config_ini", "[model]\nd_model = 32\nd_model = 64\n"),
        set_attr("config_ini", "[model]\nnot_a_key = 1\n"),
        set_attr("config_ini", "x" * 100000),
        del_attr("format"), del_attr("step"), del_attr("config_ini"),
        set_attr("momfmm_version", np.int32(3)),
        set_attr("momfmm_version", np.array([b"momfmm 0.2.0", b"x"])),
    ]
    tensor = "model/tok_emb"
    cases += [
        (f"{tensor} float64 [3, 3]", replace_dataset(tensor, lambda f, p: f.create_dataset(p, data=np.zeros((3, 3))))),
        (f"{tensor} declared [2^31, 32] unstored",
         replace_dataset(tensor, lambda f, p: f.create_dataset(p, shape=(2**31, 32), dtype="f4", chunks=(1, 32)))),
        (f"{tensor} a group", replace_dataset(tensor, lambda f, p: f.create_group(p))),
        ("no /model", lambda f: f.__delitem__("model")),
        ("metrics/train/step declares 10^9 rows" + METRICS,
         replace_dataset("metrics/train/step",
                         lambda f, p: f.create_dataset(p, shape=(10**9,), dtype="i8", chunks=(256,)))),
        ("metrics/train/step declares 3*10^7 rows" + METRICS,
         replace_dataset("metrics/train/step",
                         lambda f, p: f.create_dataset(p, shape=(3 * 10**7,), dtype="i8", chunks=(256,),
                                                       data=None))),
        ("metrics/train/step 2-D" + METRICS, replace_dataset("metrics/train/step",
                                                   lambda f, p: f.create_dataset(p, data=np.zeros((2, 2), "i8")))),
    ]
    # random: a random tensor of the model gets a random shape
    for _ in range(4):
        def mutate(f, shape=tuple(int(rng.integers(1, 40)) for _ in range(int(rng.integers(1, 4))))):
            names = []
            f["model"].visit(lambda n: names.append(n) if isinstance(f["model"][n], h5py.Dataset) else None)
            name = "model/" + names[int(rng.integers(len(names)))]
            del f[name]
            f.create_dataset(name, data=np.zeros(shape, "f4"))
        cases.append(("random tensor reshaped", mutate))
    return cases


def token_cases():
    def tokens(**datasets):
        def make(path):
            with h5py.File(path, "w") as f:
                for name, spec in datasets.items():
                    if callable(spec):
                        spec(f, name)
                    else:
                        f[name] = spec
        return make

    def declared(shape, dtype="i4", chunks=None):
        return lambda f, name: f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks)

    huge = declared((1, 2**32 + 1), chunks=(1, 1024))
    rows = declared((10**6, 16), chunks=(1, 16))
    ones = np.ones((2, 8), "i4")
    return [
        ("inputs/targets [1, 2^32+1] chunked", tokens(inputs=huge, targets=huge)),
        ("inputs/targets [2^31, 8] chunked", tokens(inputs=declared((2**31, 8), chunks=(1, 8)),
                                                    targets=declared((2**31, 8), chunks=(1, 8)))),
        ("inputs/targets 10^6 x 16 unstored", tokens(inputs=rows, targets=rows)),
        ("float ids", tokens(inputs=np.ones((2, 8), "f4"), targets=np.ones((2, 8), "f4"))),
        ("float targets", tokens(inputs=ones, targets=np.ones((2, 8), "f8"))),
        ("string ids", tokens(inputs=np.array([[b"a"] * 8] * 2), targets=ones)),
        ("1-D inputs", tokens(inputs=np.ones(8, "i4"), targets=np.ones(8, "i4"))),
        ("3-D inputs", tokens(inputs=np.ones((2, 8, 1), "i4"), targets=np.ones((2, 8, 1), "i4"))),
        ("ids out of range", tokens(inputs=np.full((2, 8), 99, "i4"), targets=ones)),
        ("negative ids", tokens(inputs=np.full((2, 8), -3, "i4"), targets=ones)),
        ("targets shape differs", tokens(inputs=ones, targets=np.ones((2, 7), "i4"))),
        ("no targets", tokens(inputs=ones)),
        ("empty", tokens(inputs=np.ones((0, 8), "i4"), targets=np.ones((0, 8), "i4"))),
        ("T beyond positions", tokens(inputs=np.ones((1, 100), "i4"), targets=np.ones((1, 100), "i4"))),
        ("scalar inputs", tokens(inputs=np.int32(1), targets=np.int32(1))),
    ]


def config_cases():
    return [
        ("model.d_model = 0", "model.d_model=0"), ("model.n_classes = 1", "model.n_classes=1"),
        ("train.lr = -1", "train.lr=-1"), ("train.lr = nan", "train.lr=nan"),
        ("data.seq_len = 2^40", "data.seq_len=1099511627776"), ("unknown key", "train.lrr=1"),
        ("train.on_nonfinite = maybe", "train.on_nonfinite=maybe"), ("no section", "lr=1"),
        ("momentum.beta = inf", "momentum.beta=inf"), ("train.keep = 0", "train.keep=0"),
        # ranges that train (docs/config.md §6): values that cannot are refused, saying why
        ("momentum.beta = 2", "momentum.beta=2"), ("momentum.beta = 1", "momentum.beta=1"),
        ("momentum.gamma = 1e18", "momentum.gamma=1e18"), ("momentum.gamma2 = -1e3", "momentum.gamma2=-1000"),
        ("fmm.eps = 0", "fmm.eps=0"), ("train.lr = 1e18", "train.lr=1e18"),
        ("train.lr x train.weight_decay >= 1", "train.weight_decay=1000"), ("train.steps = 2^53 + 2",
                                                                           "train.steps=9007199254740994"),
    ]




def run_all(momfmm, jobs, codes=(2, 3)):
    """Runs (description, args) jobs a few at a time: each run mostly waits for MPI's
    start-up, so this keeps the module's runtime down on two cores. Returns the
    CompletedProcess of each job."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run([momfmm, *job[1]], timeout=TIMEOUT_S), jobs))
    for (what, _), r in zip(jobs, results):
        assert_refused(r, what, codes)
    return results


def test_malformed_checkpoints(momfmm, base):
    d, ini, ck, tok = base
    rng = np.random.default_rng(SEED)
    cases = checkpoint_cases(rng)
    jobs, keys = [], []
    for i, (what, mutate) in enumerate(cases):
        bad = os.path.join(d, f"bad_ck_{i}.h5")
        mutated_copy(ck, bad, mutate)
        metrics_only = what.endswith(METRICS)
        for cmd in COMMANDS[:1] if metrics_only else COMMANDS:
            jobs.append((f"{cmd[0]} on {what}", (cmd[0], bad, *cmd[1:])))
            keys.append((i, cmd[0]))
        if not metrics_only:
            jobs.append((f"loss on {what}", ("loss", bad, tok)))
            keys.append((i, "loss"))
        out = os.path.join(d, f"resume_{i}")
        os.makedirs(out, exist_ok=True)
        jobs.append((f"train --resume on {what}", ("train", ini, "--set", f"train.out_dir={out}", "--resume", bad)))
        keys.append((i, "train"))
    results = run_all(momfmm, jobs)
    binary = {}
    for (i, command), r in zip(keys, results):
        binary.setdefault(i, {})[command] = r.returncode
    mismatches = []
    for i, (what, _) in enumerate(cases):
        mismatches += verdict_mismatches(what, os.path.join(d, f"bad_ck_{i}.h5"), binary[i])
    assert not mismatches, "the Python readers and the binary disagree:\n  " + "\n  ".join(mismatches)
    print(f"fuzz: {len(cases)} malformed checkpoints, {len(jobs)} runs, the Python readers agree on each")


def test_malformed_token_files(momfmm, base):
    d, _, ck, _ = base
    jobs = []
    for i, (what, make) in enumerate(token_cases()):
        path = os.path.join(d, f"bad_tok_{i}.h5")
        make(path)
        jobs.append((f"loss on token file with {what}", ("loss", ck, path)))
    results = run_all(momfmm, jobs, codes=(3,))
    mismatches = [tokens_mismatch(what, args[2], ck, r.returncode) for (what, args), r in zip(jobs, results)]
    mismatches = [m for m in mismatches if m]
    assert not mismatches, "momfmm.h5.load_tokens and momfmm loss disagree:\n  " + "\n  ".join(mismatches)
    print(f"fuzz: {len(jobs)} malformed token files, load_tokens agrees on each")


def test_special_files(momfmm, base):
    d, ini, ck, tok = base
    fifo = os.path.join(d, "fifo.h5")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    for cmd in COMMANDS:
        assert_refused(run([momfmm, cmd[0], fifo, *cmd[1:]], timeout=20), f"{cmd[0]} on a FIFO", codes=(3,))
    assert_refused(run([momfmm, "loss", ck, fifo], timeout=20), "loss on a FIFO token file", codes=(3,))
    assert python_verdicts(fifo) == {"momfmm.pt.load": 3, "momfmm_report.py": 3}, "the Python readers on a FIFO"
    assert tokens_mismatch("a FIFO token file", fifo, ck, 3) is None
    out = os.path.join(d, "fifo_run")
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(out, "ckpt_00000009.h5")):
        os.mkfifo(os.path.join(out, "ckpt_00000009.h5"))
    r = run([momfmm, "train", ini, "--set", f"train.out_dir={out}", "--resume", "auto"], timeout=20)
    assert_refused(r, "train --resume auto with a FIFO checkpoint", codes=(3,))
    assert "ckpt_00000009.h5" in r.stderr
    # a config that is a FIFO (would block) or a directory (would read as empty)
    for config, what in ((fifo, "a FIFO"), (d, "a directory")):
        r = run([momfmm, "init", config, "--out", os.path.join(d, "never.h5")], timeout=20)
        assert_refused(r, f"init with {what} as the config", codes=(2,))
        assert "not a regular file" in r.stderr


def test_malformed_configs(momfmm, base):
    d, ini, _, _ = base
    jobs = []
    for what, override in config_cases():
        jobs.append((f"train with {what}", ("train", ini, "--set", override)))
        jobs.append((f"init with {what}", ("init", ini, "--set", override, "--out", os.path.join(d, "never.h5"))))
    dup = os.path.join(d, "dup.ini")
    with open(dup, "w") as f:
        f.write(TINY.format(out=os.path.join(d, "dup")) + "lr = 1\nlr = 2\n")
    jobs.append(("duplicate key", ("train", dup)))
    print(f"fuzz: {run_all(momfmm, jobs, codes=(2,))} malformed configs")


def test_overwrite_refusals(momfmm, base):
    d, ini, ck, tok = base
    before = open(ck, "rb").read()
    assert_refused(run([momfmm, "loss", ck, tok, "--grads", ck], timeout=TIMEOUT_S), "--grads onto the checkpoint",
                   codes=(2,))
    assert_refused(run([momfmm, "loss", ck, tok, "--grads", tok], timeout=TIMEOUT_S), "--grads onto the token file",
                   codes=(2,))
    assert_refused(run([momfmm, "init", ini, "--out", ck], timeout=TIMEOUT_S), "init --out onto a checkpoint", codes=(2,))
    assert open(ck, "rb").read() == before, "the checkpoint changed"
    grads = os.path.join(d, "grads.h5")
    assert run([momfmm, "loss", ck, tok, "--grads", grads], timeout=TIMEOUT_S).returncode == 0
    assert_refused(run([momfmm, "loss", ck, tok, "--grads", grads], timeout=TIMEOUT_S), "--grads onto an existing file",
                   codes=(2,))
    assert run([momfmm, "loss", ck, tok, "--grads", grads, "--force"], timeout=TIMEOUT_S).returncode == 0
    fresh = os.path.join(d, "fresh.h5")
    assert run([momfmm, "init", ini, "--out", fresh], timeout=TIMEOUT_S).returncode == 0
    assert run([momfmm, "init", ini, "--out", fresh, "--force"], timeout=TIMEOUT_S).returncode == 0


def tiny_ini(d, name, **overrides):
    out = os.path.join(d, name)
    path = os.path.join(d, name + ".ini")
    with open(path, "w") as f:
        f.write(TINY.format(out=out))
    return path, out


def test_run_directory(momfmm, workdir):
    d = os.path.join(workdir, "rundir")
    os.makedirs(d, exist_ok=True)
    ini, out = tiny_ini(d, "a")
    assert run([momfmm, "train", ini], timeout=TIMEOUT_S).returncode == 0
    r = run([momfmm, "train", ini], timeout=TIMEOUT_S)
    assert_refused(r, "a second run over an earlier run's checkpoints", codes=(2,))
    assert "--overwrite" in r.stderr
    assert run([momfmm, "train", ini, "--resume", "auto"], timeout=TIMEOUT_S).returncode == 0
    r = run([momfmm, "train", ini, "--overwrite", "--set", "train.steps=1"], timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert sorted(n for n in os.listdir(out) if n.startswith("ckpt_")) == ["ckpt_00000001.h5"]
    # the lock: a long run holds it, a second one is refused naming the pid
    first = subprocess.Popen([momfmm, "train", ini, "--overwrite", "--set", "train.steps=100000",
                              "--set", "train.ckpt_interval=0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(os.path.join(out, "metrics.h5")):
            time.sleep(0.1)
        time.sleep(0.3)
        r = run([momfmm, "train", ini, "--resume", "auto"], timeout=TIMEOUT_S)
        assert_refused(r, "a second concurrent run", codes=(2,))
        assert f"pid {first.pid}" in r.stderr, r.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 0
    assert os.path.exists(os.path.join(out, "STOPPED")), "a signal stop leaves the STOPPED marker"
    # the lock went with the process
    r = run([momfmm, "train", ini, "--resume", "auto", "--set", "train.steps=1"], timeout=TIMEOUT_S)
    assert r.returncode == 0


def test_divergence_guard(momfmm, workdir):
    """Every config value trains (docs/config.md §6), so the guard is driven by weights: a
    checkpoint of finite weights whose products overflow float32 (LayerNorm's bias 1 and
    qkv weights of 3e38: every q, k and v is infinite) makes the next loss NaN."""
    d = os.path.join(workdir, "diverge")
    os.makedirs(d, exist_ok=True)
    ini, out = tiny_ini(d, "stop")
    assert run([momfmm, "train", ini, "--set", "train.steps=2"], timeout=TIMEOUT_S).returncode == 0
    huge = os.path.join(out, "ckpt_00000002.h5")
    with h5py.File(huge, "r+") as f:
        f["model/blocks/0/ln1/bias"][...] = np.float32(1)
        f["model/blocks/0/attn/qkv/weight"][...] = np.float32(3e38)
    r = run([momfmm, "train", ini, "--set", "train.steps=30", "--resume", "auto"], timeout=TIMEOUT_S)
    assert r.returncode == 4, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert "diverged at step 3" in r.stderr, r.stderr[-500:]
    kept = sorted(n for n in os.listdir(out) if n.startswith("ckpt_"))
    assert kept, "the last good checkpoints are kept"
    for name in kept:
        with h5py.File(os.path.join(out, name), "r") as f:
            for key in ("model/tok_emb", "model/head/weight"):
                assert np.isfinite(f[key][()]).all(), f"{name}: non-finite weights"
    # the first step of a run from step 0 has made no update: not called a divergence
    ini3, out3 = tiny_ini(d, "init")
    r = run([momfmm, "train", ini3, "--init", huge], timeout=TIMEOUT_S)
    assert r.returncode == 4 and "step 1 is not finite" in r.stderr and "no training diverged" in r.stderr and \
        "diverged at step" not in r.stderr, r.stderr[-500:]
    ini2, out2 = tiny_ini(d, "skip")
    os.makedirs(out2, exist_ok=True)
    shutil.copy(huge, out2)
    r = run([momfmm, "train", ini2, "--set", "train.on_nonfinite=skip", "--set", "train.steps=8", "--resume", "auto"],
            timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-500:]
    assert "update skipped" in r.stdout
    with h5py.File(os.path.join(out2, "ckpt_00000008.h5"), "r") as f:
        assert int(f.attrs["skipped_steps"]) > 0
        assert np.isfinite(f["model/tok_emb"][()]).all()
