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
import signal
import socket
import subprocess
import time

import h5py
import numpy as np
import pytest
from momfmm.files import list_checkpoints
from momfmm.h5 import load_checkpoint, newest_checkpoint

from processes import children, kill_session, rank_of, session_members
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


# ---- robustness ------------------------------------------------------------

class LongRun:
    """mpirun -np n on a 20000-step run (tens of seconds; bounded in case the
    test itself is killed) in its own session, stdout to a log;
    waits until a step line appeared and n momfmm ranks are children of mpirun.
    close() SIGKILLs, by pid, whatever is left in the session."""

    def __init__(self, runner, name, n, **extra):
        path, self.out_dir = runner.config(name, **{"train.steps": 20000, "train.log_interval": 5,
                                                    "train.eval_interval": 0, "dist.check_interval": 50, **extra})
        for old in glob.glob(os.path.join(self.out_dir, "ckpt_*.h5")):
            os.remove(old)
        self.log_path = os.path.join(runner.workdir, name + ".log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(train_command(runner.momfmm, path, np_=n), stdout=log,
                                         stderr=subprocess.STDOUT, env=env(), start_new_session=True)
        self.sid = self.proc.pid
        self.ranks, self.started = {}, False
        try:
            deadline = time.time() + 60
            while time.time() < deadline and self.proc.poll() is None:
                self.started = re.search(r"^step \d+/", self.log(), re.M) is not None
                self.ranks = {rank_of(p): p for p, exe in children(self.proc.pid) if exe == runner.momfmm}
                if self.started and len(self.ranks) == n:
                    break
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        self.ready = self.started and len(self.ranks) == n and self.proc.poll() is None

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def wait(self, seconds):
        t0 = time.time()
        try:
            rc = self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.time() - t0

    def leftovers(self):
        return [p for p in session_members(self.sid) if p != self.proc.pid]

    def close(self):
        kill_session(self.sid)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def check_kill(report, runner):
    """SIGKILL one non-zero rank mid-run: mpirun must end non-zero within 30 s."""
    job = LongRun(runner, "kill", 3)
    try:
        assert job.ready, ("kill: training started on 3 ranks (a step line, 3 momfmm children of mpirun): "
                           f"ranks {sorted(k for k in job.ranks if k is not None)}")
        os.kill(job.ranks[1], signal.SIGKILL)
        rc, took = job.wait(30)
        report.check("kill: mpirun ends with a non-zero status within 30 s of SIGKILL to rank 1",
                     rc is not None and rc != 0, f"rc {rc} after {took:.1f} s")
        time.sleep(0.5)
        left = job.leftovers()
        report.check("kill: no momfmm process left behind", not left, f"left {left}")
    finally:
        job.close()


def check_sigstop(report, runner):
    """SIGSTOP rank 1 of 3 with dist.timeout = 5 (docs/design.md §8.11): the
    job ends with exit 5 within 5 s + 8 s, and the dist.timeout line of a
    surviving rank names rank 1 and its host, none names another rank.
    (Ending the job, mpirun sends the stopped rank SIGCONT: its own line and a
    survivor's written after it may say that every rank answered.)"""
    job = LongRun(runner, "sigstop", 3, **{"dist.timeout": 5})
    try:
        assert job.ready, "sigstop: training started on 3 ranks"
        os.kill(job.ranks[1], signal.SIGSTOP)
        rc, took = job.wait(5 + 8)
        report.check("sigstop: mpirun ends with exit 5 within 13 s of SIGSTOP to rank 1", rc == 5,
                     f"rc {rc} after {took:.1f} s")
    finally:
        job.close()
    host = socket.gethostname()
    lines = [l for l in job.log().splitlines() if "dist.timeout: step" in l and " on rank 1 of 3 " not in l]
    named = [re.search(r"no answer from (.*); exiting 5$", l) for l in lines]
    report.check(f"sigstop: a surviving rank's line names rank 1 (host {host})",
                 any(m and m.group(1) == f"rank 1 (host {host})" for m in named), "\n".join(lines) or job.log()[-800:])
    report.check("sigstop: no surviving rank names another rank",
                 all(m is None or m.group(1) == f"rank 1 (host {host})" for m in named), "\n".join(lines))


def check_stop_at_shutdown(report, runner):
    """Rank 1 of 3 stops (SIGSTOP to itself: the test hook MOMFMM_TEST_STOP)
    as it enters the shutdown exchange after the last step, dist.timeout = 5
    (docs/design.md §8.11): the ranks that finished wait for it there, watched,
    not inside MPI_Finalize for ever; the job ends with exit 5 within 5 s + 8 s
    of the last checkpoint, a surviving rank's line names the shutdown and
    rank 1, and that checkpoint, the run's result, stands."""
    path, out_dir = runner.config("stop_shutdown", **{"dist.timeout": 5, "train.eval_interval": 0})
    for old in glob.glob(os.path.join(out_dir, "ckpt_*.h5")):
        os.remove(old)
    log_path = os.path.join(runner.workdir, "stop_shutdown.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(train_command(runner.momfmm, path, np_=3), stdout=log, stderr=subprocess.STDOUT,
                                env=env(MOMFMM_TEST_STOP="1:1:shutdown"), start_new_session=True)
    try:
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            rc = None
        ended = time.time()
    finally:
        kill_session(proc.pid)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    with open(log_path) as f:
        text = f.read()
    last = os.path.join(out_dir, f"ckpt_{STEPS:08d}.h5")
    after = ended - os.path.getmtime(last) if os.path.exists(last) else None
    report.check("stop at shutdown: mpirun ends with exit 5 within 5 s + 8 s of the last checkpoint",
                 rc == 5 and after is not None and after < 5 + 8,
                 f"rc {rc}, {after if after is None else round(after, 1)} s after {os.path.basename(last)}\n"
                 f"{text[-800:]}")
    host = socket.gethostname()
    lines = [l for l in text.splitlines() if "dist.timeout: step" in l and " on rank 1 of 3 " not in l]
    want = f"step {STEPS}: shutdown did not complete in "
    report.check(f"stop at shutdown: a surviving rank's line names the shutdown and rank 1 (host {host})",
                 any(want in l and l.endswith(f"no answer from rank 1 (host {host}); exiting 5") for l in lines),
                 "\n".join(lines) or text[-800:])
    ok = os.path.exists(last) and load_checkpoint(last, optim=False, metrics=False).step == STEPS
    report.check(f"stop at shutdown: the last checkpoint (step {STEPS}) loads", ok, last)


def check_stop_signal(report, runner):
    """SIGUSR1 to rank 2 alone: every rank stops at the same step, rank 0
    writes a checkpoint, the job exits 0 (docs/cli.md §5: a signal seen by any rank counts)."""
    job = LongRun(runner, "usr1", 3)
    try:
        assert job.ready, "usr1: training started on 3 ranks"
        os.kill(job.ranks[2], signal.SIGUSR1)
        rc, took = job.wait(30)
        text = job.log()
        m = re.search(r"stop requested: writing a checkpoint at step (\d+)", text)
        ckpts = [path for _, path in list_checkpoints(job.out_dir)]
        ok = rc == 0 and m is not None and len(ckpts) == 1 and ckpts[0].endswith(f"ckpt_{int(m.group(1)):08d}.h5")
        report.check("usr1 to rank 2 only: job exits 0 within 30 s with a checkpoint at the announced step", ok,
                     f"rc {rc} after {took:.1f} s, {m.group(0) if m else 'no stop line'}, "
                     f"{[os.path.basename(c) for c in ckpts]}")
        if ok:
            step = load_checkpoint(ckpts[0], optim=False, metrics=False).step
            report.check("usr1: checkpoint step attribute = the stop step", step == int(m.group(1)))
    finally:
        job.close()


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


def check_too_many_ranks(report, runner):
    path, _ = runner.config("np_gt_batch", **{"train.batch_size": 2, "train.steps": 2})
    r = run(train_command(runner.momfmm, path, np_=4), timeout=120)
    msgs = [l for l in r.stderr.splitlines() if l.startswith("momfmm:")]
    named = any(re.search(r"\b2\b", l) and re.search(r"\b4\b", l) and "batch_size" in l for l in msgs)
    report.check("np 4 > batch_size 2: exit 2", r.returncode == 2, f"rc {r.returncode}")
    report.check("np 4 > batch_size 2: one message naming train.batch_size, 2 and 4", named and len(msgs) == 1,
                 f"{msgs}")


def check_divergence(report, runner):
    """MPMD launch: the ranks resume from two step-2 checkpoints with the same parameters
    and config but different AdamW moments (a different lr on one rank is refused at
    start-up, test_fuzz.py), so parameters differ after step 3; the checksum at
    dist.check_interval = 3 must stop the job naming step 3."""
    path, out_dir = runner.config("diverge", **{"dist.check_interval": 3, "train.steps": 2,
                                                "train.eval_interval": 0})
    r = run([runner.momfmm, "train", path], timeout=120)
    report.check("diverged ranks: the step-2 run", r.returncode == 0, r.stderr[-300:])
    first = os.path.join(out_dir, "ckpt_00000002.h5")
    sources = [os.path.join(runner.workdir, f"diverge_{i}.h5") for i in range(2)]
    for i, source in enumerate(sources):
        shutil.copy(first, source)
        with h5py.File(source, "a") as f:
            f["optim/m/tok_emb"][...] = f["optim/m/tok_emb"][()] * (1 + i)
    for name in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, name))
    sets = ["--set", "train.steps=10"]
    cmd = MPIRUN + ["-np", "1", runner.momfmm, "train", path, *sets, "--resume", sources[0], ":",
                    "-np", "1", runner.momfmm, "train", path, *sets, "--resume", sources[1]]
    r = run(cmd, timeout=120)
    text = r.stdout + r.stderr
    report.check("diverged ranks: checksum mismatch stops the job (non-zero) at step 3",
                 r.returncode != 0 and re.search(r"step 3: .*checksum", text) is not None and
                 "step 4/" not in r.stdout,
                 f"rc {r.returncode}; " + " / ".join(l for l in text.splitlines() if "checksum" in l)[:300])
    report.check("diverged ranks: no checkpoint written", not glob.glob(os.path.join(out_dir, "ckpt_*.h5")))


def check_waiting_naps(report, runner):
    """A long wait for a peer that has not reached it naps between its polls
    (docs/design.md §8.11): rank 1's steps 200 ms longer (the test hook, MPMD
    launch), rank 0 waits for it in every all-reduce, and bench's
    cpu_ms_per_step (rank 0's CPU time) stays under half of its ms_per_step;
    polling on, it was the whole step (200.7 of 200.8 ms)."""
    path, _ = runner.config("naps", **{"train.eval_interval": 0})
    bench = [runner.momfmm, "bench", path, "--steps", "3"]
    r = run(MPIRUN + ["-np", "1", *bench, ":", "-np", "1", "-x", "MOMFMM_TEST_STEP_SLEEP_MS=200", *bench],
            timeout=120)
    found = re.search(r"ms_per_step=([\d.]+) .*cpu_ms_per_step=([\d.]+)", r.stdout)
    wall, cpu = (float(found.group(1)), float(found.group(2))) if found else (float("nan"),) * 2
    report.check("waiting rank: bench at np 2 exits 0, a step 200 ms or longer", r.returncode == 0 and wall >= 200,
                 f"rc {r.returncode}, {wall} ms: {r.stderr.strip()[-200:]}")
    report.check("waiting rank: rank 0's CPU time under half its step while it waits for rank 1", cpu < 0.5 * wall,
                 f"cpu {cpu} ms of {wall} ms")


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
        alone, bit for bit, and the ranks agree at step 1 (dist.check_interval)."""
        sets = {"model.vocab_size": 1024, "model.d_model": 64, "train.lr": 0.0, "train.min_lr": 0.0,
                "train.steps": 1, "train.eval_interval": 0}
        path, _ = R.config("init_shares", **sets)
        alone = os.path.join(R.workdir, "init_alone.h5")
        r = run([R.momfmm, "init", path, "--out", alone, "--force"], timeout=60)
        report.check("momfmm init writes the weights", r.returncode == 0, r.stderr[-300:])
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
