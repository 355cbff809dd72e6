#!/usr/bin/python3
"""Checkpoints (SPEC 4, 5): layout, resume, crash safety, bad files, full
disk, stop signals, live metrics.

- layout: after short runs (momentum with learned gamma; then fmm with
  learned gamma, 3 layers) h5py reads every dataset and each shape matches
  the config: every parameter name of SPEC 4 in PyTorch shape, /optim/m and
  /optim/v mirror /model, /buffers [H, dh], /metrics/train 1-D (step int64),
  /metrics/eval loss_by_k [n, 16], gain_R [n, L], gamma [n, L, H]; the root
  attributes, and config_ini parsed with configparser equals the config used;
  `h5dump -H` reads the file.
- bit-exact resume: 2N steps straight vs N steps + `--resume auto` + N more
  (train.steps changed from N to 2N; constant schedule, so the lr of the
  first N steps does not depend on train.steps), and vs `--resume PATH`:
  /model, /optim, /buffers and the metric history bitwise equal (momentum
  with anchor = false, so the buffers enter the loss; a control run with
  zeroed buffers shows they do); the same for fmm attention.
- another number of ranks: N steps at np = 1, resumed at np = 2 under
  mpirun, matches the straight run (loss 1e-5, weights 1e-4 relative).
- crash: a run that checkpoints every step is SIGKILLed at random moments
  8 times, resuming with --resume auto each time; every ckpt_*.h5 left
  behind loads, temporary files never carry a checkpoint's name, and the
  last run reaches train.steps.
- bad files with --resume PATH (empty, truncated, not HDF5, wrong format,
  newer format_version, missing dataset, wrong shapes, model keys changed):
  exit 3 naming the file and the problem, the file untouched, nothing
  trained; `momfmm inspect` and `eval` exit 3 as well unless the damage is
  only in /optim (which they do not read, SPEC 4). --resume auto skips a
  corrupt newest checkpoint (reported, kept) and resumes bitwise from the
  older one; pruning (train.keep) never deletes the run's own new
  checkpoints because of a corrupt newer file.
- full disk (a 600 KB tmpfs as train.out_dir): a checkpoint that does not
  fit is reported naming its path, the previous one is intact and loads,
  no temporary file is left, the program does not crash.
- stop signals: SIGTERM to one of 4 ranks, and SIGUSR1 to mpirun, stop
  every rank at one step with "stop requested", a checkpoint at that step
  that loads, exit 0.
- live metrics: metrics.h5 read with h5py (SWMR) while a run writes it:
  rows grow, values finite, config_ini present; after SIGTERM it holds the
  same history as the final checkpoint.

Usage: test_checkpoint.py --momfmm BIN --workdir DIR [--seed S] [--only GROUP,...]
"""
import configparser
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np

from processes import children, kill_session, rank_of, session_members
from common import argument_parser, Report, env, run, train_command, write_tiny_config

CKPT_NAME = re.compile(r"^ckpt_(\d{8})\.h5$")
CKPT_LINE = re.compile(r"^checkpoint (\S+) \| ([\d.]+) MB in ([\d.]+) s \(([\d.]+) MB/s\)$", re.M)
LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-4


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ckpt(out_dir, step):
    return os.path.join(out_dir, f"ckpt_{step:08d}.h5")


def checkpoints(out_dir):
    """{step: path} of files named exactly ckpt_<8 digits>.h5."""
    out = {}
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        m = CKPT_NAME.match(name)
        if m:
            out[int(m.group(1))] = os.path.join(out_dir, name)
    return out


def tail(result, n=600):
    return f"rc {result.returncode}; stdout ...{result.stdout[-n:]!r}; stderr ...{result.stderr[-n:]!r}"


class Runner:
    def __init__(self, momfmm, workdir):
        self.momfmm = os.path.realpath(momfmm)
        self.work = os.path.abspath(workdir)

    def config(self, name, **overrides):
        """Writes <work>/<name>.ini (tiny_config + overrides), fresh out_dir; returns (ini, out_dir, sections)."""
        shutil.rmtree(os.path.join(self.work, name), ignore_errors=True)
        return write_tiny_config(self.work, name, **overrides)

    def train(self, ini, *sets, resume=None, np_=None, timeout=300):
        return run(train_command(self.momfmm, ini, sets, np_=np_, resume=resume), timeout=timeout)

    def inspect(self, path):
        return run([self.momfmm, "inspect", path], timeout=60)


# ---- reading checkpoints ----------------------------------------------------

def datasets(f, group):
    """{name relative to group: dataset} of every dataset under group."""
    out = {}
    if group in f:
        f[group].visititems(lambda n, o: out.__setitem__(n, o) if isinstance(o, h5py.Dataset) else None)
    return out


def load_state(path):
    """Every dataset (as arrays) and root attribute of a checkpoint."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        attrs = {k: f.attrs[k] for k in f.attrs}
    return out, attrs


def same_bits(a, b):
    """Bitwise equal arrays; NaN equals NaN whatever its payload."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        a, b = np.where(nan, 0, a), np.where(nan, 0, b)
    return a.tobytes() == b.tobytes()


def compared_keys(state):
    """The state that must survive a resume exactly: tensors, buffers and the
    metric history except the wall-clock tokens_per_s."""
    return sorted(k for k in state if k.split("/")[0] in ("model", "optim", "buffers")
                  or (k.startswith("metrics/") and not k.endswith("tokens_per_s")))


def bitwise_report(a_path, b_path):
    """(ok, detail): every compared dataset and step/tokens_seen bitwise equal."""
    (a, aa), (b, ba) = load_state(a_path), load_state(b_path)
    keys = compared_keys(a)
    if keys != compared_keys(b):
        return False, f"dataset sets differ: {sorted(set(keys) ^ set(compared_keys(b)))[:6]}"
    differ = [k for k in keys if not same_bits(a[k], b[k])]
    for attr in ("step", "tokens_seen"):
        if int(aa[attr]) != int(ba[attr]):
            differ.append(f"attr {attr} {aa[attr]} vs {ba[attr]}")
    detail = f"{len(keys)} datasets compared"
    if differ:
        worst = max((float(np.nanmax(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
                     for k in differ if k in a and a[k].shape == b[k].shape and a[k].size), default=0.0)
        detail += f"; {len(differ)} differ, e.g. {differ[:4]}, worst |diff| {worst:.3g}"
    return not differ, detail


def rel_tensors(a, b, prefixes):
    """Worst max|a-b| / max|a| over the datasets under prefixes; and where."""
    worst, where = 0.0, ""
    for k in a:
        if k.split("/")[0] not in prefixes:
            continue
        if k not in b or a[k].shape != b[k].shape:
            return float("inf"), k + " missing or reshaped"
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) if x.size else 0.0
        if rel > worst:
            worst, where = rel, k
    return worst, where


def rel_losses(a, b, key):
    x, y = a[key], b.get(key)
    if y is None or x.shape != y.shape:
        return float("inf")
    ok = ~np.isnan(x)
    if not np.array_equal(ok, ~np.isnan(y)):
        return float("inf")
    return float(np.max(np.abs(x[ok] - y[ok]) / np.maximum(np.abs(x[ok]), 1e-30))) if ok.any() else 0.0


# ---- 1. layout --------------------------------------------------------------

def expected_parameters(s):
    """SPEC 4 parameter names and PyTorch shapes for config sections s."""
    m = s["model"]
    V, d, H, L, F = m["vocab_size"], m["d_model"], m["n_heads"], m["n_layers"], m["d_ff"]
    learn = s.get("momentum", {}).get("learn_gamma", False)
    fmm = s.get("attention", {}).get("kind", "softmax") == "fmm"
    out = {"tok_emb": (V, d)}
    for i in range(L):
        p = f"blocks/{i}/"
        out.update({p + "ln1/weight": (d,), p + "ln1/bias": (d,),
                    p + "attn/qkv/weight": (3 * d, d), p + "attn/qkv/bias": (3 * d,),
                    p + "attn/proj/weight": (d, d), p + "attn/proj/bias": (d,),
                    p + "ln2/weight": (d,), p + "ln2/bias": (d,),
                    p + "mlp/fc/weight": (F, d), p + "mlp/fc/bias": (F,),
                    p + "mlp/proj/weight": (d, F), p + "mlp/proj/bias": (d,)})
        if learn:
            out[p + "attn/momentum_gamma"] = (H,)
        if fmm:
            out[p + "attn/fmm_blend"] = (2, H)
    out.update({"ln_f/weight": (d,), "ln_f/bias": (d,), "head/weight": (V, d)})
    return out


def logged_steps(steps, interval):
    return [s for s in range(1, steps + 1) if s % interval == 0 or s == steps]


def same_value(written, stored):
    if isinstance(written, bool):
        return stored.strip().lower() == ("true" if written else "false")
    if isinstance(written, (int, float)):
        try:
            return abs(float(stored) - float(written)) <= 1e-12 * max(1.0, abs(float(written)))
        except ValueError:
            return False
    return stored.strip() == str(written)


def check_layout(R, report, label, path, s):
    m, t = s["model"], s["train"]
    d, H, L = m["d_model"], m["n_heads"], m["n_layers"]
    want = expected_parameters(s)
    train_steps = logged_steps(t["steps"], t["log_interval"])
    eval_steps = logged_steps(t["steps"], t["eval_interval"])
    n_eval = len(eval_steps)
    with h5py.File(path, "r") as f:
        bad = []

        def read_all(name, obj):
            if isinstance(obj, h5py.Dataset):
                try:
                    obj[()]
                except Exception as e:  # noqa: BLE001 - any failure to read is the finding
                    bad.append(f"{name}: {e}")
        f.visititems(read_all)
        report.check(f"layout {label}: h5py reads every dataset", not bad, "; ".join(bad[:3]))

        model = datasets(f, "model")
        shapes = {k: v.shape for k, v in model.items()}
        wrong = sorted(k for k in set(want) | set(shapes) if want.get(k) != shapes.get(k))
        report.check(f"layout {label}: /model has the SPEC 4 names in PyTorch shapes ({len(want)} tensors)",
                     not wrong and all(v.dtype == np.float32 for v in model.values()),
                     "; ".join(f"{k}: {shapes.get(k)} (want {want.get(k)})" for k in wrong[:6]))
        for moment in ("m", "v"):
            opt = datasets(f, f"optim/{moment}")
            mism = sorted(k for k in set(opt) | set(model)
                          if k not in opt or k not in model or opt[k].shape != model[k].shape
                          or opt[k].dtype != np.float32)
            report.check(f"layout {label}: /optim/{moment} mirrors /model", not mism, f"differ: {mism[:6]}")

        bufs = datasets(f, "buffers")
        want_b = {f"blocks/{i}/attn/{w}": (H, d // H) for i in range(L) for w in ("prev_q", "prev_k")}
        got_b = {k: v.shape for k, v in bufs.items()}
        report.check(f"layout {label}: /buffers/blocks/<i>/attn/prev_q, prev_k are [H, dh] = [{H}, {d // H}]",
                     got_b == want_b and all(v.dtype == np.float32 for v in bufs.values()),
                     f"got {sorted(got_b.items())[:4]}")

        tr = datasets(f, "metrics/train")
        keys_ok = set(tr) == {"step", "loss", "lr", "grad_norm", "tokens_per_s"}
        shapes_ok = all(v.shape == (len(train_steps),) for v in tr.values())
        types_ok = keys_ok and tr["step"].dtype == np.int64 and all(
            v.dtype == np.float64 for k, v in tr.items() if k != "step")
        steps_ok = keys_ok and list(tr["step"][()]) == train_steps
        report.check(f"layout {label}: /metrics/train/* 1-D with {len(train_steps)} rows, step int64 = {train_steps}",
                     keys_ok and shapes_ok and types_ok and steps_ok,
                     f"{ {k: (v.shape, str(v.dtype)) for k, v in tr.items()} }")

        ev = datasets(f, "metrics/eval")
        want_e = {k: (n_eval,) for k in ("step", "loss", "L_new", "L_rep", "delta_12", "acc", "exact_match")}
        want_e.update({"loss_by_k": (n_eval, 16), "gain_R": (n_eval, L), "gamma": (n_eval, L, H)})
        got_e = {k: v.shape for k, v in ev.items()}
        types_ok = "step" in ev and ev["step"].dtype == np.int64 and all(
            v.dtype == np.float64 for k, v in ev.items() if k != "step")
        steps_ok = "step" in ev and list(ev["step"][()]) == eval_steps
        report.check(f"layout {label}: /metrics/eval: loss_by_k [{n_eval}, 16], gain_R [{n_eval}, {L}], "
                     f"gamma [{n_eval}, {L}, {H}], the rest [{n_eval}], step int64 = {eval_steps}",
                     got_e == want_e and types_ok and steps_ok, f"got {got_e}")
        if s.get("momentum", {}).get("learn_gamma") and got_e == want_e:
            last = np.stack([model[f"blocks/{i}/attn/momentum_gamma"][()] for i in range(L)]).astype(np.float64)
            report.check(f"layout {label}: the last eval's gamma row is the learned momentum_gamma",
                         np.array_equal(ev["gamma"][-1], last), f"{ev['gamma'][-1].ravel()[:4]} vs {last.ravel()[:4]}")

        a = f.attrs
        tokens = t["steps"] * t["batch_size"] * s["data"]["seq_len"]
        got = {k: (a[k].item() if hasattr(a.get(k), "item") else a.get(k))
               for k in ("format", "format_version", "step", "tokens_seen", "world_size")}
        want_a = {"format": "momfmm-checkpoint", "format_version": 1, "step": t["steps"], "tokens_seen": tokens,
                  "world_size": 1}
        report.check(f"layout {label}: root attributes {want_a}", got == want_a, f"got {got}")
        ini = a.get("config_ini")
        parser = configparser.ConfigParser()
        try:
            parser.read_string(ini if isinstance(ini, str) else "")
            differ = [f"{sec}.{k}: {v!r} vs {parser.get(sec, k, fallback=None)!r}"
                      for sec, keys in s.items() for k, v in keys.items()
                      if not parser.has_option(sec, k) or not same_value(v, parser.get(sec, k))]
            missing = [sec for sec in ("model", "attention", "momentum", "fmm", "data", "train", "dist")
                       if not parser.has_section(sec)]
        except configparser.Error as e:
            differ, missing = [str(e)], []
        report.check(f"layout {label}: config_ini parses (configparser) and equals the config used, all sections",
                     isinstance(ini, str) and not differ and not missing, f"differ {differ[:4]} missing {missing}")

    r = run(["h5dump", "-H", path], timeout=60)
    needles = ['GROUP "model"', 'DATASET "tok_emb"', 'GROUP "optim"', 'DATASET "prev_q"', 'DATASET "loss_by_k"',
               'ATTRIBUTE "config_ini"']
    report.check(f"layout {label}: h5dump -H reads it (exit 0, names the datasets)",
                 r.returncode == 0 and all(n in r.stdout for n in needles),
                 f"rc {r.returncode}, missing {[n for n in needles if n not in r.stdout]} {r.stderr[:200]!r}")


def test_layout(R, report):
    runs = [
        ("momentum", {"momentum.gamma": 0.5, "momentum.learn_gamma": True, "momentum.beta": 0.5,
                      "train.steps": 4}),
        ("fmm", {"model.vocab_size": 24, "model.d_model": 16, "model.n_heads": 2, "model.n_layers": 3,
                 "model.d_ff": 48, "attention.kind": "fmm", "fmm.bandwidth": 3, "fmm.kernels": "elu,tanh",
                 "momentum.gamma": 0.3, "momentum.learn_gamma": True, "momentum.gamma2": 0.1,
                 "train.steps": 5, "train.log_interval": 2, "train.eval_interval": 3}),
    ]
    for label, overrides in runs:
        ini, out_dir, sections = R.config("layout_" + label, **overrides)
        r = R.train(ini)
        path = ckpt(out_dir, sections["train"]["steps"])
        if report.check(f"layout {label}: training writes {os.path.basename(path)}",
                        r.returncode == 0 and os.path.exists(path), tail(r)):
            check_layout(R, report, label, path, sections)
            line = CKPT_LINE.search(r.stdout)
            report.check(f"layout {label}: log line 'checkpoint <path> | <MB> MB in <s> s (<MB/s> MB/s)'",
                         line is not None and line.group(1) == path, f"{line.group(0) if line else r.stdout[-300:]}")


# ---- 2. resume ---------------------------------------------------------------

N = 4  # steps before the resume; runs go to 2N

RESUME = {
    "momentum.gamma": 0.5, "momentum.beta": 0.5, "momentum.learn_gamma": True, "momentum.anchor": False,
    "train.schedule": "constant", "train.warmup": 2, "train.log_interval": 1, "train.eval_interval": 2,
    "train.ckpt_interval": 2, "train.keep": 10,
    # adam_eps 1e-6 (as in test_mpi.py): with 1e-8 Adam turns float-rounding
    # noise of near-zero gradients into lr-sized steps, which only matters for
    # the np = 2 comparison (conditioning, not a checkpoint error).
    "train.adam_eps": 1e-6,
}


def test_resume(R, report):
    """Returns (ini, straight out_dir) for the corrupt-file tests."""
    ini_s, straight, _ = R.config("straight", **RESUME, **{"train.steps": 2 * N})
    r = R.train(ini_s)
    final = ckpt(straight, 2 * N)
    if not report.check(f"resume: straight run of {2 * N} steps", r.returncode == 0 and os.path.exists(final), tail(r)):
        return None
    with h5py.File(final, "r") as f:
        buf_norm = sum(float(np.abs(d[()]).sum()) for d in datasets(f, "buffers").values())
    report.check("resume: momentum buffers are non-zero (anchor = false: they enter the loss)", buf_norm > 0,
                 f"sum |buffers| = {buf_norm:.3g}")

    ini_r, split, _ = R.config("split", **RESUME, **{"train.steps": N})
    r = R.train(ini_r)
    half = ckpt(split, N)
    if not report.check(f"resume: first {N} steps", r.returncode == 0 and os.path.exists(half), tail(r)):
        return None
    half_digest = digest(half)
    r = R.train(ini_r, f"train.steps={2 * N}", resume="auto")
    ok = r.returncode == 0 and f"resumed from {half} at step {N}" in r.stdout
    report.check(f"resume: --resume auto picks {os.path.basename(half)} and runs to step {2 * N}",
                 ok and os.path.exists(ckpt(split, 2 * N)), tail(r))
    report.check("resume: changing train.steps is a warning naming the key and both values",
                 f"train.steps: {N} vs {2 * N}" in r.stdout + r.stderr and "warning" in r.stdout + r.stderr, tail(r))
    if os.path.exists(ckpt(split, 2 * N)):
        ok, detail = bitwise_report(final, ckpt(split, 2 * N))
        report.check(f"resume: {N} + --resume auto + {N} steps equals {2 * N} straight bitwise "
                     "(/model, /optim, /buffers, metric history)", ok, detail)

    ini_p, by_path, _ = R.config("by_path", **RESUME, **{"train.steps": 2 * N})
    r = R.train(ini_p, resume=half)
    if report.check("resume: --resume PATH runs", r.returncode == 0 and os.path.exists(ckpt(by_path, 2 * N)), tail(r)):
        ok, detail = bitwise_report(final, ckpt(by_path, 2 * N))
        report.check("resume: --resume PATH equals the straight run bitwise", ok, detail)
    report.check("resume: the checkpoint resumed from is untouched", digest(half) == half_digest)

    # control: zeroed buffers must change the result, or the comparison above
    # would not see a resume that drops them
    ini_z, zeroed, _ = R.config("zeroed", **RESUME, **{"train.steps": 2 * N})
    os.makedirs(zeroed, exist_ok=True)
    zero_src = os.path.join(R.work, "zeroed_buffers.h5")
    shutil.copy(half, zero_src)
    with h5py.File(zero_src, "r+") as f:
        for d in datasets(f, "buffers").values():
            d[...] = 0
    r = R.train(ini_z, resume=zero_src)
    if r.returncode == 0 and os.path.exists(ckpt(zeroed, 2 * N)):
        a, _ = load_state(final)
        b, _ = load_state(ckpt(zeroed, 2 * N))
        rel, where = rel_tensors(a, b, ("model",))
        report.check("resume control: zeroing the buffers of the N checkpoint changes the final weights", rel > 1e-6,
                     f"max rel diff {rel:.3g} at {where}")
    else:
        report.check("resume control: run from zeroed buffers", False, tail(r))

    # fmm attention (with momentum): same bitwise resume
    fmm = dict(RESUME, **{"attention.kind": "fmm", "fmm.bandwidth": 3, "fmm.kernels": "elu,elu_flip",
                          "fmm.chunk": 4})
    ini_fs, fs, _ = R.config("fmm_straight", **fmm, **{"train.steps": 2 * N})
    ini_fr, fr, _ = R.config("fmm_split", **fmm, **{"train.steps": N})
    r1 = R.train(ini_fs)
    r2 = R.train(ini_fr)
    r3 = R.train(ini_fr, f"train.steps={2 * N}", resume="auto")
    if report.check("resume fmm: straight, first half and --resume auto run",
                    all(x.returncode == 0 for x in (r1, r2, r3)) and os.path.exists(ckpt(fr, 2 * N)),
                    " | ".join(tail(x, 200) for x in (r1, r2, r3) if x.returncode)):
        ok, detail = bitwise_report(ckpt(fs, 2 * N), ckpt(fr, 2 * N))
        report.check("resume fmm: resumed equals straight bitwise", ok, detail)

    # N steps at np = 1, the rest at np = 2
    ini_x, x_dir, _ = R.config("np2", **RESUME, **{"train.steps": 2 * N})
    r = R.train(ini_x, resume=half, np_=2)
    got = ckpt(x_dir, 2 * N)
    if report.check("resume np 1 -> 2: mpirun -np 2 --resume PATH (written by 1 rank) runs",
                    r.returncode == 0 and os.path.exists(got) and "resuming on 2" in r.stdout, tail(r)):
        a, _ = load_state(final)
        b, battrs = load_state(got)
        worst_loss = max(rel_losses(a, b, k) for k in ("metrics/train/loss", "metrics/eval/loss",
                                                       "metrics/eval/L_new", "metrics/eval/L_rep"))
        report.check(f"resume np 1 -> 2: losses within {LOSS_RTOL} relative of the straight run",
                     worst_loss <= LOSS_RTOL, f"worst {worst_loss:.3g}")
        rel, where = rel_tensors(a, b, ("model", "buffers"))
        report.check(f"resume np 1 -> 2: weights and buffers within {WEIGHT_RTOL} relative",
                     rel <= WEIGHT_RTOL, f"worst {rel:.3g} at {where}")
        report.check("resume np 1 -> 2: world_size attribute 2", int(battrs["world_size"]) == 2,
                     f"{battrs['world_size']}")
    return ini_p, straight


# ---- 3. crash ------------------------------------------------------------------

def test_crash(R, report, rng, kills=8):
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
            if n.startswith("ckpt_") and n.endswith(".h5") and not CKPT_NAME.match(n):
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
    left = [n for n in os.listdir(out_dir) if ".tmp." in n]
    print(f"     crash: {len(left)} temporary files left in {out_dir}: {left[:3]}", flush=True)


# ---- 4. bad files -----------------------------------------------------------------

def test_bad_files(R, report, ini, straight):
    base = ckpt(straight, N)
    work = os.path.join(R.work, "bad")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out_dir = os.path.join(work, "out")

    def variant(name, edit=None, data=None):
        path = os.path.join(work, name)
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        else:
            shutil.copy(base, path)
            with h5py.File(path, "r+") as f:
                edit(f)
        return path

    def expect(name, path, *needles, sets=(), readers=True):
        """--resume PATH exits 3; `momfmm inspect` and `eval` exit 3 too when the
        damage is in what they read (root attributes, /model, /buffers), and
        read the file when it is only in /optim (SPEC 4)."""
        before = digest(path)
        shutil.rmtree(out_dir, ignore_errors=True)
        r = R.train(ini, f"train.out_dir={out_dir}", *sets, resume=path)
        msg = r.stderr.strip()
        ok = r.returncode == 3 and os.path.basename(path) in msg and all(n in msg for n in needles)
        ok = ok and "Segmentation" not in msg and "signal" not in msg and len(msg.splitlines()) == 1
        report.check(f"bad file {name}: exit 3 naming the file and the problem", ok,
                     f"rc {r.returncode}; stderr {msg[:300]!r}")
        if readers is not None:
            got = []
            for command in ("inspect", "eval"):
                x = run([R.momfmm, command, path], timeout=60)
                m = x.stderr.strip()
                good = (x.returncode == 3 and os.path.basename(path) in m and all(n in m for n in needles)
                        and len(m.splitlines()) == 1) if readers else x.returncode == 0
                got.append(good)
                if not good:
                    print(f"     {command} {path}: rc {x.returncode} {m[:200]!r}", flush=True)
            report.check(f"bad file {name}: momfmm inspect and eval " +
                         ("exit 3 naming it" if readers else "read it (the damage is in /optim only)"), all(got))
        report.check(f"bad file {name}: file untouched, nothing trained",
                     digest(path) == before and not checkpoints(out_dir)
                     and not re.search(r"^step \d+/", r.stdout, re.M))

    with open(base, "rb") as f:
        data = f.read()
    expect("empty", variant("empty.h5", data=b""), "not an HDF5")
    expect("truncated", variant("truncated.h5", data=data[: len(data) // 2]))
    expect("not HDF5", variant("text.h5", data=b"step 4 loss 3.5\n" * 100), "HDF5")
    expect("wrong format attribute", variant("format.h5", lambda f: f.attrs.__setitem__("format", "other-format")),
           "format", "other-format")
    expect("newer format_version", variant("version.h5", lambda f: f.attrs.__setitem__(
        "format_version", np.int32(2))), "format_version", "2")
    gone = "/optim/v/blocks/1/mlp/fc/weight"
    expect("missing dataset", variant("missing.h5", lambda f: f.__delitem__(gone)), gone, readers=False)

    def reshape(name, shape):
        def edit(f):
            del f[name]
            f[name] = np.zeros(shape, dtype=np.float32)
        return edit
    expect("wrong shape /model", variant("shape.h5", reshape("model/ln_f/weight", (31,))),
           "/model/ln_f/weight", "[31]", "[32]")
    expect("wrong shape /buffers", variant("bufshape.h5", reshape("buffers/blocks/0/attn/prev_q", (4, 7))),
           "/buffers/blocks/0/attn/prev_q", "[4, 7]", "[4, 8]")
    expect("wrong shape /optim/m", variant("optshape.h5", reshape("optim/m/tok_emb", (32, 31))),
           "/optim/m/tok_emb", readers=False)
    expect("model keys changed", shutil.copy(base, os.path.join(work, "config.h5")),
           "model.d_ff: 64 vs 128", "momentum.beta", sets=("model.d_ff=128", "momentum.beta=0.25"), readers=None)

    # --resume auto: a corrupt newest checkpoint is reported, kept, skipped
    six = ckpt(straight, 6)

    def truncated(p):
        with open(six, "rb") as src, open(p, "wb") as dst:
            dst.write(src.read()[:5000])

    def drop(name):
        def make(p):
            shutil.copy(six, p)
            with h5py.File(p, "r+") as f:
                del f[name]
        return make

    def narrow_gain(p):
        shutil.copy(six, p)
        with h5py.File(p, "r+") as f:
            g = f["metrics/eval/gain_R"][()]
            del f["metrics/eval/gain_R"]
            f["metrics/eval/gain_R"] = g[:, :1]

    cases = [
        ("truncated", truncated, "ckpt_00000006.h5"),
        # /model, /buffers and /optim/m are already read when the load fails
        ("missing /optim/v", drop("optim/v/blocks/0/attn/qkv/weight"), "/optim/v/blocks/0/attn/qkv/weight"),
        # everything but /metrics/eval is already read when the load fails
        ("bad /metrics/eval", narrow_gain, "/metrics/eval/gain_R"),
    ]
    for label, make, needle in cases:
        auto = os.path.join(work, "auto_" + re.sub(r"\W+", "_", label))
        os.makedirs(auto)
        shutil.copy(base, ckpt(auto, N))
        corrupt = ckpt(auto, 6)
        make(corrupt)
        before = digest(corrupt)
        # ckpt_interval 0: nothing at step 6 replaces the corrupt file
        r = R.train(ini, f"train.out_dir={auto}", "train.ckpt_interval=0", resume="auto")
        text = r.stdout + r.stderr
        ok = (r.returncode == 0 and "warning: skipping checkpoint that does not load" in text and corrupt in text
              and needle in text and f"resumed from {ckpt(auto, N)} at step {N}" in text)
        report.check(f"resume auto, corrupt newest ({label}): reported with the reason, older one used", ok, tail(r))
        report.check(f"resume auto, corrupt newest ({label}): the corrupt file still exists, unchanged",
                     os.path.exists(corrupt) and digest(corrupt) == before)
        if os.path.exists(ckpt(auto, 2 * N)):
            ok, detail = bitwise_report(ckpt(straight, 2 * N), ckpt(auto, 2 * N))
            report.check(f"resume auto, corrupt newest ({label}): result equals the straight run bitwise", ok, detail)

    # train.keep must not let a corrupt newer file push out the run's own checkpoints
    auto = os.path.join(work, "auto_keep")
    os.makedirs(auto)
    shutil.copy(base, ckpt(auto, N))
    corrupt = ckpt(auto, 50)
    with open(corrupt, "wb") as f:
        f.write(data[:5000])
    r = R.train(ini, f"train.out_dir={auto}", "train.keep=1", resume="auto")
    found = checkpoints(auto)
    loads = [s for s, p in found.items() if R.inspect(p).returncode == 0]
    report.check("resume auto + train.keep = 1 with a corrupt ckpt_00000050.h5: the run's final checkpoint "
                 f"(step {2 * N}) survives pruning and the corrupt file is not deleted",
                 r.returncode == 0 and 2 * N in loads and os.path.exists(corrupt),
                 f"rc {r.returncode}; checkpoints left {sorted(found)}, loadable {sorted(loads)}")


# ---- 5. full disk ---------------------------------------------------------------------

def test_full_disk(R, report, ini):
    mnt = os.path.join(R.work, "tmpfs")
    os.makedirs(mnt, exist_ok=True)
    while os.path.ismount(mnt):  # left mounted by an aborted earlier run
        if run(["umount", mnt], timeout=30).returncode != 0:
            break
    r = run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", mnt], timeout=30)
    if r.returncode != 0:
        report.check("full disk: skipped: cannot mount a tmpfs", True, r.stderr.strip()[:200])
        return
    try:
        r = R.train(ini, f"train.out_dir={mnt}", "train.steps=2", "train.keep=1")
        first = ckpt(mnt, 2)
        if not report.check("full disk: a first checkpoint fits in the 600 KB tmpfs",
                            r.returncode == 0 and os.path.exists(first), tail(r)):
            return
        before = digest(first)
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(b"\0" * max(0, free - 40 * 1024))
        r = R.train(ini, f"train.out_dir={mnt}", "train.steps=4", "train.keep=1", resume="auto")
        second = ckpt(mnt, 4)
        report.check("full disk: the error names the checkpoint ('checkpoint at step 4 not written: <path>')",
                     "checkpoint at step 4 not written" in r.stderr and second in r.stderr, tail(r))
        report.check("full disk: the program does not crash after the failed write",
                     r.returncode >= 0 and "Segmentation" not in r.stderr and "signal" not in r.stderr,
                     f"rc {r.returncode}; stderr {r.stderr.strip()[:400]!r}")
        report.check("full disk: the previous checkpoint is intact (same sha256) and loads",
                     digest(first) == before and R.inspect(first).returncode == 0)
        left = [n for n in os.listdir(mnt) if n not in ("filler", "metrics.h5", os.path.basename(first))]
        report.check("full disk: no half-written file left (neither ckpt_00000004.h5 nor a temporary)", not left,
                     f"left {left}")
    finally:
        run(["umount", mnt], timeout=30)


# ---- 6. stop signals under mpirun ------------------------------------------------------

class LongRun:
    """A 100000-step run (under mpirun when n > 0) in its own session, output
    to a log; waits for a step line (and n rank processes)."""

    def __init__(self, R, name, n, **overrides):
        over = {"train.steps": 100000, "train.log_interval": 1, "train.eval_interval": 0,
                "dist.check_interval": 50}
        over.update(overrides)
        self.ini, self.out_dir, _ = R.config(name, **over)
        self.log_path = os.path.join(R.work, name + ".log")
        cmd = train_command(R.momfmm, self.ini, np_=n)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(),
                                         start_new_session=True)
        self.ranks = {}
        started = False
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            started = re.search(r"^step \d+/", self.log(), re.M) is not None
            if n:
                self.ranks = {rank_of(p): p for p, exe in children(self.proc.pid) if exe == R.momfmm}
            if started and len(self.ranks) == n:
                break
            time.sleep(0.05)
        self.ready = started and len(self.ranks) == n and self.proc.poll() is None

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def wait(self, seconds):
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        kill_session(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def check_stopped(R, report, label, job, rc, world):
    text = job.log()
    m = re.search(r"^stop requested: writing a checkpoint at step (\d+)", text, re.M)
    report.check(f"{label}: exit 0 with 'stop requested'", rc == 0 and m is not None,
                 f"rc {rc}; log ...{text[-400:]!r}")
    if not m:
        return None
    step = int(m.group(1))
    path = ckpt(job.out_dir, step)
    ok = os.path.exists(path) and R.inspect(path).returncode == 0
    attrs = {}
    if ok:
        with h5py.File(path, "r") as f:
            attrs = {k: int(f.attrs[k]) for k in ("step", "world_size")}
    report.check(f"{label}: a checkpoint at the stop step ({step}) that loads, world_size {world}",
                 ok and attrs == {"step": step, "world_size": world} and len(re.findall("stop requested", text)) == 1,
                 f"{path} exists {os.path.exists(path)} attrs {attrs}")
    return path


def test_signals(R, report):
    job = LongRun(R, "sigterm", 4)
    try:
        if report.check("SIGTERM to one rank: 4 ranks started", job.ready, f"ranks {sorted(map(str, job.ranks))}"):
            os.kill(job.ranks[2], signal.SIGTERM)
            rc = job.wait(60)
            check_stopped(R, report, "SIGTERM to rank 2 of 4", job, rc, 4)
            time.sleep(0.3)
            left = [p for p in session_members(job.proc.pid) if p != job.proc.pid]
            report.check("SIGTERM to rank 2 of 4: no process left behind", not left, f"left {left}")
    finally:
        job.close()
    job = LongRun(R, "sigusr1", 4)
    try:
        if report.check("SIGUSR1 to mpirun: 4 ranks started", job.ready, f"ranks {sorted(map(str, job.ranks))}"):
            os.kill(job.proc.pid, signal.SIGUSR1)
            rc = job.wait(60)
            check_stopped(R, report, "SIGUSR1 to mpirun -np 4", job, rc, 4)
    finally:
        job.close()


# ---- 7. live metrics ----------------------------------------------------------------------

def test_live_metrics(R, report):
    job = LongRun(R, "live", 0, **{"train.eval_interval": 10})
    path = os.path.join(job.out_dir, "metrics.h5")
    rows, problems, ini = [], [], None
    try:
        if not report.check("live metrics: a long run started", job.ready, repr(job.log()[-300:])):
            return
        names = ("step", "loss", "lr", "grad_norm", "tokens_per_s")
        for _ in range(5):
            time.sleep(0.3)
            try:
                with h5py.File(path, "r", libver="latest", swmr=True) as f:
                    cols = [f[f"metrics/train/{k}"][()] for k in names]
                    n_eval = f["metrics/eval/loss"].shape[0]
                    ini = f.attrs.get("config_ini", ini)
            except (OSError, KeyError) as e:
                problems.append(f"read failed: {e}")
                continue
            # Each dataset is seen as of its own read while the writer appends
            # (step first, then loss, ...): a later column may be one row
            # behind an earlier one, or any number ahead; the last row's
            # extent may be visible before its value. Check the common rows.
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
            if not (n - 1) // 10 <= n_eval <= max(lens) // 10 + 1:
                problems.append(f"{n_eval} eval rows at {lens} train rows")
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
            with h5py.File(final, "r") as c, h5py.File(path, "r", libver="latest", swmr=True) as m:
                same = all(same_bits(c[f"metrics/{k}"][()], m[f"metrics/{k}"][()])
                           for k in ("train/step", "train/loss", "train/tokens_per_s", "eval/loss", "eval/loss_by_k"))
            report.check("live metrics: after the stop, metrics.h5 holds the same history as the checkpoint", same)
    finally:
        job.close()


def main():
    ap = argument_parser(__doc__)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--only", default="layout,resume,bad,disk,crash,signals,live",
                    help="comma-separated groups (bad and disk need resume)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed} (crash-test kill times; rerun with --seed {seed})", flush=True)
    R = Runner(a.momfmm, a.workdir)
    report = Report()
    t0 = time.time()
    only = set(a.only.split(","))
    if "layout" in only:
        test_layout(R, report)
    resumed = test_resume(R, report) if only & {"resume", "bad", "disk"} else None
    if resumed:
        ini, straight = resumed
        if "bad" in only:
            test_bad_files(R, report, ini, straight)
        if "disk" in only:
            test_full_disk(R, report, ini)
    if "crash" in only:
        test_crash(R, report, random.Random(seed))
    if "signals" in only:
        test_signals(R, report)
    if "live" in only:
        test_live_metrics(R, report)
    print(f"took {time.time() - t0:.0f} s", flush=True)
    report.finish()


if __name__ == "__main__":
    main()
