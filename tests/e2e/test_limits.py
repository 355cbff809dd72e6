"""Environment and limits (docs/cli.md §5 "Under mpirun" and "Signals", docs/scale.md):

- TestSingleProcess: help, init, inspect, eval, generate and loss run alone
  start no MPI runtime: they work under env -i, TMPDIR a file, TMPDIR a
  directory that does not exist (not created) or an empty one (left empty: no
  session directory), ulimit -n 8 and ulimit -f 4 MB; 50 inspects at once,
  twice, beside a training run under mpirun all succeed.
- TestFileLimits: a checkpoint larger than ulimit -f stops train with exit 3
  and one line naming the file and the limit, no temporary left, a summary
  naming no checkpoint; init likewise exits 3. `train | head -1` (alone, and
  under momfmm-mpirun -np 2) stops with a checkpoint and exit 0, not SIGPIPE.
- TestStandardOutput: every command that prints, with stdout on /dev/full or
  closed, exits 3 with one line naming standard output.
- TestThreads: OMP_NUM_THREADS of 100000, 20000 and the CPUs + 1 train at
  once on the machine's CPUs with one warning; values that are no count
  exit 2; alone and at np = 2.
- TestMemoryLimits: under ulimit -v (not in the sanitizer build, whose shadow
  memory needs the address space) OpenBLAS's buffers that do not fit, and a
  model whose parameters, gradients and moments do not fit, or activations
  that do not, exit 2 within seconds with the estimate; under ulimit -v
  300 MB SIGTERM still stops a run with a checkpoint.
- TestRefusedStart: a start refused under momfmm-mpirun -np 2 prints one line,
  no Open MPI banner.
"""
import os
import re
import resource
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from ckpt_util import LAUNCHER, checkpoints, ckpt
from common import MPIRUN, env, run, write_tiny_config
from processes import kill_session

TIMEOUT_S = 120


def limited(**limits):
    """preexec_fn setting resource limits, e.g. limited(NOFILE=8)."""
    def apply():
        for name, value in limits.items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
    return apply


def sanitized(momfmm):
    with open(momfmm, "rb") as f:
        return b"__asan_init" in f.read()


def bare_env():
    """env -i, but for the sanitizers' options (CTest's ASAN_OPTIONS)."""
    return {k: v for k, v in os.environ.items() if k in ("ASAN_OPTIONS", "UBSAN_OPTIONS")}


def one_line(stderr):
    lines = [l for l in stderr.splitlines() if l.strip()]
    return len(lines) == 1 and lines[0].startswith("momfmm: ")


@pytest.fixture(scope="module")
def trained(momfmm, workdir):
    """A finished 2-step run: (ini, run dir, its checkpoint, a token file)."""
    ini, out_dir, _ = write_tiny_config(workdir, "base", **{"train.steps": 2, "train.eval_interval": 0})
    r = run([momfmm, "train", ini], timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    tokens = os.path.join(workdir, "tokens.h5")
    rng = np.random.default_rng(0)
    with h5py.File(tokens, "w") as f:
        f["inputs"] = rng.integers(0, 32, (2, 16), dtype=np.int32)
        f["targets"] = rng.integers(0, 32, (2, 16), dtype=np.int32)
    return ini, out_dir, ckpt(out_dir, 2), tokens


def commands(momfmm, trained, workdir):
    ini, out_dir, ck, tokens = trained
    return {
        "help": [momfmm, "help"],
        "init": [momfmm, "init", ini, "--out", os.path.join(workdir, "init.h5"), "--force"],
        "inspect": [momfmm, "inspect", ck],
        "eval": [momfmm, "eval", out_dir],
        "generate": [momfmm, "generate", ck, "--prompt", "1 2 3", "--tokens", "4"],
        "loss": [momfmm, "loss", ck, tokens],
    }


class TestSingleProcess:
    def test_odd_environments(self, momfmm, trained, workdir, report):
        tmp_file = os.path.join(workdir, "tmpdir_is_a_file")
        open(tmp_file, "w").close()
        empty = os.path.join(workdir, "empty_tmpdir")
        os.makedirs(empty, exist_ok=True)
        missing = os.path.join(workdir, "no", "such", "dir")
        cases = [
            ("env -i", {"env": bare_env()}),
            ("TMPDIR a file", {"env": env(TMPDIR=tmp_file)}),
            ("TMPDIR missing", {"env": env(TMPDIR=missing)}),
            ("TMPDIR empty", {"env": env(TMPDIR=empty)}),
            ("ulimit -n 8", {"preexec_fn": limited(NOFILE=8)}),
            ("ulimit -f 4 MB", {"preexec_fn": limited(FSIZE=4 << 20)}),
        ]
        for what, kw in cases:
            for name, cmd in commands(momfmm, trained, workdir).items():
                start = time.time()
                r = run(cmd, timeout=TIMEOUT_S, **kw)
                report.check(f"{name} under {what}: exit 0, nothing on stderr, within 20 s",
                             r.returncode == 0 and not r.stderr.strip() and time.time() - start < 20,
                             f"rc {r.returncode}: {r.stderr[-400:]!r}")
        report.check("TMPDIR missing: the directory was not created", not os.path.exists(os.path.dirname(missing)))
        report.check("TMPDIR empty: still empty (no MPI session directory)", os.listdir(empty) == [],
                     str(os.listdir(empty)))

    def test_fifty_at_once_beside_a_run(self, momfmm, trained, workdir, report):
        ini, out_dir, ck, _ = trained
        busy, busy_dir, _ = write_tiny_config(workdir, "busy", **{"train.steps": 100000, "train.eval_interval": 0,
                                                                   "train.log_interval": 50})
        job = subprocess.Popen(MPIRUN + ["-np", "2", momfmm, "train", busy], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
        try:
            time.sleep(1.0)
            for round_ in (1, 2):
                procs = [subprocess.Popen([momfmm, "inspect", ck], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True, env=env()) for _ in range(50)]
                results = [(p.wait(timeout=TIMEOUT_S), p.stderr.read()) for p in procs]
                failed = [(rc, err[-200:]) for rc, err in results if rc != 0 or err.strip()]
                report.check(f"50 inspects at once beside a training run under mpirun (round {round_}): all exit 0, "
                             "quietly", not failed and job.poll() is None, f"{len(failed)} failed, e.g. {failed[:2]}")
        finally:
            kill_session(job.pid)
            job.wait()


class TestFileLimits:
    def test_checkpoint_beyond_ulimit_f(self, momfmm, trained, workdir, report):
        size = os.path.getsize(trained[2])
        ini, out_dir, _ = write_tiny_config(workdir, "fsize", **{"train.steps": 4, "train.ckpt_interval": 2,
                                                                  "train.eval_interval": 0})
        start = time.time()
        r = run([momfmm, "train", ini], timeout=TIMEOUT_S, preexec_fn=limited(FSIZE=size // 2))
        took = time.time() - start
        path = ckpt(out_dir, 2)
        report.check("train, ulimit -f half a checkpoint: exit 3 (no SIGXFSZ) within 30 s, one line naming the "
                     "checkpoint, ulimit -f and the run directory", r.returncode == 3 and took < 30 and
                     one_line(r.stderr) and path in r.stderr and "ulimit -f" in r.stderr and
                     f"train.out_dir = {out_dir}" in r.stderr, f"rc {r.returncode} after {took:.1f} s: "
                     f"{r.stderr[-500:]!r}")
        left = [n for n in os.listdir(out_dir) if ".tmp" in n]
        report.check("train, ulimit -f: no checkpoint and no temporary file left",
                     not checkpoints(out_dir) and not left, str(os.listdir(out_dir)))
        report.check("train, ulimit -f: the summary names no checkpoint",
                     "latest none written" in r.stdout and "ckpt_" not in r.stdout.split("summary:", 1)[-1],
                     r.stdout[-300:])
        out = os.path.join(workdir, "fsize_init.h5")
        r = run([momfmm, "init", ini, "--out", out], timeout=TIMEOUT_S, preexec_fn=limited(FSIZE=size // 2))
        left = [n for n in os.listdir(workdir) if n.startswith("fsize_init.h5")]
        report.check("init, ulimit -f half its output: exit 3, one line naming the file and ulimit -f, nothing left",
                     r.returncode == 3 and one_line(r.stderr) and out in r.stderr and "ulimit -f" in r.stderr and
                     not left, f"rc {r.returncode}: {r.stderr[-300:]!r}; left {left}")

    def test_metrics_beyond_ulimit_f(self, momfmm, workdir, report):
        """metrics.h5, the live mirror of the metric tables, meets a file size limit (as a full disk): when
        it cannot be made, or later when an append does not fit, one warning naming it, and training goes on
        to its last step (docs/cli.md §5); the final checkpoint, larger, fails as above (exit 3). The file
        grows by a chunk of 256 rows a column: its size after 6 and after 260 logged steps, unlimited, put
        the second limit where the first chunk fits and the second does not."""
        overrides = {"train.log_interval": 1, "train.eval_interval": 0, "train.ckpt_interval": 1000,
                     "train.on_save_failure": "continue"}
        ini, out_dir, _ = write_tiny_config(workdir, "metrics_fsize", **overrides)
        path = os.path.join(out_dir, "metrics.h5")
        sizes = []
        for steps in (6, 260):
            shutil.rmtree(out_dir, ignore_errors=True)
            r = run([momfmm, "train", ini, "--set", f"train.steps={steps}"], timeout=TIMEOUT_S)
            assert r.returncode == 0, r.stderr
            sizes.append(os.path.getsize(path))
        assert sizes[1] > sizes[0], f"metrics.h5 did not grow from 6 to 260 rows: {sizes}"
        cases = [("cannot be made", 4096, 6, f"momfmm: warning: {path}: cannot create the live metrics file (disk "
                                             "full, or beyond ulimit -f?); training goes on without it"),
                 ("an append does not fit", sum(sizes) // 2, 260,
                  f"momfmm: warning: {path}: append failed (disk full, or beyond ulimit -f?); live metrics stop "
                  "here (checkpoints keep the history)")]
        for case, size, steps, warning in cases:
            shutil.rmtree(out_dir)
            r = run([momfmm, "train", ini, "--set", f"train.steps={steps}"], timeout=TIMEOUT_S,
                    preexec_fn=limited(FSIZE=size))
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            report.check(f"metrics.h5 beyond ulimit -f ({case}, {size} bytes): the warning once, first",
                         lines[:1] == [warning] and r.stderr.count("metrics.h5") == 1, r.stderr[-600:])
            report.check(f"metrics.h5 beyond ulimit -f ({case}): all {steps} steps trained, then exit 3 for the "
                         "final checkpoint, every line momfmm's",
                         r.returncode == 3 and f"step {steps}/{steps}" in r.stdout
                         and all(l.startswith("momfmm: ") for l in lines), f"rc {r.returncode}: {r.stderr[-400:]!r}")

    @pytest.mark.parametrize("wrapped", [False, True], ids=["alone", "momfmm-mpirun"])
    def test_train_into_head(self, momfmm, workdir, report, wrapped):
        name = "head_wrapped" if wrapped else "head_alone"
        ini, out_dir, _ = write_tiny_config(workdir, name, **{"train.steps": 100000, "train.eval_interval": 0,
                                                               "train.log_interval": 1})
        cmd = [momfmm, "train", ini]
        if wrapped:
            cmd = [LAUNCHER] + MPIRUN[1:] + ["-np", "2"] + cmd
        what = "momfmm-mpirun -np 2 train | head -1" if wrapped else "train | head -1"
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(MOMFMM_MPIRUN=MPIRUN[0]),
                             start_new_session=True)
        try:
            first = p.stdout.readline()
            p.stdout.close()  # the reader goes away, as head does
            try:
                rc = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rc = None
            err = p.stderr.read().decode(errors="replace")
        finally:
            kill_session(p.pid)
            p.wait()
        stopped = os.path.join(out_dir, "STOPPED")
        marker = open(stopped).read() if os.path.exists(stopped) else ""
        saved = checkpoints(out_dir)
        report.check(f"{what}: exit 0 (no SIGPIPE) after printing a line, with a checkpoint named in STOPPED",
                     rc == 0 and first and saved and saved[max(saved)] in marker and
                     ("standard output closed" if wrapped else "standard output closed (EPIPE)") in err,
                     f"rc {rc}; first {first!r}; checkpoints {sorted(saved)}; STOPPED {marker!r}; {err[-400:]!r}")


class TestStandardOutput:
    def test_output_lost(self, momfmm, trained, workdir, report):
        """docs/cli.md §5: what a command writes to stdout is checked at exit. Every command
        that prints, with stdout on a full device (/dev/full) or closed (>&-): one line
        naming standard output and exit 3, never a silent 0; a closed stdout is not handed
        to a file the command opens (the checkpoint of train, init's --out)."""
        ini, out_dir, ck, tokens = trained
        logits_in = os.path.join(workdir, "logits_tokens.h5")
        with h5py.File(logits_in, "w") as f:
            f["tokens"] = np.arange(8, dtype=np.int32)
        every = dict(commands(momfmm, trained, workdir))
        every.update({
            "--version": [momfmm, "--version"],
            "help train": [momfmm, "help", "train"],
            "logits": [momfmm, "logits", ck, logits_in, "--out", os.path.join(workdir, "logits.h5"), "--force"],
            "data": [momfmm, "data", ini, "--show", "2"],
            "bench": [momfmm, "bench", ini, "--steps", "1"],
            "train": [momfmm, "train", ini, "--set", f"train.out_dir={os.path.join(workdir, 'stdout_run')}",
                      "--overwrite"],
        })
        for name, cmd in every.items():
            for how in ("/dev/full", "closed"):
                with open("/dev/full", "w") as full:
                    kw = {"stdout": full} if how == "/dev/full" else {"stdout": subprocess.PIPE,
                                                                      "preexec_fn": lambda: os.close(1)}
                    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S, env=env(), **kw)
                report.check(f"{name} with stdout {how}: exit 3, one line naming standard output",
                             r.returncode == 3 and one_line(r.stderr) and "standard output" in r.stderr,
                             f"rc {r.returncode}: {r.stderr[-300:]!r}")
        with h5py.File(ckpt(os.path.join(workdir, "stdout_run"), 2), "r") as f:
            report.check("train with stdout closed: its checkpoint is a checkpoint (no log lines in it)",
                         f.attrs["format"] == "momfmm-checkpoint")


class TestThreads:
    def test_thread_counts_bounded(self, momfmm, trained, workdir, report):
        """docs/cli.md §5, threads: OMP_NUM_THREADS is bounded by the machine's CPUs before any
        pool starts (100000 segfaulted, 20000 took 80 s for a 0.05 s run): above it, a one-line
        warning and the CPU count; not a positive integer, exit 2 naming it. OpenBLAS's own
        variables are capped by OpenBLAS at load. Alone and at np = 2."""
        ini, _, _, _ = trained
        cpus = os.cpu_count()
        out = os.path.join(workdir, "threads_run")
        cmd = [momfmm, "train", ini, "--set", f"train.out_dir={out}", "--overwrite"]
        cases = [({"OMP_NUM_THREADS": "100000"}, 0, f"using {cpus}"),
                 ({"OMP_NUM_THREADS": "20000"}, 0, f"using {cpus}"),
                 ({"OMP_NUM_THREADS": str(cpus + 1)}, 0, f"using {cpus}"),
                 ({"OMP_NUM_THREADS": f"{cpus},1"}, 0, None),
                 ({"OPENBLAS_NUM_THREADS": "100000", "GOTO_NUM_THREADS": "100000"}, 0, None)]
        cases += [({"OMP_NUM_THREADS": bad}, 2, f"OMP_NUM_THREADS = '{bad}'") for bad in ("abc", "0", "-1", "1e9")]
        for variables, code, needle in cases:
            # under mpirun: one value clamped, one refused (every rank alike, rank 0 says it)
            for np_ in (None, 2) if variables.get("OMP_NUM_THREADS") in ("100000", "abc") else (None,):
                what = " ".join(f"{k}={v}" for k, v in variables.items()) + ("" if np_ is None else " np 2")
                start = time.time()
                r = run((MPIRUN + ["-np", str(np_)] if np_ else []) + cmd, timeout=TIMEOUT_S, env=env(**variables))
                took = time.time() - start
                lines = [l for l in r.stderr.splitlines() if l.startswith("momfmm:")]
                threads = re.search(r"x (\d+) threads?", r.stdout)
                if code == 0:
                    report.check(f"{what}: trains within 60 s on at most {cpus} threads"
                                 + (", one warning naming the count used" if needle else ", no warning"),
                                 r.returncode == 0 and took < 60 and threads and int(threads[1]) <= cpus and
                                 (len(lines) == 1 and needle in lines[0] if needle else not lines),
                                 f"rc {r.returncode} in {took:.1f} s: {r.stderr[-300:]!r}")
                else:
                    report.check(f"{what}: exit 2, one line naming it", r.returncode == 2 and len(lines) == 1 and
                                 needle in lines[0], f"rc {r.returncode}: {r.stderr[-300:]!r}")


class TestMemoryLimits:
    def test_ulimit_v(self, momfmm, workdir, report):
        if sanitized(momfmm):
            pytest.skip("AddressSanitizer reserves terabytes of address space: ulimit -v cannot apply")
        ini, out_dir, _ = write_tiny_config(workdir, "vmem", **{"train.steps": 2})
        start = time.time()
        r = run([momfmm, "train", ini], timeout=TIMEOUT_S, preexec_fn=limited(AS=200 << 20))
        took = time.time() - start
        report.check("train under ulimit -v 200 MB: exit 2 within 20 s, one line on OpenBLAS's buffers",
                     r.returncode == 2 and took < 20 and one_line(r.stderr) and "OpenBLAS maps" in r.stderr,
                     f"rc {r.returncode} after {took:.1f} s: {r.stderr[-400:]!r}")
        big = ["--set", "model.d_model=2048", "--set", "model.d_ff=8192", "--set", "model.n_layers=8",
               "--set", "model.n_heads=8"]
        start = time.time()
        r = run([momfmm, "train", ini] + big, timeout=TIMEOUT_S, preexec_fn=limited(AS=2 << 30))
        took = time.time() - start
        report.check("a 403M-parameter model (6.4 GB) under ulimit -v 2 GB: exit 2 within 20 s with the estimate",
                     r.returncode == 2 and took < 20 and one_line(r.stderr) and
                     re.search(r"this model needs [\d.]+ GB per rank before activations \(\d+ parameters x 16\.00 bytes",
                               r.stderr) is not None,
                     f"rc {r.returncode} after {took:.1f} s: {r.stderr[-500:]!r}")
        acts = ["--set", "data.seq_len=512", "--set", "train.batch_size=64", "--set", "attention.impl=dense"]
        r = run([momfmm, "train", ini] + acts, timeout=TIMEOUT_S, preexec_fn=limited(AS=600 << 20))
        report.check("activations of 64 x 512 (dense attention) under ulimit -v 600 MB: exit 2 with the estimate",
                     r.returncode == 2 and one_line(r.stderr) and
                     re.search(r"this run needs [\d.]+ MB per rank \([\d.]+ MB of activations for 64 x 512",
                               r.stderr) is not None, f"rc {r.returncode}: {r.stderr[-500:]!r}")
        report.check("refused for memory: nothing written", not checkpoints(out_dir))
        # OpenBLAS's allocation under a tight limit is bounded: SIGTERM still stops the run
        ini, out_dir, _ = write_tiny_config(workdir, "vmem_term", **{"train.steps": 100000, "train.eval_interval": 0,
                                                                      "train.log_interval": 1})
        p = subprocess.Popen([momfmm, "train", ini], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env(), preexec_fn=limited(AS=300 << 20))
        first = p.stdout.readline()
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        report.check("train under ulimit -v 300 MB: SIGTERM stops it with a checkpoint, exit 0",
                     p.returncode == 0 and first and checkpoints(out_dir) and "stop requested" in out,
                     f"rc {p.returncode}: {err[-300:]!r}")


class TestRefusedStart:
    def test_one_line_under_momfmm_mpirun(self, momfmm, trained, workdir, report):
        ini, out_dir, _, _ = trained
        e = env(MOMFMM_MPIRUN=MPIRUN[0])
        wrapped = [LAUNCHER] + MPIRUN[1:] + ["-np", "2", momfmm, "train"]
        for what, args, code in [("an earlier run's directory", [ini], 2),
                                 ("an unknown key", [ini, "--set", "train.bogus=1"], 2),
                                 ("a missing --init", [ini, "--init", os.path.join(workdir, "none.h5"),
                                                       "--set", "train.out_dir=" + os.path.join(workdir, "r")], 3)]:
            r = run(wrapped + args, timeout=TIMEOUT_S, env=e)
            report.check(f"momfmm-mpirun -np 2, {what}: exit {code}, one line, no Open MPI banner",
                         r.returncode == code and one_line(r.stderr) and "MPI_ABORT" not in r.stderr,
                         f"rc {r.returncode}: {r.stderr[-600:]!r}")
        report.check("the refused --init created no run directory", not os.path.exists(os.path.join(workdir, "r")))
