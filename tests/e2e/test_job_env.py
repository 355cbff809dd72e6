"""The job scripts' SLURM_* values (jobs/momfmm_lib.sh, check_slurm_env), without
a Slurm cluster: each job script runs with the variables set by hand, MOMFMM =
/bin/true, a recording mpirun (MOMFMM_MPIRUN) and srun (on PATH).

- every SLURM_* variable that jobs/ or tools/ read is in the library's table
  SLURM_VARIABLES and in BAD below, and nothing else is;
- for each of the four job scripts, each variable with each bad value (empty,
  letters, zero or negative counts, leading zeros, too many digits, an
  arithmetic expansion, thread counts beyond this node's CPUs, malformed
  task lists, a relative or missing directory, control characters): exit 2,
  one line on stderr naming the variable and the value, nothing launched;
- a variable a script needs left unset (SLURM_JOB_ID, SLURM_JOB_NAME,
  SLURM_ARRAY_TASK_ID): exit 2, one line naming it;
- well-formed values launch, with OMP_NUM_THREADS = SLURM_CPUS_PER_TASK
  (1 when unset) and the rank count from SLURM_TASKS_PER_NODE.
"""
import glob
import os
import re
import subprocess

import pytest

from common import env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(ROOT, "jobs")
SCRIPTS = ["train.sbatch", "train_srun.sbatch", "sweep.sbatch", "experiments.sbatch"]
NCPU = os.sysconf("SC_NPROCESSORS_ONLN")
INJECT = "a[$(touch INJECTED)]"  # bash arithmetic would run it

# variable -> values Slurm never writes there
BAD = {
    "SLURM_JOB_ID": ["", "abc", "0", "-3", "07", "1.5", "7 8", "12345678901", INJECT],
    "SLURM_ARRAY_JOB_ID": ["", "x", "0", "08", "9" * 11, INJECT],
    "SLURM_ARRAY_TASK_ID": ["", "x", "-1", "01", "1e3", INJECT],
    "SLURM_RESTART_COUNT": ["", "one", "-1", "00", INJECT],
    "SLURM_NTASKS": ["", "0", "x", "-4", "08", "2 ", "2\n3"],
    "SLURM_TASKS_PER_NODE": ["", "0", "x", "2(x0)", "2(x3),", ",2", "2(3)", "-1", "2x3", "0(x4)", "2\n3"],
    "SLURM_CPUS_PER_TASK": ["", "0", "abc", "100000", str(NCPU + 1), "1.5", " 2", "-1", INJECT],
    "SLURM_OVERCOMMIT": ["", "2", "yes"],
    "SLURM_JOB_NAME": ["", "a/b", "a\nb", "a\tb"],
    "SLURM_SUBMIT_DIR": ["", "relative/dir", "/nonexistent/momfmm", "/etc/hostname"],
    "SLURM_JOB_NODELIST": ["", "node 1", "n1\nn2"],
}
# variables a script cannot run without, and the word of its message
NEEDED = {
    "train.sbatch": ["SLURM_JOB_ID", "SLURM_JOB_NAME"],
    "train_srun.sbatch": ["SLURM_JOB_ID", "SLURM_JOB_NAME"],
    "sweep.sbatch": ["SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME"],
    "experiments.sbatch": ["SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME"],
}


@pytest.fixture(scope="module")
def setup(workdir):
    """A fake mpirun and srun that record their arguments and OMP_NUM_THREADS,
    a config, a sweep file and a one-line suite list."""
    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir, exist_ok=True)
    calls = os.path.join(workdir, "calls.log")
    for name in ("mpirun", "srun"):
        path = os.path.join(bindir, name)
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\necho "{name} OMP_NUM_THREADS=$OMP_NUM_THREADS $*" >> {calls}\n')
        os.chmod(path, 0o755)
    config = os.path.join(workdir, "job.ini")
    with open(config, "w") as f:
        f.write("[train]\nsteps = 4\n")
    sweep = os.path.join(workdir, "sweep.txt")
    with open(sweep, "w") as f:
        f.write("--set momentum.gamma=0.1\n--set momentum.gamma=0.2\n")
    suite = os.path.join(workdir, "suite.list")
    with open(suite, "w") as f:
        f.write(f"one {config} --set train.steps=4\n")
    return {"bin": bindir, "calls": calls, "config": config, "sweep": sweep, "suite": suite, "work": workdir}


def good_env(s):
    """Every SLURM_* variable well formed, as Slurm would set them for an
    array task of 2 tasks on one node."""
    e = {k: v for k, v in env().items() if not k.startswith("SLURM_")}
    e.update(SLURM_JOB_ID="7", SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="0", SLURM_RESTART_COUNT="0",
             SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1", SLURM_OVERCOMMIT="0",
             SLURM_JOB_NAME="job", SLURM_SUBMIT_DIR=s["work"], SLURM_JOB_NODELIST="node1",
             MOMFMM="/bin/true", MOMFMM_RUNS=os.path.join(s["work"], "runs"), MOMFMM_SUITE=s["suite"],
             MOMFMM_MPIRUN=os.path.join(s["bin"], "mpirun"), MOMFMM_REQUEUE="0")
    e["PATH"] = s["bin"] + os.pathsep + e["PATH"]
    return e


def job(s, script, e):
    args = {"train.sbatch": [s["config"]], "train_srun.sbatch": [s["config"]],
            "sweep.sbatch": [s["config"], s["sweep"]], "experiments.sbatch": []}[script]
    if os.path.exists(s["calls"]):
        os.remove(s["calls"])
    r = subprocess.run(["bash", os.path.join(JOBS, script)] + args, capture_output=True, text=True, env=e,
                       cwd=s["work"], timeout=60)
    calls = open(s["calls"]).read().splitlines() if os.path.exists(s["calls"]) else []
    return r, calls


def used_variables():
    """SLURM_* names in the code (not the comments) of jobs/ and tools/."""
    names = set()
    for path in sorted(glob.glob(os.path.join(JOBS, "*")) + glob.glob(os.path.join(ROOT, "tools", "*"))):
        if not os.path.isfile(path):
            continue
        try:
            text = open(path).read()
        except UnicodeDecodeError:
            continue
        for line in text.splitlines():
            if not line.lstrip().startswith("#"):
                names.update(re.findall(r"\bSLURM_[A-Z_]+\b", line))
    return names - {"SLURM_VARIABLES"}


def library_table():
    text = open(os.path.join(JOBS, "momfmm_lib.sh")).read()
    table = re.search(r"^SLURM_VARIABLES='(.*?)'$", text, re.M | re.S).group(1)
    return {line.split()[0] for line in table.replace("'\"'\"'", "'").splitlines()}


def test_every_variable_is_checked(report):
    used, table = used_variables(), library_table()
    report.check("every SLURM_* variable the job scripts and tools read is in SLURM_VARIABLES", used <= table,
                 f"not in the table: {sorted(used - table)}")
    report.check("SLURM_VARIABLES names only variables that are read", table <= used,
                 f"never read: {sorted(table - used)}")
    report.check("the test walks every variable of SLURM_VARIABLES", set(BAD) == table,
                 f"{sorted(set(BAD) ^ table)}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_values(setup, report, script):
    s = setup
    r, calls = job(s, script, good_env(s))
    report.check(f"{script}: well-formed values launch", r.returncode == 0 and len(calls) == 1,
                 f"rc {r.returncode}: {r.stderr[-400:]} {calls}")
    wrong = []
    for name, values in BAD.items():
        for value in values:
            e = good_env(s)
            e[name] = value
            r, calls = job(s, script, e)
            shown = re.sub(r"[\x00-\x1f\x7f]", "?", value)
            lines = r.stderr.splitlines()
            if not (r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{script}: {name}='{shown}': "
                                                                                  "expected ") and not calls):
                wrong.append(f"{name}={value!r}: rc {r.returncode}, stderr {r.stderr!r}, launched {calls}")
    report.check(f"{script}: every bad SLURM_* value exits 2 with one line naming the variable and value, "
                 f"nothing launched ({sum(map(len, BAD.values()))} values)", not wrong, "\n".join(wrong[:8]))
    report.check(f"{script}: no arithmetic expansion ran", not os.path.exists(os.path.join(s["work"], "INJECTED")))


@pytest.mark.parametrize("script", SCRIPTS)
def test_needed_variables_unset(setup, report, script):
    s = setup
    for name in NEEDED[script]:
        e = good_env(s)
        del e[name]
        r, calls = job(s, script, e)
        lines = r.stderr.splitlines()
        report.check(f"{script}: {name} unset: exit 2, one line naming it, nothing launched",
                     r.returncode == 2 and len(lines) == 1 and f"{name} is not set" in lines[0] and not calls,
                     f"rc {r.returncode}: {r.stderr!r} {calls}")


def test_train_without_job_name_but_out_dir(setup, report):
    s = setup
    e = good_env(s)
    del e["SLURM_JOB_NAME"]
    out = os.path.join(s["work"], "named_run")
    r = subprocess.run(["bash", os.path.join(JOBS, "train.sbatch"), s["config"], "--set", f"train.out_dir={out}"],
                       capture_output=True, text=True, env=e, cwd=s["work"], timeout=60)
    report.check("train.sbatch --set train.out_dir=DIR needs no SLURM_JOB_NAME", r.returncode == 0, r.stderr)


@pytest.mark.parametrize("cpus,per_node,threads,ranks", [(None, "2", 1, 2), (str(NCPU), "2(x3),1", NCPU, 7),
                                                         ("1", None, 1, 2)])
def test_derived_values(setup, report, cpus, per_node, threads, ranks):
    s = setup
    e = good_env(s)
    for name, value in (("SLURM_CPUS_PER_TASK", cpus), ("SLURM_TASKS_PER_NODE", per_node)):
        if value is None:
            del e[name]
        else:
            e[name] = value
    e["OMP_NUM_THREADS"] = "100000"  # the job's own value wins
    for script in ("train.sbatch", "train_srun.sbatch"):
        r, calls = job(s, script, e)
        report.check(f"{script}, SLURM_CPUS_PER_TASK={cpus} SLURM_TASKS_PER_NODE={per_node}: "
                     f"{ranks} ranks x {threads} threads, OMP_NUM_THREADS={threads} for the launcher",
                     r.returncode == 0 and f": {ranks} ranks x {threads} threads," in r.stdout and len(calls) == 1
                     and calls[0].split()[1] == f"OMP_NUM_THREADS={threads}"
                     and (script != "train_srun.sbatch" or f"--ntasks={ranks}" in calls[0]),
                     f"rc {r.returncode}: {r.stdout[-300:]} {r.stderr[-300:]} {calls}")
