#!/usr/bin/python3
"""The package installs with pip (pyproject.toml; docs/design.md §8.8), offline, into a venv:

    PYTHONPATH=python /usr/bin/python3 -m pytest tests/python/test_install.py

1. `python3 -m venv --system-site-packages V` and `V/bin/pip install --no-build-isolation
   --no-deps --no-index SRC` (SRC: a copy of pyproject.toml, README.md and python/, so that
   setuptools' scratch files stay out of the source tree) install the package and the console
   scripts momfmm-report and momfmm-plot;
2. the scripts run from a directory outside the source tree with no PYTHONPATH, on the venv's
   copy of the package (not the source tree's);
3. that copy, outside a source tree, reads the repository's suite when run from its root
   (paths in the suite are relative to the current directory then).

Skipped, saying so, only when Python's venv or ensurepip module is missing (Debian:
python3-venv, which tools/install_deps.sh installs).
"""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)


def clean_env():
    """The environment without PYTHONPATH (and pip's user configuration), as a user's shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    missing = [m for m in ("venv", "ensurepip") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{sys.executable} has no {' and no '.join(missing)} module (Debian: apt-get install "
                    "python3-venv); pip install into a venv not tested")
    where = tmp_path_factory.mktemp("install")
    src = where / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "python"), src / "python", ignore=shutil.ignore_patterns("__pycache__"))
    v = where / "venv"
    r = run([sys.executable, "-m", "venv", "--system-site-packages", v], env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([v / "bin" / "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", src],
            env=clean_env(), cwd=where)
    assert r.returncode == 0, r.stdout + r.stderr
    return v


def test_console_scripts_run_the_installed_package(venv, tmp_path):
    for script, words in (("momfmm-report", ("--results", "--runs", "--group-by")),
                          ("momfmm-plot", ("--out", "RUN_OR_CKPT"))):
        path = venv / "bin" / script
        assert os.access(path, os.X_OK), f"{path}: not installed"
        r = run([path, "--help"], env=clean_env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        for word in words:
            assert word in r.stdout, (script, word, r.stdout)
    r = run([venv / "bin" / "python", "-c", "import momfmm.results.cli, momfmm.pt; print(momfmm.results.cli.__file__)"],
            env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(venv)), r.stdout
    assert "PYTHONPATH" not in clean_env()


def test_installed_report_reads_the_suite_from_the_current_directory(venv, tmp_path):
    empty = tmp_path / "no_runs"
    empty.mkdir()
    r = run([venv / "bin" / "momfmm-report", "--results", "--runs", empty, "--allow-empty", "--no-figures"],
            env=clean_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# RESULTS") and "Suite: `configs/experiments/suite.list`" in r.stdout, r.stdout[:400]
    r = run([venv / "bin" / "momfmm-report", "--results", "--runs", empty], env=clean_env(), cwd=tmp_path)
    assert r.returncode == 2 and "--suite" in r.stderr and "no such file" in r.stderr, r.stderr
