"""Scale features of docs/scale.md §7: gradient accumulation (train.micro_batch)
and the ZeRO-1 sharded optimizer (dist.zero = 1) with checkpoints that resume at
any world size. One class per group, each its own CTest entry
(e2e_scale_<group>, tests/CMakeLists.txt):

- TestMicroBatch: micro-batches of 1, 3 (not dividing the shard of 10), 4 and
  20 (larger than the shard) train the model of the whole-shard step: losses
  within 1e-5, weights within 1e-5 in norm (||diff|| / ||w|| per tensor;
  measured 2.2e-6 at most) and within 1e-4 elementwise (max |diff| / max |w|
  per tensor, the float-summation-order tolerance of test_mpi.py: Adam turns
  rounding noise of near-zero gradients into lr-sized steps; measured
  1.5e-5 at most); larger than the shard is bitwise
  the whole shard. At np = 2 with uneven shards (5 and 6 rows, hence a
  different number of micro-batches per rank) likewise.
- TestZero: dist.zero = 1 vs 0 at np = 1..5 (the tiny model's parameter count
  is not divisible by 3, 4 or 5: uneven slices): weights and /optim within
  1e-5, losses within 1e-5; the start-up line shows moments 8/np bytes per
  parameter; the checkpoint line says the ranks wrote it together (MPI-IO)
  when np > 1. best.h5 (train.keep_best) at np = 3, zero 1 vs 0. Collective
  transfers (dist.collective_io) write the same tensors as independent ones.
- TestResume: a run at np = 4, zero = 1 checkpoints at step 10; resuming it at
  np = 4, zero = 1 ends bitwise equal to the uninterrupted run; at np = 3,
  zero = 1 and at np = 1, zero = 0 within 1e-5 (weights, moments, buffers).
- TestKillDuringSave: SIGKILL of rank 2 of 4 (zero = 1) while the ranks are
  writing checkpoints together (every 2 steps) ends the job; every ckpt_*.h5
  left loads, and `--resume auto` at np = 3 continues from the newest to the
  end with exit 0.
- TestRecompute: train.recompute = mlp and block train the run of none bit
  for bit (weights, moments, buffers, the train and eval tables but
  tokens/s: the eval's gain_R and attention read-out remake the blocks'
  state too), 3 layers, at np = 1 with micro-batches of 3 and at np = 2
  with ZeRO-1 and learned gamma; the start-up line's activation estimate is
  smaller (block); `bench` runs them, times the recomputation as its own
  phase and reports activation_mb none > mlp > block.
- TestBadValues: train.micro_batch = -1, dist.zero = 2, dist.timeout = 0,
  train.recompute = layer and non-numbers exit 2 naming the key.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np

from momfmm.files import list_checkpoints
from momfmm.h5 import load_checkpoint

from common import env, load_newest, run, train_command, write_tiny_config
from processes import children, kill_session, rank_of

LOSS_TOL = 1e-5
NORM_TOL = 1e-5  # micro-batches: the issue's "1e-5 relative on the weights", per tensor in norm
WEIGHT_TOL = 1e-4  # ... and elementwise, the summation-order tolerance of test_mpi.py
ZERO_TOL = 1e-5
STEPS = 20


def base_overrides(**extra):
    # momentum with anchor false: the buffers (global-batch means) enter the
    # loss, so summing them over micro-batches or slices is tested too
    o = {"train.steps": STEPS, "train.batch_size": 10, "train.adam_eps": 1e-6, "train.eval_interval": STEPS,
         "train.log_interval": 1, "momentum.gamma": 0.2, "momentum.anchor": False}
    o.update(extra)
    return o


def train(momfmm, workdir, name, np_=None, resume=None, **overrides):
    """Trains config `name` afresh; returns (CompletedProcess, newest checkpoint or None)."""
    ini, out_dir, _ = write_tiny_config(workdir, name, **base_overrides(**overrides))
    shutil.rmtree(out_dir, ignore_errors=True)
    r = run(train_command(momfmm, ini, np_=np_, resume=resume), timeout=120)
    if r.returncode != 0:
        print(f"--- {name} rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}", flush=True)
        return r, None
    return r, load_newest(out_dir)


def rel_diff(a, b, prefix):
    """Largest per-tensor max |a - b| / max |a| over the datasets under prefix."""
    da, db = a.datasets(), b.datasets()
    worst = 0.0
    for key, x in da.items():
        if key.startswith(prefix):
            y = db[key]
            worst = max(worst, float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)))
    return worst


def rel_norm_diff(a, b, prefix):
    """Largest per-tensor ||a - b|| / ||a|| over the datasets under prefix."""
    da, db = a.datasets(), b.datasets()
    worst = 0.0
    for key, x in da.items():
        if key.startswith(prefix):
            worst = max(worst, float(np.linalg.norm(x - db[key]) / max(float(np.linalg.norm(x)), 1e-30)))
    return worst


def loss_diff(a, b):
    return float(np.max(np.abs(a.train["loss"] - b.train["loss"])))


class TestMicroBatch:
    def test_micro_batches_match_whole_shard(self, momfmm, workdir, report):
        _, ref = train(momfmm, workdir, "mb_ref")
        assert ref is not None
        for mb in (1, 3, 4, 20):
            _, got = train(momfmm, workdir, f"mb_{mb}", **{"train.micro_batch": mb})
            if got is None:
                report.check(f"micro_batch {mb} trains", False)
                continue
            w, l, b = rel_diff(ref, got, "model/"), loss_diff(ref, got), rel_diff(ref, got, "buffers")
            wn = rel_norm_diff(ref, got, "model/")
            report.check(f"micro_batch {mb}: weights, ||diff|| / ||w|| per tensor", wn <= NORM_TOL, f"{wn:.2e}")
            report.check(f"micro_batch {mb}: weights, max |diff| / max |w| per tensor", w <= WEIGHT_TOL, f"{w:.2e}")
            report.check(f"micro_batch {mb}: losses", l <= LOSS_TOL, f"{l:.2e}")
            report.check(f"micro_batch {mb}: momentum buffers", b <= WEIGHT_TOL, f"{b:.2e}")
            if mb >= 10:
                report.check(f"micro_batch {mb} > shard is the whole shard bitwise", w == 0 and l == 0)

    def test_eval_in_micro_batches(self, momfmm, workdir, report):
        # the same checkpoint evaluated whole and in micro-batches of 3 rows
        # (train.micro_batch edited in its config_ini): eval forwards take the
        # micro-batches too (docs/scale.md §7), with the same metrics
        _, ref = train(momfmm, workdir, "mb_eval", **{"train.log_interval": 20})
        assert ref is not None
        whole = list_checkpoints(os.path.join(workdir, "mb_eval"))[-1][1]  # the newest
        split = os.path.join(workdir, "mb_eval_split.h5")
        shutil.copy(whole, split)
        with h5py.File(split, "r+") as f:
            ini = f.attrs["config_ini"]
            ini = ini.decode() if isinstance(ini, bytes) else ini
            assert "micro_batch = 0" in ini
            f.attrs["config_ini"] = ini.replace("micro_batch = 0", "micro_batch = 3")
        out = {}
        for label, path in (("whole", whole), ("micro", split)):
            r = run([momfmm, "eval", path, "--stream"], timeout=60)
            assert r.returncode == 0, r.stderr
            # both eval lines (full and --stream): loss, L_new, L_rep, delta_12; then gain_R per layer
            out[label] = [float(x) for x in re.findall(r"\b(?:loss|L_new|L_rep|delta_12) (-?[\d.]+)", r.stdout)]
            out[label] += [float(x) for x in re.search(r"^gain_R (.*)$", r.stdout, re.M).group(1).split()]
        a, b = np.array(out["whole"]), np.array(out["micro"])
        diff = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30)))
        report.check("eval of a checkpoint in micro-batches of 3: loss, L_new, L_rep, streamed metrics and gain_R "
                     "as whole", a.size == b.size and a.size >= 8 and diff <= 1e-6, f"{a.size} numbers, {diff:.2e}")

    def test_uneven_shards_two_ranks(self, momfmm, workdir, report):
        _, ref = train(momfmm, workdir, "mb_np2_ref", np_=2, **{"train.batch_size": 11})
        _, got = train(momfmm, workdir, "mb_np2_2", np_=2, **{"train.batch_size": 11, "train.micro_batch": 2})
        assert ref is not None and got is not None
        w, l, wn = rel_diff(ref, got, "model/"), loss_diff(ref, got), rel_norm_diff(ref, got, "model/")
        report.check("np 2, shards 5 and 6, micro_batch 2: weights, norm", wn <= NORM_TOL, f"{wn:.2e}")
        report.check("np 2, shards 5 and 6, micro_batch 2: weights, max", w <= WEIGHT_TOL, f"{w:.2e}")
        report.check("np 2, shards 5 and 6, micro_batch 2: losses", l <= LOSS_TOL, f"{l:.2e}")


class TestZero:
    def test_zero1_matches_replicated(self, momfmm, workdir, report):
        for n in (1, 2, 3, 4, 5):
            _, ref = train(momfmm, workdir, f"z0_np{n}", np_=n)
            r, got = train(momfmm, workdir, f"z1_np{n}", np_=n, **{"dist.zero": 1})
            if ref is None or got is None:
                report.check(f"np {n}: both runs train", False)
                continue
            w, o, l = rel_diff(ref, got, "model/"), rel_diff(ref, got, "optim/"), loss_diff(ref, got)
            report.check(f"np {n} zero 1 vs 0: weights", w <= ZERO_TOL, f"{w:.2e}")
            report.check(f"np {n} zero 1 vs 0: moments (gathered into full tensors)", o <= ZERO_TOL, f"{o:.2e}")
            report.check(f"np {n} zero 1 vs 0: losses", l <= LOSS_TOL, f"{l:.2e}")
            # rank 0's slice is floor(n_params / n) elements: 8/n bytes per parameter or just below
            line = next((s for s in r.stdout.splitlines() if s.startswith("memory:")), "")
            moments = float(line.split("moments ")[1]) if "moments " in line else -1
            report.check(f"np {n}: start-up line shows moments ~8/np bytes per parameter",
                         abs(moments - 8 / n) < 0.01, line)
            # docs/scale.md §7: with zero = 1 on several ranks all write the file together
            together = f"| {n} ranks together (MPI-IO)" in r.stdout
            report.check(f"np {n} zero 1: checkpoint written {'by all ranks together' if n > 1 else 'by rank 0'}",
                         together == (n > 1), next((s for s in r.stdout.splitlines() if s.startswith("checkpoint ")), ""))

    def test_collective_transfers(self, momfmm, workdir, report):
        # dist.collective_io: the same file through MPI-IO collective buffering
        _, ref = train(momfmm, workdir, "io_indep", np_=3, **{"dist.zero": 1})
        r, got = train(momfmm, workdir, "io_coll", np_=3, **{"dist.zero": 1, "dist.collective_io": True})
        assert ref is not None and got is not None
        line = next((s for s in r.stdout.splitlines() if s.startswith("checkpoint ")), "")
        report.check("np 3 zero 1 collective_io: the checkpoint line says so",
                     line.endswith("| 3 ranks together (MPI-IO, collective)"), line)
        same = all(np.array_equal(x, got.datasets()[k]) for k, x in ref.datasets().items()
                   if k.startswith(("model/", "optim/", "buffers")))
        report.check("np 3 zero 1: collective and independent transfers write the same tensors", same)

    def test_keep_best_with_zero1(self, momfmm, workdir, report):
        # best.h5 is a full checkpoint too: with zero = 1 the ranks write it
        # together, each its own slice of the moments
        best = {"train.keep_best": True, "train.eval_interval": 10}
        _, ref = train(momfmm, workdir, "best_z0", np_=3, **best)
        r, got = train(momfmm, workdir, "best_z1", np_=3, **{"dist.zero": 1}, **best)
        assert ref is not None and got is not None
        paths = [os.path.join(workdir, name, "best.h5") for name in ("best_z0", "best_z1")]
        report.check("np 3 zero 1, keep_best: best.h5 written", all(os.path.exists(p) for p in paths),
                     r.stdout[-300:])
        a, b = (load_checkpoint(p) for p in paths)
        w, o = rel_diff(a, b, "model/"), rel_diff(a, b, "optim/")
        report.check("np 3 zero 1 vs 0: best.h5 from the same step", a.step == b.step, f"{a.step} vs {b.step}")
        report.check("np 3 zero 1 vs 0: best.h5 weights and full moments", max(w, o) <= ZERO_TOL,
                     f"weights {w:.2e}, moments {o:.2e}")


class TestResume:
    def test_resume_any_world_size(self, momfmm, workdir, report):
        every10 = {"train.ckpt_interval": 10, "train.keep": 5}
        _, full = train(momfmm, workdir, "full_np4_z1", np_=4, **{"dist.zero": 1}, **every10)
        assert full is not None
        half = os.path.join(workdir, "full_np4_z1", "ckpt_00000010.h5")
        assert os.path.exists(half)
        for name, n, zero in (("same_np4_z1", 4, 1), ("np3_z1", 3, 1), ("np1_z0", 1, 0)):
            _, got = train(momfmm, workdir, name, np_=n, resume=half, **{"dist.zero": zero}, **every10)
            if got is None:
                report.check(f"{name}: resumes", False)
                continue
            diffs = [rel_diff(full, got, p) for p in ("model/", "optim/", "buffers")] + [loss_diff(full, got)]
            detail = "weights %.2e, moments %.2e, buffers %.2e, losses %.2e" % tuple(diffs)
            if name.startswith("same"):
                report.check("np 4 zero 1 -> np 4 zero 1: bitwise", max(diffs) == 0, detail)
            else:
                report.check(f"np 4 zero 1 -> np {n} zero {zero}: within 1e-5", max(diffs) <= ZERO_TOL, detail)


class TestKillDuringSave:
    def test_sigkill_during_sharded_save(self, momfmm, workdir, report):
        overrides = base_overrides(**{"train.steps": 20000, "train.ckpt_interval": 2, "train.keep": 3,
                                      "train.eval_interval": 0, "train.log_interval": 50, "dist.zero": 1,
                                      "model.d_model": 64, "model.d_ff": 256})
        ini, out_dir, _ = write_tiny_config(workdir, "killed", **overrides)
        shutil.rmtree(out_dir, ignore_errors=True)
        log_path = os.path.join(workdir, "killed.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(train_command(momfmm, ini, np_=4), stdout=log, stderr=subprocess.STDOUT,
                                    env=env(), start_new_session=True)
        caught_tmp = False
        try:
            deadline = time.time() + 60
            victim = None
            while time.time() < deadline and proc.poll() is None:
                ranks = {rank_of(p): p for p, exe in children(proc.pid) if exe == momfmm}
                victim = ranks.get(2)
                have = glob.glob(os.path.join(out_dir, "ckpt_*.h5"))
                caught_tmp = bool(glob.glob(os.path.join(out_dir, "ckpt_*.h5.tmp.*")))
                if victim and have and caught_tmp:
                    break
                time.sleep(0.005)
            assert victim, "rank 2 not found"
            os.kill(victim, signal.SIGKILL)
            rc = proc.wait(timeout=30)
            report.check("SIGKILL of rank 2 ends the job non-zero", rc != 0, f"rc {rc}")
        finally:
            kill_session(proc.pid)
        report.check("rank 2 killed while a sharded checkpoint was being written (a *.tmp.* file existed)",
                     caught_tmp, "no temporary file seen before the kill")
        files = [path for _, path in list_checkpoints(out_dir)]
        loadable = []
        for f in files:
            try:
                loadable.append(load_checkpoint(f).step)
            except Exception as exc:  # a finished name must never be a torn file
                report.check(f"{os.path.basename(f)} loads", False, str(exc))
        report.check("checkpoints left load", bool(loadable), f"steps {loadable}")
        if not loadable:
            return
        target = max(loadable) + 4
        r = run(train_command(momfmm, ini, sets=[f"train.steps={target}"], np_=3, resume="auto"), timeout=120)
        report.check("--resume auto at np 3 continues to the end", r.returncode == 0 and
                     "resumed from" in r.stdout, f"rc {r.returncode}: {r.stderr.strip()[-300:]}")
        final = load_newest(out_dir)
        report.check("the resumed run reaches its last step", final.step == target, f"step {final.step}")


class TestRecompute:
    # fillers and a length eval: queries whose positional and induction keys
    # differ, so that the attention read-out has numbers to compare
    SIZE = {"model.n_layers": 3, "train.steps": 10, "train.eval_interval": 5, "train.gemm": "openblas",
            "data.chain_noise": 0.3, "data.chain_fillers": 8, "data.eval_chain_len": 4, "data.eval_chain_len_max": 6}

    @staticmethod
    def activation_mb(stdout):
        found = re.search(r"^memory: .*\| activations ([\d.]+) MB", stdout, re.M)
        return float(found.group(1)) if found else float("nan")

    def test_recompute_equals_none(self, momfmm, workdir, report):
        for label, np_, extra in (("np 1, micro_batch 3", None, {"train.micro_batch": 3}),
                                  ("np 2, zero 1, learned gamma", 2, {"dist.zero": 1, "momentum.learn_gamma": True})):
            runs = {mode: train(momfmm, workdir, f"rc_{mode}_np{np_ or 1}", np_=np_,
                                **self.SIZE, **extra, **{"train.recompute": mode}) for mode in ("none", "mlp", "block")}
            r_none, ref = runs["none"]
            for mode in ("mlp", "block"):
                r, got = runs[mode]
                if not report.check(f"{label}: none and {mode} train", ref is not None and got is not None):
                    continue
                da, db = ref.datasets(), got.datasets()
                differ = [k for k in da if not np.array_equal(da[k], db[k])]
                report.check(f"{label}, {mode}: every checkpoint tensor (weights, moments, buffers) bitwise as none",
                             da.keys() == db.keys() and not differ, f"{len(da)} tensors, differ: {differ[:5]}")
                tables = [(f"train/{k}", ref.train[k], got.train[k]) for k in ref.train if k != "tokens_per_s"]
                tables += [(f"eval/{k}", ref.eval[k], got.eval[k]) for k in ref.eval]
                differ = [k for k, a, b in tables if not np.array_equal(a, b, equal_nan=True)]
                read = [k for k, a, _ in tables if k.endswith(("gain_R", "attn_induction")) and np.isfinite(a).all()]
                report.check(f"{label}, {mode}: train and eval tables bitwise as none (gain_R, attention read-out)",
                             len(read) == 3 and not differ, f"finite: {read}, differ: {differ[:5]}")
                if mode == "block":  # mlp's saving is below the line's 0.1 MB here: test_bench checks it
                    a, b = self.activation_mb(r_none.stdout), self.activation_mb(r.stdout)
                    report.check(f"{label}, block: the start-up line's activation estimate is smaller", b < a,
                                 f"{a} vs {b} MB")

    def test_bench(self, momfmm, workdir, report):
        # large enough that the MLP's recomputation shows in bench's 0.1 ms resolution
        bigger = {"model.d_model": 64, "model.d_ff": 256, "data.seq_len": 64}
        ini, _, _ = write_tiny_config(workdir, "rc_bench", **base_overrides(**self.SIZE, **bigger))
        phases, acts = {}, {}
        for mode in ("none", "mlp", "block"):
            r = run([momfmm, "bench", ini, "--steps", "1", "--set", f"train.recompute={mode}"], timeout=60)
            found = re.search(r"backward recompute ([\d.]+) ms", r.stdout)
            phases[mode] = float(found.group(1)) if r.returncode == 0 and found else float("nan")
            found = re.search(r"activation_mb=([\d.]+)", r.stdout)
            acts[mode] = float(found.group(1)) if found else float("nan")
        report.check("bench: the recomputation is its own phase, 0 without it",
                     phases["block"] > 0 and phases["mlp"] > 0 and phases["none"] == 0,
                     " ".join(f"{mode} {ms} ms" for mode, ms in phases.items()))
        report.check("bench: activation_mb none > mlp > block", acts["none"] > acts["mlp"] > acts["block"],
                     " ".join(f"{mode} {mb} MB" for mode, mb in acts.items()))
        # the evaluator's buffers are made and counted only where the run evaluates (config_evaluates)
        evals = {"bench": self.eval_mb(r.stdout)}
        for label, sets in (("train", []), ("train, eval_interval 0", ["train.eval_interval=0"]),
                            ("train, eval_at_start alone", ["train.eval_interval=0", "train.eval_at_start=true"])):
            t = run(train_command(momfmm, ini, sets=["train.steps=1", *sets]) + ["--overwrite"], timeout=60)
            evals[label] = self.eval_mb(t.stdout) if t.returncode == 0 else float("nan")
        report.check("memory line: eval 0.0 MB in bench and without evaluations, more where the run evaluates",
                     evals["bench"] == 0 and evals["train, eval_interval 0"] == 0 and evals["train"] > 0 and
                     evals["train, eval_at_start alone"] == evals["train"],
                     " ".join(f"{label} {mb} MB" for label, mb in evals.items()))

    @staticmethod
    def eval_mb(stdout):
        found = re.search(r"^memory: .*\| eval ([\d.]+) MB", stdout, re.M)
        return float(found.group(1)) if found else float("nan")


class TestBadValues:
    def test_bad_values_exit_2(self, momfmm, workdir, report):
        for key, value in (("train.micro_batch", -1), ("dist.zero", 2), ("train.micro_batch", "two"),
                           ("dist.timeout", 0), ("dist.timeout", "soon"), ("train.recompute", "layer")):
            ini, _, _ = write_tiny_config(workdir, "bad", **base_overrides())
            r = run(train_command(momfmm, ini, sets=[f"{key}={value}"]), timeout=60)
            report.check(f"{key} = {value}: exit 2 naming the key", r.returncode == 2 and key.split(".")[1] in r.stderr,
                         f"rc {r.returncode}: {r.stderr.strip()[:200]}")
