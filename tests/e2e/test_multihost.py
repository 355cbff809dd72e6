"""Training across hosts (docs/design.md §8.11): ranks in separate network
namespaces, each with its own host name, talking over TCP through veth links
and a bridge (tests/multihost/netbed.sh). CTest runs each class under
`netbed.sh with PREFIX 4 DIR -- pytest ...` (multihost_<group>,
tests/CMakeLists.txt), which makes the bed and removes it on every exit;
by hand the same:

    tests/multihost/netbed.sh with mhx 4 /tmp/mhx -- /usr/bin/python3 -m pytest \\
        tests/e2e/test_multihost.py::TestEquality --momfmm build/momfmm

- TestEquality: 4 hosts x 1 rank and 2 hosts x 2 ranks train the model of
  4 ranks on one host (shared memory): losses within 1e-6 relative, every
  tensor within 1e-5 (max |diff| / max |value|), at dist.zero 0 and 1; the
  start-up line names the hosts; the checkpoint is written by the ranks
  together across hosts (MPI-IO, zero 1); resuming its step-6 checkpoint on
  the same 4 hosts ends bitwise equal to the uninterrupted run, and on 3
  hosts within 1e-5.
- TestFaults: under the launcher tools/momfmm-mpirun, a host's link down, a
  rank stopped (also mid-checkpoint), a host's processes stopped, a rank
  killed, a host's processes killed: the survivors end within dist.timeout,
  the launcher within dist.timeout + its grace with the ranks' status (5, or
  137 for a killed rank) and their line on its stderr, the checkpoints load
  and `--resume auto` continues on the surviving host (the class's docstring).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
from momfmm.files import list_checkpoints
from momfmm.h5 import load_checkpoint

from common import MPIRUN, env, run, write_tiny_config
from netbed import Bed
from processes import kill_session, rank_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "tools", "momfmm-mpirun")

STEPS = 12
LOSS_RTOL = 1e-6
WEIGHT_RTOL = 1e-5


def overrides(**extra):
    # gemm openblas: `auto` times the engines at start-up and may choose
    # differently in two runs; adam_eps 1e-6 as in test_mpi.py
    o = {"train.steps": STEPS, "train.batch_size": 8, "train.adam_eps": 1e-6, "train.warmup": 2,
         "train.log_interval": 1, "train.eval_interval": STEPS, "train.eval_batches": 1,
         "train.ckpt_interval": 6, "train.keep": 5, "train.gemm": "openblas", "dist.check_interval": 1}
    o.update(extra)
    return o


def train(momfmm, workdir, name, launch, resume=None, **extra):
    """Trains config `name` afresh with `launch` (a function of the momfmm
    command -> full command); returns (CompletedProcess, out_dir)."""
    ini, out_dir, _ = write_tiny_config(workdir, name, **overrides(**extra))
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [momfmm, "train", ini] + (["--resume", resume] if resume else [])
    r = run(launch(cmd), timeout=120, env=env())
    if r.returncode != 0:
        print(f"--- {name} rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}", flush=True)
    return r, out_dir


def final(out_dir):
    path = os.path.join(out_dir, f"ckpt_{STEPS:08d}.h5")
    return load_checkpoint(path) if os.path.exists(path) else None


def tensor_rel(a, b):
    """Worst max |a - b| / max |a| over every dataset (model, optim, buffers)."""
    da, db = a.datasets(), b.datasets()
    if set(da) != set(db):
        return float("inf"), "dataset sets differ"
    worst, where = 0.0, ""
    for k, x in da.items():
        x, y = x.astype(np.float64), db[k].astype(np.float64)
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) if x.size else 0.0
        if rel > worst:
            worst, where = rel, k
    return worst, where


def loss_rel(a, b):
    x, y = a.train["loss"], b.train["loss"]
    if x.shape != y.shape:
        return float("inf")
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-30)))


def bitwise(a, b):
    da, db = a.datasets(), b.datasets()
    return set(da) == set(db) and all(np.array_equal(da[k], db[k]) for k in da) and \
        np.array_equal(a.train["loss"], b.train["loss"])


def one_host(np_):
    return lambda cmd: MPIRUN + ["-np", str(np_)] + cmd


class TestEquality:
    def test_hosts_train_the_model_of_one_host(self, momfmm, workdir, report):
        bed = Bed()
        layouts = {"4x1": ([1, 2, 3, 4], 1), "2x2": ([1, 2], 2)}
        for zero in (0, 1):
            r, ref_dir = train(momfmm, workdir, f"one_host_z{zero}", one_host(4), **{"dist.zero": zero})
            ref = final(ref_dir)
            if not report.check(f"zero {zero}: 4 ranks on one host train", ref is not None, f"rc {r.returncode}"):
                continue
            for layout, (hosts, per_host) in layouts.items():
                r, out = train(momfmm, workdir, f"hosts_{layout}_z{zero}",
                               lambda cmd: bed.mpirun(hosts, per_host, cmd), **{"dist.zero": zero})
                got = final(out)
                if not report.check(f"zero {zero}: {layout} trains", got is not None, f"rc {r.returncode}"):
                    continue
                names = [bed.name(i) for i in hosts]
                report.check(f"zero {zero}: {layout} start-up line names the hosts",
                             f"4 ranks x 1 thread on {' '.join(names)}" in r.stdout,
                             next((l for l in r.stdout.splitlines() if " ranks x " in l), "no start-up line"))
                if zero == 1:
                    report.check(f"{layout}: checkpoint written by the ranks together across hosts",
                                 "4 ranks together (MPI-IO" in r.stdout)
                lr, (wr, where) = loss_rel(ref, got), tensor_rel(ref, got)
                report.check(f"zero {zero}: {layout} losses within {LOSS_RTOL} of one host", lr <= LOSS_RTOL,
                             f"{lr:.2e}")
                report.check(f"zero {zero}: {layout} tensors within {WEIGHT_RTOL} of one host",
                             wr <= WEIGHT_RTOL, f"{wr:.2e} {where}")

    def test_resume_across_hosts(self, momfmm, workdir, report):
        bed = Bed()
        four = lambda cmd: bed.mpirun([1, 2, 3, 4], 1, cmd)
        r, full_dir = train(momfmm, workdir, "resume_full", four, **{"dist.zero": 1})
        full = final(full_dir)
        half = os.path.join(full_dir, "ckpt_00000006.h5")
        assert full is not None and os.path.exists(half), f"4-host run failed (rc {r.returncode})"
        for name, hosts in (("same_4_hosts", [1, 2, 3, 4]), ("on_3_hosts", [1, 2, 3])):
            r, out = train(momfmm, workdir, f"resume_{name}", lambda cmd: bed.mpirun(hosts, 1, cmd),
                           resume=half, **{"dist.zero": 1})
            got = final(out)
            if not report.check(f"{name}: resumes step 6", got is not None, f"rc {r.returncode}"):
                continue
            if len(hosts) == 4:
                report.check("4 hosts -> 4 hosts: bitwise", bitwise(full, got))
            else:
                wr, where = tensor_rel(full, got)
                lr = loss_rel(full, got)
                report.check(f"4 hosts -> 3 hosts: tensors within {WEIGHT_RTOL}", wr <= WEIGHT_RTOL,
                             f"{wr:.2e} {where}")
                report.check(f"4 hosts -> 3 hosts: losses within {WEIGHT_RTOL}", lr <= WEIGHT_RTOL, f"{lr:.2e}")
        report.check("no temporary file left", not glob.glob(os.path.join(workdir, "resume_*", "*.tmp*")))


# Faults: dist.timeout of the tests, the launcher's grace (MOMFMM_LAUNCHER_GRACE
# of tools/momfmm-mpirun: then it kills mpirun), and the margin allowed for a
# step or checkpoint in progress and the polling.
TIMEOUT = 10
GRACE = 5
MARGIN = 8
# The launcher's status per fault (docs/cli.md §5): a peer that did not
# answer is 5, as the ranks say; a rank killed by SIGKILL is 137, as mpirun
# says (the job ends at once: its daemon reports the death); a host whose
# processes are killed is 5 (mpirun loses its daemon there and ends the job
# at once with a status of its own, 9, which the launcher replaces).
STATUS = {"link_down": 5, "sigstop": 5, "sigstop_in_save": 5, "sigstop_host": 5, "sigkill_rank": 137, "sigkill_host": 5,
          "context_sigstop": 5}
# context_sigstop: one context group of 4 ranks across both hosts
# (docs/design.md §8.12); rank 3 stopped, the others stall in one of the
# group's exchanges, which the line names
CONTEXT = {"attention.kind": "fmm", "fmm.bandwidth": 3, "data.seq_len": 32, "dist.context": 4, "momentum.gamma": 0.2}
CONTEXT_OPERATIONS = ("far-field state scan",)


def process_state(pid):
    """The one-letter state of /proc/PID/stat ('T': stopped), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, TypeError, IndexError):
        return None


def rank_pids(bed, host):
    """rank number -> pid of the MPI ranks inside host's namespace."""
    out = {}
    for pid in bed.pids(host):
        r = rank_of(pid)
        if r is not None:
            out[r] = pid
    return out


def wait_for(condition, seconds, step=0.2):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def checkpoints(out_dir):
    """The checkpoints of a run directory, oldest first (momfmm.files.list_checkpoints); none
    while the run has not made its directory yet."""
    return [path for _, path in list_checkpoints(out_dir)] if os.path.isdir(out_dir) else []


class TestFaults:
    """2 hosts x 2 ranks, dist.zero 1 (every rank writes the checkpoints),
    launched by tools/momfmm-mpirun on host 1 (MOMFMM_LAUNCHER_GRACE = 5);
    after a second checkpoint, host 2's link goes down, rank 3 (on host 2) is
    SIGSTOPped (also while the ranks write a checkpoint together), every
    process of host 2 is SIGSTOPped, rank 3 is SIGKILLed, or every process of
    host 2 is SIGKILLed. The ranks on host 1 end within dist.timeout (+
    margin); when the peers go silent (link down, stopped), they print the
    one dist.timeout line naming the step, the operation, their host and who
    did not answer (ranks 2 and 3 on host 2, or rank 3; check_named), and it
    is on the launcher's stderr; the launcher ends within dist.timeout +
    grace (+ margin), the kills within seconds, with exit 5 (137 for the
    killed rank: STATUS); every checkpoint left loads and no temporary
    carries a checkpoint's name; `--resume auto` on host 1 alone (2 ranks)
    continues from the newest checkpoint to the end."""

    def fault_run(self, momfmm, workdir, report, fault):
        bed = Bed()
        context = CONTEXT if fault.startswith("context") else {}
        ini, out_dir, _ = write_tiny_config(workdir, f"fault_{fault}", **overrides(**{
            "train.steps": 1000000, "train.ckpt_interval": 5, "train.keep": 3, "train.log_interval": 50,
            "train.eval_interval": 0, "dist.zero": 1, "dist.timeout": TIMEOUT, "dist.check_interval": 0,
            **context}))
        shutil.rmtree(out_dir, ignore_errors=True)
        cmd = bed.mpirun([1, 2], 2, [momfmm, "train", ini])
        cmd[cmd.index("mpirun")] = LAUNCHER  # on host 1, it starts mpirun ($MOMFMM_MPIRUN) with the same arguments
        log_path = os.path.join(workdir, f"fault_{fault}.log")
        err_path = os.path.join(workdir, f"fault_{fault}.err")
        # context_sigstop: rank 3 stops itself in the far-field state scan of step 11 (2 layers a step)
        hook = {"MOMFMM_TEST_STOP": "3:21:far-field state scan"} if context else {}
        with open(log_path, "w") as log, open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=log, stderr=err, start_new_session=True,
                                    env=env(MOMFMM_LAUNCHER_GRACE=GRACE, **hook))
        try:
            started = wait_for(lambda: len(checkpoints(out_dir)) >= 2 and len(rank_pids(bed, 2)) == 2, 90)
            assert started, f"no second checkpoint within 90 s:\n{open(log_path).read()[-2000:]}"
            t0 = time.time()
            if fault == "sigstop_in_save":
                t0 = self.stop_in_write(bed, out_dir, report)
            elif fault == "link_down":
                bed.link(2, False)
            elif fault == "context_sigstop":
                stopped = wait_for(lambda: process_state(rank_pids(bed, 2).get(3)) == "T", 60, step=0.01)
                t0 = time.time()
                report.check(f"{fault}: rank 3 stopped itself in the far-field state scan", stopped)
            elif fault in ("sigstop", "sigkill_rank"):
                os.kill(rank_pids(bed, 2)[3], signal.SIGKILL if fault == "sigkill_rank" else signal.SIGSTOP)
            else:
                for pid in bed.pids(2):
                    os.kill(pid, signal.SIGKILL if fault == "sigkill_host" else signal.SIGSTOP)
            survivors_gone = wait_for(lambda: not rank_pids(bed, 1), TIMEOUT + MARGIN)
            t_ranks = time.time() - t0
            report.check(f"{fault}: the ranks on host 1 end within dist.timeout {TIMEOUT} s + {MARGIN} s",
                         survivors_gone, f"{t_ranks:.1f} s")
            bound = TIMEOUT + GRACE + MARGIN
            try:
                proc.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                pass
            t_launcher = time.time() - t0
            rc = proc.poll()
            report.check(f"{fault}: the launcher ends within dist.timeout + grace + {MARGIN} s = {bound} s",
                         rc is not None, f"{t_launcher:.1f} s, status {rc}")
            report.check(f"{fault}: the launcher's status is {STATUS[fault]}", rc == STATUS[fault],
                         f"status {rc}; stderr ...{open(err_path).read()[-600:]}")
        finally:
            kill_session(proc.pid)
            for pid in bed.pids(2) + bed.pids(1):
                os.kill(pid, signal.SIGKILL)
            if fault == "link_down":
                subprocess.run([bed.script, "link", bed.prefix, "2", "up"], timeout=30, check=True)
        text = open(err_path).read()  # the launcher's stderr: the ranks' lines, its own
        lines = [l for l in text.splitlines() if "dist.timeout:" in l]
        print(f"{fault}: ranks on host 1 ended {t_ranks:.1f} s, the launcher {t_launcher:.1f} s after the fault, "
              f"status {rc}; "
              + (lines[0] if lines else "no dist.timeout line"), flush=True)
        if not fault.startswith("sigkill"):
            # with rank 3 or host 2's processes gone, mpirun itself ends the job at once
            named = [l for l in lines if re.search(r"step \d+: .+ did not complete in \d+ s", l)
                     and f"(host {bed.name(1)})" in l and "exiting 5" in l]
            report.check(f"{fault}: a rank on host 1 says which step and operation timed out", named,
                         lines[0] if lines else text[-500:])
        if not fault.startswith("sigkill"):
            self.check_named(bed, fault, lines, report)
        if fault == "sigstop_in_save":
            report.check(f"{fault}: the line names the checkpoint write", any("checkpoint write" in l for l in lines))
        if context:
            report.check(f"{fault}: the line names the context group's exchange it stalled in",
                         any(op in l for l in lines for op in CONTEXT_OPERATIONS), "\n".join(lines))
        self.check_checkpoints(momfmm, bed, out_dir, ini, fault, report, ["--set", "dist.context=2"] if context else [])

    def stop_in_write(self, bed, out_dir, report):
        """Stops rank 3 while the ranks write a checkpoint together (MPI-IO)
        and returns when. A write takes about 0.2 s here, so rank 3's pid is
        found first and the signal follows the temporary file within the
        poll; a stop that still lands after the write ended (the temporary
        gone: the ranks would time out in the next step, not in the write)
        lets rank 3 go on and tries the next checkpoint."""
        pid = rank_pids(bed, 2)[3]
        pattern = os.path.join(out_dir, "ckpt_*.h5.tmp.*")
        caught, t0 = False, time.time()
        for _ in range(5):
            if not wait_for(lambda: glob.glob(pattern), 60, step=0.005):
                break
            os.kill(pid, signal.SIGSTOP)
            t0 = time.time()
            time.sleep(0.5)
            caught = bool(glob.glob(pattern))
            if caught:
                break
            os.kill(pid, signal.SIGCONT)
        report.check("a rank stopped while the ranks were writing a checkpoint (its *.tmp.* file left)", caught)
        return t0

    def check_named(self, bed, fault, lines, report):
        """The ranks on host 1 name who did not answer: rank 3 (host 2) when it
        is stopped, ranks 2 and 3 (host 2) when the link is down. A rank that
        times out inside the ranks' joint checkpoint write (parallel HDF5's
        own MPI calls and the agreement on its outcome, where it hears no
        one) says instead that every rank arrived and the write stalls
        inside (docs/design.md §8.11), or, at an operation of ours inside
        the write (its agreement), names those of the expected ranks that
        have reached it and gone silent: a peer still inside parallel HDF5's
        calls is not heard and not named. The fault sigstop_in_save aims
        there, and the others land there when the fault comes during a write
        (sigstop_host once named rank 3 alone: rank 2 was stopped inside
        HDF5's calls, rank 3 at the agreement)."""
        ranks = [2, 3] if fault in ("link_down", "sigstop_host") else [3]
        expect = (f"ranks {', '.join(map(str, ranks))}" if len(ranks) > 1 else f"rank {ranks[0]}") \
            + f" (host {bed.name(2)})"
        mine = [l for l in lines if f"(host {bed.name(1)}): " in l]
        found = [(l, re.search(r"\(host [^)]*\): (.*); exiting 5$", l)) for l in mine]
        said = [m.group(1) for _, m in found if m]
        ok = [x for x in said if x == "no answer from " + expect]
        # the write phase as a whole, or an operation inside it ("checkpoint write: agreement all-reduce")
        in_write = re.compile(r"checkpoint write(: [a-z -]+)? did not complete")
        some = {f"no answer from rank {r} (host {bed.name(2)})" for r in ranks}
        ok += [m.group(1) for l, m in found
               if m and in_write.search(l) and (m.group(1).startswith("every rank arrived; it stalled inside")
                                                 or m.group(1) in some)]
        report.check(f"{fault}: a rank on host 1 names {expect} as not answering", ok, "\n".join(mine))
        report.check(f"{fault}: no rank on host 1 names another rank",
                     all(x in ok or not x.startswith("no answer") for x in said), "\n".join(mine))

    def check_checkpoints(self, momfmm, bed, out_dir, ini, fault, report, sets=()):
        files = checkpoints(out_dir)
        steps = []
        for f in files:
            try:
                steps.append(load_checkpoint(f).step)
            except Exception as exc:  # a finished name must never be a torn file
                report.check(f"{fault}: {os.path.basename(f)} loads", False, str(exc))
        report.check(f"{fault}: the checkpoints left load", steps and len(steps) == len(files), f"steps {steps}")
        report.check(f"{fault}: no temporary under a checkpoint's name",
                     all(re.fullmatch(r"ckpt_\d{8}\.h5", os.path.basename(f)) for f in files))
        if not steps:
            return
        newest = max(steps)
        r = run(bed.mpirun([1], 2, [momfmm, "train", ini, "--resume", "auto", "--set", f"train.steps={newest + 5}",
                                    *sets]), timeout=120)
        done = os.path.join(out_dir, f"ckpt_{newest + 5:08d}.h5")
        report.check(f"{fault}: --resume auto on host 1 with 2 ranks continues from step {newest} to the end",
                     r.returncode == 0 and os.path.exists(done) and load_checkpoint(done).step == newest + 5
                     and "2 ranks x 1 thread on " + bed.name(1) in r.stdout,
                     f"rc {r.returncode}: {r.stderr.strip()[-300:]}")

    def test_link_down(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "link_down")

    def test_sigstop_rank(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "sigstop")

    def test_sigstop_rank_in_checkpoint_write(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "sigstop_in_save")

    def test_sigstop_host(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "sigstop_host")

    def test_sigkill_rank(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "sigkill_rank")

    def test_context_group_rank_stopped(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "context_sigstop")

    def test_sigkill_host(self, momfmm, workdir, report):
        self.fault_run(momfmm, workdir, report, "sigkill_host")
