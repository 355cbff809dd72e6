#!/usr/bin/python3
"""Training throughput of the momfmm model in PyTorch float32, next to `momfmm bench`.

Builds the docs/model.md §1 model (pre-LN, RoPE, softmax attention, gelu-tanh MLP, lm head)
from a momfmm INI config (model.*, data.seq_len, train.batch_size, train.lr,
train.weight_decay, train.beta1/beta2/adam_eps), feeds random tokens and times
`--steps` steps of forward + backward + torch.optim.AdamW after `--warmup`
untimed steps. With `--momfmm PATH` it also runs `PATH bench CONFIG`, in rounds
that alternate the two programs, so that a noisy neighbour on a shared machine
hits both alike.

Both sides get the same threads from this tool: OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS are set to --threads before torch is
imported (OpenBLAS reads them when it loads; unset, it runs on every core) and
torch.set_num_threads(--threads); momfmm gets the same variables. Each side's
threads as the libraries report them are printed.

With `--procs P` each side runs P processes as a data-parallel user runs them:
PyTorch's DistributedDataParallel over the gloo backend (torch.distributed,
P processes on this machine, batch/P rows each), and momfmm under
`mpirun -np P`. Steps are timed between barriers on every process (the
slowest process sets the step time), as `momfmm bench` does.

With `--bf16` both sides run mixed precision (docs/scale.md §7): torch's forward
under `torch.autocast('cpu', dtype=torch.bfloat16)`, momfmm with
`--set train.precision=bf16`.

Usage:
    /usr/bin/python3 tools/bench_torch.py CONFIG.ini [--momfmm build/momfmm]
        [--threads N] [--procs P] [--steps 20] [--warmup 3] [--rounds 3]
        [--set section.key=value ...] [--bf16] [--mpirun mpirun]

The torch model covers softmax attention without momentum only; other settings
are reported and ignored on the torch side.
"""
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time

from momfmm_launcher import use_source_package

use_source_package()  # this tree's momfmm package: the config as the binary reads it, one-line errors
from momfmm import config, files  # noqa: E402
from momfmm.files import EXIT_USAGE  # noqa: E402
from momfmm.tool import Parser, binary_cannot_run, fail  # noqa: E402

BENCH_LINE = re.compile(r"bench\s+tokens_per_s=(\S+)\s+ms_per_step=(\S+)\s+gflops=(\S+)")
CORE_LINE = re.compile(r"OpenBLAS core (\S+)")
RANKS_LINE = re.compile(r"momfmm: (\d+) ranks? x (\d+) threads?")
PEAK_LINE = re.compile(r"bench peak fp32_fma_gflops=(\S+).*fraction_of_peak=(\S+)")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parse_args(argv=None):
    ap = Parser(description="PyTorch vs momfmm training throughput")
    ap.add_argument("config", help="momfmm INI config")
    ap.add_argument("--momfmm", help="momfmm binary; omit to time torch only")
    ap.add_argument("--threads", type=int, default=1, help="threads per process, both sides (default 1)")
    ap.add_argument("--procs", type=int, default=1,
                    help="processes per side: torch DDP over gloo, momfmm under mpirun (default 1)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both programs")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config override, applied to both sides")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: torch autocast bfloat16, momfmm train.precision=bf16")
    ap.add_argument("--mpirun", default="mpirun", help="launcher of momfmm with --procs > 1")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.procs < 1 or args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error("--threads, --procs, --steps and --rounds must be >= 1, --warmup >= 0")
    if args.momfmm is not None and not (os.path.isfile(args.momfmm) and os.access(args.momfmm, os.X_OK)):
        ap.error(f"--momfmm {args.momfmm}: not an executable momfmm binary")
    if args.momfmm and args.procs > 1 and not shutil.which(args.mpirun):
        ap.error(f"--mpirun {args.mpirun}: not an executable launcher (--procs {args.procs} runs momfmm under it)")
    return args


def thread_environment(threads):
    return {name: str(threads) for name in THREAD_VARIABLES}


class MomfmmFailed(Exception):
    """momfmm exited non-zero, or printed no figures."""


def run_momfmm(args):
    """Runs `momfmm bench` once; returns a dict of its figures and what it ran on."""
    env = dict(os.environ, **thread_environment(args.threads))
    cmd = [args.momfmm, "bench", args.config]
    for kv in list(args.set) + (["train.precision=bf16"] if args.bf16 else []):
        cmd += ["--set", kv]
    if args.procs > 1:
        cmd = [args.mpirun, "--oversubscribe", "-np", str(args.procs)] + cmd
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        line = next((l for l in p.stderr.splitlines() if l.startswith("momfmm:")), p.stderr.strip()[-300:])
        raise MomfmmFailed(f"{' '.join(cmd)} exited {p.returncode}: {line}")
    found = [m for m in (BENCH_LINE.search(ln) for ln in p.stdout.splitlines()) if m]
    if not found:
        raise MomfmmFailed(f"no `bench tokens_per_s=...` line in the output of {' '.join(cmd)}")
    tps, ms, gf = (float(x) for x in found[-1].groups())
    core, ranks, peak = CORE_LINE.search(p.stdout), RANKS_LINE.search(p.stdout), PEAK_LINE.search(p.stdout)
    return {"tps": tps, "ms": ms, "gflops": gf, "core": core.group(1) if core else "",
            "ranks_threads": f"{ranks.group(1)} x {ranks.group(2)}" if ranks else "?",
            "peak": float(peak.group(1)) if peak else 0.0, "fraction": float(peak.group(2)) if peak else 0.0}


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
    """The config values the benchmark needs (docs/config.md §6 names; momfmm's defaults)."""

    def __init__(self, c):
        g = c.get
        self.V, self.d, self.H = g("model.vocab_size"), g("model.d_model"), g("model.n_heads")
        self.n_layers, self.d_ff = g("model.n_layers"), g("model.d_ff")
        self.rope_base, self.causal = g("model.rope_base"), g("model.causal")
        self.T, self.B = g("data.seq_len"), g("train.batch_size")
        self.lr, self.weight_decay = g("train.lr"), g("train.weight_decay")
        self.betas, self.adam_eps = (g("train.beta1"), g("train.beta2")), g("train.adam_eps")
        self.notes = []
        if g("attention.kind") != "softmax":
            self.notes.append("attention.kind is not softmax: torch side times softmax")
        if c.momentum_on:
            self.notes.append("momentum is on: torch side times plain attention")
        if g("model.head") != "lm":
            self.notes.append("model.head is not lm: torch side times the lm head")


def read_settings(args):
    """The config as momfmm reads it (momfmm.config: its syntax, each key's range and the keys
    against each other; --set applied as the binary applies it), so that the torch side never
    times a config momfmm would refuse. Raises ConfigError or RunError naming the file or key."""
    text = files.read_input(args.config, "config").decode("utf-8", "surrogateescape")
    c = config.parse(text, args.config)
    for assignment in args.set:
        c.override(assignment)
    return Settings(c.check(f"{args.config} with --set" if args.set else args.config))


def build_model(s: Settings):
    """The docs/model.md §1 model as a torch nn.Module (torch imported by the caller)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        """Pre-LN block: x += Attn(LN1 x); x += MLP(LN2 x) (docs/model.md §1)."""

        def __init__(self, cos, sin, mask):
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
        def __init__(self):
            super().__init__()
            dh = s.d // s.H
            t = torch.arange(s.T, dtype=torch.float32).unsqueeze(1)
            theta = s.rope_base ** (-2.0 * torch.arange(dh // 2, dtype=torch.float32) / dh)
            cos, sin = torch.cos(t * theta), torch.sin(t * theta)          # [T, dh/2]
            mask = torch.full((s.T, s.T), float("-inf")).triu(1) if s.causal else None
            self.tok_emb = nn.Embedding(s.V, s.d)
            self.blocks = nn.ModuleList(Block(cos, sin, mask) for _ in range(s.n_layers))
            self.ln_f = nn.LayerNorm(s.d, eps=1e-5)
            self.head = nn.Linear(s.d, s.V, bias=False)

        def forward(self, inputs, targets):
            x = self.tok_emb(inputs)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    return Model()


def torch_step_times(s: Settings, args, rank=0, world=1):
    """Median seconds per step of this process (with world > 1, between barriers, as DDP)."""
    import torch
    torch.manual_seed(0)
    model = build_model(s)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=s.betas, eps=s.adam_eps)
    rows = s.B // world
    inputs = torch.randint(0, s.V, (rows, s.T))
    targets = torch.randint(0, s.V, (rows, s.T))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(inputs, targets)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        if world > 1:
            torch.distributed.barrier()
        start = time.perf_counter()
        step()
        if world > 1:
            torch.distributed.barrier()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def ddp_worker(rank, world, port, s, args, result):
    import torch
    torch.set_num_threads(args.threads)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    seconds = torch_step_times(s, args, rank, world)
    if rank == 0:
        result.put(seconds)
    torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def time_torch(s: Settings, args):
    """The median step of one round on the torch side, in seconds."""
    import torch
    if args.procs == 1:
        return torch_step_times(s, args)
    ctx = torch.multiprocessing.get_context("spawn")
    result = ctx.Queue()
    port = free_port()
    torch.multiprocessing.spawn(ddp_worker, args=(args.procs, port, s, args, result), nprocs=args.procs, join=True)
    return result.get()


def torch_threads():
    """Threads torch's intra-op pool and its OpenBLAS report (same shared library)."""
    import ctypes
    import torch
    blas = "?"
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_num_threads.restype = ctypes.c_int
        lib.openblas_get_corename.restype = ctypes.c_char_p
        blas = f"{lib.openblas_get_num_threads()} (OpenBLAS {lib.openblas_get_corename().decode()})"
    except OSError:
        pass
    return f"torch {torch.get_num_threads()}, BLAS {blas}"


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    args = parse_args()
    try:
        s = read_settings(args)
    except (config.ConfigError, files.RunError) as exc:  # what momfmm would refuse: exit 2 (docs/cli.md §5)
        return fail("bench_torch.py", exc, EXIT_USAGE)
    for note in s.notes:
        print(f"note: {note}")
    if s.B % args.procs:
        return fail("bench_torch.py", f"train.batch_size = {s.B} does not split over --procs {args.procs}", EXIT_USAGE)
    # refused before torch loads
    why = binary_cannot_run(args.momfmm, "bf16") if args.momfmm and args.bf16 else None
    if why:
        return fail("bench_torch.py", f"--bf16: {args.momfmm} cannot run bf16 here: {why}", EXIT_USAGE)
    os.environ.update(thread_environment(args.threads))
    momfmm_runs = []
    if args.momfmm:
        # momfmm first: its OpenBLAS core (it may pick a faster one than OpenBLAS
        # detects, src/base/blas_core.c) is given to torch's OpenBLAS before it loads
        momfmm_runs.append(run_momfmm(args))
        core = momfmm_runs[0]["core"]
        if core and "OPENBLAS_CORETYPE" not in os.environ:
            os.environ["OPENBLAS_CORETYPE"] = core
    import torch  # noqa: E402  (after the thread variables and the core are set)
    torch.set_num_threads(args.threads)
    tokens = s.B * s.T
    flops = training_flops_per_step(s.V, s.d, s.n_layers, s.d_ff, s.T, s.B)
    print(f"model: V={s.V} d={s.d} H={s.H} layers={s.n_layers} d_ff={s.d_ff} T={s.T} B={s.B} "
          f"processes={args.procs} threads/process={args.threads} steps={args.steps} warmup={args.warmup} "
          f"rounds={args.rounds} precision={'bf16' if args.bf16 else 'fp32'}")
    print(f"threads per process as run: {torch_threads()}"
          + (f"; momfmm {momfmm_runs[0]['ranks_threads']} (ranks x threads, its start-up line)"
             if momfmm_runs else ""))
    torch_ms = []
    for r in range(args.rounds):
        torch_ms.append(1e3 * time_torch(s, args))
        line = f"round {r + 1}: torch {torch_ms[-1]:.1f} ms/step"
        if args.momfmm:
            if r > 0:
                momfmm_runs.append(run_momfmm(args))
            line += f", momfmm {momfmm_runs[-1]['ms']:.1f} ms/step"
        print(line, flush=True)
    t_ms = median(torch_ms)
    print("summary (median over rounds):")
    print(f"  torch   tokens/s {1e3 * tokens / t_ms:12.1f}  ms/step {t_ms:9.3f}  GFLOP/s {flops / t_ms / 1e6:8.2f}")
    if momfmm_runs:
        c_ms = median([run["ms"] for run in momfmm_runs])
        gf = median([run["gflops"] for run in momfmm_runs])
        peak = median([run["peak"] for run in momfmm_runs])
        print(f"  momfmm  tokens/s {1e3 * tokens / c_ms:12.1f}  ms/step {c_ms:9.3f}  GFLOP/s {gf:8.2f}"
              f"  (this tool's formula: {flops / c_ms / 1e6:.2f})")
        if peak > 0:
            print(f"  fp32 FMA peak (momfmm's probe): {peak:.1f} GFLOP/s: momfmm {gf / peak:.1%}, "
                  f"torch {flops / t_ms / 1e6 / peak:.1%} of it")
        print(f"  ratio momfmm/torch: tokens/s {t_ms / c_ms:.3f}  ms/step {c_ms / t_ms:.3f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MomfmmFailed as e:  # one line, as the other refusals
        sys.exit(f"bench_torch.py: {e}")
