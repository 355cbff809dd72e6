"""Helpers of the checkpoint tests (test_checkpoint.py, test_checkpoint_files.py, test_checkpoint_stop.py):
a runner for tiny configs, checkpoint comparisons through the package's reader
(momfmm.h5.load_checkpoint), and long runs stopped by signals."""
import hashlib
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from momfmm.files import list_checkpoints
from momfmm.h5 import load_checkpoint

from processes import children, kill_session, rank_of, session_members
from common import MPIRUN, env, run, train_command, write_tiny_config

# docs/cli.md §5: the launcher wrapper that turns Ctrl-C and SIGTERM into SIGUSR1
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "momfmm-mpirun")

LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-4

# The resume runs (test_checkpoint.py): N steps, then N more.
N = 4
RESUME = {
    "momentum.gamma": 0.5, "momentum.beta": 0.5, "momentum.learn_gamma": True, "momentum.anchor": False,
    "train.schedule": "constant", "train.warmup": 2, "train.log_interval": 1, "train.eval_interval": 2,
    "train.ckpt_interval": 2, "train.keep": 10,
    # adam_eps 1e-6 (as in test_mpi.py): with 1e-8 Adam turns float-rounding
    # noise of near-zero gradients into lr-sized steps, which only matters for
    # the np = 2 comparison (conditioning, not a checkpoint error).
    "train.adam_eps": 1e-6,
}


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ckpt(out_dir, step):
    return os.path.join(out_dir, f"ckpt_{step:08d}.h5")


def checkpoints(out_dir):
    """{step: path} of the checkpoints of a run directory, by the package's one name rule
    (momfmm.files.list_checkpoints, docs/files.md §4)."""
    return dict(list_checkpoints(out_dir)) if os.path.isdir(out_dir) else {}


def tail(result, n=600):
    return f"rc {result.returncode}; stdout ...{result.stdout[-n:]!r}; stderr ...{result.stderr[-n:]!r}"


class Runner:
    def __init__(self, momfmm, workdir):
        self.momfmm = os.path.realpath(momfmm)
        self.work = os.path.abspath(workdir)

    def config(self, name, **overrides):
        """Writes <work>/<name>.ini (tiny_config + overrides), fresh out_dir; returns (ini, out_dir, sections)."""
        shutil.rmtree(os.path.join(self.work, name), ignore_errors=True)
        return write_tiny_config(self.work, name, **overrides)

    def train(self, ini, *sets, resume=None, np_=None, timeout=300):
        return run(train_command(self.momfmm, ini, sets, np_=np_, resume=resume), timeout=timeout)

    def inspect(self, path):
        return run([self.momfmm, "inspect", path], timeout=60)


# ---- reading checkpoints ----------------------------------------------------

def load_state(path):
    """Every tensor ("model/...", "optim/m/...", "buffers/...") and metric
    ("metrics/train/...", "metrics/eval/...") of a checkpoint as arrays, and
    its root attributes."""
    ck = load_checkpoint(path)
    out = ck.datasets()
    out.update({f"metrics/train/{k}": v for k, v in ck.train.items()})
    out.update({f"metrics/eval/{k}": v for k, v in ck.eval.items()})
    return out, ck.attrs


def same_bits(a, b):
    """Bitwise equal arrays; NaN equals NaN whatever its payload."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        a, b = np.where(nan, 0, a), np.where(nan, 0, b)
    return a.tobytes() == b.tobytes()


def compared_keys(state):
    """The state that must survive a resume exactly: tensors, buffers and the
    metric history except the wall-clock tokens_per_s."""
    return sorted(k for k in state if k.split("/")[0] in ("model", "optim", "buffers")
                  or (k.startswith("metrics/") and not k.endswith("tokens_per_s")))


def bitwise_report(a_path, b_path):
    """(ok, detail): every compared dataset and step/tokens_seen bitwise equal."""
    (a, aa), (b, ba) = load_state(a_path), load_state(b_path)
    keys = compared_keys(a)
    if keys != compared_keys(b):
        return False, f"dataset sets differ: {sorted(set(keys) ^ set(compared_keys(b)))[:6]}"
    differ = [k for k in keys if not same_bits(a[k], b[k])]
    for attr in ("step", "tokens_seen"):
        if int(aa[attr]) != int(ba[attr]):
            differ.append(f"attr {attr} {aa[attr]} vs {ba[attr]}")
    detail = f"{len(keys)} datasets compared"
    if differ:
        worst = max((float(np.nanmax(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
                     for k in differ if k in a and a[k].shape == b[k].shape and a[k].size), default=0.0)
        detail += f"; {len(differ)} differ, e.g. {differ[:4]}, worst |diff| {worst:.3g}"
    return not differ, detail


def rel_tensors(a, b, prefixes):
    """Worst max|a-b| / max|a| over the datasets under prefixes; and where."""
    worst, where = 0.0, ""
    for k in a:
        if k.split("/")[0] not in prefixes:
            continue
        if k not in b or a[k].shape != b[k].shape:
            return float("inf"), k + " missing or reshaped"
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) if x.size else 0.0
        if rel > worst:
            worst, where = rel, k
    return worst, where


def rel_losses(a, b, key):
    x, y = a[key], b.get(key)
    if y is None or x.shape != y.shape:
        return float("inf")
    ok = ~np.isnan(x)
    if not np.array_equal(ok, ~np.isnan(y)):
        return float("inf")
    return float(np.max(np.abs(x[ok] - y[ok]) / np.maximum(np.abs(x[ok]), 1e-30))) if ok.any() else 0.0


# ---- long runs stopped by signals ----------------------------------------

class LongRun:
    """A 100000-step run (under mpirun when n > 0) in its own session, output
    to a log; waits for a step line (and n rank processes)."""

    def __init__(self, R, name, n, **overrides):
        over = {"train.steps": 100000, "train.log_interval": 1, "train.eval_interval": 0,
                "dist.check_interval": 50}
        over.update(overrides)
        self.ini, self.out_dir, _ = R.config(name, **over)
        self.log_path = os.path.join(R.work, name + ".log")
        cmd = train_command(R.momfmm, self.ini, np_=n)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(),
                                         start_new_session=True)
        self.ranks = {}
        started = False
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            started = re.search(r"^step \d+/", self.log(), re.M) is not None
            if n:
                self.ranks = {rank_of(p): p for p, exe in children(self.proc.pid) if exe == R.momfmm}
            if started and len(self.ranks) == n:
                break
            time.sleep(0.05)
        self.ready = started and len(self.ranks) == n and self.proc.poll() is None

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def wait(self, seconds):
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        kill_session(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def check_stopped(R, report, label, job, rc, world):
    text = job.log()
    m = re.search(r"^stop requested: writing a checkpoint at step (\d+)", text, re.M)
    report.check(f"{label}: exit 0 with 'stop requested'", rc == 0 and m is not None,
                 f"rc {rc}; log ...{text[-400:]!r}")
    if not m:
        return None
    step = int(m.group(1))
    path = ckpt(job.out_dir, step)
    ok = os.path.exists(path) and R.inspect(path).returncode == 0
    attrs = {}
    if ok:
        a = load_checkpoint(path, optim=False, metrics=False).attrs
        attrs = {k: int(a[k]) for k in ("step", "world_size")}
    report.check(f"{label}: a checkpoint at the stop step ({step}) that loads, world_size {world}",
                 ok and attrs == {"step": step, "world_size": world} and len(re.findall("stop requested", text)) == 1,
                 f"{path} exists {os.path.exists(path)} attrs {attrs}")
    return path


class SlowRun:
    """A run whose steps last `step_ms` (the test hook MOMFMM_TEST_STEP_SLEEP_MS),
    under `momfmm-mpirun` (wrapped) or plain mpirun, -np n, in a session of
    its own; waits until the log shows step 1. close() kills every process
    of it, mpirun's own session included (the wrapper starts mpirun with
    setsid)."""

    def __init__(self, R, name, n, step_ms, wrapped=True, launcher_env=None, **overrides):
        over = {"train.steps": 100000, "train.log_interval": 1, "train.eval_interval": 0}
        over.update(overrides)
        self.ini, self.out_dir, _ = R.config(name, **over)
        self.log_path = os.path.join(R.work, name + ".log")
        cmd = [R.momfmm, "train", self.ini]
        cmd = [LAUNCHER] + MPIRUN[1:] + ["-np", str(n)] + cmd if wrapped else MPIRUN + ["-np", str(n)] + cmd
        e = env(MOMFMM_TEST_STEP_SLEEP_MS=step_ms, MOMFMM_MPIRUN=MPIRUN[0], **(launcher_env or {}))
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None and not re.search(r"^step 1/", self.log(), re.M):
            time.sleep(0.05)
        self.ready = self.proc.poll() is None and re.search(r"^step 1/", self.log(), re.M) is not None
        # the wrapper's session, and mpirun's (setsid) while it is the wrapper's child
        self.sessions = [self.proc.pid] + [p for p, _ in children(self.proc.pid)]

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def last_step(self):
        steps = re.findall(r"^step (\d+)/", self.log(), re.M)
        return int(steps[-1]) if steps else 0

    def wait(self, seconds):
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def processes(self):
        """Live processes of the run but the launcher: its session and mpirun's."""
        return sorted({p for sid in self.sessions for p in session_members(sid)} - {self.proc.pid})

    def close(self):
        for sid in self.sessions:
            kill_session(sid)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# ---- fixtures of the checkpoint modules (test_checkpoint.py, test_checkpoint_files.py) ----

@pytest.fixture(scope="module")
def R(momfmm, workdir):
    return Runner(momfmm, workdir)


@pytest.fixture(scope="module")
def straight(R):
    """The 2N-step straight run (checkpoints every 2 steps, all kept): its
    out_dir, the reference of the resume and bad-file tests."""
    ini, out_dir, _ = R.config("straight", **RESUME, **{"train.steps": 2 * N})
    r = R.train(ini)
    assert r.returncode == 0 and os.path.exists(ckpt(out_dir, 2 * N)), \
        f"resume: straight run of {2 * N} steps: {tail(r)}"
    return out_dir
