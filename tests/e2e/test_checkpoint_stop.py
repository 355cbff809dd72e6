"""Checkpoints under crashes and signals (docs/files.md §4, 5); one class per group,
each its own CTest entry (e2e_checkpoint_<group>, tests/CMakeLists.txt).

- TestCrash: a run that checkpoints every step is SIGKILLed at random moments
  8 times, resuming with --resume auto each time; every ckpt_*.h5 left
  behind loads, temporary files never carry a checkpoint's name, and the
  last run reaches train.steps (seed: $MOMFMM_TEST_SEED, else random, printed).
- TestStopSignals: SIGTERM to one of 4 ranks, and SIGUSR1 to mpirun, stop
  every rank at one step with "stop requested", a checkpoint at that step
  that loads, exit 0. Steps of 6 s (MOMFMM_TEST_STEP_SLEEP_MS) at np = 2:
  SIGINT to the process group of tools/momfmm-mpirun, and SIGTERM to it,
  write the checkpoint of the last finished step within 2 s, the step in
  progress dropped, and exit 0; SIGTERM to a plain mpirun still leaves that
  checkpoint and STOPPED before mpirun's SIGKILL (mpirun exits 1), and so
  does SIGTERM to mpirun and every rank at once (Slurm's scancel) with the
  job scripts' odls_base_sigkill_timeout = 5; a second
  SIGINT ends the whole job within seconds (130), leaving no process.
- TestLiveMetrics: metrics.h5 read with h5py (SWMR) while a run writes it:
  rows grow, values finite, config_ini present; given where a checkpoint
  or a token file belongs (eval, generate, loss, train --init, the Python
  readers) it is named as live metrics; after SIGTERM it holds the same
  history as the final checkpoint.
"""
import configparser
import os
import random
import re
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from processes import session_members
from common import env, run
from ckpt_util import (LongRun, Runner, SlowRun, check_stopped, checkpoints, ckpt, load_state, same_bits,
                       tail)
from momfmm.files import RunError, checkpoint_step
from momfmm.h5 import load_checkpoint, load_tokens


@pytest.fixture(scope="module")
def R(momfmm, workdir):
    return Runner(momfmm, workdir)


# ---- 3. crash ------------------------------------------------------------------

def crash_rng():
    seed = int(os.environ.get("MOMFMM_TEST_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (crash-test kill times; rerun with MOMFMM_TEST_SEED={seed})", flush=True)
    return random.Random(seed)


class TestCrash:
    def test_sigkill_and_resume(self, R, report):
        check_crash(R, report, crash_rng())


def check_crash(R, report, rng, kills=8):
    ini, out_dir, _ = R.config("crash", **{
        "model.vocab_size": 256, "model.d_model": 128, "model.d_ff": 512, "train.steps": 100000,
        "train.schedule": "constant", "train.ckpt_interval": 1, "train.keep": 3, "train.eval_interval": 0,
        "train.log_interval": 1})
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(R.work, "crash.log")
    bad, resumes, tmp_seen, notes = [], [], 0, []
    newest = 0
    for i in range(kills):
        with open(log_path, "w") as log:
            proc = subprocess.Popen([R.momfmm, "train", ini, "--resume", "auto"], stdout=log,
                                    stderr=subprocess.STDOUT, env=env())
        try:
            deadline = time.time() + 60
            while time.time() < deadline and proc.poll() is None and max(checkpoints(out_dir), default=0) <= newest:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            proc.kill()
            proc.wait()
        with open(log_path) as f:
            text = f.read()
        if "skipping checkpoint" in text:
            bad.append(f"kill {i}: a visible checkpoint did not load: "
                       f"{re.findall(r'warning: skipping.*', text)[:2]}")
        m = re.search(r"^resumed from (\S+) at step (\d+)", text, re.M)
        resumes.append(int(m.group(2)) if m else 0)
        names = os.listdir(out_dir)
        tmp_seen += sum(".tmp." in n for n in names)
        for n in names:
            if n.startswith("ckpt_") and n.endswith(".h5") and checkpoint_step(n) is None:
                bad.append(f"kill {i}: unexpected name {n}")
        found = checkpoints(out_dir)
        for step, path in sorted(found.items()):
            r = R.inspect(path)
            if r.returncode != 0:
                bad.append(f"kill {i}: {os.path.basename(path)} does not load: {r.stderr.strip()[:200]}")
        newest = max(found, default=newest)
        notes.append(newest)
    report.check(f"crash: {kills} SIGKILLs at random moments: every ckpt_*.h5 left behind loads (momfmm inspect), "
                 "no temporary file under a checkpoint's name",
                 not bad and newest > 0, "; ".join(bad[:4]) or
                 f"newest step after each kill {notes}; resumed at {resumes}; "
                 f"{tmp_seen} leftover *.tmp.* sightings (kills during writes)")
    report.check("crash: each --resume auto continued from the newest checkpoint of the previous run",
                 all(resumes[i] == notes[i - 1] for i in range(1, kills)), f"resumed {resumes} newest {notes}")
    target = newest + 3
    r = R.train(ini, f"train.steps={target}", resume="auto")
    final = ckpt(out_dir, target)
    ok = r.returncode == 0 and f"resumed from {ckpt(out_dir, newest)} at step {newest}" in r.stdout
    report.check(f"crash: the last run resumes at step {newest} and reaches train.steps = {target}",
                 ok and os.path.exists(final) and R.inspect(final).returncode == 0, tail(r))
    # docs/files.md, "Temporaries": train removes the killed writes' temporaries when it starts
    left = [n for n in os.listdir(out_dir) if ".tmp." in n]
    report.check("crash: no temporary file left after the last run", not left,
                 f"{len(left)} in {out_dir}: {left[:3]}; {tmp_seen} seen after the kills")


class TestStopSignals:
    def test_sigterm_to_one_rank(self, R, report):
        job = LongRun(R, "sigterm", 4)
        try:
            assert job.ready, f"SIGTERM to one rank: 4 ranks started: ranks {sorted(map(str, job.ranks))}"
            os.kill(job.ranks[2], signal.SIGTERM)
            rc = job.wait(60)
            path = check_stopped(R, report, "SIGTERM to rank 2 of 4", job, rc, 4)
            stopped = os.path.join(job.out_dir, "STOPPED")
            marker = open(stopped).read() if os.path.exists(stopped) else ""
            report.check("SIGTERM to rank 2 of 4: STOPPED names signal 15 and the checkpoint; no word of EPIPE",
                         path is not None and marker == f"signal 15: checkpoint {path}\n" and
                         "EPIPE" not in job.log(), f"STOPPED {marker!r}; log ...{job.log()[-300:]!r}")
            time.sleep(0.3)
            left = [p for p in session_members(job.proc.pid) if p != job.proc.pid]
            report.check("SIGTERM to rank 2 of 4: no process left behind", not left, f"left {left}")
        finally:
            job.close()

    def test_sigusr1_to_mpirun(self, R, report):
        job = LongRun(R, "sigusr1", 4)
        try:
            assert job.ready, f"SIGUSR1 to mpirun: 4 ranks started: ranks {sorted(map(str, job.ranks))}"
            os.kill(job.proc.pid, signal.SIGUSR1)
            rc = job.wait(60)
            check_stopped(R, report, "SIGUSR1 to mpirun -np 4", job, rc, 4)
        finally:
            job.close()


    def test_sigint_to_group_slow_steps(self, R, report):
        check_slow_stop(R, report, "SIGINT to the process group of momfmm-mpirun -np 2", "sigint_group",
                        lambda job: os.killpg(job.proc.pid, signal.SIGINT), wrapped=True)

    def test_sigterm_to_launcher_slow_steps(self, R, report):
        check_slow_stop(R, report, "SIGTERM to momfmm-mpirun -np 2", "sigterm_wrapper",
                        lambda job: os.kill(job.proc.pid, signal.SIGTERM), wrapped=True)

    def test_sigterm_to_plain_mpirun_slow_steps(self, R, report):
        check_slow_stop(R, report, "SIGTERM to plain mpirun -np 2", "sigterm_mpirun",
                        lambda job: os.kill(job.proc.pid, signal.SIGTERM), wrapped=False)

    def test_sigterm_to_every_process_slow_steps(self, R, report):
        # Slurm's scancel or time limit: SIGTERM to mpirun and every rank at
        # once, mpirun's grace as the job scripts set it (jobs/momfmm_lib.sh)
        check_slow_stop(R, report, "SIGTERM to plain mpirun and its ranks (Slurm), sigkill_timeout 5 s",
                        "sigterm_all", lambda job: [os.kill(p, signal.SIGTERM) for p in job.processes() +
                                                    [job.proc.pid]], wrapped=False, grace_s=5)

    def test_second_sigint_ends_at_once(self, R, report):
        job = SlowRun(R, "sigint_twice", 2, SLOW_STEP_MS)
        try:
            assert job.ready, f"two SIGINTs: the run started: {job.log()[-400:]!r}"
            os.killpg(job.proc.pid, signal.SIGINT)
            time.sleep(0.5)
            start = time.time()
            os.killpg(job.proc.pid, signal.SIGINT)
            rc = job.wait(20)
            took = time.time() - start
            report.check("a second SIGINT to momfmm-mpirun's group ends the job within 5 s, exit 130",
                         rc == 130 and took < 5, f"rc {rc} after {took:.1f} s; log ...{job.log()[-300:]!r}")
            time.sleep(0.5)
            left = job.processes()
            report.check("a second SIGINT: no rank or mpirun left behind", not left, f"left {left}")
        finally:
            job.close()


# Steps of 6 s: longer than Open MPI's grace (1 s after its SIGTERM to the
# ranks, 2 s after mpirun's own SIGTERM), so a rank that finished its step
# first would be killed without a checkpoint.
SLOW_STEP_MS = 6000


def check_slow_stop(R, report, label, name, send, wrapped, grace_s=None):
    """grace_s: Open MPI's odls_base_sigkill_timeout for the run (default 1 s)."""
    grace = {"OMPI_MCA_odls_base_sigkill_timeout": grace_s} if grace_s else {}
    job = SlowRun(R, name, 2, SLOW_STEP_MS, wrapped=wrapped, launcher_env=grace)
    try:
        assert job.ready, f"{label}: the run started: {job.log()[-400:]!r}"
        time.sleep(1.0)  # into step 2
        finished = job.last_step()
        sent = time.time()
        send(job)
        rc = job.wait(SLOW_STEP_MS / 1000 + 20)
        took = time.time() - sent
        text = job.log()
        path = ckpt(job.out_dir, finished)
        written = os.path.getmtime(path) - sent if os.path.exists(path) else None
        loads = os.path.exists(path) and R.inspect(path).returncode == 0
        stopped = os.path.join(job.out_dir, "STOPPED")
        marker = open(stopped).read() if os.path.exists(stopped) else ""
        report.check(f"{label}, {SLOW_STEP_MS / 1000:.0f} s steps: the checkpoint of the last finished step "
                     f"({finished}) loads, written within 2 s of the signal, named in STOPPED",
                     loads and written is not None and written < 2.0 and path in marker,
                     f"{path}: written {written if written is None else round(written, 2)} s after; "
                     f"STOPPED {marker!r}; log ...{text[-500:]!r}")
        later = sorted(s for s in checkpoints(job.out_dir) if s > finished)
        report.check(f"{label}: the step in progress was dropped (no later checkpoint)",
                     not later and (not wrapped or f"step {finished + 1} abandoned on a stop signal" in text),
                     f"later {later}")
        if wrapped:
            report.check(f"{label}: exit 0 within one step of the signal", rc == 0 and took < SLOW_STEP_MS / 1000 + 5,
                         f"rc {rc} after {took:.1f} s")
        else:
            # docs/cli.md §5: Open MPI 4.1's mpirun kills its ranks two graces after its own SIGTERM and exits 1
            within = 2 * (grace_s or 1) + 3
            report.check(f"{label}: mpirun ends within {within} s (its own kill sequence), status 1",
                         rc == 1 and took < within, f"rc {rc} after {took:.1f} s")
        time.sleep(0.3)
        left = job.processes()
        report.check(f"{label}: no rank or mpirun left behind", not left, f"left {left}")
    finally:
        job.close()


def check_live_file_named(R, report, path, ini):
    """The live metrics.h5 where another kind belongs is named by its kind (docs/files.md §4,
    another of momfmm's files), by every reader: it used to be "cannot open checkpoint as HDF5
    (corrupt?)", HDF5 opening a file an SWMR writer holds only as an SWMR reader."""
    said = "a run's live metrics (metrics.h5), not a"
    for args in (["eval", path], ["generate", path], ["loss", path, path],
                 ["train", ini, "--init", path,
                  "--set", f"train.out_dir={os.path.join(R.work, 'live_init')}"]):
        r = run([R.momfmm] + args, timeout=60)
        lines = r.stderr.strip().splitlines()
        report.check(f"live metrics: momfmm {args[0]} given metrics.h5 while the run writes it names its kind",
                     r.returncode == 3 and len(lines) == 1 and said in lines[0], tail(r))
    for reader in (load_checkpoint, load_tokens):
        try:
            reader(path)
            error = "read"
        except RunError as e:
            error = str(e)
        report.check(f"live metrics: momfmm.h5.{reader.__name__} of metrics.h5 while the run writes it names "
                     "its kind", said in error, error)


# ---- 7. live metrics ----------------------------------------------------------------------

class TestLiveMetrics:
    def test_swmr_reader(self, R, report):
        check_live_metrics(R, report)


def check_live_metrics(R, report):
    job = LongRun(R, "live", 0, **{"train.eval_interval": 10})
    path = os.path.join(job.out_dir, "metrics.h5")
    rows, problems, ini = [], [], None
    try:
        assert job.ready, f"live metrics: a long run started: {job.log()[-300:]!r}"
        names = ("step", "loss", "lr", "grad_norm", "tokens_per_s")
        for _ in range(5):
            time.sleep(0.3)
            try:
                with h5py.File(path, "r", libver="latest", swmr=True) as f:
                    evals = f["metrics/eval/loss"]
                    eval_before = evals.shape[0]
                    cols = [f[f"metrics/train/{k}"][()] for k in names]
                    # a SWMR reader sees a dataset's extent as of its last
                    # refresh: opened again by name it kept eval_before's
                    # (69..69 eval rows against 705 train rows, once)
                    evals.refresh()
                    eval_after = evals.shape[0]
                    ini = f.attrs.get("config_ini", ini)
            except (OSError, KeyError) as e:
                problems.append(f"read failed: {e}")
                continue
            # Each dataset is seen as of its own read while the writer appends
            # (step first, then loss, ...): a later column may be one row
            # behind an earlier one, or any number ahead; the last row's
            # extent may be visible before its value. Check the common rows.
            # The eval rows, read before and after the train columns, bound
            # them from both sides: read after, they may be any number ahead
            # (once 13 steps, in a loaded suite, with steps of 0.5 ms).
            lens = [len(c) for c in cols]
            n = min(lens)
            rows.append(n)
            if any(lens[i] < lens[i - 1] - 1 for i in range(1, len(lens))):
                problems.append(f"column lengths {lens}")
            if not all(np.isfinite(c[:n]).all() for c in cols[1:]):
                problems.append(f"non-finite values in the first {n} rows")
            step = cols[0]
            if n == 0 or list(step[:n - 1]) != list(range(1, n)) or step[n - 1] not in (n, 0):
                problems.append(f"steps not 1..{n}: {list(step[:n])[-5:]}")
            if not (eval_before <= max(lens) // 10 + 1 and (n - 1) // 10 <= eval_after):
                problems.append(f"{eval_before}..{eval_after} eval rows at {lens} train rows")
        report.check("live metrics: h5py (swmr=True) opened 5 times while the run writes metrics.h5: rows grow, "
                     "values finite, steps 1..n, eval rows every 10 steps",
                     len(rows) == 5 and all(b > a for a, b in zip(rows, rows[1:])) and not problems,
                     f"rows {rows}; {problems[:3]}")
        # one handle kept open: refresh() shows the new rows
        seen = []
        try:
            with h5py.File(path, "r", libver="latest", swmr=True) as f:
                d = f["metrics/train/loss"]
                for _ in range(3):
                    d.refresh()
                    seen.append(d.shape[0])
                    time.sleep(0.3)
                tail_ok = bool(np.isfinite(d[max(0, seen[-1] - 50):seen[-1] - 1]).all())
        except (OSError, KeyError) as e:
            seen.append(str(e))
            tail_ok = False
        report.check("live metrics: a reader that keeps the file open sees new rows after refresh()",
                     len(seen) == 3 and all(isinstance(x, int) for x in seen) and seen[0] < seen[1] < seen[2]
                     and tail_ok, f"rows {seen}")
        # momfmm inspect reads the file as the run writes it (it used to say "corrupt?")
        r = R.inspect(path)
        report.check("live metrics: momfmm inspect metrics.h5 while the run writes it shows its latest rows",
                     r.returncode == 0 and "train metrics (" in r.stdout and "last 5:" in r.stdout,
                     (r.stdout + r.stderr)[-300:])
        check_live_file_named(R, report, path, job.ini)
        parser = configparser.ConfigParser()
        try:
            parser.read_string(ini if isinstance(ini, str) else "")
            same = parser.get("train", "out_dir", fallback=None) == job.out_dir
        except configparser.Error:
            same = False
        report.check("live metrics: config_ini root attribute (the resolved config)", same, f"{str(ini)[:80]!r}")
        job.proc.send_signal(signal.SIGTERM)
        rc = job.wait(60)
        final = check_stopped(R, report, "live metrics: SIGTERM to a single process", job, rc, 1)
        if final:
            c, _ = load_state(final)
            with h5py.File(path, "r", libver="latest", swmr=True) as m:
                same = all(same_bits(c[f"metrics/{k}"], m[f"metrics/{k}"][()])
                           for k in ("train/step", "train/loss", "train/tokens_per_s", "eval/loss", "eval/loss_by_k"))
            report.check("live metrics: after the stop, metrics.h5 holds the same history as the checkpoint", same)
    finally:
        job.close()
