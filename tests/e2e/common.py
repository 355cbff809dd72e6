"""Helpers shared by the end-to-end tests (pytest modules beside this file):
run momfmm, write configs and token files, and collect named checks. The one
place for them: the test modules import these rather than keep copies (the
binary itself comes from conftest.py's `momfmm` fixture)."""
import os
import re
import subprocess

import h5py
import numpy as np
from momfmm.h5 import load_checkpoint, newest_checkpoint

ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def env(**extra):
    """The environment of a test's commands: os.environ, ROOT_ENV, then extra;
    LeakSanitizer off unless ASAN_OPTIONS says otherwise (as CTest sets it)."""
    e = dict(os.environ)
    e.update(ROOT_ENV)
    e.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(args, timeout=600, **kw):
    """Runs a command (its arguments made str) with env() unless env= is
    given; further keywords (cwd=...) go to subprocess.run. Returns the
    CompletedProcess with text output."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=kw.pop("env", env()), **kw)


def unavailable(momfmm, feature, **extra_env):
    """Why `feature` ('bf16', 'avx512') cannot run here, as `momfmm --version` says on its line
    under env(**extra_env), or None. MOMFMM_FORCE_BF16=1 asks whether bf16 runs here at all (emulated by
    oneDNN, or as bf16 values on OpenBLAS's sgemm: docs/scale.md §7)."""
    out = run([momfmm, "--version"], env=env(**extra_env)).stdout
    m = re.search(rf"^{feature}:\s+unavailable: (.*)$", out, re.M)
    return m.group(1) if m else None


def write_config(path, sections):
    """sections: {"model": {"d_model": 32, ...}, ...} -> INI file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for section, keys in sections.items():
            f.write(f"[{section}]\n")
            for k, v in keys.items():
                if isinstance(v, bool):
                    v = "true" if v else "false"
                f.write(f"{k} = {v}\n")
            f.write("\n")
    return path


def tiny_config(out_dir, **overrides):
    """A small chain-task config; overrides as {"section.key": value}."""
    sections = {
        "model": {"vocab_size": 32, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64},
        "data": {"task": "chain", "seq_len": 16, "chain_len": 5},
        "train": {"steps": 4, "batch_size": 4, "lr": 3e-3, "warmup": 1, "log_interval": 1,
                  "eval_interval": 2, "eval_batches": 1, "out_dir": out_dir},
    }
    return apply_overrides(sections, overrides)


def apply_overrides(sections, overrides):
    """sections with each {"section.key": value} of overrides set (a new section as needed)."""
    for key, value in overrides.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return sections


# The MPI launcher CMake found (FindMPI's MPIEXEC_EXECUTABLE, passed by CTest
# as MPIEXEC); plain `mpirun` when the tests run outside CTest.
MPIRUN = [os.environ.get("MPIEXEC") or "mpirun", "--oversubscribe"]


def write_tiny_config(workdir, name, **overrides):
    """<workdir>/<name>.ini from tiny_config(<workdir>/<name>, **overrides); returns
    (ini, out_dir, sections)."""
    out_dir = os.path.join(workdir, name)
    sections = tiny_config(out_dir, **overrides)
    return write_config(os.path.join(workdir, name + ".ini"), sections), out_dir, sections


def train_command(momfmm, ini, sets=(), np_=None, resume=None):
    """`momfmm train INI [--set S ...] [--resume R]`, under `mpirun -np np_` when np_ is given."""
    cmd = [momfmm, "train", ini]
    for s in sets:
        cmd += ["--set", s]
    if resume:
        cmd += ["--resume", resume]
    return MPIRUN + ["-np", str(np_)] + cmd if np_ else cmd


def load_newest(out_dir, **kw):
    """The highest-step checkpoint of a run directory, through the package's
    one reader (momfmm.h5.load_checkpoint; docs/design.md §8.8)."""
    path = newest_checkpoint(out_dir)
    assert path, f"no checkpoint in {out_dir}"
    return load_checkpoint(path, **kw)


def write_tokens(path, inputs, targets, labels=None):
    """A token file (docs/files.md): int32 inputs and targets [B, T], labels [B]."""
    with h5py.File(path, "w") as f:
        f["inputs"] = np.asarray(inputs, dtype=np.int32)
        f["targets"] = np.asarray(targets, dtype=np.int32)
        if labels is not None:
            f["labels"] = np.asarray(labels, dtype=np.int32)
    return path


class Report:
    """Named checks of one test (the `report` fixture of conftest.py): each
    check() prints PASS or FAIL with its detail and the test goes on, so one
    failure does not hide the checks after it; conftest fails the test after
    it returns when any check failed, naming every failed check, and when it
    made no check at all (a test that asks for `report` and checks nothing
    tested nothing). Fixtures that train once for several tests use one too
    and call assert_all()."""

    made = []  # every Report of the session, for conftest's summary line

    def __init__(self):
        self.passed = 0
        self.failures = []
        Report.made.append(self)

    def check(self, name, ok, detail=""):
        ok = bool(ok)
        line = f"{name}{': ' + detail if detail else ''}"
        print(f"{'PASS' if ok else 'FAIL'} {line}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failures.append(line)
        return ok

    @property
    def failed(self):
        return len(self.failures)

    def assert_all(self):
        assert self.passed + self.failed > 0, "no named check was made: nothing was tested (report.check never called)"
        assert not self.failures, (f"{self.failed} of {self.passed + self.failed} checks failed:\n  "
                                   + "\n  ".join(self.failures))


def perturb(path, rng):
    """Weights far from the 0.02 initialisation, so every path matters."""
    with h5py.File(path, "r+") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            x = obj[()]
            if name.startswith("model/"):
                if name.endswith("momentum_gamma"):
                    x = rng.uniform(0.05, 0.4, x.shape)
                elif x.ndim == 2:
                    x = x + rng.normal(0, 1.0 / np.sqrt(x.shape[1]), x.shape)
                else:
                    x = x + rng.normal(0, 0.2, x.shape)
            elif name.startswith("buffers/"):
                x = rng.normal(0, 1.0, x.shape)
            obj[...] = x.astype(np.float32)
        f.visititems(visit)
