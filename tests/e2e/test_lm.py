"""The language-model workflow (docs/cli.md §5, docs/metrics.md §3, docs/files.md §4):
bits per byte in the train log, `eval`, `inspect` and metrics.h5 of a text run;
"—" for empty loss_by_k bins; `generate --text` (text in, text out, invalid
UTF-8 escaped), top-k, top-p, seed, --stop, the sliding window past
model.max_seq_len, bad values; `train --init` (fine-tuning); train.keep_best
(best.h5) and the end-of-run summary.

One tiny byte-level model is trained on a generated corpus for the module
(a few seconds); the other tests start from its checkpoints."""
import math
import os
import re
import subprocess

import h5py
import numpy as np
import pytest

from common import MPIRUN, apply_overrides, env, run, write_config

WORDS = ("the model reads bytes and learns which byte comes next in a text of plain words "
         "with momentum attention the keys carry a little of their past").split()
W = 32  # model.max_seq_len = data.seq_len: the streaming window


def corpus(path, n_words=6000, seed=7):
    rng = np.random.default_rng(seed)
    lines, line = [], []
    for w in rng.choice(WORDS, n_words):
        line.append(str(w))
        if len(line) == 9:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def text_sections(out_dir, data_path, **overrides):
    sections = {
        "model": {"vocab_size": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_seq_len": W},
        "data": {"task": "text", "seq_len": W, "path": data_path},
        "train": {"steps": 24, "batch_size": 8, "lr": 1e-2, "warmup": 2, "log_interval": 4, "eval_interval": 4,
                  "eval_batches": 2, "ckpt_interval": 4, "keep": 1, "keep_best": True, "out_dir": out_dir},
    }
    return apply_overrides(sections, overrides)


@pytest.fixture(scope="module")
def lm(momfmm, workdir):
    """A trained text run: {ini, out_dir, ckpt (latest), best, data, stdout}."""
    data = corpus(os.path.join(workdir, "corpus.txt"))
    out_dir = os.path.join(workdir, "run")
    ini = write_config(os.path.join(workdir, "text.ini"), text_sections(out_dir, data))
    r = run([momfmm, "train", ini])
    assert r.returncode == 0, r.stderr
    return {"ini": ini, "out_dir": out_dir, "ckpt": os.path.join(out_dir, "ckpt_00000024.h5"),
            "best": os.path.join(out_dir, "best.h5"), "data": data, "stdout": r.stdout}


def generate(momfmm, ckpt, *args, np_=None):
    cmd = [momfmm, "generate", ckpt] + [str(a) for a in args]
    return run(MPIRUN + ["-np", str(np_)] + cmd if np_ else cmd)


# ---- metrics -------------------------------------------------------------------


def test_bpb_everywhere(momfmm, lm, report):
    log = lm["stdout"]
    step = re.search(r"^step 24/24 \| loss (\S+) \| bpb (\S+) \|", log, re.M)
    report.check("train log: bpb = loss / ln 2", step is not None and
                 abs(float(step.group(2)) - float(step.group(1)) / math.log(2)) < 2e-4, log[-600:])
    ev = re.search(r"^eval step 24 \| loss (\S+) \| bpb (\S+) \| ppl (\S+)$", log, re.M)
    report.check("eval log line: loss, bpb and perplexity only (text; no gain_R without momentum)",
                 ev is not None and "L_new" not in ev.group(0), log[-600:])
    r = run([momfmm, "eval", lm["ckpt"]])
    m = re.search(r"^eval \| loss (\S+) \| bpb (\S+) \| ppl (\S+)$", r.stdout, re.M)
    report.check("eval: loss | bpb | ppl, ppl = e^loss", r.returncode == 0 and m is not None and
                 abs(float(m.group(2)) - float(m.group(1)) / math.log(2)) < 1e-5 and
                 abs(float(m.group(3)) / math.exp(float(m.group(1))) - 1) < 1e-5, r.stdout + r.stderr)
    report.check("eval: no gain_R for text without momentum (train.eval_readouts = auto)",
                 "gain_R" not in r.stdout, r.stdout)
    r = run([momfmm, "inspect", lm["ckpt"]])
    report.check("inspect: last eval in bits per byte",
                 re.search(r"^last eval \(text, step 24\): loss \S+ \| bpb \S+ \| ppl \S+$", r.stdout, re.M)
                 is not None,
                 r.stdout)
    report.check("inspect: train and eval rows carry bpb", r.stdout.count(" bpb ") >= 2, r.stdout)
    report.check("inspect: no chain columns (L_new, L_rep, delta_12, loss_by_k) for text",
                 all(name not in r.stdout for name in ("L_new", "L_rep", "delta_12", "loss_by_k")), r.stdout)
    with h5py.File(os.path.join(lm["out_dir"], "metrics.h5"), "r") as f:
        for table in ("train", "eval"):
            loss, bpb = f[f"metrics/{table}/loss"][()], f[f"metrics/{table}/bpb"][()]
            report.check(f"metrics.h5 /metrics/{table}/bpb = loss / ln 2", len(bpb) == len(loss) > 0 and
                         np.allclose(bpb, loss / math.log(2), rtol=1e-12), f"{bpb} {loss}")


def test_empty_bins_print_a_dash(momfmm, workdir, report):
    """seq_len 8: a target occurs at most 8 times before, so loss_by_k bins 9.. are empty."""
    out_dir = os.path.join(workdir, "short")
    ini = write_config(os.path.join(workdir, "short.ini"), {
        "model": {"vocab_size": 32, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "data": {"task": "chain", "seq_len": 8, "chain_len": 3},
        "train": {"steps": 2, "batch_size": 2, "eval_interval": 2, "eval_batches": 1, "out_dir": out_dir}})
    r = run([momfmm, "train", ini])
    assert r.returncode == 0, r.stderr
    out = run([momfmm, "inspect", os.path.join(out_dir, "ckpt_00000002.h5")]).stdout
    report.check("inspect: empty bins as —, never nan", "—" in out and "nan" not in out.lower(), out)
    report.check("chain metrics: L_new, L_rep, delta_12", re.search(r"L_new \S+ \| L_rep \S+ \| delta_12", out), out)


# ---- generate ------------------------------------------------------------------


def continuation(r, prompt):
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(prompt), (prompt, r.stdout)
    return r.stdout[len(prompt):].rstrip("\n")


def test_generate_text(momfmm, lm, report):
    ckpt, prompt = lm["ckpt"], "The model "
    greedy = continuation(generate(momfmm, ckpt, "--text", prompt, "--tokens", 24), prompt)
    report.check("--text: the continuation is text", len(greedy) > 0 and "\\x" not in greedy, repr(greedy))
    top1 = continuation(generate(momfmm, ckpt, "--text", prompt, "--tokens", 24, "--temperature", 1,
                                 "--top-k", 1, "--seed", 5), prompt)
    report.check("--top-k 1 = greedy", top1 == greedy, f"{top1!r} vs {greedy!r}")
    r = generate(momfmm, lm["out_dir"], "--text", prompt, "--tokens", 24)
    first, _, rest = r.stdout.partition("\n")
    report.check("a run directory: its newest checkpoint, named on the first line, the same continuation",
                 r.returncode == 0 and first == f"checkpoint: {lm['ckpt']}" and
                 continuation(subprocess.CompletedProcess([], 0, rest, ""), prompt) == greedy, r.stdout + r.stderr)
    sampled = [continuation(generate(momfmm, ckpt, "--text", prompt, "--tokens", 48, "--temperature", 1,
                                     "--seed", s), prompt) for s in (1, 1, 2)]
    report.check("same seed, same output", sampled[0] == sampled[1], repr(sampled))
    report.check("another seed, another output", sampled[0] != sampled[2], repr(sampled))
    mpi = continuation(generate(momfmm, ckpt, "--text", prompt, "--tokens", 48, "--temperature", 1, "--seed", 1,
                                np_=2), prompt)
    report.check("same seed at np = 2, same output (printed once)", mpi == sampled[0], f"{mpi!r}")
    nucleus = continuation(generate(momfmm, ckpt, "--text", prompt, "--tokens", 24, "--temperature", 1,
                                    "--top-p", 1e-6, "--seed", 3), prompt)
    report.check("--top-p tiny = greedy", nucleus == greedy, f"{nucleus!r} vs {greedy!r}")


def test_generate_prints_bytes_safely(momfmm, lm, report):
    r = subprocess.run([os.fsencode(momfmm), b"generate", os.fsencode(lm["ckpt"]), b"--text",
                        b"ab\x01\xff\xc3\xa9\tc", b"--tokens", b"4"], capture_output=True, env=env(), timeout=60)
    r.stdout, r.stderr = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    report.check("control and invalid bytes escaped, UTF-8 and tab kept",
                 r.returncode == 0 and r.stdout.startswith("ab\\x01\\xFFé\tc"), repr(r.stdout) + r.stderr)


def test_generate_stop(momfmm, lm, report):
    ids = "84,104,101,32"  # "The "
    r = generate(momfmm, lm["ckpt"], "--prompt", ids, "--tokens", 20)
    full = [int(x) for x in re.search(r"generated:((?: \d+)+)", r.stdout).group(1).split()]
    stop = full[5:7]
    want = next(i for i in range(len(full)) if full[max(0, i - 1):i + 1] == stop) + 1
    escaped = "".join(f"\\x{b:02x}" for b in stop)
    r = generate(momfmm, lm["ckpt"], "--prompt", ids, "--tokens", 20, "--stop", escaped)
    got = [int(x) for x in re.search(r"generated:((?: \d+)+)", r.stdout).group(1).split()]
    report.check("--stop: output ends at the first occurrence of the bytes", got == full[:want], f"{got} vs {full}")
    prompt = "The "
    text = continuation(generate(momfmm, lm["ckpt"], "--text", prompt, "--tokens", 64), prompt)
    if " " in text:
        cut = continuation(generate(momfmm, lm["ckpt"], "--text", prompt, "--tokens", 64, "--stop", " "), prompt)
        report.check("--stop ' ' on text", cut == text[:text.index(" ") + 1], f"{cut!r} vs {text!r}")


def test_sliding_window(momfmm, lm, report):
    """1 layer, softmax, no momentum: a window's logits are those of the window's
    tokens alone at positions 0.. (RoPE is relative), so every token generated
    past max_seq_len is the greedy next token of the last W - 1 tokens before it."""
    ini = write_config(os.path.join(os.path.dirname(lm["ini"]), "one_layer.ini"),
                       text_sections(os.path.join(os.path.dirname(lm["ini"]), "one"), lm["data"],
                                     **{"model.n_layers": 1, "train.steps": 16, "train.keep_best": False}))
    r = run([momfmm, "train", ini])
    assert r.returncode == 0, r.stderr
    ckpt = os.path.join(os.path.dirname(lm["ini"]), "one", "ckpt_00000016.h5")
    prompt = [84, 104, 101, 32]
    ids = ",".join(map(str, prompt))

    def tokens(r):
        assert r.returncode == 0, r.stderr
        return [int(x) for x in re.search(r"generated:((?: \d+)+)", r.stdout).group(1).split()]

    inside = tokens(generate(momfmm, ckpt, "--prompt", ids, "--tokens", W - len(prompt)))
    long = tokens(generate(momfmm, ckpt, "--prompt", ids, "--tokens", 3 * W))
    report.check("3 x max_seq_len tokens", len(long) == 3 * W, str(len(long)))
    report.check("within the window: the same tokens", long[:len(inside)] == inside, f"{long} vs {inside}")
    stream = prompt + long
    for at in (W + 1, 2 * W, 3 * W + 2):  # stream[at] was generated from stream[at - W + 1 .. at - 1] + itself
        window = stream[at - W:at]
        nxt = tokens(generate(momfmm, ckpt, "--prompt", ",".join(map(str, window)), "--tokens", 1))[0]
        report.check(f"token {at}: greedy next of its window", nxt == stream[at], f"{nxt} vs {stream[at]}")
    fmm = write_config(os.path.join(os.path.dirname(lm["ini"]), "fmm.ini"), text_sections(
        os.path.join(os.path.dirname(lm["ini"]), "fmm"), lm["data"],
        **{"attention.kind": "fmm", "momentum.gamma": 0.2, "momentum.anchor": False, "train.steps": 2}))
    assert run([momfmm, "train", fmm]).returncode == 0
    r = generate(momfmm, os.path.join(os.path.dirname(lm["ini"]), "fmm", "ckpt_00000002.h5"), "--text", "The ",
                 "--tokens", 3 * W, "--temperature", 0.8, "--seed", 1)
    report.check("fmm + momentum: 3 x max_seq_len tokens", r.returncode == 0, r.stderr)


@pytest.mark.parametrize("args,needle", [
    (["--text", "a", "--top-k", "-1"], "--top-k"),
    (["--text", "a", "--top-p", "0"], "--top-p"),
    (["--text", "a", "--top-p", "1.5"], "--top-p"),
    (["--text", "a", "--temperature", "-1"], "--temperature"),
    (["--text", "a", "--prompt", "1"], "exactly one"),
    (["--tokens", "3"], "exactly one"),
])
def test_generate_bad_values(momfmm, lm, args, needle):
    r = generate(momfmm, lm["ckpt"], *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_generate_text_needs_bytes(momfmm, workdir):
    out_dir = os.path.join(workdir, "v32")
    ini = write_config(os.path.join(workdir, "v32.ini"), {
        "model": {"vocab_size": 32, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "data": {"seq_len": 8, "chain_len": 3}, "train": {"out_dir": out_dir}})
    ckpt = os.path.join(workdir, "v32.h5")
    assert run([momfmm, "init", ini, "--out", ckpt]).returncode == 0
    r = generate(momfmm, ckpt, "--text", "hi")
    assert r.returncode == 2 and "vocab_size = 32" in r.stderr and "256" in r.stderr, r.stderr


# ---- fine-tuning and the best checkpoint ------------------------------------------


def test_init(momfmm, lm, workdir, report):
    other = corpus(os.path.join(workdir, "other.txt"), n_words=3000, seed=11)
    out_dir = os.path.join(workdir, "tuned")
    # lr 0, no weight decay: AdamW leaves the weights as loaded; one step writes them
    sets = ["--set", f"train.out_dir={out_dir}", "--set", f"data.path={other}", "--set", "data.seq_len=16",
            "--set", "train.steps=1", "--set", "train.lr=0", "--set", "train.weight_decay=0",
            "--set", "train.keep_best=false"]
    r = run([momfmm, "train", lm["ini"], "--init", lm["best"]] + sets)
    assert r.returncode == 0, r.stderr
    tuned = os.path.join(out_dir, "ckpt_00000001.h5")
    with h5py.File(lm["best"], "r") as src, h5py.File(tuned, "r") as dst:
        names = []
        src["model"].visit(lambda n: names.append(n) if isinstance(src["model"][n], h5py.Dataset) else None)
        same = all(np.array_equal(src["model"][n][()], dst["model"][n][()]) for n in names)
        report.check("weights = the source checkpoint's", len(names) > 0 and same)
        report.check("step and tokens start at 0", dst.attrs["step"] == 1 and dst.attrs["tokens_seen"] == 8 * 16,
                     f"{dst.attrs['step']} {dst.attrs['tokens_seen']}")
        init_from = dst.attrs["init_from"]
        init_from = init_from.decode() if isinstance(init_from, bytes) else init_from
        report.check("root attribute init_from", init_from == os.path.realpath(lm["best"]), init_from)
        m = []   # the moment tensors' names (optim/v has the same ones)
        dst["optim/m"].visit(lambda n: m.append(n) if isinstance(dst["optim/m"][n], h5py.Dataset) else None)
        # one step from zero moments: m = (1 - beta1) g, v = (1 - beta2) g^2, so m^2 / v = 0.01 / 0.001
        ratios = np.concatenate([(dst["optim/m"][n][()].astype(np.float64) ** 2 /
                                  np.maximum(dst["optim/v"][n][()].astype(np.float64), 1e-300)).ravel()
                                 for n in m])
        nz = np.concatenate([dst["optim/v"][n][()].ravel() for n in m]) > 1e-30
        report.check("fresh optimizer", np.allclose(ratios[nz], 10.0, rtol=1e-3), f"{ratios[nz][:5]}")
        report.check("train history starts anew", len(dst["metrics/train/step"]) == 1)
        report.check("--init evaluates at step 0, before the first step",
                     list(dst["metrics/eval/step"][()]) == [0, 1] and "eval step 0 | loss" in r.stdout,
                     f"{dst['metrics/eval/step'][()]}")
    r = run([momfmm, "train", lm["ini"], "--init", lm["best"], "--set", f"train.out_dir={out_dir}2",
             "--set", "model.d_ff=32"])
    report.check("a model key change exits 3 listing it", r.returncode == 3 and "model.d_ff: 64 vs 32" in r.stderr,
                 r.stderr)
    r = run([momfmm, "train", lm["ini"], "--init", lm["best"], "--resume", "auto"])
    report.check("--init with --resume exits 2", r.returncode == 2 and "--init" in r.stderr, r.stderr)


def test_eval_options(momfmm, lm, workdir, report):
    """eval --batches N|all, --set for data keys and train.eval_readouts (docs/cli.md §5)."""
    size = os.path.getsize(lm["data"])
    r = run([momfmm, "eval", lm["ckpt"], "--batches", "all"])
    windows = (size - int(size * 0.9) - 1) // W  # the tail of data.eval_fraction = 0.1
    report.check(f"--batches all: {windows} windows of {W} in ceil({windows} / 8) batches",
                 r.returncode == 0 and f"all {windows} windows of {W} tokens in {-(-windows // 8)} batches of 8"
                 in r.stdout, r.stdout + r.stderr)
    other = corpus(os.path.join(workdir, "val.txt"), n_words=400, seed=3)
    r = run([momfmm, "eval", lm["ckpt"], "--set", f"data.eval_path={other}", "--set", "train.eval_readouts=true",
             "--batches", "1"])
    report.check("--set data.eval_path: the other text is the eval split",
                 r.returncode == 0 and f"data.eval_path, 1 document, {os.path.getsize(other)} bytes" in r.stdout,
                 r.stdout + r.stderr)
    report.check("--set train.eval_readouts=true: gain_R measured",
                 re.search(r"^gain_R( \S+){2}$", r.stdout, re.M) is not None, r.stdout)
    r = run([momfmm, "eval", lm["ckpt"], "--set", "model.d_model=64"])
    report.check("--set of a model key exits 2", r.returncode == 2 and "model.d_model" in r.stderr, r.stderr)
    r = run([momfmm, "eval", lm["ckpt"], "--batches", "zero"])
    report.check("--batches zero exits 2", r.returncode == 2 and "--batches" in r.stderr, r.stderr)


def test_keep_best_and_summary(momfmm, lm, report):
    with h5py.File(os.path.join(lm["out_dir"], "metrics.h5"), "r") as f:
        steps, losses = f["metrics/eval/step"][()], f["metrics/eval/loss"][()]
    with h5py.File(lm["best"], "r") as f:
        best_step = int(f.attrs["step"])
    report.check("best.h5 holds the lowest eval loss", best_step == int(steps[np.argmin(losses)]),
                 f"best.h5 step {best_step}, evals {list(zip(steps, losses))}")
    kept = sorted(n for n in os.listdir(lm["out_dir"]) if n.startswith("ckpt_"))
    report.check("train.keep = 1 pruned the others, best.h5 stays", kept == ["ckpt_00000024.h5"], str(kept))
    out = lm["stdout"]
    report.check("summary: steps, time, tokens/s", re.search(r"^summary: step 24 of 24 .* s \| \d+ tok/s$", out, re.M),
                 out[-800:])
    report.check("summary: final and best eval in bits per byte",
                 re.search(r"^summary: final eval \(step 24\) \| loss \S+ \| bpb", out, re.M) and
                 re.search(rf"^summary: best eval \(step {best_step}\) \| loss \S+ \| bpb", out, re.M), out[-800:])
    report.check("summary: checkpoint paths", re.search(r"^summary: checkpoints \| latest \S+ckpt_00000024.h5 \| "
                                                        r"best \S+best.h5$", out, re.M), out[-800:])
    # a resumed run does not replace a better best.h5: make the file's record unbeatable
    with h5py.File(lm["best"], "r+") as f:
        f["metrics/eval/loss"][...] = 0.0
    before = os.stat(lm["best"]).st_mtime_ns
    r = run([momfmm, "train", lm["ini"], "--resume", "auto", "--set", "train.steps=28"])
    report.check("resume reads the best so far from best.h5", r.returncode == 0 and "best so far: eval loss 0.0000"
                 in r.stdout, r.stdout + r.stderr)
    report.check("and keeps the better best.h5", os.stat(lm["best"]).st_mtime_ns == before and
                 not re.search(r"^best \S+best.h5 \|", r.stdout, re.M), r.stdout)
