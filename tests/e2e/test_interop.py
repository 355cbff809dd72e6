"""momfmm and PyTorch on the same checkpoints (docs/cli.md §5 `logits`, docs/design.md §8.8
momfmm.pt): `momfmm logits` equals the forward of momfmm.pt within float32 tolerance, for
[B, T] int32 and [T] uint16 token files, a run directory and a cls model, and refuses bad token
files with exit 3 naming the file and the first bad offset; momfmm.pt.generate samples the
tokens `momfmm generate` samples (same checkpoint, prompt, seed, temperature, top-k, top-p);
momfmm.pt.save writes a checkpoint that `eval`, `generate` and `train --init` accept.

One tiny chain-task model with learned, unanchored momentum (so γ and the buffers matter) is
trained for the module in a few steps (seconds)."""
import os
import re

import h5py
import numpy as np
import pytest
import torch

import momfmm.pt as mt
from common import apply_overrides, run, write_config

LOGIT_TOL = 1e-5  # float32, relative to max(1, max |logit|), as tests/python/test_torch_interop.py


def sections(out_dir, **overrides):
    s = {
        "model": {"vocab_size": 32, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_seq_len": 24},
        "momentum": {"gamma": 0.3, "learn_gamma": True, "beta": 0.3, "anchor": False},
        "data": {"task": "chain", "seq_len": 16, "chain_len": 5},
        "train": {"steps": 6, "batch_size": 4, "lr": 1e-2, "warmup": 1, "log_interval": 3, "eval_interval": 6,
                  "eval_batches": 1, "ckpt_interval": 6, "seed": 3, "out_dir": out_dir},
    }
    return apply_overrides(s, overrides)


@pytest.fixture(scope="module")
def trained(momfmm, workdir):
    """{ini, out_dir, ckpt}: the module's trained checkpoint."""
    out_dir = os.path.join(workdir, "run")
    ini = write_config(os.path.join(workdir, "chain.ini"), sections(out_dir))
    r = run([momfmm, "train", ini])
    assert r.returncode == 0, r.stderr
    return {"ini": ini, "out_dir": out_dir, "ckpt": os.path.join(out_dir, "ckpt_00000006.h5")}


def write_ids(path, ids, dtype="int32"):
    with h5py.File(path, "w") as f:
        f["tokens"] = np.asarray(ids, dtype=dtype)
    return path


def torch_logits(ckpt, ids):
    model = mt.load(ckpt)
    with torch.no_grad():
        return model(torch.as_tensor(np.atleast_2d(ids), dtype=torch.long)).numpy()


def close(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    return got.shape == want.shape and float(np.abs(got - want).max()) <= LOGIT_TOL * scale


# ---- momfmm logits ---------------------------------------------------------------


def test_logits_equal_torch(momfmm, trained, workdir, report):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 32, size=(5, 24))  # 5 rows: two forward passes of train.batch_size 4
    tokens, out = write_ids(os.path.join(workdir, "ids.h5"), ids), os.path.join(workdir, "logits.h5")
    r = run([momfmm, "logits", trained["ckpt"], tokens, "--out", out])
    report.check("logits [B, T]: exit 0, names the file and shape", r.returncode == 0 and
                 f"/logits [5, 24, 32]" in r.stdout, r.stdout + r.stderr)
    with h5py.File(out, "r") as f:
        got, attrs = f["logits"][()], dict(f.attrs)
    want = torch_logits(trained["ckpt"], ids)
    report.check("logits: float32 [B, T, V]", got.dtype == np.float32 and got.shape == (5, 24, 32), str(got.shape))
    report.check("logits = momfmm.pt's forward within 1e-5 max(1, |z|)", close(got, want),
                 f"max diff {float(np.abs(got - want).max()):.3g}")
    checkpoint = attrs.get("checkpoint")
    checkpoint = checkpoint.decode() if isinstance(checkpoint, bytes) else checkpoint
    report.check("attributes: checkpoint, step, tokens_seen", checkpoint == trained["ckpt"] and
                 int(attrs["step"]) == 6 and int(attrs["tokens_seen"]) == 6 * 4 * 16, str(attrs))

    one = write_ids(os.path.join(workdir, "one.h5"), ids[2, :10], "uint16")
    r = run([momfmm, "logits", trained["out_dir"], one, "--out", os.path.join(workdir, "one_logits.h5")])
    report.check("a run directory, named on the first line", r.returncode == 0 and
                 r.stdout.startswith(f"checkpoint: {trained['ckpt']}\n"), r.stdout + r.stderr)
    with h5py.File(os.path.join(workdir, "one_logits.h5"), "r") as f:
        got1 = f["logits"][()]
    report.check("uint16 [T] reads as one row [1, T, V]", got1.shape == (1, 10, 32), str(got1.shape))
    report.check("[T]: the logits of that row's prefix (causal)", close(got1[0], want[2, :10]),
                 f"max diff {float(np.abs(got1[0] - want[2, :10]).max()):.3g}")

    packed = os.path.join(workdir, "packed.h5")
    with h5py.File(packed, "w") as f:
        f.create_dataset("tokens", data=ids.astype(">i4"), chunks=(1, 8), compression="gzip")
    r = run([momfmm, "logits", trained["ckpt"], packed, "--out", os.path.join(workdir, "packed_logits.h5")])
    with h5py.File(os.path.join(workdir, "packed_logits.h5"), "r") as f:
        same = np.array_equal(f["logits"][()], got)
    report.check("big-endian, chunked, gzip-compressed /tokens: the same logits", r.returncode == 0 and same,
                 r.stderr)


def test_logits_cls(momfmm, workdir, report):
    ini = write_config(os.path.join(workdir, "cls.ini"), {
        "model": {"vocab_size": 24, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "head": "cls",
                  "causal": False, "n_classes": 10},
        "data": {"task": "listops", "seq_len": 20}, "train": {"out_dir": os.path.join(workdir, "cls")}})
    ckpt = os.path.join(workdir, "cls.h5")
    assert run([momfmm, "init", ini, "--out", ckpt]).returncode == 0
    ids = np.random.default_rng(2).integers(0, 24, size=(3, 20))
    out = os.path.join(workdir, "cls_logits.h5")
    r = run([momfmm, "logits", ckpt, write_ids(os.path.join(workdir, "cls_ids.h5"), ids), "--out", out])
    report.check("cls: exit 0", r.returncode == 0, r.stderr)
    with h5py.File(out, "r") as f:
        got = f["logits"][()]
    want = torch_logits(ckpt, ids)
    report.check("cls: /logits [B, n_classes] = momfmm.pt's (every position pooled)", close(got, want),
                 f"{got.shape} vs {want.shape}")


def bad_files(workdir):
    """(label, file, needles in the message) of token files `logits` refuses with exit 3."""
    d = os.path.join(workdir, "bad")
    os.makedirs(d, exist_ok=True)
    ids = np.arange(20).reshape(2, 10) % 32
    ids[1, 3] = 32
    ids[1, 5] = 40
    with h5py.File(os.path.join(d, "none.h5"), "w") as f:
        f["inputs"] = np.zeros((1, 4), dtype=np.int32)
    with h5py.File(os.path.join(d, "empty.h5"), "w") as f:
        f["tokens"] = np.zeros((0,), dtype=np.int32)
    return [
        ("an id outside the vocabulary", write_ids(os.path.join(d, "range.h5"), ids),
         ["range.h5", "offset 13", "row 1, position 3", "32", "[0, 32)"]),
        ("a negative id", write_ids(os.path.join(d, "neg.h5"), [1, 2, -1]), ["neg.h5", "offset 2", "-1"]),
        ("T longer than the model's positions", write_ids(os.path.join(d, "long.h5"), np.zeros(25)),
         ["long.h5", "T = 25", "24 positions"]),
        ("float ids", write_ids(os.path.join(d, "float.h5"), np.zeros(4), "float32"), ["float.h5", "integers"]),
        ("int64 ids", write_ids(os.path.join(d, "wide.h5"), np.zeros(4), "int64"), ["wide.h5", "uint16 or int32"]),
        ("three dimensions", write_ids(os.path.join(d, "cube.h5"), np.zeros((1, 2, 3))),
         ["cube.h5", "[T] or [B, T]"]),
        ("no /tokens", os.path.join(d, "none.h5"), ["none.h5", "/tokens"]),
        ("an empty /tokens", os.path.join(d, "empty.h5"), ["empty.h5", "empty"]),
        ("not an HDF5 file", os.path.join(workdir, "chain.ini"), ["chain.ini"]),
    ]


def test_logits_bad_token_files(momfmm, trained, workdir, report):
    out = os.path.join(workdir, "bad_out.h5")
    for label, path, needles in bad_files(workdir):
        r = run([momfmm, "logits", trained["ckpt"], path, "--out", out])
        lines = r.stderr.strip().splitlines()
        report.check(f"{label}: exit 3, one line naming {needles}", r.returncode == 3 and len(lines) == 1 and
                     all(n in lines[0] for n in needles) and not os.path.exists(out), r.stderr)


def test_logits_command_line(momfmm, trained, workdir, report):
    tokens = write_ids(os.path.join(workdir, "cl.h5"), [1, 2, 3])
    r = run([momfmm, "help"])
    report.check("help lists logits", r.returncode == 0 and re.search(r"^  logits +CKPT", r.stdout, re.M), r.stdout)
    r = run([momfmm, "logits", "--help"])
    report.check("logits --help: usage with --out (required)", r.returncode == 0 and
                 "usage: momfmm logits CKPT.h5|RUN_DIR TOKENS.h5 --out FILE.h5" in r.stdout, r.stdout)
    r = run([momfmm, "logits", trained["ckpt"], tokens])
    report.check("no --out: exit 2", r.returncode == 2 and "--out" in r.stderr, r.stderr)
    r = run([momfmm, "logits", trained["ckpt"], tokens, "--out", trained["ckpt"], "--force"])
    report.check("--out naming the checkpoint: exit 2, checkpoint intact", r.returncode == 2 and
                 mt.load(trained["ckpt"]) is not None, r.stderr)
    r = run([momfmm, "logits", trained["out_dir"], tokens, "--out", trained["ckpt"], "--force"])
    report.check("--out naming the checkpoint a run directory stands for: exit 2, intact", r.returncode == 2 and
                 "is the input" in r.stderr and mt.load(trained["ckpt"]) is not None, r.stderr)
    out = os.path.join(workdir, "cl_out.h5")
    open(out, "w").close()
    r = run([momfmm, "logits", trained["ckpt"], tokens, "--out", out])
    report.check("an existing --out without --force: exit 2", r.returncode == 2 and "--force" in r.stderr, r.stderr)
    r = run([momfmm, "logits", trained["ckpt"], tokens, "--out", out, "--force"])
    report.check("--force replaces it", r.returncode == 0 and h5py.is_hdf5(out), r.stderr)
    r = run([momfmm, "logits", trained["ckpt"], tokens, "--out", ""])
    report.check("an empty --out: exit 2 naming the flag", r.returncode == 2 and "--out: an empty path" in r.stderr,
                 r.stderr)
    r = run([momfmm, "forward", trained["ckpt"], tokens])
    report.check("forward: did you mean logits?", r.returncode == 2 and "did you mean logits" in r.stderr, r.stderr)


# ---- momfmm.pt.generate = momfmm generate --------------------------------------------

PROMPT = [3, 1, 4, 1, 5]
SETTINGS = [  # (temperature, top_k, top_p, seed)
    (0.0, 0, 1.0, 0), (1.0, 0, 1.0, 0), (1.0, 0, 1.0, 1), (1.0, 0, 1.0, 2), (0.7, 5, 1.0, 3),
    (1.5, 0, 0.9, 4), (1.0, 8, 0.6, 5), (2.0, 1, 1.0, 6), (1.0, 0, 0.05, 7), (1e-3, 0, 1.0, 8),
]


def c_generate(momfmm, ckpt, n, temperature, top_k, top_p, seed, *extra):
    r = run([momfmm, "generate", ckpt, "--prompt", ",".join(map(str, PROMPT)), "--tokens", n,
             "--temperature", temperature, "--top-k", top_k, "--top-p", top_p, "--seed", seed, *extra])
    m = re.search(r"^generated:(.*)$", r.stdout, re.M)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    return [int(t) for t in m.group(1).split()]


def test_generate_equals_c(momfmm, trained, report):
    model = mt.load(trained["ckpt"])
    n = 24 + 1 - len(PROMPT)  # the whole window: the C command slides nothing
    for temperature, top_k, top_p, seed in SETTINGS:
        want = c_generate(momfmm, trained["ckpt"], n, temperature, top_k, top_p, seed)
        got = mt.generate(model, PROMPT, n, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        report.check(f"T {temperature} top-k {top_k} top-p {top_p} seed {seed}: the same {n} ids", got == want,
                     f"python {got} vs C {want}")
    sampled = {tuple(mt.generate(model, PROMPT, n, temperature=1.0, seed=s)) for s in range(4)}
    report.check("the seeds give different samples (the test can fail)", len(sampled) == 4, str(sampled))
    for stop in ([9], [8, 21]):  # seed 2 samples 9 at new id 8, and 8, 21 at 6, 7
        want = c_generate(momfmm, trained["ckpt"], n, 1.0, 0, 1.0, 2, "--stop", "".join(f"\\x{t:02x}" for t in stop))
        got = mt.generate(model, PROMPT, n, temperature=1.0, seed=2, stop=stop)
        report.check(f"--stop {stop}: ends at the same id, early", got == want and len(got) < n,
                     f"python {got} vs C {want}")


def test_generate_refusals(trained, report):
    model = mt.load(trained["ckpt"])
    report.check("positions(model) = max(model.max_seq_len, data.seq_len)", mt.positions(model) == 24,
                 str(mt.positions(model)))
    for label, kw, needle in [("past the window", dict(n_tokens=21), "slides"),
                              ("negative temperature", dict(n_tokens=2, temperature=-1), "temperature"),
                              ("top_p 0", dict(n_tokens=2, top_p=0), "top_p"),
                              ("negative top_k", dict(n_tokens=2, top_k=-1), "top_k")]:
        try:
            mt.generate(model, PROMPT, **kw)
            report.check(f"{label}: ValueError", False, "no error")
        except ValueError as exc:
            report.check(f"{label}: ValueError", needle in str(exc), str(exc))


def test_old_name(report):
    """momfmm.torch, the deprecated old name of momfmm.pt, has the new functions too."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import momfmm.torch as old
    report.check("momfmm.torch.generate, .save, .sample_next are momfmm.pt's",
                 old.generate is mt.generate and old.save is mt.save and old.sample_next is mt.sample_next)


def test_rng_matches_c(report):
    """rng_key and rng_uniform of src/base/rng.h: values a one-off C program printed
    from the header (seed 0, draws 0..2; seed 123456789012345, draw 1000)."""
    key = mt.rng_key(0, mt.GENERATE_STREAM, 0, 0)
    report.check("rng_key(0, 0x6E4, 0, 0)", key == 2425697351651058593, str(key))
    draws = [mt.rng_uniform(key, i) for i in range(3)]
    report.check("rng_uniform(key, 0..2)", draws == [0.47345563524635725, 0.23784661793472495,
                                                      0.35667450656071253], str(draws))
    u = mt.rng_uniform(mt.rng_key(123456789012345, mt.GENERATE_STREAM, 0, 0), 1000)
    report.check("a large seed, draw 1000", u == 0.62773135663565305, repr(u))


# ---- momfmm.pt.save -> eval, generate, logits, train --init ----------------------------


def eval_line(r):
    m = re.search(r"^eval \| (.*)$", r.stdout, re.M)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    return m.group(1)


def test_save_round_trip(momfmm, trained, workdir, report):
    saved = os.path.join(workdir, "saved.h5")
    model = mt.load(trained["ckpt"])
    mt.save(model, saved, step=6, tokens_seen=384)
    want, got = eval_line(run([momfmm, "eval", trained["ckpt"]])), eval_line(run([momfmm, "eval", saved]))
    report.check("momfmm eval of the saved file: the same loss line", got == want, f"{got} vs {want}")
    args = ["--prompt", "1,2,3", "--tokens", 12, "--temperature", 1, "--seed", 4]
    a, b = run([momfmm, "generate", trained["ckpt"], *args]), run([momfmm, "generate", saved, *args])
    report.check("momfmm generate: the same ids", a.returncode == b.returncode == 0 and a.stdout == b.stdout,
                 a.stdout + b.stdout + b.stderr)
    r = run([momfmm, "inspect", saved])
    report.check("inspect: step 6, written by momfmm.pt.save", r.returncode == 0 and "step 6 |" in r.stdout and
                 "momfmm.pt.save" in r.stdout, r.stdout[:400] + r.stderr)
    with h5py.File(trained["ckpt"], "r") as src, h5py.File(saved, "r") as dst:
        names = []
        src.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and
                       n.startswith(("model/", "buffers/")) else None)
        same = all(n in dst and np.array_equal(src[n][()], dst[n][()]) for n in names)
        ours = []
        dst.visititems(lambda n, o: ours.append(n) if isinstance(o, h5py.Dataset) else None)
    report.check("/model and /buffers: every tensor, bit for bit, nothing else", same and
                 sorted(ours) == sorted(names), f"{len(names)} vs {len(ours)}")

    out_dir = os.path.join(workdir, "tuned")
    r = run([momfmm, "train", trained["ini"], "--init", saved, "--set", f"train.out_dir={out_dir}",
             "--set", "train.steps=2", "--set", "train.ckpt_interval=2", "--set", "train.eval_interval=0"])
    report.check("train --init of the saved file runs 2 steps", r.returncode == 0 and
                 "initialised from" in r.stdout and os.path.exists(os.path.join(out_dir, "ckpt_00000002.h5")),
                 r.stdout[-400:] + r.stderr)
    r = run([momfmm, "train", trained["ini"], "--resume", saved, "--set", f"train.out_dir={out_dir}r"])
    report.check("train --resume of it exits 3 (no /optim)", r.returncode == 3 and "optim" in r.stderr, r.stderr)


def test_save_built_module(momfmm, workdir, report):
    """A module momfmm never wrote (mt.build, its own weights): the config comes from the
    ModelConfig and `sections`; momfmm's logits equal the module's forward."""
    torch.manual_seed(0)
    model = mt.build(mt.ModelConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                    kind="fmm", bandwidth=3, kernels=["elu", "tanh"], gamma=0.2)).eval()
    with torch.no_grad():
        model.blocks[0].attn.fmm_blend.normal_()
    saved = os.path.join(workdir, "built.h5")
    mt.save(model, saved, sections={"data": {"seq_len": 12}, "model": {"max_seq_len": 16},
                                    "train": {"out_dir": os.path.join(workdir, "built_run")}})
    ids = np.random.default_rng(4).integers(0, 20, size=(2, 16))
    out = os.path.join(workdir, "built_logits.h5")
    r = run([momfmm, "logits", saved, write_ids(os.path.join(workdir, "built_ids.h5"), ids), "--out", out])
    report.check("momfmm logits reads it", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        with h5py.File(out, "r") as f:
            got = f["logits"][()]
        with torch.no_grad():
            want = model(torch.as_tensor(ids)).numpy()
        report.check("its logits = the module's forward", close(got, want),
                     f"max diff {float(np.abs(got - want).max()):.3g}")
    with torch.no_grad():
        model.blocks[0].mlp.fc.bias[0] = float("nan")
    try:
        mt.save(model, os.path.join(workdir, "nan.h5"))
        report.check("a non-finite tensor: ValueError", False, "saved")
    except ValueError as exc:
        report.check("a non-finite tensor: ValueError naming it, nothing written", "mlp.fc.bias" in str(exc) and
                     not os.path.exists(os.path.join(workdir, "nan.h5")), str(exc))
