#!/usr/bin/python3
"""Self-check of reference_model.py, runnable without the C binary.

1. Builds random checkpoints and token files with h5py in the docs/files.md §4 layout,
   loads them through load_checkpoint / load_tokens, and compares the autograd
   gradients of loss_and_grads with central finite differences in float64
   (momentum + FMM configs, a cls config, a non-causal softmax config).
2. Compares the vectorised building blocks with naive per-position loops written
   from docs/model.md §1.1-1.3 (momentum recursion, band softmax, running-sum linear
   attention) and checks identities: FMM near field with bandwidth >= T equals
   the full softmax; gamma = 0 momentum equals plain softmax attention; RoPE
   scores depend only on the position difference; anchored momentum ignores the
   buffers.

Usage: /usr/bin/python3 tests/reference/selftest_reference.py
Prints one line per check and a final `N passed, M failed`; exits 0 on pass.
"""
import configparser
import math
import os
import sys
import tempfile

import h5py
import numpy as np
import torch

import reference_model as ref  # beside this script; momfmm through PYTHONPATH (CTest sets it)

torch.set_default_dtype(torch.float64)

BASE_SECTIONS = {
    "model": {"vocab_size": 11, "d_model": 8, "n_heads": 2, "n_layers": 2, "d_ff": 16,
              "max_seq_len": 9, "rope_base": 10000, "causal": "true", "head": "lm",
              "n_classes": 4},
    "attention": {"kind": "softmax"},
    "momentum": {"gamma": 0, "learn_gamma": "false", "beta": 0, "gamma2": 0,
                 "apply_to": "qk", "placement": "post_rope", "anchor": "true"},
    "fmm": {"bandwidth": 5, "kernels": "elu", "eps": 1e-6, "chunk": 4},
    "data": {"task": "chain", "seq_len": 9, "chain_len": 4},
    "train": {"batch_size": 2, "seed": 1},
}


def ini_text(overrides):
    """INI text of BASE_SECTIONS updated with {section: {key: value}}."""
    cp = configparser.ConfigParser(interpolation=None)
    for sec, kv in BASE_SECTIONS.items():
        cp[sec] = {k: str(v) for k, v in kv.items()}
    for sec, kv in overrides.items():
        for k, v in kv.items():
            cp[sec][k] = str(v)
    lines = []
    for sec in cp.sections():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {v}" for k, v in cp[sec].items()]
        lines.append("")
    return "\n".join(lines)


def write_random_checkpoint(path, text, rng):
    """Random parameters and buffers in the docs/files.md §4 layout, written by h5py."""
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(text)
    s = ref.settings_from_config(cp)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "momfmm-checkpoint"
        f.attrs["format_version"] = 1
        f.attrs["step"] = 0
        f.attrs["tokens_seen"] = 0
        f.attrs["world_size"] = 1
        f.attrs["config_ini"] = text
        for name, shape in ref.parameter_shapes(s).items():
            scale = 1.0 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.3
            a = rng.normal(0.0, scale, size=shape)
            if name.endswith(("ln1/weight", "ln2/weight", "ln_f/weight")):
                a += 1.0
            f.create_dataset("model/" + name, data=a.astype(np.float32))
        for i in range(s.n_layers):
            for which in ("prev_q", "prev_k"):
                f.create_dataset(f"buffers/blocks/{i}/attn/{which}",
                                 data=rng.normal(size=(s.n_heads, s.head_dim)).astype(np.float32))
    return s


def write_tokens(path, s, B, T, rng):
    inputs = rng.integers(0, s.vocab_size, size=(B, T))
    targets = rng.integers(0, s.vocab_size, size=(B, T))
    if s.head == "cls":
        targets[:, :] = 0
        for b in range(B):                              # trailing padding
            targets[b, rng.integers(2, T + 1):] = -1
    else:
        targets[rng.random((B, T)) < 0.25] = -1
        targets[:, 0] = rng.integers(0, s.vocab_size, size=B)
    with h5py.File(path, "w") as f:
        f.create_dataset("inputs", data=inputs.astype(np.int32))
        f.create_dataset("targets", data=targets.astype(np.int32))
        if s.head == "cls":
            f.create_dataset("labels", data=rng.integers(0, s.n_classes, size=B).astype(np.int32))


# --------------------------------------------------------------------------
def finite_difference_check(label, overrides, workdir, seed, per_tensor=6, h=1e-6, tol=1e-6):
    rng = np.random.default_rng(seed)
    ck, tok = os.path.join(workdir, f"{label}.h5"), os.path.join(workdir, f"{label}_tok.h5")
    text = ini_text(overrides)
    s = write_random_checkpoint(ck, text, rng)
    write_tokens(tok, s, B=2, T=int(BASE_SECTIONS["data"]["seq_len"]), rng=rng)
    cfg, params, buffers = ref.load_checkpoint(ck)
    inputs, targets, labels = ref.load_tokens(tok)
    loss, grads = ref.loss_and_grads(cfg, params, buffers, inputs, targets, labels)
    assert set(grads) == set(ref.parameter_shapes(s)), "parameter names differ from docs/files.md §4"
    worst = 0.0
    for name in sorted(params):
        p = params[name]
        n = p.numel()
        idx = range(n) if n <= per_tensor else rng.choice(n, per_tensor, replace=False)
        ana_max = float(grads[name].abs().max())
        for i in idx:
            flat = p.data.view(-1)
            orig = float(flat[i])
            with torch.no_grad():
                flat[i] = orig + h
                lp = float(ref.forward_loss(cfg, params, buffers, inputs, targets, labels))
                flat[i] = orig - h
                lm = float(ref.forward_loss(cfg, params, buffers, inputs, targets, labels))
                flat[i] = orig
            num = (lp - lm) / (2 * h)
            err = abs(num - float(grads[name].view(-1)[i])) / max(ana_max, 1e-3)
            worst = max(worst, err)
    return worst <= tol, f"loss {loss:.6f}  worst relative FD error {worst:.2e} (tol {tol:.0e})"


# --------------------------------------------------------------------------
# Naive per-position implementations straight from the text of docs/model.md.
def naive_momentum(x, gamma, beta, gamma2, anchor, buf):
    """x: [T, dh] numpy for one head of one sequence."""
    T = x.shape[0]
    out = np.zeros_like(x)
    p_prev = np.zeros(x.shape[1])
    for t in range(T):
        if t > 0:
            d = x[t] - x[t - 1]
        else:
            d = np.zeros(x.shape[1]) if anchor else x[0] - buf
        p = d + beta * p_prev
        out[t] = x[t] + gamma * p + gamma2 * (p - p_prev)
        p_prev = p
    return out


def naive_near(q, k, v, band, causal):
    T, dh = q.shape
    out = np.zeros_like(v)
    for i in range(T):
        js = [j for j in range(T) if (i - band < j <= i if causal else abs(i - j) < band)]
        s = np.array([q[i] @ k[j] / math.sqrt(dh) for j in js])
        w = np.exp(s - s.max())
        w /= w.sum()
        out[i] = sum(wj * v[j] for wj, j in zip(w, js))
    return out


PHI = {"elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))) + 1,
       "elu_flip": lambda x: np.where(-x > 0, -x, np.expm1(np.minimum(-x, 0))) + 1,
       "tanh": lambda x: np.tanh(x) + 1}


def naive_far(q, k, v, kernels, eps, causal):
    """Running sums S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j) (linear attention form)."""
    T = q.shape[0]
    total = np.zeros_like(v)
    for name in kernels:
        phi = PHI[name]
        S_all = sum(np.outer(phi(k[j]), v[j]) for j in range(T))
        z_all = sum(phi(k[j]) for j in range(T))
        S, z = np.zeros((q.shape[1], v.shape[1])), np.zeros(q.shape[1])
        for i in range(T):
            S += np.outer(phi(k[i]), v[i])
            z += phi(k[i])
            Si, zi = (S, z) if causal else (S_all, z_all)
            total[i] += (phi(q[i]) @ Si) / (phi(q[i]) @ zi + eps)
    return total / len(kernels)


def check_blocks(rng):
    """Vectorised building blocks against the naive loops; identities."""
    results = []
    B, H, T, dh = 2, 3, 11, 6
    q, k, v = (torch.tensor(rng.normal(size=(B, H, T, dh))) for _ in range(3))
    buf = torch.tensor(rng.normal(size=(H, dh)))
    gam = torch.tensor([0.3, -0.2, 0.7])

    for anchor in (True, False):
        got = ref.momentum_shear(q, gam, 0.4, 0.15, anchor, buf)
        err = max(np.abs(got[b, h].numpy() - naive_momentum(
            q[b, h].numpy(), float(gam[h]), 0.4, 0.15, anchor, buf[h].numpy())).max()
            for b in range(B) for h in range(H))
        results.append((f"momentum recursion vs loop (anchor={anchor})", err < 1e-12, f"{err:.1e}"))

    for causal in (True, False):
        for band in (1, 3, T + 2):
            got = ref.fmm_near_field(q, k, v, band, causal)
            err = max(np.abs(got[b, h].numpy() - naive_near(q[b, h].numpy(), k[b, h].numpy(),
                      v[b, h].numpy(), band, causal)).max() for b in range(B) for h in range(H))
            results.append((f"near field vs loop (band={band}, causal={causal})", err < 1e-12,
                            f"{err:.1e}"))
        kernels = ["elu", "elu_flip", "tanh"]
        got = ref.fmm_far_field(q, k, v, kernels, 1e-6, causal)
        err = max(np.abs(got[b, h].numpy() - naive_far(q[b, h].numpy(), k[b, h].numpy(),
                  v[b, h].numpy(), kernels, 1e-6, causal)).max() for b in range(B) for h in range(H))
        results.append((f"far field vs running sums (causal={causal})", err < 1e-12, f"{err:.1e}"))

        full = ref.softmax_attention(q, k, v, causal)
        for band in (T, T + 5):
            err = float((ref.fmm_near_field(q, k, v, band, causal) - full).abs().max())
            results.append((f"near field band={band}>=T equals softmax (causal={causal})",
                            err < 1e-13, f"{err:.1e}"))

    zero = ref.momentum_shear(q, torch.zeros(H), 0.5, 0.0, False, buf)
    results.append(("gamma=0 shear is the identity", bool(torch.equal(zero, q)), ""))

    # RoPE: q_t . k_s depends only on t - s; norms are preserved.
    x = torch.tensor(rng.normal(size=(1, 1, 1, dh))).expand(1, 1, T, dh)
    y = torch.tensor(rng.normal(size=(1, 1, 1, dh))).expand(1, 1, T, dh)
    rx, ry = ref.apply_rope(x, 500.0), ref.apply_rope(y, 500.0)
    g = (rx @ ry.transpose(-1, -2))[0, 0]
    diag_err = max(float((torch.diagonal(g, o) - torch.diagonal(g, o)[0]).abs().max())
                   for o in range(-T + 1, T))
    norm_err = float((rx.norm(dim=-1) - x.norm(dim=-1)).abs().max())
    results.append(("RoPE relative-position and norm invariance", max(diag_err, norm_err) < 1e-12,
                    f"{max(diag_err, norm_err):.1e}"))
    # RoPE pair convention at t = 1, j = 0 (angle 1 rad): (u0, u1) -> rotated by +1.
    e0 = torch.zeros(1, 1, 2, dh)
    e0[..., 0] = 1.0
    r = ref.apply_rope(e0, 10000.0)[0, 0, 1]
    ok = abs(float(r[0]) - math.cos(1)) < 1e-15 and abs(float(r[1]) - math.sin(1)) < 1e-15
    results.append(("RoPE pair (2j, 2j+1) sign convention", ok, ""))
    return results


def check_model_identities(workdir, rng):
    """Whole-model identities through the loader."""
    results = []
    text = ini_text({"momentum": {"gamma": 0.0, "learn_gamma": "true", "beta": 0.5,
                                  "anchor": "false", "placement": "pre_rope"}})
    ck = os.path.join(workdir, "ident.h5")
    tok = os.path.join(workdir, "ident_tok.h5")
    s = write_random_checkpoint(ck, text, rng)
    write_tokens(tok, s, 3, 9, rng)
    cfg, params, buffers = ref.load_checkpoint(ck)
    inputs, targets, labels = ref.load_tokens(tok)
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("momentum_gamma"):
                p.zero_()
        mom0 = float(ref.forward_loss(cfg, params, buffers, inputs, targets))
        cfg_soft = configparser.ConfigParser(interpolation=None)
        cfg_soft.read_string(ini_text({}))
        plain = {n: p for n, p in params.items() if not n.endswith("momentum_gamma")}
        soft = float(ref.forward_loss(cfg_soft, plain, {}, inputs, targets))
    results.append(("model: learned gamma=0 (anchor=false, buffers) equals softmax",
                    mom0 == soft, f"{mom0!r} vs {soft!r}"))

    # Anchored momentum ignores the buffers; unanchored uses them.
    text = ini_text({"momentum": {"gamma": 0.3, "anchor": "true"}})
    s = write_random_checkpoint(ck, text, rng)
    cfg, params, buffers = ref.load_checkpoint(ck)
    with torch.no_grad():
        a = float(ref.forward_loss(cfg, params, buffers, inputs, targets))
        b = float(ref.forward_loss(cfg, params, {}, inputs, targets))
        cfg.set("momentum", "anchor", "false")
        c = float(ref.forward_loss(cfg, params, buffers, inputs, targets))
    results.append(("model: anchored momentum ignores buffers, unanchored does not",
                    a == b and c != a, f"{a:.9f} {b:.9f} {c:.9f}"))
    return results


FD_CASES = [
    ("fd_momentum_fmm_post_rope", {
        "attention": {"kind": "fmm"},
        "momentum": {"gamma": 0.2, "learn_gamma": "true", "beta": 0.3, "gamma2": 0.1,
                     "anchor": "false"},
        "fmm": {"bandwidth": 3, "kernels": "elu,elu_flip,tanh"}}),
    ("fd_momentum_fmm_pre_rope_q", {
        "attention": {"kind": "fmm"},
        "momentum": {"gamma": 0.25, "placement": "pre_rope", "apply_to": "q", "beta": 0.5},
        "fmm": {"bandwidth": 0, "kernels": "elu"}}),
    ("fd_cls_fmm_noncausal", {  # the cls head is ListOps' (docs/config.md §6: 10 classes)
        "model": {"head": "cls", "causal": "false", "n_classes": 10}, "attention": {"kind": "fmm"},
        "data": {"task": "listops", "listops_min_len": 4},
        "momentum": {"gamma": 0.2, "learn_gamma": "true"},
        "fmm": {"bandwidth": 2, "kernels": "tanh"}}),
    ("fd_softmax_noncausal_rope500", {
        "model": {"causal": "false", "rope_base": 500, "n_layers": 1},
        "momentum": {"gamma": -0.3, "gamma2": 0.2}}),
    ("fd_fmm_band_only", {"attention": {"kind": "fmm"}, "fmm": {"bandwidth": 4, "kernels": ""}}),
]


def main():
    rng = np.random.default_rng(2024)
    passed = failed = 0

    def report(name, ok, detail):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}  {detail}")

    with tempfile.TemporaryDirectory() as workdir:
        for label, ok, detail in check_blocks(rng):
            report(label, ok, detail)
        for label, ok, detail in check_model_identities(workdir, rng):
            report(label, ok, detail)
        for seed, (label, overrides) in enumerate(FD_CASES):
            ok, detail = finite_difference_check(label, overrides, workdir, seed)
            report(label, ok, detail)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
