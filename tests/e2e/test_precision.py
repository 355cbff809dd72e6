"""bf16 mixed precision (docs/scale.md §7), one class per CTest entry (e2e_precision_<group>):

- TestConvergence: the chain (chain_len 10) and copy tasks trained in fp32 and in bf16 over
  3 seeds each reach the same final eval loss within the spread of the seeds (the
  numbers are printed).
- TestRanks: np = 1 and np = 4 in bf16 give the same first loss, bit for bit, and the
  same per-step loss within 3e-5 relative over 15 steps (the gradient reduction is fp32;
  bf16's roundings amplify its last-bit differences as training goes on).
- TestResume: a checkpoint written in fp32 resumes in bf16 with a warning naming
  train.precision, and back; eval, loss and generate take the checkpoint's precision
  and --precision overrides it; in bf16, `eval --stream` gives the full forward's logits
  (the model makes LN1's, LN2's and the GELU's outputs in bf16 itself, streaming lets the
  engine round them: the same bits).
- TestRefusal: a CPU without bf16 (MOMFMM_FAKE_NO_BF16=1 plays one) exits 2 naming
  AVX512_BF16, for train and for eval --precision bf16; a bad --precision value exits 2;
  without AVX-512 either (MOMFMM_FAKE_NO_AVX512=1), MOMFMM_FORCE_BF16=1 runs bf16 on
  OpenBLAS's sgemm and gives the eval loss that oneDNN's bf16 gives.

The bf16 runs set MOMFMM_FORCE_BF16=1 so that they also run (slowly: emulated by
oneDNN, or on an AVX2-only core as bf16 values on OpenBLAS's sgemm) on a CPU without
native bf16; the build must have oneDNN (tests/CMakeLists.txt registers this module only
then).
"""
import os
import re
import shutil

import h5py
import numpy as np
import pytest
from momfmm.h5 import load_checkpoint, newest_checkpoint

from common import env, perturb, run, train_command, unavailable, write_tiny_config, write_tokens

BF16 = "train.precision=bf16"
FP32 = "train.precision=fp32"


def bf16_env(**extra):
    return env(MOMFMM_FORCE_BF16=1, **extra)


@pytest.fixture
def bf16_runs(momfmm):
    """Skips (CTest counts it: SKIP_REGULAR_EXPRESSION) where even MOMFMM_FORCE_BF16
    cannot run bf16 (`momfmm --version`, 'bf16:'): a build without oneDNN."""
    why = unavailable(momfmm, "bf16", MOMFMM_FORCE_BF16=1)
    if why:
        pytest.skip(f"bf16 cannot run on this CPU: {why}")


def train(momfmm, workdir, name, sets=(), np_=None, resume=None, extra_env=None, **overrides):
    ini, out_dir, _ = write_tiny_config(workdir, name, **overrides)
    r = run(train_command(momfmm, ini, sets, np_=np_, resume=resume), timeout=300, env=bf16_env(**(extra_env or {})))
    if r.returncode != 0:
        print(f"--- {name} rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}", flush=True)
    return r, ini, out_dir


def eval_losses(stdout):
    return [float(m) for m in re.findall(r"^eval step \d+ \| loss (\S+)", stdout, re.M)]


def eval_loss(stdout):
    """`momfmm eval`'s loss, or None."""
    m = re.search(r"^eval \| loss (\S+)", stdout, re.M)
    return float(m.group(1)) if m else None


def step_losses(stdout):
    return [float(m) for m in re.findall(r"^step \d+/\d+ \| loss (\S+)", stdout, re.M)]


# ---------------------------------------------------------------------------
TASKS = {
    "chain": {"data.task": "chain", "data.seq_len": 32, "data.chain_len": 10, "momentum.gamma": 0.2},
    "copy": {"data.task": "copy", "data.seq_len": 32},
}
SEEDS = (1, 2, 3)
STEPS = 150


@pytest.mark.usefixtures("bf16_runs")
class TestConvergence:
    def test_bf16_reaches_the_fp32_loss(self, momfmm, workdir, report):
        for task, keys in TASKS.items():
            finals = {}
            for precision in ("fp32", "bf16"):
                finals[precision] = []
                for seed in SEEDS:
                    r, _, _ = train(momfmm, workdir, f"{task}_{precision}_{seed}",
                                    sets=[f"train.precision={precision}"],
                                    **keys, **{"train.steps": STEPS, "train.batch_size": 8, "train.seed": seed,
                                               "train.eval_interval": STEPS, "train.eval_batches": 4,
                                               "train.log_interval": 50, "train.warmup": 10,
                                               "train.lr": 3e-3})
                    losses = eval_losses(r.stdout)
                    report.check(f"{task} {precision} seed {seed}: trains", r.returncode == 0 and losses,
                                 f"rc {r.returncode}")
                    if losses:
                        finals[precision].append(losses[-1])
            if len(finals["fp32"]) != len(SEEDS) or len(finals["bf16"]) != len(SEEDS):
                continue
            f32, b16 = np.array(finals["fp32"]), np.array(finals["bf16"])
            spread = max(np.ptp(f32), np.ptp(b16))
            gap = abs(f32.mean() - b16.mean())
            report.check(f"{task}: bf16 mean final eval loss within the seeds' spread of fp32's", gap <= spread,
                         f"fp32 {np.round(f32, 4).tolist()} (mean {f32.mean():.4f}), "
                         f"bf16 {np.round(b16, 4).tolist()} (mean {b16.mean():.4f}), gap {gap:.4f}, "
                         f"spread {spread:.4f}")


# ---------------------------------------------------------------------------
@pytest.mark.usefixtures("bf16_runs")
class TestRanks:
    def test_np1_equals_np4(self, momfmm, workdir, report):
        keys = {"train.steps": 15, "train.batch_size": 24, "train.adam_eps": 1e-6, "train.warmup": 2,
                "train.log_interval": 1, "train.eval_interval": 15, "train.eval_batches": 1}
        curves = {}
        for n in (1, 4):
            r, _, _ = train(momfmm, workdir, f"ranks_np{n}", sets=[BF16], np_=n, **keys)
            curves[n] = np.array(step_losses(r.stdout))
            report.check(f"np={n} bf16 trains", r.returncode == 0 and curves[n].size == 15, f"rc {r.returncode}")
            if r.returncode != 0:
                return
        # the log prints 4 decimals: compare the checkpoint's full-precision history
        hist = {n: load_checkpoint(newest_checkpoint(os.path.join(workdir, f"ranks_np{n}"))).train["loss"]
                for n in (1, 4)}
        rel = np.abs(hist[1] - hist[4]) / np.abs(hist[1])
        # The first step's loss is the same bits (each rank's rows as on one
        # rank); from the second the reduction's order differs in the last
        # bits (5e-9 relative), and every bf16 rounding that difference tips
        # over moves one operand by a bf16 ulp (2^-8 to 2^-7 of it), so the
        # curves drift apart by training itself: measured up to 8.2e-6 with
        # attention in fp32 and 1.3e-5 with it in bf16 (docs/design.md
        # §8.10), within 3e-5 over 15 steps.
        report.check("np=4 first step's loss equals np=1's", rel[0] == 0.0, f"rel {rel[0]:.2e}")
        report.check("np=4 per-step loss (checkpoint history) within 3e-5 relative of np=1",
                     float(rel.max()) <= 3e-5, f"{hist[1].size} steps, worst {float(rel.max()):.2e}")


# ---------------------------------------------------------------------------
@pytest.mark.usefixtures("bf16_runs")
class TestResume:
    def test_across_precisions(self, momfmm, workdir, report):
        keys = {"train.steps": 4, "train.ckpt_interval": 2}
        for first, then in (("fp32", "bf16"), ("bf16", "fp32")):
            name = f"resume_{first}_to_{then}"
            r, ini, out_dir = train(momfmm, workdir, name, sets=[f"train.precision={first}"], **keys)
            report.check(f"{first} run", r.returncode == 0, r.stderr[-300:])
            r2 = run(train_command(momfmm, ini, [f"train.precision={then}", "train.steps=8"], resume="auto"),
                     timeout=300, env=bf16_env())
            out = r2.stdout + r2.stderr
            report.check(f"{first} checkpoint resumes in {then}", r2.returncode == 0 and "resumed from" in out,
                         out[-400:])
            report.check(f"{first} -> {then}: warning names train.precision",
                         re.search(rf"warning:.*train\.precision: {first} vs {then}", out) is not None, out[-400:])
            report.check(f"{first} -> {then}: start-up line says {then}", f"precision {then} |" in out, "")

    def test_commands_take_the_checkpoint_precision(self, momfmm, workdir, report):
        r, ini, out_dir = train(momfmm, workdir, "cmd_bf16", sets=[BF16], **{"train.steps": 2})
        report.check("bf16 run", r.returncode == 0, r.stderr[-300:])
        ck = os.path.join(out_dir, "ckpt_00000002.h5")
        rng = np.random.default_rng(0)
        tok = write_tokens(os.path.join(workdir, "tok.h5"), rng.integers(0, 32, (2, 16)), rng.integers(0, 32, (2, 16)))
        losses = {}
        for label, extra in (("checkpoint's (bf16)", []), ("bf16", ["--precision", "bf16"]),
                             ("fp32", ["--precision", "fp32"])):
            rl = run([momfmm, "loss", ck, tok] + extra, env=bf16_env())
            m = re.search(r"^loss (\S+)", rl.stdout, re.M)
            report.check(f"loss with {label} precision", rl.returncode == 0 and m, rl.stderr[-300:])
            losses[label] = float(m.group(1)) if m else None
        if None not in losses.values():
            report.check("loss: the checkpoint's precision is bf16", losses["checkpoint's (bf16)"] == losses["bf16"],
                         str(losses))
            a, b = losses["bf16"], losses["fp32"]
            report.check("loss: --precision fp32 differs from bf16 by bf16 rounding only",
                         a != b and abs(a - b) <= 1e-2 * abs(b), str(losses))
        for cmd in (["eval", ck, "--precision", "fp32"], ["eval", ck],
                    ["generate", ck, "--prompt", "1 2 3", "--tokens", "4", "--precision", "bf16"]):
            rc = run([momfmm] + cmd, env=bf16_env())
            report.check(" ".join(cmd[:1] + cmd[2:]) + " runs", rc.returncode == 0, rc.stderr[-300:])


    def test_stream_is_the_full_forward_in_bf16(self, momfmm, workdir, report):
        """In bf16 the model makes LN1's and LN2's outputs (and the GELU's) in bf16 itself, in
        their pass (docs/design.md §8.10); streaming makes them in fp32 and the engine rounds
        them: the same bits, so `eval --stream` gives the full forward's logits. The weights are
        moved far from their initialisation so that a rounding of its own would show."""
        ini, out_dir, _ = write_tiny_config(workdir, "stream_bf16", **{"train.precision": "bf16"})
        ck = os.path.join(workdir, "stream_bf16.h5")
        r = run([momfmm, "init", ini, "--out", ck], env=bf16_env())
        report.check("init a bf16 config", r.returncode == 0, r.stderr[-300:])
        perturb(ck, np.random.default_rng(7))
        losses = []
        for segment, extra in ((1, []), (5, []), (5, ["--precision", "fp32"])):
            rs = run([momfmm, "eval", ck, "--stream", "--segment", str(segment)] + extra, env=bf16_env())
            m = re.search(r"stream max \|logit difference\| vs full forward: (\S+)", rs.stdout)
            loss = re.search(r"^eval \| loss (\S+)", rs.stdout, re.M)
            losses.append(loss.group(1) if loss else None)
            diff = float(m.group(1)) if m else float("inf")
            report.check(f"{' '.join(extra) or 'bf16'}: eval --stream in segments of {segment} = the full forward",
                         rs.returncode == 0 and diff <= 1e-4, f"max |logit diff| {diff:.3e}; {rs.stderr[-300:]}")
        report.check("the checkpoint's precision ran bf16 (its loss differs from --precision fp32's)",
                     None not in losses and losses[0] == losses[1] != losses[2], str(losses))

    def test_gain_r_is_fp32_in_bf16(self, momfmm, workdir, report):
        """gain_R's perturbation (1e-3 of the input's norm) is below bf16's resolution: the
        read-out's forwards run in fp32 whatever the precision (docs/metrics.md §3)."""
        r, ini, out_dir = train(momfmm, workdir, "gain_fp32", **{"train.steps": 40, "train.eval_interval": 40})
        report.check("fp32 run", r.returncode == 0, r.stderr[-300:])
        gains = {}
        for precision in ("fp32", "bf16"):
            re_ = run([momfmm, "eval", out_dir, "--precision", precision], env=bf16_env())
            m = re.search(r"^gain_R((?: \S+)+)$", re_.stdout, re.M)
            report.check(f"eval --precision {precision} prints gain_R", re_.returncode == 0 and m, re_.stderr[-300:])
            gains[precision] = [float(x) for x in m.group(1).split()] if m else None
        if None not in gains.values():
            worst = max(abs(a - b) / abs(a) for a, b in zip(gains["fp32"], gains["bf16"]))
            report.check("gain_R in bf16 within 10% of fp32's (it was 6x off)", worst <= 0.10, f"{gains} (worst {worst:.3g})")


# ---------------------------------------------------------------------------
class TestRefusal:
    def test_no_bf16_cpu_exits_2(self, momfmm, workdir, report):
        ini, out_dir, _ = write_tiny_config(workdir, "refuse", **{"train.steps": 2})
        fake = env(MOMFMM_FAKE_NO_BF16=1)
        r = run(train_command(momfmm, ini, [BF16]), env=fake)
        report.check("train.precision = bf16 without AVX512_BF16: exit 2 naming it",
                     r.returncode == 2 and "AVX512_BF16" in r.stderr, f"rc {r.returncode}: {r.stderr.strip()}")
        r = run(train_command(momfmm, ini, [FP32, "train.steps=2"]), env=fake)
        report.check("fp32 runs on the same CPU", r.returncode == 0, r.stderr[-300:])
        ck = os.path.join(out_dir, "ckpt_00000002.h5")
        r = run([momfmm, "eval", ck, "--precision", "bf16"], env=fake)
        report.check("eval --precision bf16 without AVX512_BF16: exit 2", r.returncode == 2 and "AVX512_BF16" in r.stderr,
                     f"rc {r.returncode}: {r.stderr.strip()}")
        # a checkpoint trained in bf16, read there: the checkpoint and the way out named
        # (its config says bf16; rewritten here so that any CPU can make it)
        bf16_ck = os.path.join(workdir, "trained_in_bf16.h5")
        shutil.copyfile(ck, bf16_ck)
        with h5py.File(bf16_ck, "r+") as f:
            text = f.attrs["config_ini"]
            assert "precision = fp32" in text, text
            f.attrs["config_ini"] = text.replace("precision = fp32", "precision = bf16")
        tokens = os.path.join(workdir, "refuse_tokens.h5")
        with h5py.File(tokens, "w") as f:
            f["tokens"] = np.zeros((1, 8), dtype=np.int32)
        for args in (["eval", bf16_ck], ["generate", bf16_ck], ["logits", bf16_ck, tokens, "--out",
                                                                 os.path.join(workdir, "refuse_logits.h5")]):
            r = run([momfmm, *args], env=fake)
            lines = r.stderr.strip().splitlines()
            report.check(f"{args[0]} of a bf16 checkpoint without AVX512_BF16: exit 2, one line naming it and "
                         "--precision fp32", r.returncode == 2 and len(lines) == 1 and bf16_ck in lines[0]
                         and "--precision fp32" in lines[0], f"rc {r.returncode}: {r.stderr.strip()}")
        r = run([momfmm, "eval", bf16_ck, "--precision", "fp32"], env=fake)
        report.check("eval --precision fp32 of that checkpoint runs there", r.returncode == 0, r.stderr[-300:])
        avx2 = env(MOMFMM_FAKE_NO_AVX512=1)
        r = run([momfmm, "eval", ck, "--precision", "bf16"], env=avx2)
        report.check("without AVX-512 at all: exit 2 naming the override", r.returncode == 2
                     and "MOMFMM_FORCE_BF16=1 overrides" in r.stderr, f"rc {r.returncode}: {r.stderr.strip()}")
        # forced there, bf16 runs as bf16 values on OpenBLAS's sgemm (gemm_widen.c); its eval
        # loss is bf16's, which oneDNN's bf16 (native or emulated, where AVX-512 is) gives too
        forced = env(MOMFMM_FAKE_NO_AVX512=1, MOMFMM_FORCE_BF16=1)
        r = run(train_command(momfmm, ini, [BF16, "train.steps=2", "train.out_dir=" + os.path.join(workdir, "widened")]),
                env=forced)
        report.check("without AVX-512, forced: train exits 0, its start-up line naming OpenBLAS's sgemm",
                     r.returncode == 0 and "precision bf16 | gemm onednn-bf16 (no bf16 matmul here: bf16 values on "
                     "OpenBLAS sgemm" in r.stdout, r.stdout[-400:] + r.stderr[-300:])
        widened = run([momfmm, "eval", ck, "--precision", "bf16"], env=forced)
        fp32 = run([momfmm, "eval", ck, "--precision", "fp32"], env=avx2)
        dnn = run([momfmm, "eval", ck, "--precision", "bf16"], env=env(MOMFMM_FORCE_BF16=1))
        losses = [eval_loss(x.stdout) for x in (widened, fp32, dnn)]
        if unavailable(momfmm, "avx512"):
            report.check("the forced bf16 eval loss within 2e-3 of fp32's (this CPU has no oneDNN bf16 to compare)",
                         None not in losses[:2] and abs(losses[0] - losses[1]) <= 2e-3 * abs(losses[1]), str(losses))
        else:
            report.check("the forced bf16 eval loss = oneDNN bf16's within 1e-4 (fp32's printed beside)",
                         None not in losses and abs(losses[0] - losses[2]) <= 1e-4 * abs(losses[2]), str(losses))
        r = run([momfmm, "eval", ck, "--precision", "fp16"])
        report.check("--precision fp16: exit 2 naming the choices", r.returncode == 2 and "bf16" in r.stderr,
                     f"rc {r.returncode}: {r.stderr.strip()}")
        r = run(train_command(momfmm, ini, ["train.precision=bf32"]))
        report.check("train.precision = bf32: exit 2", r.returncode == 2, r.stderr.strip())
