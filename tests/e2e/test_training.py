"""Training tests: the chain task (L=10) with a 2-layer
model reaches L_rep < 0.5 L_new, and the copy task accuracy rises well above
chance. Metrics come from the final checkpoint's /metrics/eval."""
import os

import pytest

from common import load_newest, run, tiny_config, write_config


def final_eval(out_dir):
    return {k: v[-1] for k, v in load_newest(out_dir, optim=False).eval.items()}


def test_chain(momfmm, workdir, report):
    chain_dir = os.path.join(workdir, "chain")
    cfg = tiny_config(chain_dir, **{
        "model.vocab_size": 64, "model.d_model": 64, "model.n_heads": 4, "model.d_ff": 128,
        "data.seq_len": 64, "data.chain_len": 10, "train.steps": 200, "train.batch_size": 16,
        "train.lr": 3e-3, "train.min_lr": 3e-4, "train.warmup": 30, "train.weight_decay": 0.0,
        "train.log_interval": 50, "train.eval_interval": 200, "train.eval_batches": 4})
    path = write_config(os.path.join(workdir, "chain.ini"), cfg)
    r = run([momfmm, "train", path])
    print(r.stdout[-1500:], r.stderr[-1500:])
    assert r.returncode == 0, f"chain training exits 0: rc {r.returncode}"
    m = final_eval(chain_dir)
    report.check("chain: L_rep < 0.5 L_new", m["L_rep"] < 0.5 * m["L_new"],
                 f"L_rep {m['L_rep']:.4f} L_new {m['L_new']:.4f}")
    report.check("chain: delta_12 > 0 (first repeat easier than new)", m["delta_12"] > 0,
                 f"delta_12 {m['delta_12']:.4f}")


def test_copy(momfmm, workdir):
    copy_dir = os.path.join(workdir, "copy")
    cfg = tiny_config(copy_dir, **{
        "model.vocab_size": 16, "model.d_model": 64, "model.n_heads": 4, "model.d_ff": 128,
        "data.task": "copy", "data.seq_len": 32, "train.steps": 300, "train.batch_size": 16,
        "train.lr": 3e-3, "train.min_lr": 3e-4, "train.warmup": 20, "train.weight_decay": 0.0,
        "train.log_interval": 100, "train.eval_interval": 300, "train.eval_batches": 4})
    path = write_config(os.path.join(workdir, "copy.ini"), cfg)
    r = run([momfmm, "train", path])
    print(r.stdout[-800:], r.stderr[-800:])
    assert r.returncode == 0, f"copy training exits 0: rc {r.returncode}"
    m = final_eval(copy_dir)
    # chance: one of 10 symbols (the separator target is 1 of n+1)
    assert m["acc"] > 0.4, f"copy: accuracy well above chance (> 0.4, chance ~0.1): acc {m['acc']:.4f}"


@pytest.mark.parametrize("seed", (1, 2, 3))
def test_momentum_vs_baseline(momfmm, workdir, seed):
    """The momentum seed's single-layer claim: on the chain task (L = 10, one
    layer) gamma = 0.2 reaches a lower L_rep than gamma = 0 after the same
    number of steps with the same seed. Measured here at 100 steps, where it
    holds for every seed; by 300 steps the baseline overtakes (see the issue
    note), so this checks the early-training claim only."""
    results = {}
    for gamma in (0.0, 0.2):
        out = os.path.join(workdir, f"one_layer_s{seed}_g{gamma}")
        cfg = tiny_config(out, **{
            "model.vocab_size": 64, "model.d_model": 64, "model.n_heads": 4, "model.n_layers": 1,
            "model.d_ff": 128, "data.seq_len": 64, "data.chain_len": 10, "momentum.gamma": gamma,
            "train.steps": 100, "train.batch_size": 16, "train.lr": 3e-3, "train.min_lr": 3e-4,
            "train.warmup": 30, "train.weight_decay": 0.0, "train.seed": seed, "train.log_interval": 50,
            "train.eval_interval": 100, "train.eval_batches": 8})
        r = run([momfmm, "train", write_config(out + ".ini", cfg)])
        assert r.returncode == 0, f"one-layer run seed {seed} gamma {gamma}: {r.stderr}"
        results[gamma] = final_eval(out)["L_rep"]
    assert results[0.2] < results[0.0], (f"one layer, seed {seed}: L_rep(gamma 0.2) < L_rep(gamma 0) at 100 steps: "
                                         f"{results[0.2]:.4f} vs {results[0.0]:.4f}")
