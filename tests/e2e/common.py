"""Helpers shared by the end-to-end tests: run momfmm, write configs and
token files, report in the `N passed, M failed` form CTest logs show."""
import argparse
import glob
import os
import subprocess
import sys

import h5py
import numpy as np

ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def argument_parser(description=None):
    """The arguments every end-to-end test takes (CTest passes both)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--momfmm", required=True, help="the momfmm binary under test")
    ap.add_argument("--workdir", required=True, help="scratch directory for configs and runs")
    return ap


def newest_checkpoint(out_dir):
    """Path of the highest-step ckpt_*.h5 in a run directory."""
    return sorted(glob.glob(os.path.join(out_dir, "ckpt_*.h5")))[-1]


def env(**extra):
    e = dict(os.environ)
    e.update(ROOT_ENV)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(args, timeout=600, **kw):
    """Runs a command; returns CompletedProcess with text output."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=kw.pop("env", env()), **kw)


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
    for key, value in overrides.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return sections


MPIRUN = ["mpirun", "--oversubscribe"]


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


def write_tokens(path, inputs, targets, labels=None):
    with h5py.File(path, "w") as f:
        f["inputs"] = np.asarray(inputs, dtype=np.int32)
        f["targets"] = np.asarray(targets, dtype=np.int32)
        if labels is not None:
            f["labels"] = np.asarray(labels, dtype=np.int32)
    return path


class Report:
    """Collects named checks; finish() prints `N passed, M failed` and exits."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
