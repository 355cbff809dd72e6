"""test_mpi.py's robustness checks (TestRobustness): a long run to stop, kill or
signal one rank of, np > batch, diverged ranks, and a waiting rank's naps. Each
check takes the Runner of test_mpi.py (its config and train methods) and a Report."""
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import h5py
from momfmm.files import list_checkpoints
from momfmm.h5 import load_checkpoint

from processes import children, kill_session, rank_of, session_members
from common import MPIRUN, env, run, train_command

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
    last = os.path.join(out_dir, f"ckpt_{runner.steps:08d}.h5")
    after = ended - os.path.getmtime(last) if os.path.exists(last) else None
    report.check("stop at shutdown: mpirun ends with exit 5 within 5 s + 8 s of the last checkpoint",
                 rc == 5 and after is not None and after < 5 + 8,
                 f"rc {rc}, {after if after is None else round(after, 1)} s after {os.path.basename(last)}\n"
                 f"{text[-800:]}")
    host = socket.gethostname()
    lines = [l for l in text.splitlines() if "dist.timeout: step" in l and " on rank 1 of 3 " not in l]
    want = f"step {runner.steps}: shutdown did not complete in "
    report.check(f"stop at shutdown: a surviving rank's line names the shutdown and rank 1 (host {host})",
                 any(want in l and l.endswith(f"no answer from rank 1 (host {host}); exiting 5") for l in lines),
                 "\n".join(lines) or text[-800:])
    ok = os.path.exists(last) and load_checkpoint(last, optim=False, metrics=False).step == runner.steps
    report.check(f"stop at shutdown: the last checkpoint (step {runner.steps}) loads", ok, last)


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
