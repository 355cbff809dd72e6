"""Installation (docs/cli.md §5, install; docs/design.md §8.8): `cmake --install`
into a scratch prefix, then, from a directory outside the source tree and
with nothing of the source tree on PYTHONPATH:
- the installed files are where they belong (bin, share/momfmm, share/doc/momfmm);
- the installed `momfmm` (found on PATH) trains the installed quickstart config
  under `mpirun -np 2` (20 steps), start-up line first; its outputs land in the
  run directory under the current directory and nothing in the source tree;
- `inspect` and `eval` read the run directory (its newest checkpoint, named),
  `inspect` reads the live metrics file;
- the installed `momfmm-report` and `momfmm-plot` read the run;
- the installed job scripts find their library (share/momfmm/jobs/momfmm_lib.sh)
  and `momfmm` on PATH when MOMFMM is not set and there is no build/momfmm
  (mpirun replaced by a script that records its command).

CTest passes CMAKE_COMMAND and MOMFMM_BUILD_DIR (tests/CMakeLists.txt).
"""
import glob
import os
import tempfile

import pytest

from common import MPIRUN, env as root_env, run

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 20


def installed_env(prefix, **extra):
    """The environment of a user of the install: its bin first on PATH, no
    PYTHONPATH (the tools must find their installed package), no MOMFMM."""
    e = root_env()
    e["PATH"] = os.path.join(prefix, "bin") + os.pathsep + e.get("PATH", "")
    for name in ("PYTHONPATH", "MOMFMM", "MOMFMM_BIN"):
        e.pop(name, None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def source_tree_state():
    """Untracked and modified files of the source tree (None outside a git checkout)."""
    r = run(["git", "-C", SOURCE, "status", "--porcelain", "--untracked-files=all"])
    return r.stdout if r.returncode == 0 else None


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    build = os.environ.get("MOMFMM_BUILD_DIR")
    if not build:
        pytest.skip("MOMFMM_BUILD_DIR is not set (CTest sets it)")
    where = str(tmp_path_factory.mktemp("prefix"))
    r = run([os.environ.get("CMAKE_COMMAND", "cmake"), "--install", build, "--prefix", where], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return where


@pytest.fixture(scope="module")
def elsewhere():
    """A working directory outside the source tree (and outside the build
    tree, which may sit inside it)."""
    with tempfile.TemporaryDirectory(prefix="momfmm_install_") as path:
        assert not os.path.realpath(path).startswith(os.path.realpath(SOURCE) + os.sep)
        yield path


@pytest.fixture(scope="module")
def quickstart(prefix, elsewhere):
    """The installed quickstart config trained for STEPS steps from `elsewhere`."""
    before = source_tree_state()
    config = os.path.join(prefix, "share", "momfmm", "configs", "quickstart.ini")
    sets = [f"train.steps={STEPS}", "train.log_interval=5", "train.eval_interval=10", "train.ckpt_interval=10",
            "train.eval_batches=1"]
    args = MPIRUN + ["-np", "2", "momfmm", "train", config] + [a for s in sets for a in ("--set", s)]
    r = run(args, cwd=elsewhere, env=installed_env(prefix))
    return r, before


INSTALLED = ["bin/momfmm", "bin/momfmm-report", "bin/momfmm-plot", "bin/momfmm-mpirun",
             "share/momfmm/python/momfmm/__init__.py", "share/momfmm/python/momfmm/h5.py",
             "share/momfmm/tools/momfmm_report.py", "share/momfmm/tools/momfmm_plot.py",
             "share/momfmm/tools/run_experiments.sh", "share/momfmm/configs/quickstart.ini",
             "share/momfmm/configs/experiments/suite.list", "share/momfmm/jobs/train.sbatch",
             "share/momfmm/jobs/train_srun.sbatch", "share/momfmm/jobs/sweep.sbatch",
             "share/momfmm/jobs/experiments.sbatch", "share/momfmm/jobs/momfmm_lib.sh", "share/doc/momfmm/README.md",
             "share/doc/momfmm/docs/cli.md"]
EXECUTABLE = ["bin/momfmm", "bin/momfmm-report", "bin/momfmm-plot", "bin/momfmm-mpirun",
              "share/momfmm/tools/momfmm_report.py", "share/momfmm/jobs/train.sbatch"]


def test_files_installed(prefix):
    missing = [f for f in INSTALLED if not os.path.isfile(os.path.join(prefix, f))]
    assert not missing, f"not installed under {prefix}: {missing}"
    not_executable = [f for f in EXECUTABLE if not os.access(os.path.join(prefix, f), os.X_OK)]
    assert not not_executable, not_executable
    assert not glob.glob(os.path.join(prefix, "**", "__pycache__"), recursive=True)


def test_quickstart_trains_from_the_install(quickstart, elsewhere):
    r, before = quickstart
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = os.path.join(elsewhere, "runs", "quickstart")
    assert os.path.isfile(os.path.join(run_dir, f"ckpt_{STEPS:08d}.h5")), os.listdir(elsewhere)
    assert os.path.isfile(os.path.join(run_dir, "metrics.h5"))
    lines = r.stdout.splitlines()
    startup = next(i for i, line in enumerate(lines) if line.startswith("momfmm: 2 ranks"))
    memory = next(i for i, line in enumerate(lines) if line.startswith("memory:"))
    assert startup < memory, "the start-up line comes first:\n" + r.stdout
    # outputs go to the run directory only: nothing new in the source tree
    if before is not None:
        assert source_tree_state() == before


def test_inspect_and_eval_take_the_run_directory(prefix, quickstart, elsewhere):
    assert quickstart[0].returncode == 0
    e = installed_env(prefix)
    newest = f"runs/quickstart/ckpt_{STEPS:08d}.h5"
    r = run(["momfmm", "inspect", "runs/quickstart"], cwd=elsewhere, env=e)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"checkpoint: {newest}\n"), r.stdout
    assert "gamma = 0.2\n" in r.stdout and "memory:" not in r.stdout, r.stdout
    r = run(MPIRUN + ["-np", "2", "momfmm", "eval", "runs/quickstart"], cwd=elsewhere, env=e)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"checkpoint: {newest}\n"), r.stdout
    assert "memory:" not in r.stdout and "eval | loss" in r.stdout, r.stdout
    r = run(["momfmm", "inspect", "runs/quickstart/metrics.h5"], cwd=elsewhere, env=e)
    assert r.returncode == 0, r.stderr
    assert f"step {STEPS} loss" in r.stdout and "corrupt" not in r.stdout + r.stderr, r.stdout


def test_installed_tools(prefix, quickstart, elsewhere):
    assert quickstart[0].returncode == 0
    e = installed_env(prefix)
    r = run(["momfmm-report", "runs/quickstart"], cwd=elsewhere, env=e)
    assert r.returncode == 0, r.stderr
    assert "quickstart" in r.stdout and "|" in r.stdout, r.stdout
    r = run(["momfmm-plot", "runs/quickstart", "--out", "figures"], cwd=elsewhere, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    assert glob.glob(os.path.join(elsewhere, "figures", "*.png")), os.listdir(elsewhere)


def fake_job(prefix, cwd, tmp_path, path_dirs, **extra):
    """train.sbatch as Slurm would start it in `cwd`, with a recording mpirun that
    records its command line; returns (CompletedProcess, recorded arguments)."""
    recorder_dir = tmp_path / "recorder"
    recorder_dir.mkdir(exist_ok=True)
    log = tmp_path / "mpirun.args"
    recorder = recorder_dir / "mpirun"
    recorder.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\n")
    recorder.chmod(0o755)
    if log.exists():
        log.unlink()
    e = installed_env(prefix, SLURM_JOB_ID=7, SLURM_JOB_NAME="job", SLURM_SUBMIT_DIR=cwd, **extra)
    e["PATH"] = os.pathsep.join([str(recorder_dir)] + path_dirs + ["/usr/bin", "/bin"])
    config = os.path.join(prefix, "share", "momfmm", "configs", "quickstart.ini")
    r = run(["bash", os.path.join(prefix, "share", "momfmm", "jobs", "train.sbatch"), config], cwd=cwd, env=e)
    return r, log.read_text().splitlines() if log.exists() else []


def test_job_script_finds_momfmm(prefix, tmp_path):
    cwd = str(tmp_path / "submit")
    os.makedirs(cwd)
    installed = os.path.join(prefix, "bin", "momfmm")
    r, args = fake_job(prefix, cwd, tmp_path, [os.path.join(prefix, "bin")])
    assert r.returncode == 0 and installed in args, r.stdout + r.stderr
    library = os.path.join(prefix, "share", "momfmm", "jobs", "momfmm_lib.sh")
    assert f"train.sbatch: functions from {library}\n" in r.stdout, r.stdout
    r, args = fake_job(prefix, cwd, tmp_path, [])
    assert r.returncode == 2 and "not found" in r.stderr and not args, r.stdout + r.stderr
    # build/momfmm of the submit directory wins over PATH, MOMFMM over both
    os.makedirs(os.path.join(cwd, "build"))
    local = os.path.join(cwd, "build", "momfmm")
    os.symlink(installed, local)
    r, args = fake_job(prefix, cwd, tmp_path, [os.path.join(prefix, "bin")])
    assert r.returncode == 0 and local in args, r.stdout + r.stderr
    r, args = fake_job(prefix, cwd, tmp_path, [os.path.join(prefix, "bin")], MOMFMM=installed)
    assert r.returncode == 0 and installed in args, r.stdout + r.stderr
