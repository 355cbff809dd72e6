"""The experiment runner's mechanics, beside test_experiments.py (which holds the suite's
items 1-6; CTest entry e2e_experiment_runner).

1. Stopping (docs/cli.md §5): a SIGTERM to the runner's process group, as Ctrl-C and `timeout`
   send, reaches only the script, which turns it into a SIGUSR1 for mpirun (mpirun answers a
   SIGTERM by killing its ranks about 2 s later): the run's STOPPED marker names signal 10 and
   its checkpoint, the runner exits 143 and starts no further run.
2. A line with --init SOURCE (ListOps from the short models): the runner runs an unfinished
   SOURCE first, selected or not, and starts the line from SOURCE's final checkpoint; an --init
   naming no earlier line is refused by the runner (exit 2) and by the report's parser; the
   Slurm array task of such a line exits 2 naming SOURCE's task until that one has finished.
"""
import os
import signal
import subprocess
import time

from momfmm.results import suite as momfmm_suite
from momfmm.results.errors import ReportError
from common import env, run
from processes import kill_session
from test_experiments import ROOT, RUNNER, SBATCH, TINY


def test_stop_signal(momfmm, workdir, report):
    """7. a SIGTERM to the runner's process group checkpoints the running run and stops the suite."""
    runs = os.path.join(workdir, "stop_runs")
    suite_file = os.path.join(workdir, "stop_suite.list")
    with open(suite_file, "w") as f:
        f.write("first configs/experiments/chain_L10.ini --set train.steps=1000000 --set train.log_interval=1\n"
                "second configs/experiments/chain_L10.ini --set train.steps=2\n")
    proc = subprocess.Popen(["bash", RUNNER, "--np", "2", "--runs", runs, "--suite", suite_file, "--momfmm", momfmm],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
                            start_new_session=True)
    log = os.path.join(runs, "first", "train.log")

    def stepping():
        if not os.path.exists(log):
            return False
        with open(log) as f:
            return "\nstep " in f.read()

    try:
        deadline = time.time() + 120
        while time.time() < deadline and not stepping():
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_session(proc.pid)  # the runner's mpirun has its own process group, in the same session
    stopped = os.path.join(runs, "first", "STOPPED")
    marker = open(stopped).read().strip() if os.path.exists(stopped) else "no STOPPED"
    ckpt = marker.split("checkpoint ", 1)[-1]
    report.check("a SIGTERM to the runner's group: exit 143", proc.returncode == 143, f"exit {proc.returncode}: {out[-400:]}")
    report.check("the ranks got the runner's SIGUSR1 (not the TERM) and checkpointed",
                 marker.startswith("signal 10: checkpoint ") and os.path.exists(ckpt), marker)
    report.check("the runner says how to go on and starts no further run",
                 "the same command resumes it" in out and not os.path.exists(os.path.join(runs, "second")), out[-400:])


def test_init_lines(momfmm, workdir, report):
    """8. --init SOURCE: the source runs first, the line starts from its final checkpoint."""
    runs = os.path.join(workdir, "init_runs")
    suite_file = os.path.join(workdir, "init_suite.list")
    tiny = " ".join(f"--set {kv}" for kv in TINY + ["data.seq_len=32"])
    with open(suite_file, "w") as f:
        f.write(f"src configs/experiments/copy_T128.ini {tiny}\n"
                f"ft configs/experiments/copy_T128.ini {tiny} --set train.seed=2 --init src\n")
    r = run(["bash", RUNNER, "--np", "2", "--runs", runs, "--suite", suite_file, "--momfmm", momfmm, "--only", "^ft$"],
            timeout=180)
    log = open(os.path.join(runs, "ft", "train.log")).read() if os.path.exists(os.path.join(runs, "ft", "train.log")) else ""
    src_ckpt = os.path.join("src", "ckpt_00000002.h5")
    report.check("runner: --only an --init line runs its unfinished source first, then the line from its checkpoint",
                 r.returncode == 0 and os.path.exists(os.path.join(runs, src_ckpt))
                 and os.path.exists(os.path.join(runs, "ft", "ckpt_00000002.h5"))
                 and f"initialised from {os.path.join(runs, src_ckpt)}" in log, (r.stdout + r.stderr)[-600:])
    r = run(["bash", RUNNER, "--np", "2", "--runs", runs, "--suite", suite_file, "--momfmm", momfmm, "--dry-run"],
            timeout=60)
    report.check("runner: a line that has checkpoints of its own resumes (--resume auto), not --init",
                 r.returncode == 0 and all("--resume auto" in c and "--init" not in c for c in r.stdout.splitlines()),
                 r.stdout + r.stderr)
    bad_suite = os.path.join(workdir, "init_bad.list")
    with open(bad_suite, "w") as f:
        f.write(f"ft configs/experiments/copy_T128.ini {tiny} --init later\nlater configs/experiments/copy_T128.ini\n")
    r = run(["bash", RUNNER, "--suite", bad_suite, "--dry-run"], timeout=60)
    report.check("runner: --init naming no earlier line exits 2 naming it",
                 r.returncode == 2 and "--init later: names no earlier line" in r.stderr, r.stderr.strip())
    try:
        momfmm_suite.parse_suite(bad_suite)
        parsed = "parsed"
    except ReportError as e:
        parsed = str(e)
    report.check("report parser: --init naming no earlier line is refused with its line",
                 "init_bad.list:1: --init later: names no earlier line" in parsed, parsed)
    sb_runs = os.path.join(workdir, "init_sbatch_runs")
    e = env(SLURM_JOB_ID=4343, SLURM_ARRAY_JOB_ID=4343, SLURM_ARRAY_TASK_ID=1, SLURM_JOB_NAME="init-test",
            SLURM_SUBMIT_DIR=ROOT, MOMFMM_SUITE=suite_file, MOMFMM_RUNS=sb_runs, MOMFMM=momfmm,
            MPIRUN_FLAGS="-np 2 --oversubscribe", MOMFMM_REQUEUE=0)
    r = run(["bash", SBATCH], env=e, timeout=60, cwd=workdir)
    report.check("experiments.sbatch: an --init task before its source's exits 2 naming the source's task",
                 r.returncode == 2 and "array task 0 (src) must finish first" in r.stderr, (r.stdout + r.stderr)[-400:])
    e["SLURM_ARRAY_TASK_ID"] = "0"
    r0 = run(["bash", SBATCH], env=e, timeout=120, cwd=workdir)
    e["SLURM_ARRAY_TASK_ID"] = "1"
    r1 = run(["bash", SBATCH], env=e, timeout=120, cwd=workdir)
    log = os.path.join(sb_runs, "ft", "train.log")
    log = open(log).read() if os.path.exists(log) else ""
    report.check("experiments.sbatch: after its source, the --init task trains from the source's checkpoint",
                 r0.returncode == 0 and r1.returncode == 0 and os.path.exists(os.path.join(sb_runs, "ft", "ckpt_00000002.h5"))
                 and "initialised from" in log, (r0.stderr + r1.stdout + r1.stderr)[-600:])
