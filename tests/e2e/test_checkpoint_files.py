"""Checkpoints that are bad or do not fit (docs/files.md §4, 5); CTest runs
each class as its own entry (e2e_checkpoint_<group>, tests/CMakeLists.txt).
- TestBadFiles: --resume PATH with bad files (empty, truncated, not HDF5,
  wrong format, newer format_version, missing dataset, wrong shapes, model
  keys changed): exit 3 naming the file and the problem, the file untouched,
  nothing trained; `momfmm inspect` and `eval` exit 3 as well unless the
  damage is only in /optim (which they do not read, docs/files.md §4); the Python
  readers agree on each (momfmm.pt.load as eval, momfmm_report.py as inspect,
  momfmm.h5.load_checkpoint with /optim as --resume). Checkpoints
  written before gain_R_attn or the chain's lengen_*, attn_* and L_rep_by_period
  columns resume, their old rows NaN. --resume auto
  skips a corrupt newest checkpoint (reported, kept) and resumes bitwise from
  the older one; pruning (train.keep) never deletes the run's own new
  checkpoints because of a corrupt newer file.
- TestFullDisk (a 600 KB or 1.2 MB tmpfs as train.out_dir; alone, np = 2
  with rank 0 writing, ZeRO-1 with independent and collective transfers): a
  checkpoint that does not fit stops the run with exit 3 and one line naming
  train.out_dir, the bytes needed and free and the checkpoint left, no step
  after it runs, the previous one is intact and loads, no temporary file is
  left; with train.keep = 2 the oldest checkpoint makes room and the retry
  succeeds; train.on_save_failure = continue trains to the end (exit 3).

The fixtures R (the runner) and straight (the reference run) are in ckpt_util.py.
"""
import os
import re
import shutil

import h5py
import numpy as np
import pytest

from common import run
from fuzz_common import verdict_mismatches
from ckpt_util import (N, RESUME, R, bitwise_report, checkpoints, ckpt, digest,  # noqa: F401 (R, straight: fixtures)
                       straight, tail)


# ---- 4. bad files -----------------------------------------------------------------

def from_bytes(make):
    """A bad-file maker: the file holds make(bytes of the good checkpoint)."""
    def maker(base, path):
        with open(base, "rb") as src, open(path, "wb") as dst:
            dst.write(make(src.read()))
    return maker


def edited(edit):
    """A bad-file maker: a copy of the good checkpoint, edited with h5py."""
    def maker(base, path):
        shutil.copy(base, path)
        with h5py.File(path, "r+") as f:
            edit(f)
    return maker


def reshape(name, shape):
    def edit(f):
        del f[name]
        f[name] = np.zeros(shape, dtype=np.float32)
    return edit


GONE = "/optim/v/blocks/1/mlp/fc/weight"
# (case, file name, maker, needles in the message, --set overrides, readers):
# readers True: `momfmm inspect` and `eval` exit 3 too; False: they read the
# file (the damage is in /optim only); None: not run (the file itself is good).
BAD_FILES = [
    ("empty", "empty.h5", from_bytes(lambda d: b""), ("not an HDF5",), (), True),
    ("truncated", "truncated.h5", from_bytes(lambda d: d[: len(d) // 2]), (), (), True),
    ("not HDF5", "text.h5", from_bytes(lambda d: b"step 4 loss 3.5\n" * 100), ("HDF5",), (), True),
    ("wrong format attribute", "format.h5", edited(lambda f: f.attrs.__setitem__("format", "other-format")),
     ("format", "other-format"), (), True),
    ("newer format_version", "version.h5", edited(lambda f: f.attrs.__setitem__("format_version", np.int32(2))),
     ("format_version", "2"), (), True),
    ("missing dataset", "missing.h5", edited(lambda f: f.__delitem__(GONE)), (GONE,), (), False),
    ("wrong shape /model", "shape.h5", edited(reshape("model/ln_f/weight", (31,))),
     ("/model/ln_f/weight", "[31]", "[32]"), (), True),
    ("wrong shape /buffers", "bufshape.h5", edited(reshape("buffers/blocks/0/attn/prev_q", (4, 7))),
     ("/buffers/blocks/0/attn/prev_q", "[4, 7]", "[4, 8]"), (), True),
    ("wrong shape /optim/m", "optshape.h5", edited(reshape("optim/m/tok_emb", (32, 31))),
     ("/optim/m/tok_emb",), (), False),
    ("model keys changed", "config.h5", shutil.copy, ("model.d_ff: 64 vs 128", "momentum.beta"),
     ("model.d_ff=128", "momentum.beta=0.25"), None),
]


def drop(name):
    return edited(lambda f: f.__delitem__(name))


# The chain columns of /metrics/eval added after format_version 1 (docs/files.md §4).
CHAIN_COLUMNS = ("lengen_loss", "lengen_L_new", "lengen_L_rep", "lengen_delta_12", "lengen_loss_by_k",
                 "attn_positional", "attn_induction", "lengen_attn_positional", "lengen_attn_induction",
                 "L_rep_by_period")


def narrow_gain(f):
    g = f["metrics/eval/gain_R"][()]
    del f["metrics/eval/gain_R"]
    f["metrics/eval/gain_R"] = g[:, :1]


# (case, maker of the corrupt newest checkpoint from ckpt_00000006.h5, needle)
CORRUPT_NEWEST = [
    ("truncated", from_bytes(lambda d: d[:5000]), "ckpt_00000006.h5"),
    # /model, /buffers and /optim/m are already read when the load fails
    ("missing /optim/v", drop("optim/v/blocks/0/attn/qkv/weight"), "/optim/v/blocks/0/attn/qkv/weight"),
    # everything but /metrics/eval is already read when the load fails
    ("bad /metrics/eval", edited(narrow_gain), "/metrics/eval/gain_R"),
]


@pytest.fixture(scope="module")
def bad_setup(R, straight):
    """(ini, a fresh work directory) for the bad-file tests; train.out_dir is set per test."""
    ini, _, _ = R.config("bad_cfg", **RESUME, **{"train.steps": 2 * N})
    work = os.path.join(R.work, "bad")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return ini, work


class TestBadFiles:
    @pytest.mark.parametrize("case,name,make,needles,sets,readers", BAD_FILES, ids=[c[0] for c in BAD_FILES])
    def test_resume_path(self, R, report, straight, bad_setup, case, name, make, needles, sets, readers):
        """--resume PATH exits 3; `momfmm inspect` and `eval` exit 3 too when the
        damage is in what they read (root attributes, /model, /buffers), and
        read the file when it is only in /optim (docs/files.md §4)."""
        ini, work = bad_setup
        path = os.path.join(work, name)
        make(ckpt(straight, N), path)
        out_dir = os.path.join(work, "out_" + os.path.splitext(name)[0])
        before = digest(path)
        r = R.train(ini, f"train.out_dir={out_dir}", *sets, resume=path)
        msg = r.stderr.strip()
        ok = r.returncode == 3 and os.path.basename(path) in msg and all(n in msg for n in needles)
        ok = ok and "Segmentation" not in msg and "signal" not in msg and len(msg.splitlines()) == 1
        report.check(f"bad file {case}: exit 3 naming the file and the problem", ok,
                     f"rc {r.returncode}; stderr {msg[:300]!r}")
        if readers is not None:
            got, binary = [], {}
            for command in ("inspect", "eval"):
                x = run([R.momfmm, command, path], timeout=60)
                binary[command] = x.returncode
                m = x.stderr.strip()
                good = (x.returncode == 3 and os.path.basename(path) in m and all(n in m for n in needles)
                        and len(m.splitlines()) == 1) if readers else x.returncode == 0
                got.append(good)
                if not good:
                    print(f"     {command} {path}: rc {x.returncode} {m[:200]!r}", flush=True)
            report.check(f"bad file {case}: momfmm inspect and eval " +
                         ("exit 3 naming it" if readers else "read it (the damage is in /optim only)"), all(got))
            mismatches = verdict_mismatches(f"bad file {case}", path, binary)
            report.check(f"bad file {case}: the Python readers agree with inspect and eval", not mismatches,
                         "; ".join(mismatches))
            from momfmm.h5 import RunError, load_checkpoint
            try:
                load_checkpoint(path)
                refusal = ""
            except RunError as exc:
                refusal = str(exc)
            report.check(f"bad file {case}: momfmm.h5.load_checkpoint (with /optim) refuses it as --resume does",
                         os.path.basename(path) in refusal and len(refusal.splitlines()) == 1, refusal)
        report.check(f"bad file {case}: file untouched, nothing trained",
                     digest(path) == before and not checkpoints(out_dir)
                     and not re.search(r"^step \d+/", r.stdout, re.M))

    def test_resume_without_gain_r_attn(self, R, report, straight, bad_setup):
        """A checkpoint written before /metrics/eval/gain_R_attn existed (docs/files.md §4)
        resumes: its old eval rows read as NaN there, the new rows are measured."""
        ini, work = bad_setup
        path = os.path.join(work, "no_gain_r_attn.h5")
        drop("metrics/eval/gain_R_attn")(ckpt(straight, N), path)
        out_dir = os.path.join(work, "out_no_gain_r_attn")
        r = R.train(ini, f"train.out_dir={out_dir}", resume=path)
        done = checkpoints(out_dir)
        ok = r.returncode == 0 and done
        if ok:
            with h5py.File(done[max(done)], "r") as f:
                g = f["metrics/eval/gain_R_attn"][()]
                old = len(f["metrics/eval/step"][()]) - int(np.sum(f["metrics/eval/step"][()] > N))
            ok = bool(np.isnan(g[:old]).all() and np.isfinite(g[old:]).all() and len(g) > old)
        report.check("a checkpoint without gain_R_attn resumes; its old rows are NaN, the new ones measured", ok,
                     f"rc {r.returncode}; {r.stderr.strip()[:300]!r}")

    def test_resume_without_chain_columns(self, R, report, straight, bad_setup):
        """A chain checkpoint written before the length eval, the attention read-out and
        L_rep_by_period existed (docs/files.md §4) resumes: its old eval rows read as NaN
        there, L_rep_by_period is measured on the new rows (lengen_* and attn_* stay NaN on
        this fixed period without a length eval: no query to count)."""
        ini, work = bad_setup
        path = os.path.join(work, "no_chain_columns.h5")
        names = list(CHAIN_COLUMNS)
        edited(lambda f: [f.__delitem__(f"metrics/eval/{n}") for n in names])(ckpt(straight, N), path)
        out_dir = os.path.join(work, "out_no_chain_columns")
        r = R.train(ini, f"train.out_dir={out_dir}", resume=path)
        done = checkpoints(out_dir)
        ok = r.returncode == 0 and done
        if ok:
            with h5py.File(done[max(done)], "r") as f:
                ev = {n: f[f"metrics/eval/{n}"][()] for n in names}
                old = len(f["metrics/eval/step"][()]) - int(np.sum(f["metrics/eval/step"][()] > N))
            by = ev["L_rep_by_period"]
            ok = (len(by) > old and bool(np.isnan(by[:old]).all() and np.isfinite(by[old:]).all())
                  and all(np.isnan(ev[n][:old]).all() for n in names))
        report.check("a chain checkpoint without the lengen_*, attn_* and L_rep_by_period columns resumes; its old "
                     "rows are NaN, L_rep_by_period measured on the new ones", ok,
                     f"rc {r.returncode}; {r.stderr.strip()[:300]!r}")

    @pytest.mark.parametrize("case,make,needle", CORRUPT_NEWEST, ids=[c[0] for c in CORRUPT_NEWEST])
    def test_resume_auto_corrupt_newest(self, R, report, straight, bad_setup, case, make, needle):
        """--resume auto: a corrupt newest checkpoint is reported, kept, skipped."""
        ini, work = bad_setup
        auto = os.path.join(work, "auto_" + re.sub(r"\W+", "_", case))
        os.makedirs(auto)
        shutil.copy(ckpt(straight, N), ckpt(auto, N))
        corrupt = ckpt(auto, 6)
        make(ckpt(straight, 6), corrupt)
        before = digest(corrupt)
        # ckpt_interval 0: nothing at step 6 replaces the corrupt file
        r = R.train(ini, f"train.out_dir={auto}", "train.ckpt_interval=0", resume="auto")
        text = r.stdout + r.stderr
        ok = (r.returncode == 0 and "warning: skipping checkpoint that does not load" in text and corrupt in text
              and needle in text and f"resumed from {ckpt(auto, N)} at step {N}" in text)
        report.check(f"resume auto, corrupt newest ({case}): reported with the reason, older one used", ok, tail(r))
        report.check(f"resume auto, corrupt newest ({case}): the corrupt file still exists, unchanged",
                     os.path.exists(corrupt) and digest(corrupt) == before)
        if os.path.exists(ckpt(auto, 2 * N)):
            ok, detail = bitwise_report(ckpt(straight, 2 * N), ckpt(auto, 2 * N))
            report.check(f"resume auto, corrupt newest ({case}): result equals the straight run bitwise", ok, detail)

    def test_keep_with_corrupt_newer(self, R, straight, bad_setup):
        """train.keep must not let a corrupt newer file push out the run's own checkpoints."""
        ini, work = bad_setup
        auto = os.path.join(work, "auto_keep")
        os.makedirs(auto)
        shutil.copy(ckpt(straight, N), ckpt(auto, N))
        corrupt = ckpt(auto, 50)
        from_bytes(lambda d: d[:5000])(ckpt(straight, N), corrupt)
        r = R.train(ini, f"train.out_dir={auto}", "train.keep=1", resume="auto")
        found = checkpoints(auto)
        loads = [s for s, p in found.items() if R.inspect(p).returncode == 0]
        assert r.returncode == 0 and 2 * N in loads and os.path.exists(corrupt), (
            "resume auto + train.keep = 1 with a corrupt ckpt_00000050.h5: the run's final checkpoint "
            f"(step {2 * N}) survives pruning and the corrupt file is not deleted: "
            f"rc {r.returncode}; checkpoints left {sorted(found)}, loadable {sorted(loads)}")


# ---- 5. full disk ---------------------------------------------------------------------

class TestFullDisk:
    """docs/cli.md §5, full disk: a checkpoint that does not fit frees what train.keep drops
    anyway, retries once, else stops the run (exit 3, one line naming train.out_dir and the
    bytes needed) with the last checkpoint intact; train.on_save_failure = continue trains on.
    Alone, with rank 0 writing for np = 2, and with ZeRO-1's collective write."""

    def test_full_disk(self, R, report):
        check_full_disk(R, report)
        check_retry_frees_older(R, report)
        check_full_disk(R, report, on_failure="continue")

    def test_full_disk_np2(self, R, report):
        # rank 0 writes alone: the other rank must stop at the same step, not wait for it
        check_full_disk(R, report, np_=2)

    def test_full_disk_together(self, R, report):
        # dist.zero = 1 at np = 2: both ranks write the file through MPI-IO
        # (docs/scale.md §7), with independent and with collective transfers;
        # a failure on the full disk must end in the same outcome on both
        # ranks, not a rank waiting forever in a collective call
        check_full_disk(R, report, np_=2, zero=1)
        check_retry_frees_older(R, report, np_=2, zero=1)
        check_full_disk(R, report, np_=2, zero=1, collective=True)


class tmpfs:
    """A small tmpfs mounted at <work>/tmpfs for the block (skips without permission)."""

    def __init__(self, R, size):
        self.mnt, self.size = os.path.join(R.work, "tmpfs"), size

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        while os.path.ismount(self.mnt):  # left mounted by an aborted earlier run
            if run(["umount", self.mnt], timeout=30).returncode != 0:
                break
        r = run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", self.mnt], timeout=30)
        if r.returncode != 0:
            pytest.skip(f"full disk: cannot mount a tmpfs: {r.stderr.strip()[:200]}")
        return self.mnt

    def __exit__(self, *exc):
        run(["umount", self.mnt], timeout=30)


def fill(mnt, leave):
    """Fills the file system of mnt with a file `filler` until `leave` bytes are free."""
    st = os.statvfs(mnt)
    with open(os.path.join(mnt, "filler"), "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


def label(np_, zero, collective, on_failure="stop"):
    where = "alone" if np_ is None else f"np {np_} zero {zero}{', collective' if collective else ''}"
    return f"full disk ({where}, on_save_failure {on_failure})"


def check_full_disk(R, report, np_=None, zero=0, collective=False, on_failure="stop"):
    what = label(np_, zero, collective, on_failure)
    ini, _, _ = R.config("disk_cfg", **{**RESUME, "train.steps": 3 * N, "dist.zero": zero,
                                                  "dist.collective_io": collective, "train.keep": 1,
                                                  "train.on_save_failure": on_failure})
    with tmpfs(R, "600k") as mnt:
        r = R.train(ini, f"train.out_dir={mnt}", "train.steps=2", np_=np_)
        first = ckpt(mnt, 2)
        assert r.returncode == 0 and os.path.exists(first), \
            f"{what}: a first checkpoint fits in the 600 KB tmpfs: {tail(r)}"
        before = digest(first)
        fill(mnt, 40 * 1024)
        r = R.train(ini, f"train.out_dir={mnt}", resume="auto", np_=np_, timeout=120)
        second = ckpt(mnt, 4)
        lines = [l for l in r.stderr.splitlines() if l.startswith("momfmm:")]
        named = ("checkpoint at step 4 not written" in r.stderr and second in r.stderr and
                 f"train.out_dir = {mnt}" in r.stderr and "needs about" in r.stderr and "MB are free" in r.stderr
                 and f"the newest checkpoint, {first}, is intact" in r.stderr)
        if on_failure == "stop":
            report.check(f"{what}: exit 3 after the failed write of step 4, one line naming the directory, the "
                         "bytes needed and free, and the checkpoint left", r.returncode == 3 and named and
                         len(lines) == 1, tail(r))
            report.check(f"{what}: no step after the failed checkpoint is run",
                         "step 4/" in r.stdout and "step 5/" not in r.stdout, r.stdout[-300:])
        else:
            report.check(f"{what}: the run trains on to step {3 * N} and exits 3 (final checkpoint lost)",
                         r.returncode == 3 and named and f"step {3 * N}/{3 * N}" in r.stdout and
                         "the final checkpoint was not written" in r.stderr, tail(r))
        report.check(f"{what}: the program does not crash after the failed write",
                     r.returncode >= 0 and "Segmentation" not in r.stderr and "signal" not in r.stderr,
                     f"rc {r.returncode}; stderr {r.stderr.strip()[:400]!r}")
        report.check(f"{what}: the previous checkpoint is intact (same sha256) and loads",
                     digest(first) == before and R.inspect(first).returncode == 0)
        left = [n for n in os.listdir(mnt) if n not in ("filler", "metrics.h5", ".lock", os.path.basename(first))]
        report.check(f"{what}: no half-written file left (no later checkpoint, no temporary)", not left,
                     f"left {left}")


def check_retry_frees_older(R, report, np_=None, zero=0):
    """keep = 2 with two checkpoints on disk: the write of the third fails, the oldest (which
    pruning drops anyway) is removed, the retry fits: exit 0, the newest two kept."""
    what = label(np_, zero, False) + ", keep 2"
    ini, _, _ = R.config("disk_retry", **{**RESUME, "train.steps": 3 * N // 2, "dist.zero": zero, "train.keep": 2})
    with tmpfs(R, "1200k") as mnt:
        r = R.train(ini, f"train.out_dir={mnt}", "train.steps=4", np_=np_)
        assert r.returncode == 0 and os.path.exists(ckpt(mnt, 4)), f"{what}: two checkpoints fit: {tail(r)}"
        fill(mnt, os.path.getsize(ckpt(mnt, 4)) // 2)
        r = R.train(ini, f"train.out_dir={mnt}", resume="auto", np_=np_, timeout=120)
        report.check(f"{what}: the oldest checkpoint is removed to make room, the retry succeeds, exit 0",
                     r.returncode == 0 and f"removed {ckpt(mnt, 2)}" in r.stdout and
                     os.path.exists(ckpt(mnt, 6)) and R.inspect(ckpt(mnt, 6)).returncode == 0, tail(r))
        report.check(f"{what}: the newest two checkpoints are kept, no temporary left",
                     sorted(checkpoints(mnt)) == [4, 6] and not [n for n in os.listdir(mnt) if ".tmp" in n],
                     str(sorted(os.listdir(mnt))))
