#!/usr/bin/python3
"""Context parallelism measured (docs/design.md §8.12, docs/scale.md §7):
`momfmm bench` under mpirun with dist.context = C, one table per question.

    tools/bench_context.py memory     [--T 65536] [--contexts 1,2,4,8] [--plot FILE.png]
    tools/bench_context.py efficiency [--T0 8192] [--kinds fmm,softmax] [--rounds 3]
    tools/bench_context.py scans      [--T 65536] [--context 4] [--rounds 3]
    tools/bench_context.py run        --T 524288 --context 8 [--steps 2]

memory: one sequence of T on C ranks (np = C) for each C: the largest peak RSS
  over the ranks (bench's peak_rss_mb) and the activation estimate of one rank,
  against the fixed part (the C = 1 run's RSS less its activations) plus
  1/C of the activations: within 15% is the goal; --plot draws RSS against C.
efficiency: np = 1 at T0 against np = 2 with context 2 at 2 T0 (the same
  tokens per rank), alternating which runs first each round: tokens/s per
  rank, their ratio pair by pair (goals: FMM >= 90%, ring softmax >= 80%).
scans: the far field's state prefix by all-gather + local prefix (LASP-2),
  MPI_Exscan and the ring (LASP), alternating: step time and the time waiting
  on the context group.
run: one configuration, its bench lines (e.g. the longest sequence).

Every run is `mpirun --oversubscribe -np N BINARY bench CONFIG --steps S --set
dist.context=C --set data.seq_len=T --set model.max_seq_len=T [--set ...]`
with 1 thread per rank; --set passes more settings (train.recompute=block).
Prints Markdown tables with the CPU (lscpu's model name) and the command.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        return m.group(1).strip() if m else "unknown CPU"
    except OSError:
        return "unknown CPU"


def bench(a, np_, context, T, extra=(), steps=None):
    """One bench run: {tokens_per_s, ms_per_step, peak_rss_mb, activation_mb, context_wait_ms, ...}."""
    cmd = [a.mpirun, "--oversubscribe", "-np", str(np_), a.binary, "bench", a.config, "--steps",
           str(steps or a.steps), "--set", f"dist.context={context}", "--set", f"data.seq_len={T}",
           "--set", f"model.max_seq_len={T}"]
    for s in list(a.set) + list(extra):
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        line = next((l for l in r.stderr.splitlines() if l.startswith("momfmm:")), r.stderr.strip()[-300:])
        return {"error": f"exit {r.returncode}: {line}", "command": " ".join(cmd)}
    out = {"command": " ".join(cmd)}
    for key, value in re.findall(r"\b([a-z_0-9]+)=([-0-9.]+)", r.stdout):
        out.setdefault(key, float(value))
    return out


def mib(megabytes):
    """bench's activation_mb is 10^6 bytes, its peak_rss_mb (getrusage's KiB / 1024) MiB: both in MiB."""
    return megabytes * 1e6 / 2**20


def fmt(x, digits=1):
    return f"{x:,.{digits}f}" if isinstance(x, float) else str(x)


def memory(a):
    contexts = [int(c) for c in a.contexts.split(",")]
    rows = [(c, bench(a, c, c, a.T)) for c in contexts]
    base = next((r for c, r in rows if c == 1 and "error" not in r), None)
    print(f"Peak RSS per rank against context, one sequence of T = {a.T:,} ({a.config}; {cpu_name()}; "
          f"{a.steps} steps)\n")
    print("| C (np) | peak RSS, largest rank (MiB) | activations of a rank (MiB) | expected: fixed + act(1)/C (MiB) "
          "| RSS / expected | tokens/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c, r in rows:
        if "error" in r:
            print(f"| {c} | {r['error']} | | | | |")
            continue
        expected = ""
        ratio = ""
        if base:
            fixed = base["peak_rss_mb"] - mib(base["activation_mb"])
            e = fixed + mib(base["activation_mb"]) / c
            expected, ratio = fmt(e), f"{r['peak_rss_mb'] / e:.2f}"
        print(f"| {c} | {fmt(r['peak_rss_mb'])} | {fmt(mib(r['activation_mb']))} | {expected} | {ratio} | "
              f"{fmt(r['tokens_per_s'])} |")
    print(f"\ncommand: {rows[-1][1]['command']}")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ok = [(c, r) for c, r in rows if "error" not in r]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([c for c, _ in ok], [r["peak_rss_mb"] for _, r in ok], "o-", label="peak RSS, largest rank")
        if base:
            fixed = base["peak_rss_mb"] - mib(base["activation_mb"])
            ax.plot([c for c, _ in ok], [fixed + mib(base["activation_mb"]) / c for c, _ in ok], "--",
                    label="fixed + activations / C")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("dist.context C (ranks per sequence)")
        ax.set_ylabel("MiB per rank")
        ax.set_title(f"T = {a.T:,}, {os.path.basename(a.config)}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"plot: {a.plot}")


def efficiency(a):
    print(f"Tokens/s per rank: np 1 at T0 = {a.T0:,} against np 2 with context 2 at 2 T0 ({a.config}; "
          f"{cpu_name()}; {a.rounds} rounds, alternating)\n")
    print("| attention | round | np 1, T0 (tokens/s) | np 2 C 2, 2 T0 (tokens/s per rank) | ratio | context wait (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in a.kinds.split(","):
        extra = [f"attention.kind={kind}"]
        for i in range(a.rounds):
            order = [(1, 1, a.T0), (2, 2, 2 * a.T0)]
            if i % 2:
                order.reverse()
            got = {np_: bench(a, np_, c, T, extra) for np_, c, T in order}
            one, two = got[1], got[2]
            if "error" in one or "error" in two:
                print(f"| {kind} | {i + 1} | {one.get('error', '')} | {two.get('error', '')} | | |")
                continue
            per_rank = two["tokens_per_s"] / 2
            print(f"| {kind} | {i + 1} | {fmt(one['tokens_per_s'])} | {fmt(per_rank)} | "
                  f"{per_rank / one['tokens_per_s']:.3f} | {fmt(two.get('context_wait_ms', 0.0))} |")
    print(f"\ncommand (np 2): {two['command'] if 'command' in two else ''}")


def scans(a):
    print(f"The far field's state prefix across context {a.context} at T = {a.T:,} ({a.config}; {cpu_name()}; "
          f"{a.rounds} rounds, alternating)\n")
    print("| dist.context_scan | round | ms/step | context wait (ms) | context sent per step (MB) |")
    print("|---|---:|---:|---:|---:|")
    methods = ["allgather", "exscan", "ring"]
    for i in range(a.rounds):
        for method in (methods if i % 2 == 0 else methods[::-1]):
            r = bench(a, a.context, a.context, a.T, [f"dist.context_scan={method}"])
            if "error" in r:
                print(f"| {method} | {i + 1} | {r['error']} | | |")
                continue
            print(f"| {method} | {i + 1} | {fmt(r['ms_per_step'])} | {fmt(r.get('context_wait_ms', 0.0))} | "
                  f"{r.get('context_sent_mb_per_step', 0.0):.3f} |")


def single(a):
    np_ = a.np or a.context
    r = bench(a, np_, a.context, a.T)
    print(f"np {np_}, context {a.context}, T = {a.T:,} ({a.config}; {cpu_name()})")
    for k, v in r.items():
        print(f"  {k} = {v}")
    return 0 if "error" not in r else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("memory", "efficiency", "scans", "run"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "momfmm"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "bench_fmm.ini"))
    ap.add_argument("--mpirun", default=os.environ.get("MPIEXEC", "mpirun"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="more section.key=value for every run")
    ap.add_argument("--T", type=int, default=65536)
    ap.add_argument("--T0", type=int, default=8192)
    ap.add_argument("--contexts", default="1,2,4,8")
    ap.add_argument("--context", type=int, default=4)
    ap.add_argument("--np", type=int, default=0, help="run: ranks (default: the context)")
    ap.add_argument("--kinds", default="fmm,softmax")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot")
    a = ap.parse_args()
    for name in ("steps", "T", "T0", "context", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if not os.access(a.binary, os.X_OK):
        ap.error(f"{a.binary}: not an executable momfmm binary (--binary)")
    return {"memory": memory, "efficiency": efficiency, "scans": scans, "run": single}[a.what](a) or 0


if __name__ == "__main__":
    sys.exit(main())
