"""Context parallelism (docs/design.md §8.12): a sequence cut across the ranks
of a context group trains the same model as one rank. Every case trains 6
steps at T = 512 or an uneven 509 and compares with np = 1: each step's loss
within 1e-6 relative and every /model tensor within 1e-5 (max |diff|), so
that a wrong gradient of any shard shows even where a loss curve would not.
One class per group, each its own CTest entry (e2e_context_<group>):

- TestFmm: momentum (beta, gamma2, learned gamma) with elu,tanh kernels, a band
  under 48 keys (rows) at T 509 on contexts 2, 3, 4 and the 2 x 2 grid; a band
  over 48 (tiles) at T 512; non-causal FMM; the three far-field scans
  (all-gather, exscan, ring) against each other.
- TestSoftmax: ring attention, causal (zigzag chunks) at T 509 on 2, 3, 4 and
  2 x 2; non-causal at T 512.
- TestTasks: the cls head (ListOps: the mean pool over the group), the text
  task (each rank reads its shard of the corpus), bf16 against its own np = 1.
- TestRunDirectory: a run trained at (D 1, C 4) resumes at (D 2, C 1) and back,
  to the same weights as an uninterrupted run; eval, eval --stream and loss on
  it; a band wider than a shard, np not a multiple of dist.context and dense
  softmax are refused with one line and exit 2.
"""
import os
import re

import numpy as np
import pytest
from momfmm.h5 import load_checkpoint, newest_checkpoint

from common import MPIRUN, env, run, unavailable, write_tiny_config, write_tokens

STEPS = 6
LOSS_RTOL = 1e-6
WEIGHT_ATOL = 1e-5


def model_keys(ck):
    return {k: v for k, v in ck.datasets().items() if k.startswith("model/")}


class Runs:
    def __init__(self, momfmm, workdir):
        self.momfmm = os.path.realpath(momfmm)
        self.workdir = os.path.abspath(workdir)

    def train(self, name, np_, context=1, resume=None, steps=STEPS, **overrides):
        sets = {"train.steps": steps, "train.batch_size": 2, "train.lr": 3e-3, "train.warmup": 1,
                "train.log_interval": 1, "train.eval_interval": steps, "train.eval_batches": 1,
                "train.ckpt_interval": 3, "train.keep": 4, "model.n_heads": 4, "dist.context": context,
                "data.seq_len": 512, "data.chain_len": 10}
        sets.update(overrides)
        ini, out_dir, _ = write_tiny_config(self.workdir, name, **sets)
        cmd = [self.momfmm, "train", ini] + (["--resume", resume] if resume else ["--overwrite"])
        r = run(MPIRUN + ["-np", str(np_)] + cmd, timeout=300, env=env())
        if r.returncode != 0:
            print(f"--- {name} np={np_} C={context} rc={r.returncode}\n{r.stdout[-1200:]}\n{r.stderr[-1200:]}")
        path = newest_checkpoint(out_dir) if r.returncode == 0 else None
        return r, path, out_dir


@pytest.fixture(scope="module")
def runs(momfmm, tmp_path_factory):
    return Runs(momfmm, tmp_path_factory.mktemp("context"))


def compare(report, label, ref_path, got):
    r, path, _ = got
    if not report.check(f"{label}: exits 0 with a checkpoint", r.returncode == 0 and path, f"rc {r.returncode}"):
        return
    a, b = load_checkpoint(ref_path), load_checkpoint(path)
    la, lb = np.asarray(a.train["loss"], float), np.asarray(b.train["loss"], float)
    rel = float(np.max(np.abs(la - lb) / np.abs(la))) if la.shape == lb.shape else float("inf")
    report.check(f"{label}: every step's loss within {LOSS_RTOL:g} relative of np = 1", rel <= LOSS_RTOL,
                 f"{len(lb)} steps, worst {rel:.2e}")
    ma, mb = model_keys(a), model_keys(b)
    worst, where = 0.0, ""
    for k in ma:
        d = float(np.max(np.abs(ma[k].astype(float) - mb[k]))) if k in mb and ma[k].shape == mb[k].shape else np.inf
        if d > worst:
            worst, where = d, k
    report.check(f"{label}: every weight within {WEIGHT_ATOL:g} of np = 1", worst <= WEIGHT_ATOL and ma.keys() == mb.keys(),
                 f"{len(mb)} tensors, worst {worst:.2e} ({where})")


def grid(report, runs, label, grids, T, **overrides):
    """np = 1, then each (np, context) of grids, compared."""
    base = runs.train(f"{label}_1", 1, **{"data.seq_len": T}, **overrides)
    if not report.check(f"{label}: np = 1 trains", base[1], f"rc {base[0].returncode}"):
        return
    for np_, context in grids:
        got = runs.train(f"{label}_{np_}x{context}", np_, context, **{"data.seq_len": T}, **overrides)
        compare(report, f"{label}, np {np_} context {context}, T {T}", base[1], got)


ALL_GRIDS = [(2, 2), (3, 3), (4, 4), (4, 2)]


class TestFmm:
    def test_momentum_band_on_rows(self, runs, report):
        grid(report, runs, "fmm_rows", ALL_GRIDS, 509, **{
            "attention.kind": "fmm", "fmm.bandwidth": 9, "fmm.kernels": "elu,tanh", "momentum.gamma": 0.3,
            "momentum.beta": 0.5, "momentum.gamma2": 0.2, "momentum.learn_gamma": True})

    def test_band_on_tiles(self, runs, report):
        grid(report, runs, "fmm_tiles", [(2, 2), (4, 4)], 512, **{
            "attention.kind": "fmm", "fmm.bandwidth": 60, "fmm.kernels": "elu,elu_flip", "momentum.gamma": 0.2})

    def test_non_causal(self, runs, report):
        grid(report, runs, "fmm_nc", [(3, 3)], 512, **{
            "attention.kind": "fmm", "fmm.bandwidth": 7, "model.causal": False, "momentum.gamma": 0.2})

    def test_scans_agree(self, runs, report):
        """The far field's prefix by all-gather (LASP-2), MPI's exscan and the ring (LASP): the same model."""
        fmm = {"attention.kind": "fmm", "fmm.bandwidth": 5, "data.seq_len": 512}
        ref = runs.train("scan_allgather", 4, 4, **fmm)
        for method in ("exscan", "ring"):
            compare(report, f"dist.context_scan = {method} vs allgather", ref[1],
                    runs.train(f"scan_{method}", 4, 4, **{"dist.context_scan": method}, **fmm))


class TestSoftmax:
    def test_ring_causal_zigzag(self, runs, report):
        grid(report, runs, "ring", ALL_GRIDS, 509, **{"attention.kind": "softmax", "momentum.gamma": 0.2,
                                                       "momentum.beta": 0.3})

    def test_ring_non_causal(self, runs, report):
        grid(report, runs, "ring_nc", [(2, 2), (3, 3)], 512, **{"attention.kind": "softmax", "model.causal": False})


def text_corpus(workdir):
    path = os.path.join(workdir, "corpus.txt")
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "shard", "ring", "halo", "scan", "carry", "state"]
    with open(path, "w") as f:
        for _ in range(4000):
            f.write(" ".join(rng.choice(words, size=12)) + ".\n")
    return path


class TestTasks:
    def test_cls_mean_pool(self, runs, report):
        grid(report, runs, "cls", [(2, 2), (4, 2)], 512, **{
            "attention.kind": "fmm", "fmm.bandwidth": 5, "model.head": "cls", "model.n_classes": 10,
            "model.vocab_size": 32, "data.task": "listops", "data.listops_min_len": 100,
            "data.listops_max_len": 500, "model.causal": False})

    def test_text(self, runs, report):
        corpus = text_corpus(runs.workdir)
        grid(report, runs, "text", [(2, 2), (3, 3)], 509, **{
            "attention.kind": "fmm", "fmm.bandwidth": 5, "data.task": "text", "data.path": corpus,
            "data.format": "bytes", "model.vocab_size": 256})

    def test_bf16(self, runs, report, momfmm):
        why = unavailable(momfmm, "bf16")
        if why:
            pytest.skip(f"bf16 cannot run on this CPU: {why}")
        bf16 = {"attention.kind": "fmm", "fmm.bandwidth": 5, "train.precision": "bf16", "data.seq_len": 512}
        base = runs.train("bf16_1", 1, **bf16)
        got = runs.train("bf16_2x2", 2, 2, **bf16)
        r, path, _ = got
        if not report.check("bf16 context 2: trains", base[1] and path, f"rc {r.returncode}"):
            return
        a, b = load_checkpoint(base[1]), load_checkpoint(path)
        la, lb = np.asarray(a.train["loss"], float), np.asarray(b.train["loss"], float)
        rel = float(np.max(np.abs(la - lb) / np.abs(la)))
        # bf16 products round the operands to 8 bits: its own np = 1 at bf16's tolerance
        report.check("bf16 context 2: losses within 1e-3 relative of bf16 np = 1", rel <= 1e-3, f"worst {rel:.2e}")


class TestRunDirectory:
    def test_resume_across_grids(self, runs, report):
        # a constant rate after warm-up: the runs of 3, 6 and 9 steps share one schedule
        fmm = {"attention.kind": "fmm", "fmm.bandwidth": 5, "momentum.gamma": 0.2, "momentum.beta": 0.4,
               "train.schedule": "constant"}
        straight = runs.train("straight", 1, steps=9, **fmm)
        first = runs.train("moved", 4, 4, steps=3, **fmm)  # (D 1, C 4)
        report.check("(D 1, C 4) writes a checkpoint", first[1], f"rc {first[0].returncode}")
        second = runs.train("moved", 2, 1, steps=6, resume="auto", **fmm)  # (D 2, C 1)
        report.check("(D 2, C 1) resumes it", second[1] and "ckpt_00000006" in second[1], f"{second[1]}")
        third = runs.train("moved", 4, 4, steps=9, resume="auto", **fmm)  # and back
        compare(report, "(1,4) -> (2,1) -> (1,4) vs one rank straight through", straight[1], third)

    def test_eval_stream_and_loss(self, runs, report, momfmm):
        fmm = {"attention.kind": "fmm", "fmm.bandwidth": 5, "momentum.gamma": 0.2}
        cp = runs.train("evalcp", 4, 4, **fmm)
        one = runs.train("eval1", 1, **fmm)
        if not report.check("both train", cp[1] and one[1]):
            return
        def losses(text):
            return [float(x) for x in re.findall(r"\bloss (\d+\.\d+)", text)]

        for args, what in (([], "eval"), (["--stream", "--segment", "64"], "eval --stream")):
            a = run([momfmm, "eval", cp[1], "--batches", "2"] + args, timeout=300)
            b = run([momfmm, "eval", one[1], "--batches", "2"] + args, timeout=300)
            la, lb = losses(a.stdout), losses(b.stdout)
            report.check(f"{what} of the context-parallel run: exits 0 and prints the loss",
                         a.returncode == 0 and la, f"rc {a.returncode} {a.stderr[-200:]}")
            report.check(f"{what}: within 1e-4 of the np = 1 run's", len(la) == len(lb) and la and
                         np.allclose(la, lb, rtol=0, atol=1e-4), f"{la[:3]} {lb[:3]}")
        rng = np.random.default_rng(3)
        tokens = write_tokens(os.path.join(runs.workdir, "tokens.h5"), rng.integers(0, 32, (2, 512)),
                              rng.integers(0, 32, (2, 512)))
        a, b = run([momfmm, "loss", cp[1], tokens]), run([momfmm, "loss", one[1], tokens])
        report.check("loss of the context-parallel run: exits 0, within 1e-4 of np = 1's",
                     a.returncode == 0 and losses(a.stdout) and np.allclose(losses(a.stdout), losses(b.stdout),
                                                                            atol=1e-4),
                     f"{a.stdout.strip()[:80]} | {b.stdout.strip()[:80]}")

    def test_refusals(self, runs, report, momfmm):
        cases = [
            ({"attention.kind": "fmm", "fmm.bandwidth": 200, "dist.context": 4}, 4, "fmm.bandwidth"),
            ({"attention.kind": "softmax", "attention.impl": "dense", "dist.context": 2}, 2, "attention.impl"),
            ({"attention.kind": "fmm", "dist.context": 3}, 4, "dist.context = 3"),
            ({"attention.kind": "fmm", "dist.context": 2, "train.eval_readouts": "true"}, 2, "eval_readouts"),
        ]
        for i, (sets, np_, needle) in enumerate(cases):
            ini, _, _ = write_tiny_config(runs.workdir, f"refuse{i}", **{"data.seq_len": 512, "train.batch_size": 2,
                                                                          **sets})
            r = run(MPIRUN + ["-np", str(np_), momfmm, "train", ini, "--overwrite"], timeout=120)
            lines = [l for l in r.stderr.splitlines() if l.startswith("momfmm:")]
            report.check(f"refused with exit 2 naming {needle}", r.returncode == 2 and lines and needle in lines[0],
                         f"rc {r.returncode} {lines[:1]}")
