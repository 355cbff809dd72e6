#!/usr/bin/python3
"""Projects data-parallel step time and weak-scaling efficiency of momfmm with
an alpha-beta cost model of its gradient all-reduce.

Rabenseifner's all-reduce of n float32 gradients over p ranks, which momfmm
selects in Open MPI (docs/design.md §8.3; the default, --algorithm
rabenseifner): a reduce-scatter by recursive halving, then an all-gather by
recursive doubling, 2 log2(p) messages that carry 2(p-1)/p of the buffer:

    t_allreduce(p) = 2 ceil(log2 p) * alpha * k  +  2 (p - 1) / p * 4 n / beta

--algorithm ring: the same bytes in 2(p-1) messages of n/p floats each:

    t_allreduce(p) = 2 (p - 1) * alpha * k  +  2 (p - 1) / p * 4 n / beta

k: number of gradient buckets (momfmm reduces each dist.bucket_mb bucket with
   its own all-reduce, so the latency term is paid once per bucket; the
   default k = ceil(4 n / bucket bytes) from --bucket-mb 4, the dist.bucket_mb
   default; --bucket-mb 0 gives k = 1, the plain formula),
alpha: per-message latency (default 2 us, a typical MPI small-message latency
       over InfiniBand/RoCE; pass --alpha-us 20 for a TCP network),
beta:  link bandwidth per rank (default 100 Gb/s = 12.5 GB/s).

Weak scaling (fixed per-rank batch): compute time per step stays the measured
`--compute-ms`; a fraction `--overlap-fraction` of the all-reduce runs behind
backward (bucketed non-blocking all-reduce, dist.overlap = true) and only the
rest adds to the step, but never less than the all-reduce outlasting the
part of the step it can hide behind (--hideable-fraction of compute, the
backward pass, about 2/3):

    exposed(p) = max((1 - f) * t_ar, t_ar - h * compute)
    step(p)    = compute + exposed(p)
    efficiency = compute / step(p)

ZeRO-1 (--zero, dist.zero = 1, docs/scale.md §7): the gradients are
all-reduced in the same buckets, overlapped with backward as above, and the
parameters all-gathered after the sharded AdamW update, which only the
(small) update itself can hide:

    t_ag(p) = (p - 1) * alpha * k  +  (p - 1) / p * 4 n / beta
    exposed(p) = max((1 - f) * t_ar, t_ar - h * compute) + t_ag

Memory per rank (bytes per parameter, activations not included): parameters
4, gradients 4, AdamW moments 8; with --zero the moments are 8/p. The table
gives GB per rank for n.

--algorithm binomial models what Open MPI 4.1's non-blocking in-place
MPI_Iallreduce (libnbc) does by default, and momfmm's buckets did before it
selected Rabenseifner's: a reduce to rank 0 then a broadcast, each along a
binomial tree, every message the whole bucket:

    t_allreduce(p) = 2 ceil(log2 p) * (alpha * k + 4 n / beta)

(measured on shaped links: docs/cluster.md §10.8).

Context parallelism (--context C, dist.context, docs/design.md §8.12): the
p ranks form D = p / C data-parallel groups of C ranks that share each
sequence; the gradient all-reduce still spans all p ranks, and every layer
adds the context group's exchanges, forward and backward, per step:

  FMM (--kind fmm): a halo shift of (k - 1) B H dh keys and values (one
  message each way), the momentum carries' all-gather of 8 B H dh floats per
  rank, the far-field state scan's all-gather of r B H dh (dh + 1) floats
  per rank (LASP-2; C - 1 messages each for a ring all-gather):
    t_ctx = 2 L [3 alpha + 2 (C - 1) alpha + 4 (k - 1) B d / beta
                + 4 (C - 1) B (8 d + r H dh (dh + 1)) / beta]
  none of it hidden (each waits for what it brings);
  softmax (--kind softmax): ring attention, C - 1 steps of the shard's K and
  V forward (2 B T_c d floats) and C steps of K, V and their gradients
  backward (4 B T_c d). Forward's sends overlap the attention of the block
  in hand (a third of --attention-ms, the step's attention, is forward's);
  a backward block leaves only after its products, so backward's are exposed:
    t_fwd = L (C - 1) (alpha + 8 B T_c d / beta),  t_bwd = L C (alpha + 16 B T_c d / beta)
    exposed = t_bwd + max(0, t_fwd - attention / 3)

With --measured-step-ms the p = 2 row is compared with the measured 2-rank
step. --probe FILE takes α and β from the `fit alpha_us=... beta_gbps=...`
line of build/net_probe's output (tools/net_probe.c: ping-pong between the
ranks, least squares), instead of --alpha-us and --beta-gbps. Prints a
Markdown table.

Example (bench_d256: 3.68 M parameters, 426 ms compute per step at 1 thread):
    tools/scaling_model.py --compute-ms 426 --params 3683840 --overlap-fraction 0.5
A 1B-parameter model with ZeRO-1 at 8-512 ranks:
    tools/scaling_model.py --compute-ms 2000 --params 1e9 --overlap-fraction 0.5 --zero
"""
import argparse
import math
import re

from momfmm_launcher import use_source_package

use_source_package()  # this tree's momfmm package: its one-line argument errors and file checks
from momfmm import files  # noqa: E402
from momfmm.tool import Parser, counts, integer, number  # noqa: E402


def n_buckets(n_params, bucket_mb, bytes_per=4):
    if bucket_mb <= 0:
        return 1
    return max(1, math.ceil(n_params * bytes_per / (bucket_mb * 1024 * 1024)))


def binomial_steps(p):
    """Messages on the critical path of a reduce then a broadcast along a binomial tree."""
    return 2 * math.ceil(math.log2(p)) if p > 1 else 0


def latency_seconds(p, alpha, buckets, algorithm="rabenseifner"):
    if p <= 1:
        return 0.0
    return (2 * (p - 1) if algorithm == "ring" else binomial_steps(p)) * alpha * buckets


def allreduce_seconds(p, n_params, alpha, beta_bytes, buckets=1, bytes_per=4, algorithm="rabenseifner"):
    """Rabenseifner: 2 ceil(log2 p) messages that carry 2 (p - 1) / p of n;
    ring: 2 (p - 1) messages of n/p; binomial (Open MPI 4.1's default for a
    non-blocking in-place MPI_Iallreduce: a reduce to rank 0, then a
    broadcast): 2 ceil(log2 p) messages of the whole n."""
    if p <= 1:
        return 0.0
    share = binomial_steps(p) if algorithm == "binomial" else 2 * (p - 1) / p
    return latency_seconds(p, alpha, buckets, algorithm) + share * n_params * bytes_per / beta_bytes


def half_seconds(p, n_params, alpha, beta_bytes, buckets=1, bytes_per=4):
    """One all-gather (libnbc's linear one): half the ring all-reduce."""
    if p <= 1:
        return 0.0
    return (p - 1) * alpha * buckets + (p - 1) / p * n_params * bytes_per / beta_bytes


def project(p, compute_s, n_params, alpha, beta_bytes, overlap, hideable, buckets=1, zero=False,
            algorithm="rabenseifner"):
    """(communication s, exposed s, step s, efficiency); with zero the
    communication is the all-reduce (hidden as without it) + the parameter
    all-gather (exposed)."""
    t_ar = allreduce_seconds(p, n_params, alpha, beta_bytes, buckets, algorithm=algorithm)
    exposed = max((1 - overlap) * t_ar, t_ar - hideable * compute_s, 0.0)
    if zero:
        t_ag = half_seconds(p, n_params, alpha, beta_bytes, buckets)
        exposed += t_ag
        t_ar += t_ag
    step = compute_s + exposed
    return t_ar, exposed, step, compute_s / step


def context_seconds(c, a, alpha, beta_bytes):
    """(context s per step, exposed s) of a context group of c ranks (docs/design.md §8.12)."""
    if c <= 1:
        return 0.0, 0.0
    L, B, d, T_c = a.layers, a.rows_per_rank, a.d_model, a.tokens_per_rank / max(a.rows_per_rank, 1)
    if a.kind == "fmm":
        dh = d / a.heads
        halo = 4 * (a.band - 1) * B * d / beta_bytes  # k and v, forward and back
        gathers = 4 * (c - 1) * B * (8 * d + a.kernels * a.heads * dh * (dh + 1)) / beta_bytes
        t = 2 * L * ((3 + 2 * (c - 1)) * alpha + halo + gathers)
        return t, t
    forward = L * (c - 1) * (alpha + 8 * B * T_c * d / beta_bytes)
    backward = L * c * (alpha + 16 * B * T_c * d / beta_bytes)
    # a backward block leaves after its products (docs/design.md §8.12): only forward overlaps
    return forward + backward, backward + max(0.0, forward - a.attention_ms / 1e3 / 3)


def bytes_per_param(p, zero):
    """Parameters, gradients, moments (sharded with zero)."""
    return 4 + 4 + (8 / p if zero else 8)


def probe_fit(path):
    """(alpha µs, beta Gb/s) from net_probe's `fit` line in the file at path (a regular file,
    opened without blocking: momfmm.files); ArgumentError or RunError naming it otherwise."""
    text = files.read_input(path, "--probe", limit=1 << 24).decode("utf-8", "replace")
    for m in re.finditer(r"^fit alpha_us=(\S+) beta_gbps=(\S+)", text, re.M):
        try:
            alpha, beta = float(m.group(1)), float(m.group(2))
        except ValueError:
            continue
        if 0 <= alpha < math.inf and 0 < beta < math.inf:
            return alpha, beta
        raise files.ArgumentError(f"{path}: its fit, alpha_us={alpha:g} beta_gbps={beta:g}, is not a network "
                                  "(alpha >= 0 and beta > 0, finite)")
    raise files.ArgumentError(f"{path}: no 'fit alpha_us=... beta_gbps=...' line (the output of build/net_probe)")


def main():
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compute-ms", type=number(0, strict=True), required=True,
                    help="measured compute time of one step per rank (ms)")
    ap.add_argument("--params", type=number(1), required=True, help="parameter count n (float32 gradients)")
    ap.add_argument("--overlap-fraction", type=number(0, high=1), default=0.0,
                    help="fraction of the all-reduce hidden behind backward (0..1)")
    ap.add_argument("--hideable-fraction", type=number(0, high=1), default=2 / 3,
                    help="fraction of the compute time the all-reduce can hide behind (backward); default 2/3")
    ap.add_argument("--alpha-us", type=number(0), default=2.0, help="latency per message, microseconds (default 2)")
    ap.add_argument("--beta-gbps", type=number(0, strict=True), default=100.0,
                    help="link bandwidth, Gbit/s (default 100)")
    ap.add_argument("--bucket-mb", type=number(0), default=4.0,
                    help="gradient bucket size (dist.bucket_mb, default 4); 0 = one all-reduce")
    ap.add_argument("--tokens-per-rank", type=number(0), default=0.0,
                    help="tokens per rank per step (prints projected global tokens/s)")
    ap.add_argument("--ranks", type=counts, default=[8, 16, 32, 64, 128, 256, 512], help="comma-separated p values")
    ap.add_argument("--zero", action="store_true",
                    help="ZeRO-1 (dist.zero = 1): all-reduce + parameter all-gather, moments sharded")
    ap.add_argument("--measured-step-ms", type=number(0), default=0.0,
                    help="measured 2-rank step (ms), to compare with the model's p = 2 row")
    ap.add_argument("--algorithm", choices=("rabenseifner", "ring", "binomial"), default="rabenseifner",
                    help="all-reduce: rabenseifner (default, what momfmm selects), ring, or binomial, a reduce "
                         "then a broadcast of the whole buffer (Open MPI 4.1's default for an in-place "
                         "MPI_Iallreduce)")
    ap.add_argument("--probe", metavar="FILE",
                    help="net_probe output whose fit line gives α and β (overrides --alpha-us, --beta-gbps)")
    cp = ap.add_argument_group("context parallelism (dist.context; the model's shape)")
    cp.add_argument("--context", type=integer(1), default=1, help="C: ranks per sequence (p must be a multiple)")
    cp.add_argument("--kind", choices=("fmm", "softmax"), default="fmm", help="attention.kind")
    cp.add_argument("--layers", type=integer(1), default=4, help="model.n_layers")
    cp.add_argument("--d-model", type=integer(1), default=256, help="model.d_model")
    cp.add_argument("--heads", type=integer(1), default=8, help="model.n_heads")
    cp.add_argument("--kernels", type=integer(1), default=2, help="FMM far-field kernels r")
    cp.add_argument("--band", type=integer(0), default=5, help="fmm.bandwidth k")
    cp.add_argument("--rows-per-rank", type=integer(1), default=1, help="sequences each context group holds, B")
    cp.add_argument("--attention-ms", type=number(0), default=0.0,
                    help="softmax: attention compute per step per rank (hides the ring's sends)")
    a = ap.parse_args()
    if a.context > 1 and a.tokens_per_rank <= 0:
        ap.error("--context needs --tokens-per-rank (this rank's shard: B x T / C)")
    if a.probe:
        try:
            a.alpha_us, a.beta_gbps = probe_fit(a.probe)
        except (files.ArgumentError, files.RunError) as exc:
            ap.error(str(exc))
    compute = a.compute_ms / 1e3
    alpha = a.alpha_us * 1e-6
    beta = a.beta_gbps * 1e9 / 8  # bytes per second
    ranks = a.ranks
    bad = [p for p in ranks if p % a.context]
    if bad:
        ap.error(f"--ranks {bad} are not multiples of --context {a.context}")
    k = n_buckets(a.params, a.bucket_mb)
    if a.measured_step_ms > 0 and 2 not in ranks:
        ranks = [2] + ranks

    print(f"α-β {a.algorithm} all-reduce{' + all-gather (ZeRO-1)' if a.zero else ''}: n = {a.params:,.0f} parameters ({a.params * 4 / 1e6:.1f} MB of float32 "
          f"gradients) in {k} bucket{'s' if k > 1 else ''}, α = {a.alpha_us:g} µs/message, β = {a.beta_gbps:g} Gb/s ({beta / 1e9:g} GB/s); "
          f"compute {a.compute_ms:g} ms/step; overlap fraction {a.overlap_fraction:g} "
          f"(at most {a.hideable_fraction:.2f} of compute can hide it)\n")
    comm = "all-reduce + all-gather" if a.zero else "all-reduce"
    head = (f"| p | {comm} (ms) | latency part (ms) | bandwidth part (ms) | exposed (ms) | step (ms) | efficiency "
            "| bytes/param per rank | GB per rank (no activations) |")
    sep = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if a.context > 1:
        print(f"context {a.context}: D = p / {a.context} data groups; {a.kind}, {a.layers} layers, d {a.d_model}, "
              f"{a.heads} heads, {a.tokens_per_rank:g} tokens per rank in {a.rows_per_rank} row(s)\n")
        head = head.replace("| p |", "| p (D x C) |") + " context (ms) | context exposed (ms) |"
        sep += "---:|---:|"
    if a.tokens_per_rank > 0:
        head += " global tokens/s |"
        sep += "---:|"
    print(head)
    print(sep)
    for p in ranks:
        t_ar, exposed, step, eff = project(p, compute, a.params, alpha, beta, a.overlap_fraction,
                                           a.hideable_fraction, k, a.zero, a.algorithm)
        t_ctx, ctx_exposed = context_seconds(a.context, a, alpha, beta)
        step += ctx_exposed
        eff = compute / step
        lat = latency_seconds(p, alpha, k, a.algorithm) + (latency_seconds(p, alpha, k, "ring") / 2 if a.zero else 0)
        per = bytes_per_param(p, a.zero)
        label = f"{p} ({p // a.context} x {a.context})" if a.context > 1 else f"{p}"
        row = (f"| {label} | {t_ar * 1e3:.3f} | {lat * 1e3:.3f} | {(t_ar - lat) * 1e3:.3f} | {exposed * 1e3:.3f} | "
               f"{step * 1e3:.1f} | {100 * eff:.2f}% | {per:.3f} | {per * a.params / 1e9:.2f} |")
        if a.context > 1:
            row += f" {t_ctx * 1e3:.3f} | {ctx_exposed * 1e3:.3f} |"
        if a.tokens_per_rank > 0:
            row += f" {p * a.tokens_per_rank / step:,.0f} |"
        print(row)
    if a.measured_step_ms > 0:
        _, _, step2, _ = project(2, compute, a.params, alpha, beta, a.overlap_fraction, a.hideable_fraction, k,
                                 a.zero, a.algorithm)
        print(f"\nmeasured 2-rank step {a.measured_step_ms:g} ms vs model {step2 * 1e3:.1f} ms "
              f"(measured efficiency {100 * compute / (a.measured_step_ms / 1e3):.1f}%; on one machine the "
              "ranks share memory bandwidth and cores, which this network model does not describe)")


if __name__ == "__main__":
    main()
