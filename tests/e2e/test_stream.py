"""Streaming inference (docs/model.md §1.2; issue: momentum attention, item 3): for every
momentum and attention variant, feeding the eval sequences token by token (and
in segments) through `momfmm eval --stream` gives the logits of one full
forward (max abs difference <= 1e-4), and `momfmm generate` continues a prompt
exactly as greedy decoding with the independent PyTorch reference does.

reference_model is tests/reference/reference_model.py (on PYTHONPATH, set by
CTest beside <source>/python)."""
import os
import re

import numpy as np
import pytest
import torch
from momfmm.h5 import load_checkpoint

import reference_model as ref
from common import perturb, run, tiny_config, write_config

VARIANTS = {
    "softmax": {},
    "gamma0.2_post_rope": {"momentum.gamma": 0.2},
    "apply_to_q": {"momentum.gamma": 0.2, "momentum.apply_to": "q"},
    "pre_rope": {"momentum.gamma": 0.2, "momentum.placement": "pre_rope"},
    "anchor_false": {"momentum.gamma": 0.2, "momentum.anchor": False},
    "beta0.5": {"momentum.gamma": 0.2, "momentum.beta": 0.5},
    "gamma2_0.1": {"momentum.gamma": 0.2, "momentum.gamma2": 0.1},
    "learn_gamma": {"momentum.gamma": 0.1, "momentum.learn_gamma": True},
    "all_unanchored_pre_rope": {"momentum.gamma": 0.3, "momentum.beta": 0.5, "momentum.gamma2": 0.1,
                                "momentum.anchor": False, "momentum.placement": "pre_rope",
                                "momentum.learn_gamma": True},
    "fmm_band3_two_kernels": {"attention.kind": "fmm", "fmm.bandwidth": 3, "fmm.kernels": "elu,elu_flip"},
    "fmm_momentum": {"attention.kind": "fmm", "fmm.kernels": "tanh", "momentum.gamma": 0.2,
                     "momentum.beta": 0.5, "momentum.anchor": False},
    "fmm_linear_only": {"attention.kind": "fmm", "fmm.bandwidth": 0},
    "fmm_band_only": {"attention.kind": "fmm", "fmm.kernels": ""},
    # a band of 60 keys: training's forward runs it on tiles (docs/model.md §1.3), streaming on rows
    "fmm_band60_on_tiles": {"attention.kind": "fmm", "fmm.bandwidth": 60, "fmm.kernels": "elu", "data.seq_len": 80,
                            "model.max_seq_len": 80},
}

DIFF_LINE = re.compile(r"stream max \|logit difference\| vs full forward: (\S+)")


def greedy_reference(ckpt, prompt, n_new):
    ck = load_checkpoint(ckpt, optim=False, metrics=False)
    params = {k: torch.tensor(v.astype(np.float64)) for k, v in ck.params.items()}
    buffers = {k: torch.tensor(v.astype(np.float64)) for k, v in ck.buffers.items()}
    s = ref.settings_from_config(ck.config)
    tokens = list(prompt)
    gaps = []
    with torch.no_grad():
        for _ in range(n_new):
            x = ref.final_hidden(s, params, buffers, torch.tensor([tokens]))
            logits = ref.linear(x, params["head/weight"])[0, -1]
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            tokens.append(int(top.indices[0]))
    return tokens[len(prompt):], gaps


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant(momfmm, workdir, report, name):
    overrides = VARIANTS[name]
    rng = np.random.default_rng([5, list(VARIANTS).index(name)])
    work = os.path.join(workdir, name)
    sets = {"model.vocab_size": 29, "data.seq_len": 24, "train.batch_size": 3, "train.eval_batches": 2}
    sets.update(overrides)
    cfg = write_config(os.path.join(work, "cfg.ini"), tiny_config(os.path.join(work, "run"), **sets))
    ckpt = os.path.join(work, "ck.h5")
    r = run([momfmm, "init", cfg, "--out", ckpt])
    assert r.returncode == 0, f"{name}: init: {r.stderr}"
    perturb(ckpt, rng)
    for segment in (1, 5):
        r = run([momfmm, "eval", ckpt, "--stream", "--segment", segment])
        m = DIFF_LINE.search(r.stdout)
        diff = float(m.group(1)) if m else float("inf")
        report.check(f"{name}: stream in segments of {segment} = full forward", r.returncode == 0 and diff <= 1e-4,
                     f"max |logit diff| {diff:.3e}" + (f"; rc {r.returncode} {r.stderr.strip()}" if r.returncode else ""))
    prompt = [3, 7, 1, 3, 7, 1]
    r = run([momfmm, "generate", ckpt, "--prompt", ",".join(map(str, prompt)), "--tokens", 8])
    m = re.search(r"generated:((?: \d+)+)", r.stdout)
    if not report.check(f"{name}: generate runs", r.returncode == 0 and m is not None, r.stdout + r.stderr):
        return
    ours = [int(x) for x in m.group(1).split()]
    theirs, gaps = greedy_reference(ckpt, prompt, len(ours))
    # a near-tie between the top two logits may break either way in float32
    first_diff = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), None)
    ok = first_diff is None or gaps[first_diff] < 1e-4
    report.check(f"{name}: generate = greedy decoding of the PyTorch reference", ok,
                 f"momfmm {ours} reference {theirs}")


def test_generate_errors(momfmm, workdir, report):
    work = os.path.join(workdir, "noncausal")
    cfg = write_config(os.path.join(work, "cfg.ini"), tiny_config(work, **{"model.causal": False}))
    ckpt = os.path.join(work, "ck.h5")
    run([momfmm, "init", cfg, "--out", ckpt])
    r = run([momfmm, "generate", ckpt, "--prompt", "1,2"])
    report.check("non-causal model: generate exits 2", r.returncode == 2 and "causal" in r.stderr, r.stderr)
    r = run([momfmm, "generate", ckpt, "--prompt", "1,999"])
    report.check("prompt token outside the vocabulary exits 2", r.returncode == 2 and "999" in r.stderr, r.stderr)
