#!/usr/bin/python3
"""Training throughput of the momfmm model in PyTorch float32, next to `momfmm bench`.

Builds the docs/model.md §1 model (pre-LN, RoPE, softmax attention, gelu-tanh MLP, lm head)
from a momfmm INI config (model.*, data.seq_len, train.batch_size, train.lr,
train.weight_decay, train.beta1/beta2/adam_eps), feeds random tokens and times
`--steps` steps of forward + backward + torch.optim.AdamW after `--warmup`
untimed steps. Then, with `--momfmm PATH`, runs `PATH bench CONFIG` with
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set to the same thread count and parses
its line `bench tokens_per_s=<f> ms_per_step=<f> gflops=<f>`.

With `--bf16` both sides run mixed precision (docs/scale.md §7): torch's forward
under `torch.autocast('cpu', dtype=torch.bfloat16)` (its backward follows the
forward's dtypes), momfmm with `--set train.precision=bf16`.

Usage:
    /usr/bin/python3 tools/bench_torch.py CONFIG.ini [--momfmm build/momfmm]
        [--threads N] [--steps 20] [--warmup 3] [--set section.key=value ...] [--bf16]

The torch model covers softmax attention without momentum only; other settings
are reported and ignored on the torch side.
"""
import argparse
import configparser
import math
import os
import re
import subprocess
import sys
import time

BENCH_LINE = re.compile(r"bench\s+tokens_per_s=(\S+)\s+ms_per_step=(\S+)\s+gflops=(\S+)")
CORE_LINE = re.compile(r"OpenBLAS core (\S+)")
MOMFMM_RESULT_ENV = "MOMFMM_BENCH_RESULT"


def run_momfmm(binary, config, sets, threads):
    """Runs `momfmm bench`; returns (tokens_per_s, ms_per_step, gflops, openblas_core)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [binary, "bench", config]
    for kv in sets:
        cmd += ["--set", kv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    found = [m for m in (BENCH_LINE.search(ln) for ln in p.stdout.splitlines()) if m]
    if not found:
        raise RuntimeError(f"no `bench tokens_per_s=...` line in the output of {' '.join(cmd)}")
    core = CORE_LINE.search(p.stdout)
    return tuple(float(x) for x in found[-1].groups()) + (core.group(1) if core else "",)


def momfmm_sets(args):
    """The --set overrides momfmm gets: the user's, plus train.precision=bf16 with --bf16."""
    return list(args.set) + (["train.precision=bf16"] if args.bf16 else [])


def momfmm_first_then_same_blas_core():
    """Like-for-like BLAS: OpenBLAS reads OPENBLAS_CORETYPE only when it loads
    (at `import torch`), and momfmm may choose a faster core than OpenBLAS's
    own detection (src/blas_core.c). So momfmm runs first, and this script
    re-executes itself with the core momfmm used before torch is imported."""
    if "--momfmm" not in sys.argv or MOMFMM_RESULT_ENV in os.environ:
        return
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("config")
    ap.add_argument("--momfmm")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--bf16", action="store_true")
    known, _ = ap.parse_known_args()
    try:
        tps, ms, gf, core = run_momfmm(known.momfmm, known.config, momfmm_sets(known), known.threads)
    except (OSError, RuntimeError) as e:
        sys.exit(f"momfmm bench failed: {e}")
    env = dict(os.environ)
    env[MOMFMM_RESULT_ENV] = f"{tps},{ms},{gf},{core}"
    if core and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = core
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


if __name__ == "__main__":
    momfmm_first_then_same_blas_core()

import torch  # noqa: E402  (after the re-exec above, so OpenBLAS sees the core)
import torch.nn as nn
import torch.nn.functional as F


def training_flops_per_step(V, d, n_layers, d_ff, T, B):
    """FLOPs of one training step (forward + backward), the one formula used for
    every GFLOP/s figure this tool prints:

        per token: 6 * N  +  12 * n_layers * T * d
        N = parameters excluding the embedding lookup table (tok_emb) but including
            the lm head: n_layers * (4 d^2 + 2 d d_ff + 9 d + d_ff) + 2 d + V d

    6 N is 2 FLOPs per multiply-add, forward, times 3 for forward + backward; the
    attention term counts QK^T and AV (2 * 2 * T * d per token per layer forward)
    the same way, over the full T x T score matrix (no causal halving).
    """
    per_layer = 4 * d * d + 2 * d * d_ff + 9 * d + d_ff    # qkv+proj, MLP, biases, 2 LN
    n_params = n_layers * per_layer + 2 * d + V * d
    tokens = B * T
    return tokens * (6.0 * n_params + 12.0 * n_layers * T * d)


class Settings:
    """The config values the benchmark needs (docs/config.md §6 names and defaults)."""

    def __init__(self, cp: configparser.ConfigParser):
        g = lambda s, k, d=None: cp.get(s, k, fallback=d)  # noqa: E731
        self.V = int(g("model", "vocab_size"))
        self.d = int(g("model", "d_model"))
        self.H = int(g("model", "n_heads"))
        self.n_layers = int(g("model", "n_layers"))
        self.d_ff = int(g("model", "d_ff"))
        self.rope_base = float(g("model", "rope_base", "10000"))
        self.causal = g("model", "causal", "true").strip().lower() in ("true", "1", "yes", "on")
        self.T = int(g("data", "seq_len"))
        self.B = int(g("train", "batch_size"))
        self.lr = float(g("train", "lr", "3e-4"))
        self.weight_decay = float(g("train", "weight_decay", "0.1"))
        self.betas = (float(g("train", "beta1", "0.9")), float(g("train", "beta2", "0.95")))
        self.adam_eps = float(g("train", "adam_eps", "1e-8"))
        self.notes = []
        if g("attention", "kind", "softmax").strip() != "softmax":
            self.notes.append("attention.kind is not softmax: torch side times softmax")
        if (float(g("momentum", "gamma", "0")) != 0.0
                or g("momentum", "learn_gamma", "false").strip().lower() == "true"):
            self.notes.append("momentum is on: torch side times plain attention")
        if g("model", "head", "lm").strip() != "lm":
            self.notes.append("model.head is not lm: torch side times the lm head")


class Block(nn.Module):
    """Pre-LN block: x += Attn(LN1 x); x += MLP(LN2 x) (docs/model.md §1)."""

    def __init__(self, s: Settings, cos, sin, mask):
        super().__init__()
        self.H, self.dh = s.H, s.d // s.H
        self.ln1, self.ln2 = nn.LayerNorm(s.d, eps=1e-5), nn.LayerNorm(s.d, eps=1e-5)
        self.qkv, self.proj = nn.Linear(s.d, 3 * s.d), nn.Linear(s.d, s.d)
        self.fc, self.fc_out = nn.Linear(s.d, s.d_ff), nn.Linear(s.d_ff, s.d)
        self.cos, self.sin, self.mask = cos, sin, mask

    def rope(self, x):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * self.cos - odd * self.sin,
                            even * self.sin + odd * self.cos), dim=-1).flatten(-2)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.H, self.dh).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q), self.rope(k)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dh))
        if self.mask is not None:
            scores = scores + self.mask
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, s: Settings):
        super().__init__()
        dh = s.d // s.H
        t = torch.arange(s.T, dtype=torch.float32).unsqueeze(1)
        theta = s.rope_base ** (-2.0 * torch.arange(dh // 2, dtype=torch.float32) / dh)
        cos, sin = torch.cos(t * theta), torch.sin(t * theta)          # [T, dh/2]
        mask = None
        if s.causal:
            mask = torch.full((s.T, s.T), float("-inf")).triu(1)
        self.tok_emb = nn.Embedding(s.V, s.d)
        self.blocks = nn.ModuleList(Block(s, cos, sin, mask) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.d, eps=1e-5)
        self.head = nn.Linear(s.d, s.V, bias=False)

    def forward(self, inputs, targets):
        x = self.tok_emb(inputs)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def time_torch(s: Settings, steps: int, warmup: int, seed: int = 0, bf16: bool = False):
    """Returns the median seconds per training step (bf16: forward under autocast)."""
    torch.manual_seed(seed)
    model = Model(s)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=s.betas, eps=s.adam_eps)
    inputs = torch.randint(0, s.V, (s.B, s.T))
    targets = torch.randint(0, s.V, (s.B, s.T))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(inputs, targets)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    # the median step, as `momfmm bench` reports it: robust to a busy machine
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def torch_blas_core():
    """The kernel set of the OpenBLAS that torch loaded (same shared library)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description="PyTorch vs momfmm training throughput")
    ap.add_argument("config", help="momfmm INI config")
    ap.add_argument("--momfmm", help="momfmm binary; omit to time torch only")
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both programs")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config override, applied to both sides")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: torch autocast bfloat16, momfmm train.precision=bf16")
    args = ap.parse_args()

    cp = configparser.ConfigParser(interpolation=None)
    if not cp.read(args.config):
        sys.exit(f"{args.config}: cannot read config")
    for kv in args.set:
        m = re.match(r"^([^.=]+)\.([^=]+)=(.*)$", kv)
        if not m:
            sys.exit(f"--set {kv}: expected section.key=value")
        if not cp.has_section(m.group(1)):
            cp.add_section(m.group(1))
        cp.set(m.group(1), m.group(2), m.group(3))
    s = Settings(cp)
    for note in s.notes:
        print(f"note: {note}")

    torch.set_num_threads(args.threads)
    tokens = s.B * s.T
    flops = training_flops_per_step(s.V, s.d, s.n_layers, s.d_ff, s.T, s.B)
    print(f"model: V={s.V} d={s.d} H={s.H} layers={s.n_layers} d_ff={s.d_ff} T={s.T} "
          f"B={s.B} threads={args.threads} steps={args.steps} warmup={args.warmup} rounds={args.rounds} "
          f"precision={'bf16' if args.bf16 else 'fp32'}")
    # Rounds alternate the two programs so that a noisy neighbour on a shared
    # machine hits both alike; each side reports the median over rounds.
    torch_ms, momfmm_ms, momfmm_gf = [], [], []
    if args.momfmm:
        tps, ms, gf, core = os.environ[MOMFMM_RESULT_ENV].split(",")
        momfmm_ms.append(float(ms))
        momfmm_gf.append(float(gf))
        print(f"OpenBLAS core: momfmm {core or '?'}, torch {torch_blas_core()} "
              f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})")
    for r in range(args.rounds):
        torch_ms.append(1e3 * time_torch(s, args.steps, args.warmup, bf16=args.bf16))
        line = f"round {r + 1}: torch {torch_ms[-1]:.1f} ms/step"
        if args.momfmm and r > 0:
            _, ms, gf, _ = run_momfmm(args.momfmm, args.config, momfmm_sets(args), args.threads)
            momfmm_ms.append(ms)
            momfmm_gf.append(gf)
        if args.momfmm:
            line += f", momfmm {momfmm_ms[-1]:.1f} ms/step"
        print(line, flush=True)

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    t_ms = median(torch_ms)
    rows = [("torch", 1e3 * tokens / t_ms, t_ms, flops / t_ms / 1e6, "")]
    if args.momfmm:
        c_ms = median(momfmm_ms)
        rows.append(("momfmm", 1e3 * tokens / c_ms, c_ms, median(momfmm_gf),
                     f"  (this tool's formula: {flops / c_ms / 1e6:.2f})"))
    print("summary (median over rounds):")
    for name, tps, ms, gf, extra in rows:
        print(f"  {name:7s} tokens/s {tps:12.1f}  ms/step {ms:9.3f}  GFLOP/s {gf:8.2f}{extra}")
    if len(rows) == 2:
        print(f"  ratio momfmm/torch: tokens/s {rows[1][1] / rows[0][1]:.3f}  "
              f"ms/step {rows[1][2] / rows[0][2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
