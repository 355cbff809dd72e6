#!/usr/bin/python3
"""Compares the C AdamW (docs/model.md §1.4) with torch.optim.AdamW in float64.

Input file (written by a C test, or by --selftest):
    /params0      float32 [n]      initial parameters
    /grads        float32 [K, n]   gradient fed at step k
    /decay_mask   int8    [n]      1 = weight decay applies
    /lr           float64 [K]      learning rate of step k
    root attrs    beta1, beta2, eps, weight_decay (float64)
    /params       float32 [K, n]   C parameters after each step
    /m, /v        float32 [n]      C moments after the last step

The decayed and non-decayed elements form two torch param groups (weight_decay
and 0); each group's lr is set before every step.
Pass: at every step max|p_c - p_ref| <= 1e-6 * max(1, max|p_ref|); for m and v
max|c - ref| <= 1e-5 * max|ref| (or <= 1e-12 if ref is all zeros).

Usage:
    /usr/bin/python3 tests/reference/test_adamw.py --file adamw.h5
    /usr/bin/python3 tests/reference/test_adamw.py --selftest [--keep FILE]
Prints the errors and a final `N passed, M failed`; exits 0 on pass.
"""
import argparse
import os
import sys
import tempfile

import h5py
import numpy as np
import torch

PARAM_TOL = 1e-6
MOMENT_TOL = 1e-5


def torch_adamw(params0, grads, decay_mask, lrs, beta1, beta2, eps, weight_decay):
    """Runs torch.optim.AdamW in float64; returns params [K, n], m [n], v [n]."""
    n = params0.shape[0]
    decay_idx = np.nonzero(decay_mask != 0)[0]
    plain_idx = np.nonzero(decay_mask == 0)[0]
    p0 = torch.tensor(params0.astype(np.float64))
    groups, tensors = [], []
    for idx, wd in ((decay_idx, weight_decay), (plain_idx, 0.0)):
        if len(idx) == 0:
            continue
        t = torch.nn.Parameter(p0[idx].clone())
        tensors.append((idx, t))
        groups.append({"params": [t], "weight_decay": wd, "lr": float(lrs[0])})
    opt = torch.optim.AdamW(groups, lr=float(lrs[0]), betas=(beta1, beta2), eps=eps)
    out = np.zeros((len(lrs), n))
    for step, lr in enumerate(lrs):
        for g in opt.param_groups:
            g["lr"] = float(lr)
        for idx, t in tensors:
            t.grad = torch.tensor(grads[step, idx].astype(np.float64))
        opt.step()
        for idx, t in tensors:
            out[step, idx] = t.detach().numpy()
    m, v = np.zeros(n), np.zeros(n)
    for idx, t in tensors:
        m[idx] = opt.state[t]["exp_avg"].numpy()
        v[idx] = opt.state[t]["exp_avg_sq"].numpy()
    return out, m, v


def numpy_adamw(params0, grads, decay_mask, lrs, beta1, beta2, eps, weight_decay):
    """Independent float64 AdamW with PyTorch semantics (for --selftest):
    p -= lr*wd*p (decay elements); m, v EMAs; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)."""
    p = params0.astype(np.float64).copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    wd = np.where(decay_mask != 0, weight_decay, 0.0)
    history = []
    for k, lr in enumerate(lrs):
        g = grads[k].astype(np.float64)
        t = k + 1
        p = p * (1.0 - lr * wd)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        bc1 = 1.0 - beta1 ** t
        bc2 = 1.0 - beta2 ** t
        p = p - (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
        history.append(p.copy())
    return np.array(history), m, v


def write_selftest_file(path, seed=7, n=257, K=12):
    """A problem with a warmup+cosine lr, results from numpy_adamw stored in float32."""
    rng = np.random.default_rng(seed)
    beta1, beta2, eps, wd = 0.9, 0.95, 1e-8, 0.1
    params0 = rng.normal(size=n).astype(np.float32)
    grads = (rng.normal(size=(K, n)) * rng.uniform(0.01, 3.0, size=(K, 1))).astype(np.float32)
    grads[:, :5] = 0.0                                   # zero-gradient elements
    grads[3, 5:9] = 0.0                                  # intermittently zero
    decay_mask = (rng.random(n) < 0.6).astype(np.int8)
    lrs = np.array([3e-3 * min(1.0, (k + 1) / 4) * (0.5 + 0.5 * np.cos(np.pi * k / K))
                    for k in range(K)])
    params, m, v = numpy_adamw(params0, grads, decay_mask, lrs, beta1, beta2, eps, wd)
    with h5py.File(path, "w") as f:
        f.create_dataset("params0", data=params0)
        f.create_dataset("grads", data=grads)
        f.create_dataset("decay_mask", data=decay_mask)
        f.create_dataset("lr", data=lrs)
        f.create_dataset("params", data=params.astype(np.float32))
        f.create_dataset("m", data=m.astype(np.float32))
        f.create_dataset("v", data=v.astype(np.float32))
        for key, val in (("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", wd)):
            f.attrs[key] = np.float64(val)


def check_file(path):
    """Returns (passed, failed) after printing one line per check."""
    with h5py.File(path, "r") as f:
        params0 = f["params0"][()]
        grads = f["grads"][()]
        decay_mask = f["decay_mask"][()]
        lrs = np.asarray(f["lr"][()], dtype=np.float64).reshape(-1)
        c_params = f["params"][()].astype(np.float64)
        c_m = f["m"][()].astype(np.float64)
        c_v = f["v"][()].astype(np.float64)
        hyper = {k: float(f.attrs[k]) for k in ("beta1", "beta2", "eps", "weight_decay")}
    K, n = grads.shape
    shapes_ok = (params0.shape == (n,) and decay_mask.shape == (n,) and lrs.shape == (K,)
                 and c_params.shape == (K, n) and c_m.shape == (n,) and c_v.shape == (n,))
    if not shapes_ok:
        print(f"FAIL shapes: params0 {params0.shape} grads {grads.shape} decay_mask "
              f"{decay_mask.shape} lr {lrs.shape} params {c_params.shape} m {c_m.shape} "
              f"v {c_v.shape}")
        return 0, 1
    print(f"AdamW: n={n} K={K} beta1={hyper['beta1']} beta2={hyper['beta2']} "
          f"eps={hyper['eps']} weight_decay={hyper['weight_decay']} "
          f"decayed={int((decay_mask != 0).sum())}")
    ref_params, ref_m, ref_v = torch_adamw(params0, grads, decay_mask, lrs, **hyper)
    passed = failed = 0
    for k in range(K):
        err = float(np.abs(c_params[k] - ref_params[k]).max())
        bound = PARAM_TOL * max(1.0, float(np.abs(ref_params[k]).max()))
        ok = err <= bound
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} params step {k + 1}: max abs err {err:.3e} "
              f"(bound {bound:.3e}, lr {lrs[k]:.3e})")
    for name, c, r in (("m", c_m, ref_m), ("v", c_v, ref_v)):
        err = float(np.abs(c - r).max())
        scale = float(np.abs(r).max())
        bound = MOMENT_TOL * scale if scale > 0 else 1e-12
        ok = err <= bound
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: max abs err {err:.3e} (bound {bound:.3e}, "
              f"max|ref| {scale:.3e})")
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", help="HDF5 file written by the C AdamW test")
    ap.add_argument("--selftest", action="store_true",
                    help="generate a file with an independent numpy AdamW, then check it")
    ap.add_argument("--keep", help="with --selftest: also write the generated file here")
    args = ap.parse_args()
    if not args.file and not args.selftest:
        ap.error("give --file PATH or --selftest")
    passed = failed = 0
    if args.selftest:
        with tempfile.TemporaryDirectory() as tmp:
            path = args.keep or os.path.join(tmp, "adamw_selftest.h5")
            write_selftest_file(path)
            print(f"selftest file: {path}")
            p, f_ = check_file(path)
            passed, failed = passed + p, failed + f_
    if args.file:
        p, f_ = check_file(args.file)
        passed, failed = passed + p, failed + f_
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
