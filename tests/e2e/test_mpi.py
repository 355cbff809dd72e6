"""Data-parallel (MPI) tests: the same config trains the same model at any
number of ranks (docs/tasks.md §2), up to float summation order. One class per group,
each its own CTest entry (e2e_mpi_<group>, tests/CMakeLists.txt):

- TestEquality: np = 1, 2, 3, 4, 8 on one config (global batch 25: uneven shards at 2, 3, 4
  and 8 ranks): every step's loss within 1e-5 relative of np = 1, every
  /model tensor within 1e-4 (max |diff| / max |value|), eval loss likewise;
  mpirun -np 1 equals the plain process bitwise; 2 ranks x 2 threads matches;
  3 ranks x 2 threads start from `momfmm init`'s weights bit for bit (each rank
  draws its share).
- TestReproducibility: np = 4 twice; overlap on vs off (same buckets);
  many tiny buckets (dist.bucket_mb = 0.001) within tolerance of np = 1 and
  bitwise equal to the default buckets (Open MPI sums in-place all-reduces in
  one order at any size).
- TestMomentum: momentum (gamma 0.2, anchor false: the buffers enter the loss) at np = 4
  vs 1: losses, weights and the /buffers prev_q, prev_k; a control run
  (anchor true) shows the buffers move the trajectory far beyond tolerance.
  A checkpoint written at np = 2 continues at np = 3 to the same final
  state (weights, buffers) as np = 1 straight through.
- TestCopy: the copy task (masked targets, uneven counted targets per rank)
  at np = 3; TestFmm: fmm attention at np = 2.
- TestRobustness: SIGUSR1 to one rank stops every rank at the same step with a
  checkpoint and exit 0; a rank killed with SIGKILL ends the job non-zero within 30 s
  with no process left behind; a rank stopped with SIGSTOP (dist.timeout = 5)
  ends the job with exit 5, a surviving rank's dist.timeout line naming
  that rank and its host, also when it stops as the run ends (in the shutdown
  exchange before MPI_Finalize); np > batch exits 2 naming both numbers;
  ranks that diverge (MPMD launch resuming from checkpoints whose AdamW moments
  differ) are caught by the parameter checksum (dist.check_interval); a rank
  waiting 200 ms a step for another naps (its CPU time under half the step).
- every run: the start-up line `momfmm: N ranks x T threads on <hosts>` shows N and T,
  and on several ranks `all-reduce rabenseifner` (docs/design.md §8.3); an algorithm
  given to mpirun (binomial) is kept and shown, within tolerance of np = 1.
"""
import glob
import os
import re
import shutil

import numpy as np
import pytest
from momfmm.h5 import load_checkpoint, newest_checkpoint

from mpi_robustness import (check_divergence, check_kill, check_sigstop, check_stop_at_shutdown, check_stop_signal,
                            check_too_many_ranks, check_waiting_naps)
from common import MPIRUN, Report, env, run, train_command, write_tiny_config

LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-4
STEPS = 15
BATCH = 25  # not divisible by 2, 3, 4 or 8: every multi-rank run has uneven shards


def shard_counts(batch, n):
    """docs/tasks.md §2: rank r takes global samples [r*B/n, (r+1)*B/n)."""
    return [(r + 1) * batch // n - r * batch // n for r in range(n)]


class Runner:
    def __init__(self, momfmm, workdir):
        self.steps = STEPS  # every config's train.steps unless overridden (mpi_robustness.py reads it)
        self.momfmm = os.path.realpath(momfmm)
        self.workdir = os.path.abspath(workdir)

    def config(self, name, **overrides):
        # adam_eps 1e-6: with 1e-8, Adam turns the float rounding noise of
        # near-zero gradients (the low-RoPE-frequency entries of the key bias,
        # ~1e-8, nearly softmax-shift-invariant) into lr-sized steps, so those
        # entries differ by up to ~1e-4 relative between any two summation
        # orders; that is conditioning, not a data-parallel error.
        base = {"train.steps": STEPS, "train.batch_size": BATCH, "train.adam_eps": 1e-6, "train.warmup": 2,
                "train.log_interval": 1, "train.eval_interval": STEPS, "train.eval_batches": 1,
                "dist.check_interval": 1}
        base.update(overrides)
        ini, out_dir, _ = write_tiny_config(self.workdir, name, **base)
        return ini, out_dir

    def train(self, name, np_, sets=(), direct=False, threads=1, extra_env=None, **overrides):
        """Trains config `name` on np_ ranks; returns (CompletedProcess, checkpoint path or None)."""
        path, out_dir = self.config(name, **overrides)
        for old in glob.glob(os.path.join(out_dir, "ckpt_*.h5")):
            os.remove(old)
        cmd = train_command(self.momfmm, path, sets, np_=None if direct else np_)
        e = env(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, **(extra_env or {}))
        r = run(cmd, timeout=300, env=e)
        if r.returncode != 0:
            print(f"--- {name} np={np_} rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}", flush=True)
        have = r.returncode == 0 and glob.glob(os.path.join(out_dir, "ckpt_*.h5"))
        return r, (newest_checkpoint(out_dir) if have else None)


def load(path):
    """Checkpoint -> dict of arrays: loss, eval_loss, model/..., buffers/..., optim/..., attrs."""
    ck = load_checkpoint(path)
    out = ck.datasets()
    out["loss"] = ck.train["loss"]
    out["eval_loss"] = ck.eval.get("loss", np.zeros(0))
    out["world_size"] = int(ck.attrs["world_size"])
    out["step"] = ck.step
    return out


def tensors(state, prefix):
    return {k: v for k, v in state.items() if k.startswith(prefix + "/")}


def loss_rel(a, b):
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30))) if a.size else 0.0


def tensor_rel(a, b, prefix):
    """Worst over tensors under prefix of max|a-b| / max|a|; and the tensor name."""
    ta, tb = tensors(a, prefix), tensors(b, prefix)
    if not ta or set(ta) != set(tb):
        return float("inf"), f"tensor sets differ: {sorted(set(ta) ^ set(tb))[:4]}"
    worst, where = 0.0, ""
    for k in ta:
        x, y = ta[k].astype(np.float64), tb[k].astype(np.float64)
        if x.shape != y.shape:
            return float("inf"), k + " shape"
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30))
        if rel > worst:
            worst, where = rel, k
    return worst, where


def bitwise_diff(a, b, prefix):
    """Names of tensors under prefix that are not bitwise equal, and the worst abs difference."""
    ta, tb = tensors(a, prefix), tensors(b, prefix)
    differ = [k for k in ta if k not in tb or ta[k].tobytes() != tb[k].tobytes()]
    worst = max((float(np.max(np.abs(ta[k].astype(np.float64) - tb[k]))) for k in differ if k in tb), default=0.0)
    return differ, worst


def startup_line(stdout):
    m = re.search(r"^momfmm: (\d+) ranks? x (\d+) threads? on (.+?)(?: \||$)", stdout, re.M)
    return (int(m.group(1)), int(m.group(2)), m.group(3).split()) if m else None


def allreduce_algorithm(stdout):
    """The start-up line's `all-reduce NAME` (several ranks only), or None."""
    m = re.search(r"^momfmm: .*? \| all-reduce ([a-z ]+?) \|", stdout, re.M)
    return m.group(1) if m else None


def compare(report, label, ref, got, buffers=False):
    rel = loss_rel(ref["loss"], got["loss"])
    report.check(f"{label}: per-step loss within {LOSS_RTOL:g} relative of np=1", rel <= LOSS_RTOL,
                 f"{len(got['loss'])} steps, worst {rel:.2e}")
    w, where = tensor_rel(ref, got, "model")
    report.check(f"{label}: final weights within {WEIGHT_RTOL:g}", w <= WEIGHT_RTOL, f"worst {w:.2e} ({where})")
    e = loss_rel(ref["eval_loss"], got["eval_loss"])
    report.check(f"{label}: eval loss within {LOSS_RTOL:g}", e <= LOSS_RTOL and got["eval_loss"].size > 0,
                 f"worst {e:.2e}")
    if buffers:
        b, where = tensor_rel(ref, got, "buffers")
        report.check(f"{label}: momentum buffers prev_q/prev_k within {WEIGHT_RTOL:g}", b <= WEIGHT_RTOL,
                     f"{len(tensors(got, 'buffers'))} tensors, worst {b:.2e} ({where})")


def trained(report, label, result, np_, threads=1, algorithm="rabenseifner", steps=STEPS):
    r, ckpt = result
    ok = report.check(f"{label}: exits 0 with a checkpoint", r.returncode == 0 and ckpt is not None,
                      f"rc {r.returncode}")
    if not ok:
        return None
    state = load(ckpt)
    line = startup_line(r.stdout)
    report.check(f"{label}: start-up line says {np_} rank(s) x {threads} thread(s)",
                 line is not None and line[0] == np_ and line[1] == threads and len(line[2]) >= 1,
                 f"{line}")
    if np_ > 1:  # docs/design.md §8.3: dist_init selects it unless mpirun chose
        got = allreduce_algorithm(r.stdout)
        report.check(f"{label}: start-up line says all-reduce {algorithm}", got == algorithm, f"{got}")
    report.check(f"{label}: checkpoint world_size = {np_}, step {steps}, {steps} loss rows",
                 state["world_size"] == np_ and state["step"] == steps and len(state["loss"]) == steps,
                 f"world_size {state['world_size']} step {state['step']} rows {len(state['loss'])}")
    return state


# ---- robustness: mpi_robustness.py; the resume across np here ---------------

def check_resume_across_np(report, R, ref):
    """Checkpoint written at np=2 (step 10), resumed at np=3: the final state
    matches np=1 trained straight through (momentum buffers carried)."""
    mom = {"momentum.gamma": 0.2, "momentum.anchor": False}
    r, _ = R.train("resume_np2", 2, **mom, **{"train.ckpt_interval": 5, "train.keep": 5})
    src = os.path.join(R.workdir, "resume_np2", "ckpt_00000010.h5")
    assert r.returncode == 0 and os.path.exists(src), "resume: np=2 run wrote ckpt_00000010.h5"
    path, out_dir = R.config("resume_np3", **mom)
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "ckpt_*.h5")):
        os.remove(old)
    with open(src, "rb") as fi, open(os.path.join(out_dir, "ckpt_00000010.h5"), "wb") as fo:
        fo.write(fi.read())
    r = run(train_command(R.momfmm, path, np_=3, resume="auto"), timeout=300)
    final = os.path.join(out_dir, f"ckpt_{STEPS:08d}.h5")
    assert r.returncode == 0 and os.path.exists(final), \
        f"resume: np=3 continues from the np=2 checkpoint to the end: rc {r.returncode} {r.stderr[-300:]}"
    got = load(final)
    report.check("resume: checkpoint world_size = 3 and 15 loss rows", got["world_size"] == 3 and
                 len(got["loss"]) == STEPS, f"{got['world_size']}, {len(got['loss'])}")
    compare(report, "np=2 -> resume at np=3 vs np=1 straight", ref, got, buffers=True)


# ---- the groups ----------------------------------------------------------------

@pytest.fixture(scope="module")
def R(momfmm, workdir):
    return Runner(momfmm, workdir)


def train_once(R, label, name, np_, threads=1, **kw):
    """A run that several tests compare against (module fixtures): its checks
    must all pass, or every test using it errors naming the failed check."""
    report = Report()
    state = trained(report, label, R.train(name, np_, threads=threads, **kw), np_, threads=threads)
    report.assert_all()
    return state


@pytest.fixture(scope="module")
def ref(R):
    """np = 1, the plain process: the reference of every comparison."""
    return train_once(R, "np=1", "base_np1", 1, direct=True)


@pytest.fixture(scope="module")
def base4(R):
    return train_once(R, "np=4", "base_np4", 4)


MOMENTUM = {"momentum.gamma": 0.2, "momentum.anchor": False}


@pytest.fixture(scope="module")
def mom1(R):
    return train_once(R, "momentum np=1", "mom_np1", 1, direct=True, **MOMENTUM)


class TestEquality:
    @pytest.mark.parametrize("n", (2, 3, 4, 8))
    def test_uneven_shards(self, n):
        """The configuration itself must exercise uneven shards."""
        c = shard_counts(BATCH, n)
        assert len(set(c)) > 1 and min(c) >= 1, (n, c)

    def test_mpirun_np1_bitwise(self, R, report, ref):
        got = trained(report, "mpirun -np 1", R.train("base_mpi1", 1), 1)
        if got:
            differ, worst = bitwise_diff(ref, got, "model")
            report.check("mpirun -np 1 equals the plain process bitwise",
                         not differ and ref["loss"].tobytes() == got["loss"].tobytes(),
                         f"{len(differ)} tensors differ")

    @pytest.mark.parametrize("n", (2, 3, 4, 8))
    def test_np(self, R, report, ref, n):
        got = trained(report, f"np={n}", R.train(f"base_np{n}", n), n)
        if got:
            compare(report, f"np={n} (shards {shard_counts(BATCH, n)})", ref, got)

    def test_initial_weights_bitwise(self, R, report):
        """Each rank draws its share of the initial weights on its threads and
        the shares go to every rank (docs/design.md §8.3): at np = 3 x 2 threads
        (uneven shares; tensors of 65,536 draws, cut between the threads) the
        weights after a step at lr 0 are `momfmm init`'s, drawn by one process
        alone, bit for bit, and the ranks agree at step 1 (dist.check_interval);
        `momfmm init` under mpirun, its ranks drawing shares, writes the same bits."""
        sets = {"model.vocab_size": 1024, "model.d_model": 64, "train.lr": 0.0, "train.min_lr": 0.0,
                "train.steps": 1, "train.eval_interval": 0}
        path, _ = R.config("init_shares", **sets)
        alone = os.path.join(R.workdir, "init_alone.h5")
        r = run([R.momfmm, "init", path, "--out", alone, "--force"], timeout=60)
        report.check("momfmm init writes the weights", r.returncode == 0, r.stderr[-300:])
        shared = os.path.join(R.workdir, "init_np3.h5")
        s = run(MPIRUN + ["-np", "3", R.momfmm, "init", path, "--out", shared, "--force"], timeout=60,
                env=env(OMP_NUM_THREADS=2))
        if report.check("momfmm init at np=3 x 2 threads writes the weights", s.returncode == 0 and
                        r.returncode == 0, s.stderr[-300:]):
            differ, worst = bitwise_diff(load_checkpoint(alone).datasets(), load_checkpoint(shared).datasets(),
                                         "model")
            report.check("momfmm init at np=3 x 2 threads: one process's weights bit for bit", not differ,
                         f"{len(differ)} tensors differ ({differ[:3]}), worst {worst:g}")
        got = trained(report, "np=3 x 2 threads at lr 0", R.train("init_shares", 3, threads=2, **sets), 3,
                      threads=2, steps=1)
        if got and r.returncode == 0:
            differ, worst = bitwise_diff(load_checkpoint(alone).datasets(), got, "model")
            report.check("np=3 x 2 threads starts from init's weights bit for bit", not differ,
                         f"{len(differ)} tensors differ ({differ[:3]}), worst {worst:g}")
        # --resume auto with nothing to resume draws them too (docs/design.md §8.3: a run
        # that may load a checkpoint draws only when it finds none)
        path, out_dir = R.config("init_shares_auto", **sets)
        shutil.rmtree(out_dir, ignore_errors=True)
        a = run(train_command(R.momfmm, path, np_=3, resume="auto"), timeout=120, env=env(OMP_NUM_THREADS=2))
        ckpt = newest_checkpoint(out_dir) if a.returncode == 0 else None
        report.check("--resume auto with no checkpoint: starts at step 0", ckpt is not None and
                     "no checkpoint to resume" in a.stdout, f"rc {a.returncode}: {a.stderr.strip()[-300:]}")
        if ckpt and r.returncode == 0:
            differ, worst = bitwise_diff(load_checkpoint(alone).datasets(), load(ckpt), "model")
            report.check("--resume auto with no checkpoint starts from init's weights bit for bit", not differ,
                         f"{len(differ)} tensors differ ({differ[:3]}), worst {worst:g}")

    def test_np2_threads2(self, R, report, ref):
        got = trained(report, "np=2 x 2 threads", R.train("base_np2_t2", 2, threads=2), 2, threads=2)
        if got:
            compare(report, "np=2 x 2 threads", ref, got)


class TestReproducibility:
    def test_np4_twice(self, R, report, base4):
        again = trained(report, "np=4 again", R.train("base_np4_again", 4), 4)
        if again:
            differ, worst = bitwise_diff(base4, again, "model")
            report.check("np=4 twice: bitwise-identical weights and losses",
                         not differ and base4["loss"].tobytes() == again["loss"].tobytes(),
                         f"{len(differ)} tensors differ, worst {worst:.2e}")

    def test_overlap_off(self, R, report, base4):
        off = trained(report, "np=4 overlap off", R.train("np4_overlap_off", 4, sets=["dist.overlap=false"]), 4)
        if off:
            differ, worst = bitwise_diff(base4, off, "model")
            differ_m, worst_m = bitwise_diff(base4, off, "optim")
            report.check("np=4 overlap on vs off: bitwise-identical weights, moments and losses",
                         not differ and not differ_m and base4["loss"].tobytes() == off["loss"].tobytes(),
                         f"{len(differ)} weight tensors differ (worst {worst:.2e}), "
                         f"{len(differ_m)} moment tensors differ (worst {worst_m:.2e})")

    def test_small_buckets(self, R, report, ref, base4):
        small = trained(report, "np=4 bucket_mb=0.001",
                        R.train("np4_small_buckets", 4, sets=["dist.bucket_mb=0.001"]), 4)
        if small:
            compare(report, "np=4 bucket_mb=0.001 (many buckets)", ref, small)
            # Bitwise too: the buckets are in-place MPI_Iallreduce calls, for which
            # libnbc's Rabenseifner algorithm (docs/design.md §8.3) sums each element
            # in the same order whatever the bucket sizes.
            differ, worst = bitwise_diff(base4, small, "model")
            report.check("np=4 bucket_mb=0.001 vs 4: bitwise-identical weights and losses",
                         not differ and base4["loss"].tobytes() == small["loss"].tobytes(),
                         f"{len(differ)} tensors differ, worst {worst:.2e}")


    def test_allreduce_algorithm_chosen_by_mpirun(self, R, report, ref):
        # an algorithm given to mpirun (here through its environment, as
        # --mca sets it) is kept and shown; the sums stay within tolerance
        chosen = trained(report, "np=4 binomial all-reduce",
                         R.train("np4_binomial", 4, extra_env={"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "2"}),
                         4, algorithm="binomial")
        if chosen:
            compare(report, "np=4 binomial all-reduce", ref, chosen)


class TestMomentum:
    """Buffers averaged over ranks."""

    def test_np4(self, R, report, mom1):
        m4 = trained(report, "momentum np=4", R.train("mom_np4", 4, **MOMENTUM), 4)
        if m4:
            compare(report, "momentum gamma=0.2 anchor=false np=4", mom1, m4, buffers=True)
        names = sorted(tensors(mom1, "buffers"))
        expect = [f"buffers/blocks/{i}/attn/{b}" for i in range(2) for b in ("prev_k", "prev_q")]
        scale = min((float(np.max(np.abs(mom1[k]))) for k in names), default=0.0)
        report.check("momentum: checkpoint holds prev_q, prev_k [H, dh] per block, non-zero",
                     names == expect and all(mom1[k].shape == (4, 8) for k in names) and scale > 1e-3,
                     f"{names}, smallest max|buffer| {scale:.3g}")

    def test_resume_across_np(self, R, report, mom1):
        check_resume_across_np(report, R, mom1)

    def test_control_anchor(self, R, report, mom1):
        """With anchor = false the buffers enter the loss (d_0 = x_0 - buf).
        The anchored run ignores them; its weights move far beyond the
        tolerance, while its per-step losses may stay within ~1e-5: that is
        why the buffers themselves are compared, not only losses."""
        ctrl = trained(report, "momentum anchor=true np=1",
                       R.train("mom_anchor_np1", 1, direct=True, **{"momentum.gamma": 0.2}), 1)
        if ctrl:
            gap = loss_rel(mom1["loss"], ctrl["loss"])
            wgap, _ = tensor_rel(mom1, ctrl, "model")
            report.check("momentum control: using the buffers moves the weights by >10x the tolerance",
                         wgap > 10 * WEIGHT_RTOL, f"weight gap {wgap:.2e}, loss gap {gap:.2e}")


class TestCopy:
    def test_copy_np3(self, R, report):
        """Masked targets, uneven counts of counted targets per rank."""
        copy = {"data.task": "copy", "model.vocab_size": 12}
        c1 = trained(report, "copy np=1", R.train("copy_np1", 1, direct=True, **copy), 1)
        c3 = trained(report, "copy np=3", R.train("copy_np3", 3, **copy), 3)
        if c1 and c3:
            compare(report, "copy np=3 (masked targets)", c1, c3)


    def test_chain_variants_np3(self, R, report):
        """Chain periods drawn per sample, fillers, the length eval and the attention
        read-out (docs/tasks.md §2, docs/metrics.md §3) at np = 3 vs 1: every sample is
        a function of its global index, and the read-out's sums are reduced once."""
        chain = {"data.chain_len": 3, "data.chain_len_max": 7, "data.chain_noise": 0.2, "data.chain_fillers": 4,
                 "data.eval_chain_len": 8, "data.eval_chain_len_max": 9}
        c1 = trained(report, "chain variants np=1", R.train("chainv_np1", 1, direct=True, **chain), 1)
        c3 = trained(report, "chain variants np=3", R.train("chainv_np3", 3, **chain), 3)
        if c1 and c3:
            compare(report, "chain variants np=3", c1, c3)
            e1 = load_checkpoint(newest_checkpoint(R.config("chainv_np1", **chain)[1])).eval
            e3 = load_checkpoint(newest_checkpoint(R.config("chainv_np3", **chain)[1])).eval
            keys = ("lengen_loss", "lengen_L_rep", "attn_positional", "attn_induction", "lengen_attn_induction",
                    "L_rep_by_period")
            worst = max(loss_rel(np.nan_to_num(e1[k]), np.nan_to_num(e3[k])) for k in keys)
            report.check(f"chain variants np=3: length eval and attention read-out within {WEIGHT_RTOL} of np=1",
                         worst <= WEIGHT_RTOL and np.isfinite(e3["lengen_attn_induction"]).all(),
                         f"worst relative difference {worst:.3g}")


class TestFmm:
    def test_fmm_np2(self, R, report):
        fmm = {"attention.kind": "fmm", "fmm.kernels": "elu,elu_flip", "fmm.bandwidth": 4}
        f1 = trained(report, "fmm np=1", R.train("fmm_np1", 1, direct=True, **fmm), 1)
        f2 = trained(report, "fmm np=2", R.train("fmm_np2", 2, **fmm), 2)
        if f1 and f2:
            compare(report, "fmm np=2", f1, f2)
            report.check("fmm: checkpoint has fmm_blend", "model/blocks/0/attn/fmm_blend" in f2)


class TestRobustness:
    def test_too_many_ranks(self, R, report):
        check_too_many_ranks(report, R)

    def test_kill_one_rank(self, R, report):
        check_kill(report, R)

    def test_usr1_to_one_rank(self, R, report):
        check_stop_signal(report, R)

    def test_sigstop_one_rank(self, R, report):
        check_sigstop(report, R)

    def test_stop_at_shutdown(self, R, report):
        check_stop_at_shutdown(report, R)

    def test_divergence(self, R, report):
        check_divergence(report, R)

    def test_waiting_rank_naps(self, R, report):
        check_waiting_naps(report, R)
