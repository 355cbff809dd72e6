"""Checkpoints (docs/files.md §4, 5): layout and resume (bad files and a full disk:
test_checkpoint_files.py; crashes and signals: test_checkpoint_stop.py). One class per group; CTest runs each as
its own entry (e2e_checkpoint_<group>, tests/CMakeLists.txt).

- TestLayout: after short runs (momentum with learned gamma; then fmm with
  learned gamma, 3 layers) h5py reads every dataset and each shape matches
  the config: every parameter name of docs/files.md §4 in PyTorch shape, /optim/m and
  /optim/v mirror /model, /buffers [H, dh], /metrics/train 1-D (step int64),
  /metrics/eval loss_by_k [n, 16], gain_R [n, L], gamma [n, L, H]; the root
  attributes, and config_ini parsed with configparser equals the config used;
  `h5dump -H` reads the file.
- TestResume: 2N steps straight vs N steps + `--resume auto` + N more
  (train.steps changed from N to 2N; constant schedule, so the lr of the
  first N steps does not depend on train.steps), and vs `--resume PATH`:
  /model, /optim, /buffers and the metric history bitwise equal (momentum
  with anchor = false, so the buffers enter the loss; a control run with
  zeroed buffers shows they do); the same for fmm attention. Another number
  of ranks: N steps at np = 1, resumed at np = 2 under mpirun, matches the
  straight run (loss 1e-5, weights 1e-4 relative). The chain variants (a period
  per sample, fillers, the length eval) resume bitwise too, and `momfmm inspect`
  prints their length eval and attention read-out per head as /metrics/eval holds
  them; on a fixed period it says no query's keys differ. L_rep_by_period brackets
  L_rep (equals it on a fixed period).
(TestBadFiles and TestFullDisk: test_checkpoint_files.py.)
Checkpoints are read with the package's reader (momfmm.h5.load_checkpoint);
h5py writes the corrupted variants, and reads the whole file once for the
claim that plain h5py can (docs/files.md §4).
"""
import configparser
import os
import re
import shutil

import h5py
import numpy as np
import pytest
from momfmm.h5 import load_checkpoint

from common import run
from ckpt_util import (LOSS_RTOL, N, RESUME, WEIGHT_RTOL, R, bitwise_report, ckpt, digest,  # noqa: F401 (R, straight:
                       load_state, rel_losses, rel_tensors, straight, tail)  # fixtures)

CKPT_LINE = re.compile(r"^checkpoint (\S+) \| ([\d.]+) MB in ([\d.]+) s \(([\d.]+) MB/s\)"
                       r"(?: \| (\d+) ranks together \(MPI-IO(?:, collective)?\))?$", re.M)




# ---- 1. layout --------------------------------------------------------------

def expected_parameters(s):
    """docs/files.md §4 parameter names and PyTorch shapes for config sections s."""
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
    # docs/files.md §4 promises the file to plain h5py: this one check reads it so.
    bad = []
    with h5py.File(path, "r") as f:
        def read_all(name, obj):
            if isinstance(obj, h5py.Dataset):
                try:
                    obj[()]
                except Exception as e:  # noqa: BLE001 - any failure to read is the finding
                    bad.append(f"{name}: {e}")
        f.visititems(read_all)
    report.check(f"layout {label}: h5py reads every dataset", not bad, "; ".join(bad[:3]))

    ck = load_checkpoint(path)
    model = ck.params
    shapes = {k: v.shape for k, v in model.items()}
    wrong = sorted(k for k in set(want) | set(shapes) if want.get(k) != shapes.get(k))
    report.check(f"layout {label}: /model has the docs/files.md §4 names in PyTorch shapes ({len(want)} tensors)",
                 not wrong and all(v.dtype == np.float32 for v in model.values()),
                 "; ".join(f"{k}: {shapes.get(k)} (want {want.get(k)})" for k in wrong[:6]))
    for moment, opt in (("m", ck.optim_m), ("v", ck.optim_v)):
        mism = sorted(k for k in set(opt) | set(model)
                      if k not in opt or k not in model or opt[k].shape != model[k].shape
                      or opt[k].dtype != np.float32)
        report.check(f"layout {label}: /optim/{moment} mirrors /model", not mism, f"differ: {mism[:6]}")

    bufs = ck.buffers
    want_b = {f"blocks/{i}/attn/{w}": (H, d // H) for i in range(L) for w in ("prev_q", "prev_k")}
    got_b = {k: v.shape for k, v in bufs.items()}
    report.check(f"layout {label}: /buffers/blocks/<i>/attn/prev_q, prev_k are [H, dh] = [{H}, {d // H}]",
                 got_b == want_b and all(v.dtype == np.float32 for v in bufs.values()),
                 f"got {sorted(got_b.items())[:4]}")

    tr = ck.train
    keys_ok = set(tr) == {"step", "loss", "lr", "grad_norm", "tokens_per_s"}
    shapes_ok = all(v.shape == (len(train_steps),) for v in tr.values())
    types_ok = keys_ok and tr["step"].dtype == np.int64 and all(
        v.dtype == np.float64 for k, v in tr.items() if k != "step")
    steps_ok = keys_ok and list(tr["step"]) == train_steps
    report.check(f"layout {label}: /metrics/train/* 1-D with {len(train_steps)} rows, step int64 = {train_steps}",
                 keys_ok and shapes_ok and types_ok and steps_ok,
                 f"{ {k: (v.shape, str(v.dtype)) for k, v in tr.items()} }")

    ev = ck.eval
    want_e = {k: (n_eval,) for k in ("step", "loss", "L_new", "L_rep", "delta_12", "acc", "exact_match")}
    want_e.update({"loss_by_k": (n_eval, 16), "gain_R": (n_eval, L), "gain_R_attn": (n_eval, L),
                   "gamma": (n_eval, L, H)})
    chain = s.get("data", {}).get("task", "chain") == "chain"
    if chain:  # the length eval and the attention read-out (docs/files.md §4, docs/metrics.md §3)
        want_e.update({k: (n_eval,) for k in ("lengen_loss", "lengen_L_new", "lengen_L_rep", "lengen_delta_12")})
        d = s.get("data", {})
        periods = max(int(d.get("chain_len_max", 0)), int(d.get("chain_len", 10))) - int(d.get("chain_len", 10)) + 1
        want_e.update({"lengen_loss_by_k": (n_eval, 16), "L_rep_by_period": (n_eval, periods)})
        want_e.update({k: (n_eval, L, H) for k in ("attn_positional", "attn_induction", "lengen_attn_positional",
                                                   "lengen_attn_induction")})
    got_e = {k: v.shape for k, v in ev.items()}
    types_ok = "step" in ev and ev["step"].dtype == np.int64 and all(
        v.dtype == np.float64 for k, v in ev.items() if k != "step")
    steps_ok = "step" in ev and list(ev["step"]) == eval_steps
    report.check(f"layout {label}: /metrics/eval: loss_by_k [{n_eval}, 16], gain_R [{n_eval}, {L}], "
                 f"gamma [{n_eval}, {L}, {H}], the rest [{n_eval}], step int64 = {eval_steps}",
                 got_e == want_e and types_ok and steps_ok, f"got {got_e}")
    if chain and got_e == want_e:
        length = int(s["data"].get("eval_chain_len", 0)) > 0
        finite = all(np.isfinite(ev[k]).all() == length for k in ("lengen_loss", "lengen_L_rep"))
        report.check(f"layout {label}: lengen_* measured with data.eval_chain_len, NaN without", finite,
                     f"lengen_loss {ev['lengen_loss']}")
        # L_rep is the count-weighted mean of the periods' entries (docs/metrics.md §3): equal to
        # the one entry of a fixed period, between the smallest and largest drawn entry otherwise
        by, rep = ev["L_rep_by_period"], ev["L_rep"]
        drawn = [row[np.isfinite(row)] for row in by]
        within = all(len(d) > 0 and d.min() - 1e-9 <= r <= d.max() + 1e-9 for d, r in zip(drawn, rep))
        exact = by.shape[1] > 1 or np.allclose(by[:, 0], rep, rtol=1e-9, atol=0)
        report.check(f"layout {label}: L_rep_by_period brackets L_rep (equals it on a fixed period)", within and exact,
                     f"L_rep {rep}, by period {by}")
    if s.get("momentum", {}).get("learn_gamma") and got_e == want_e:
        last = np.stack([model[f"blocks/{i}/attn/momentum_gamma"] for i in range(L)]).astype(np.float64)
        report.check(f"layout {label}: the last eval's gamma row is the learned momentum_gamma",
                     np.array_equal(ev["gamma"][-1], last), f"{ev['gamma'][-1].ravel()[:4]} vs {last.ravel()[:4]}")

    a = ck.attrs
    tokens = t["steps"] * t["batch_size"] * s["data"]["seq_len"]
    got = {k: (a[k].item() if hasattr(a.get(k), "item") else a.get(k))
           for k in ("format", "format_version", "step", "tokens_seen", "world_size")}
    want_a = {"format": "momfmm-checkpoint", "format_version": 1, "step": t["steps"], "tokens_seen": tokens,
              "world_size": 1}
    report.check(f"layout {label}: root attributes {want_a}", got == want_a, f"got {got}")
    build = run([R.momfmm, "--version"], timeout=30).stdout.splitlines()[:1]
    report.check(f"layout {label}: momfmm_version is the first line of momfmm --version, and inspect shows it",
                 build and a.get("momfmm_version") == build[0] and f"rank of {build[0]}\n" in R.inspect(path).stdout,
                 f"{a.get('momfmm_version')!r} vs {build}")
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


LAYOUT_RUNS = {
    "momentum": {"momentum.gamma": 0.5, "momentum.learn_gamma": True, "momentum.beta": 0.5, "train.steps": 4},
    "fmm": {"model.vocab_size": 24, "model.d_model": 16, "model.n_heads": 2, "model.n_layers": 3,
            "model.d_ff": 48, "attention.kind": "fmm", "fmm.bandwidth": 3, "fmm.kernels": "elu,tanh",
            "momentum.gamma": 0.3, "momentum.learn_gamma": True, "momentum.gamma2": 0.1,
            "data.chain_len_max": 7, "data.eval_chain_len": 8, "data.eval_chain_len_max": 9,
            "train.steps": 5, "train.log_interval": 2, "train.eval_interval": 3},
}


class TestLayout:
    @pytest.mark.parametrize("label", sorted(LAYOUT_RUNS))
    def test_layout(self, R, report, label):
        ini, out_dir, sections = R.config("layout_" + label, **LAYOUT_RUNS[label])
        r = R.train(ini)
        path = ckpt(out_dir, sections["train"]["steps"])
        assert r.returncode == 0 and os.path.exists(path), \
            f"layout {label}: training writes {os.path.basename(path)}: {tail(r)}"
        check_layout(R, report, label, path, sections)
        line = CKPT_LINE.search(r.stdout)
        report.check(f"layout {label}: log line 'checkpoint <path> | <MB> MB in <s> s (<MB/s> MB/s)'",
                     line is not None and line.group(1) == path, f"{line.group(0) if line else r.stdout[-300:]}")

    def test_build_with_control_characters(self, R, report):
        """momfmm_version is a file's text: inspect shows it without its control characters."""
        ini, out_dir, sections = R.config("layout_build", **LAYOUT_RUNS[sorted(LAYOUT_RUNS)[0]])
        assert R.train(ini).returncode == 0
        path = ckpt(out_dir, sections["train"]["steps"])
        with h5py.File(path, "r+") as f:
            f.attrs["momfmm_version"] = "momfmm 9\x1b[2J\nfake line"
        r = R.inspect(path)
        report.check("inspect: a momfmm_version with control characters loads and prints as '?'",
                     r.returncode == 0 and "rank of momfmm 9?[2J?fake line\n" in r.stdout and "\x1b" not in r.stdout,
                     r.stdout[:300] + r.stderr[-300:])


# ---- 2. resume ---------------------------------------------------------------

@pytest.fixture(scope="module")
def split(R):
    """(ini, out_dir, checkpoint at N) of a run of the first N steps."""
    ini, out_dir, _ = R.config("split", **RESUME, **{"train.steps": N})
    r = R.train(ini)
    half = ckpt(out_dir, N)
    assert r.returncode == 0 and os.path.exists(half), f"resume: first {N} steps: {tail(r)}"
    return ini, out_dir, half


class TestResume:
    def test_buffers_nonzero(self, report, straight):
        buffers = load_checkpoint(ckpt(straight, 2 * N), optim=False, metrics=False).buffers
        buf_norm = sum(float(np.abs(v).sum()) for v in buffers.values())
        report.check("resume: momentum buffers are non-zero (anchor = false: they enter the loss)", buf_norm > 0,
                     f"sum |buffers| = {buf_norm:.3g}")

    def test_resume_auto(self, R, report, straight, split):
        ini_r, split_dir, half = split
        r = R.train(ini_r, f"train.steps={2 * N}", resume="auto")
        ok = r.returncode == 0 and f"resumed from {half} at step {N}" in r.stdout
        report.check(f"resume: --resume auto picks {os.path.basename(half)} and runs to step {2 * N}",
                     ok and os.path.exists(ckpt(split_dir, 2 * N)), tail(r))
        report.check("resume: changing train.steps is a warning naming the key and both values",
                     f"train.steps: {N} vs {2 * N}" in r.stdout + r.stderr and "warning" in r.stdout + r.stderr,
                     tail(r))
        if os.path.exists(ckpt(split_dir, 2 * N)):
            ok, detail = bitwise_report(ckpt(straight, 2 * N), ckpt(split_dir, 2 * N))
            report.check(f"resume: {N} + --resume auto + {N} steps equals {2 * N} straight bitwise "
                         "(/model, /optim, /buffers, metric history)", ok, detail)

    def test_resume_path(self, R, report, straight, split):
        half = split[2]
        half_digest = digest(half)
        ini_p, by_path, _ = R.config("by_path", **RESUME, **{"train.steps": 2 * N})
        r = R.train(ini_p, resume=half)
        if report.check("resume: --resume PATH runs", r.returncode == 0 and os.path.exists(ckpt(by_path, 2 * N)),
                        tail(r)):
            ok, detail = bitwise_report(ckpt(straight, 2 * N), ckpt(by_path, 2 * N))
            report.check("resume: --resume PATH equals the straight run bitwise", ok, detail)
        report.check("resume: the checkpoint resumed from is untouched", digest(half) == half_digest)

    def test_zeroed_buffers_control(self, R, straight, split):
        """Zeroed buffers must change the result, or the bitwise comparisons
        would not see a resume that drops them."""
        ini_z, zeroed, _ = R.config("zeroed", **RESUME, **{"train.steps": 2 * N})
        os.makedirs(zeroed, exist_ok=True)
        zero_src = os.path.join(R.work, "zeroed_buffers.h5")
        shutil.copy(split[2], zero_src)
        with h5py.File(zero_src, "r+") as f:
            f["buffers"].visititems(lambda n, o: o.__setitem__(Ellipsis, 0) if isinstance(o, h5py.Dataset) else None)
        r = R.train(ini_z, resume=zero_src)
        assert r.returncode == 0 and os.path.exists(ckpt(zeroed, 2 * N)), \
            f"resume control: run from zeroed buffers: {tail(r)}"
        a, _ = load_state(ckpt(straight, 2 * N))
        b, _ = load_state(ckpt(zeroed, 2 * N))
        rel, where = rel_tensors(a, b, ("model",))
        assert rel > 1e-6, ("resume control: zeroing the buffers of the N checkpoint changes the final weights: "
                            f"max rel diff {rel:.3g} at {where}")

    def test_fmm(self, R, report):
        """fmm attention (with momentum): the same bitwise resume."""
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

    def test_chain_variants(self, R, report):
        """A period per sample, fillers and the length eval (docs/tasks.md §2): the samples
        are functions of counters, so the same bitwise resume, the lengen_* and attn_*
        columns of the metric history included."""
        chain = dict(RESUME, **{"data.chain_len": 3, "data.chain_len_max": 6, "data.chain_noise": 0.2,
                                "data.chain_fillers": 4, "data.eval_chain_len": 7, "data.eval_chain_len_max": 8})
        ini_s, straight_dir, _ = R.config("chain_straight", **chain, **{"train.steps": 2 * N})
        ini_h, half_dir, _ = R.config("chain_split", **chain, **{"train.steps": N})
        runs = (R.train(ini_s), R.train(ini_h), R.train(ini_h, f"train.steps={2 * N}", resume="auto"))
        if report.check("resume chain variants: straight, first half and --resume auto run",
                        all(x.returncode == 0 for x in runs) and os.path.exists(ckpt(half_dir, 2 * N)),
                        " | ".join(tail(x, 200) for x in runs if x.returncode)):
            ok, detail = bitwise_report(ckpt(straight_dir, 2 * N), ckpt(half_dir, 2 * N))
            report.check("resume chain variants: resumed equals straight bitwise", ok, detail)
            with h5py.File(ckpt(half_dir, 2 * N), "r") as f:
                measured = all(np.isfinite(f[f"metrics/eval/{k}"][()]).all()
                               for k in ("lengen_L_rep", "lengen_attn_induction", "attn_induction"))
            report.check("resume chain variants: the length eval and read-outs measured at every eval", measured)
            check_inspect_readouts(R, report, ckpt(half_dir, 2 * N), (7, 8))

    def test_inspect_fixed_period(self, R, report, straight):
        """A fixed period without fillers and no length eval: no counted query, so inspect says
        so instead of printing NaN scores, and prints no length-eval line."""
        r = R.inspect(ckpt(straight, 2 * N))
        report.check("inspect, fixed period: the read-out says no query's keys differ, no length-eval line",
                     r.returncode == 0 and "attention read-out (last eval): — (no query whose positional and "
                     "induction keys differ)" in r.stdout and "last length eval" not in r.stdout,
                     r.stdout[-600:] + r.stderr[-200:])

    def test_np1_to_np2(self, R, report, straight, split):
        """N steps at np = 1, the rest at np = 2."""
        ini_x, x_dir, _ = R.config("np2", **RESUME, **{"train.steps": 2 * N})
        r = R.train(ini_x, resume=split[2], np_=2)
        got = ckpt(x_dir, 2 * N)
        assert r.returncode == 0 and os.path.exists(got) and "resuming on 2" in r.stdout, \
            f"resume np 1 -> 2: mpirun -np 2 --resume PATH (written by 1 rank) runs: {tail(r)}"
        a, _ = load_state(ckpt(straight, 2 * N))
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


def check_inspect_readouts(R, report, path, periods):
    """`momfmm inspect` prints the last eval's length eval and, per layer and head, the attention
    read-out as positional/induction (docs/metrics.md §3): the numbers of /metrics/eval; `momfmm
    eval` measures them again, the same."""
    r = R.inspect(path)
    with h5py.File(path, "r") as f:
        ev = {k: f[f"metrics/eval/{k}"][-1] for k in ("lengen_loss", "lengen_L_rep", "attn_positional",
                                                       "attn_induction", "lengen_attn_positional",
                                                       "lengen_attn_induction")}
    line = re.search(r"^last length eval \(periods (\d+)\.\.(\d+)\): loss ([\d.]+) \| L_rep ([\d.]+)$", r.stdout, re.M)
    report.check(f"inspect: 'last length eval (periods {periods[0]}..{periods[1]}): loss … | L_rep …' as in metrics",
                 r.returncode == 0 and line is not None and (int(line.group(1)), int(line.group(2))) == periods
                 and abs(float(line.group(3)) - ev["lengen_loss"]) <= 6e-5
                 and abs(float(line.group(4)) - ev["lengen_L_rep"]) <= 6e-5, r.stdout[-800:] + r.stderr[-200:])
    for title, pos, ind in (("last eval", "attn_positional", "attn_induction"),
                            ("length eval", "lengen_attn_positional", "lengen_attn_induction")):
        block = re.search(rf"^attention read-out \({title}\), positional/induction per head:\n((?:  block \d+:.*\n)+)",
                          r.stdout, re.M)
        rows = [re.findall(r"h(\d+) ([\d.]+)/([\d.]+)", b) for b in block.group(1).splitlines()] if block else []
        want = ev[pos].shape
        shown = np.array([[[float(p), float(i)] for _, p, i in row] for row in rows]) if rows else np.zeros((0,))
        ok = shown.shape == want + (2,) and np.allclose(shown[..., 0], ev[pos], atol=6e-4) \
            and np.allclose(shown[..., 1], ev[ind], atol=6e-4)
        report.check(f"inspect: the attention read-out ({title}) per layer and head, positional/induction as in "
                     "metrics", ok, r.stdout[-800:])
    # `momfmm eval` measures them again on the checkpoint: the eval of the run's last step, so the same numbers
    r = run([R.momfmm, "eval", path], timeout=120)
    line = re.search(rf"^eval, length generalisation \(periods {periods[0]}\.\.{periods[1]}\) \| loss ([\d.]+) ",
                     r.stdout, re.M)
    report.check("eval: the length eval's loss line, as the run's last eval", r.returncode == 0 and line is not None
                 and abs(float(line.group(1)) - ev["lengen_loss"]) <= 2e-6, r.stdout[-800:] + r.stderr[-200:])
    for title, pos, ind in (("", "attn_positional", "attn_induction"),
                            (" (length eval)", "lengen_attn_positional", "lengen_attn_induction")):
        block = re.search(rf"^attention read-out{re.escape(title)}, positional/induction per head:\n"
                          r"((?:  block \d+:.*\n)+)", r.stdout, re.M)
        rows = [re.findall(r"h\d+ ([\d.]+)/([\d.]+)", b) for b in block.group(1).splitlines()] if block else []
        shown = np.array([[[float(p), float(i)] for p, i in row] for row in rows]) if rows else np.zeros((0,))
        ok = shown.shape == ev[pos].shape + (2,) and np.allclose(shown[..., 0], ev[pos], atol=6e-4) \
            and np.allclose(shown[..., 1], ev[ind], atol=6e-4)
        report.check(f"eval: the attention read-out{title} per layer and head, as the run's last eval", ok,
                     r.stdout[-800:])
