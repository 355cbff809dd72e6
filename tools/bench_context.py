#!/usr/bin/python3
"""Context parallelism measured (docs/design.md §8.12, docs/scale.md §7):
`momfmm bench` under mpirun with dist.context = C, one table per question.

    tools/bench_context.py memory     [--T 65536] [--contexts 1,2,4,8] [--recompute none,block] [--plot FILE.png]
    tools/bench_context.py longest    [--np 8] [--Ts 2048,4096,8192] [--Ts-context 16384,32768,65536] [--budget-gib 22]
    tools/bench_context.py efficiency [--T0 8192] [--kinds fmm,softmax] [--rounds 3]
    tools/bench_context.py scans      [--T 65536] [--context 4] [--rounds 3]
    tools/bench_context.py run        --T 524288 --context 8 [--steps 2]

memory: one sequence of T on C ranks (np = C) for each C: the largest peak RSS
  over the ranks (bench's peak_rss_mb) and the activation estimate of one rank,
  against the fixed part (the C = 1 run's RSS less its activations) plus
  1/C of the activations: within 15% is the goal; --plot draws RSS against C.
  RSS is in MiB, the activations (10^6 bytes in bench's line) converted to
  MiB. --recompute runs the sweep once per train.recompute setting (a table
  each, one plot).
longest: np ranks holding one sequence each (context 1, batch np; --Ts) or
  one sequence across all of them (context np, batch 1, with and without
  train.recompute = block; --Ts-context): the largest rank's RSS fitted as
  fixed + slope T by least squares, and the T at which np times it reaches
  --budget-gib: a projection, not a run at that T.
efficiency: np = 1 at T0 against np = 2 with context 2 at 2 T0 (the same
  tokens per rank), alternating which runs first each round: tokens/s per
  rank, their ratio pair by pair (goals: FMM >= 90%, ring softmax >= 80%),
  and the ratio of GFLOP/s per rank (the model's work: softmax's per token
  doubles from T0 to 2 T0, FMM's barely changes).
scans: the far field's state prefix by all-gather + local prefix (LASP-2),
  MPI_Exscan and the ring (LASP), alternating: step time and the time waiting
  on the context group.
run: one configuration, its bench lines (e.g. the longest sequence).

Every run is `mpirun --oversubscribe -np N BINARY bench CONFIG --steps S --set
dist.context=C --set data.seq_len=T --set model.max_seq_len=T [--set ...]`
with 1 thread per rank; --set passes more settings (train.recompute=block).
Prints Markdown tables with the CPU (lscpu's model name) and the command.
"""
import math
import os
import re
import shutil
import subprocess
import sys

from momfmm_launcher import use_source_package

use_source_package()  # this tree's momfmm package: its one-line argument errors and file checks
from momfmm import files  # noqa: E402
from momfmm.tool import Parser, counts, integer, names, number  # noqa: E402

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
    for key, value in re.findall(r"\b([a-z_0-9]+)=(-?[0-9]+(?:\.[0-9]*)?)", r.stdout):
        out.setdefault(key, float(value))
    if "tokens_per_s" not in out:
        return {"error": "exit 0 without a `bench tokens_per_s=` line", "command": " ".join(cmd)}
    return out


def mib(megabytes):
    """bench's activation_mb is 10^6 bytes, its peak_rss_mb (getrusage's KiB / 1024) MiB: both in MiB."""
    return megabytes * 1e6 / 2**20


def fmt(x, digits=1):
    return f"{x:,.{digits}f}" if isinstance(x, float) else str(x)


def memory(a):
    contexts = a.contexts
    settings = a.recompute or [None]
    curves = []
    for setting in settings:
        extra = [f"train.recompute={setting}"] if setting else []
        rows = [(c, bench(a, c, c, a.T, extra)) for c in contexts]
        base = next((r for c, r in rows if c == 1 and "error" not in r), None)
        fixed = base["peak_rss_mb"] - mib(base["activation_mb"]) if base else None
        label = f", train.recompute = {setting}" if setting else ""
        print(f"Peak RSS per rank against context, one sequence of T = {a.T:,} ({a.config}{label}; {cpu_name()}; "
              f"{a.steps} steps)\n")
        print("| C (np) | peak RSS, largest rank (MiB) | activations of a rank (MiB) | expected: fixed + act(1)/C (MiB) "
              "| RSS / expected |")
        print("|---:|---:|---:|---:|---:|")
        for c, r in rows:
            if "error" in r:
                print(f"| {c} | {r['error']} | | | |")
                continue
            expected = ""
            ratio = ""
            if base:
                e = fixed + mib(base["activation_mb"]) / c
                expected, ratio = fmt(e), f"{r['peak_rss_mb'] / e:.2f}"
            print(f"| {c} | {fmt(r['peak_rss_mb'])} | {fmt(mib(r['activation_mb']))} | {expected} | {ratio} |")
        print(f"\nfixed part (C = 1: RSS less activations): {fmt(fixed) if base else '?'} MiB")
        print(f"command: {rows[-1][1]['command']}\n")
        curves.append((setting, [(c, r) for c, r in rows if "error" not in r], base, fixed))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for i, (setting, ok, base, fixed) in enumerate(curves):
            name = f"recompute {setting}" if setting else "peak RSS"
            ax.plot([c for c, _ in ok], [r["peak_rss_mb"] for _, r in ok], "o-", color=f"C{i}", lw=2.5, ms=7,
                    label=f"{name}: peak RSS, largest rank")
            if base:  # on top, thin, so that it shows where it meets the measurement
                ax.plot([c for c, _ in ok], [fixed + mib(base["activation_mb"]) / c for c, _ in ok], "x--", color="k",
                        lw=1, ms=5, zorder=3, label="fixed + activations(C = 1) / C" if i == 0 else None)
        ax.set_yscale("log", base=2)
        values = [r["peak_rss_mb"] for _, ok, _, _ in curves for _, r in ok]
        if values:
            ticks = [2**k for k in range(int(math.log2(min(values))), int(math.log2(max(values))) + 2)]
            ax.set_yticks(ticks)
            ax.set_yticklabels([f"{t:,}" for t in ticks])
            ax.minorticks_off()
        ax.set_xscale("log", base=2)
        ax.set_xticks([c for c in contexts])
        ax.set_xticklabels([str(c) for c in contexts])
        ax.set_xlabel("dist.context C (ranks per sequence, np = C)")
        ax.set_ylabel("MiB per rank")
        ax.set_title(f"T = {a.T:,}, {os.path.basename(a.config)}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        with files.output_path(a.plot, flag="--plot") as tmp:
            fig.savefig(tmp, dpi=100)
        print(f"plot: {a.plot}")


def longest(a):
    """np ranks, one sequence each (data parallel) or one sequence across them
    (context np, with and without recomputing blocks): RSS = fixed + slope T
    fitted to the measured T, and the T at which np times the largest rank's
    RSS reaches the budget."""
    budget = a.budget_gib * 1024  # MiB for all np ranks
    setups = [("data parallel: context 1, batch np (one sequence per rank)", 1, a.np, [], a.Ts),
              (f"context {a.np}, batch 1", a.np, 1, [], a.Ts_context),
              (f"context {a.np}, batch 1, train.recompute = block", a.np, 1, ["train.recompute=block"], a.Ts_context)]
    print(f"Longest sequence on {a.np} ranks within {a.budget_gib:g} GiB in all ({a.config}; {cpu_name()}; "
          f"{a.steps} steps): RSS of the largest rank fitted as fixed + slope T, projected to "
          f"{a.np} x RSS = {a.budget_gib:g} GiB\n")
    print("| configuration | measured: T → peak RSS, largest rank (MiB) | fixed (MiB) | slope (KiB per token "
          "of the sequence) | projected longest T |")
    print("|---|---|---:|---:|---:|")
    commands = []
    for name, context, batch, extra, Ts in setups:
        points = []
        for T in Ts:
            r = bench(a, a.np, context, T, extra + [f"train.batch_size={batch}"])
            commands.append(r["command"])
            if "error" in r:
                print(f"| {name} | T = {T:,}: {r['error']} | | | |")
                continue
            points.append((T, r["peak_rss_mb"]))
        if len(points) < 2:
            continue
        n = len(points)
        mt = sum(t for t, _ in points) / n
        mr = sum(m for _, m in points) / n
        slope = sum((t - mt) * (m - mr) for t, m in points) / sum((t - mt) ** 2 for t, _ in points)
        fixed = mr - slope * mt
        longest_T = (budget / a.np - fixed) / slope
        measured = ", ".join(f"{t:,} → {fmt(m)}" for t, m in points)
        print(f"| {name} | {measured} | {fmt(fixed)} | {slope * 1024:.1f} | {longest_T:,.0f} |")
    print("\ncommands:")
    for c in commands:
        print(f"  {c}")


def efficiency(a):
    print(f"Tokens/s per rank: np 1 at T0 = {a.T0:,} against np 2 with context 2 at 2 T0 ({a.config}; "
          f"{cpu_name()}; {a.rounds} rounds, alternating)\n")
    print("| attention | round | np 1, T0 (tokens/s) | np 2 C 2, 2 T0 (tokens/s per rank) | ratio "
          "| GFLOP/s per rank ratio | context wait (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in a.kinds:
        extra = [f"attention.kind={kind}"]
        for i in range(a.rounds):
            order = [(1, 1, a.T0), (2, 2, 2 * a.T0)]
            if i % 2:
                order.reverse()
            got = {np_: bench(a, np_, c, T, extra) for np_, c, T in order}
            one, two = got[1], got[2]
            if "error" in one or "error" in two:
                print(f"| {kind} | {i + 1} | {one.get('error', '')} | {two.get('error', '')} | | | |")
                continue
            per_rank = two["tokens_per_s"] / 2
            # bench's GFLOP/s counts the model's work: softmax's per token doubles with T, so at
            # 2 T0 its tokens/s per rank cannot reach T0's even with nothing lost to the ring
            work = two["gflops"] / 2 / one["gflops"]
            print(f"| {kind} | {i + 1} | {fmt(one['tokens_per_s'])} | {fmt(per_rank)} | "
                  f"{per_rank / one['tokens_per_s']:.3f} | {work:.3f} | {fmt(two.get('context_wait_ms', 0.0))} |")
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
    ap = Parser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("memory", "longest", "efficiency", "scans", "run"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "momfmm"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "bench_fmm.ini"))
    ap.add_argument("--mpirun", default=os.environ.get("MPIEXEC", "mpirun"))
    ap.add_argument("--steps", type=integer(1), default=2)
    ap.add_argument("--set", action="append", default=[], help="more section.key=value for every run")
    ap.add_argument("--T", type=integer(1), default=65536)
    ap.add_argument("--T0", type=integer(1), default=8192)
    ap.add_argument("--contexts", type=counts, default=[1, 2, 4, 8])
    ap.add_argument("--context", type=integer(1), default=4)
    ap.add_argument("--np", type=integer(0), default=0, help="run: ranks (default: the context); longest: ranks (8)")
    ap.add_argument("--kinds", type=names("fmm", "softmax"), default=["fmm", "softmax"])
    ap.add_argument("--rounds", type=integer(1), default=3)
    ap.add_argument("--plot")
    ap.add_argument("--recompute", type=names("none", "mlp", "block"), default=[],
                    help="memory: train.recompute settings, a table each (none,block)")
    ap.add_argument("--Ts", type=counts, default=[2048, 4096, 8192], help="longest: T of the data-parallel runs")
    ap.add_argument("--Ts-context", dest="Ts_context", type=counts, default=[16384, 32768, 65536],
                    help="longest: T of the context runs")
    ap.add_argument("--budget-gib", dest="budget_gib", type=number(0, strict=True), default=22.0,
                    help="longest: GiB for all ranks")
    a = ap.parse_args()
    if not (os.path.isfile(a.binary) and os.access(a.binary, os.X_OK)):  # a directory is X_OK too
        ap.error(f"{a.binary}: not an executable momfmm binary (--binary)")
    if not shutil.which(a.mpirun):
        ap.error(f"--mpirun {a.mpirun}: not an executable launcher")
    try:  # what momfmm would refuse after mpirun started, refused here in one line
        files.check_input(a.config, "config")
        if a.plot is not None:
            files.check_output(a.plot, flag="--plot")
    except (files.ArgumentError, files.RunError) as exc:
        ap.error(str(exc))
    if a.what == "longest" and not a.np:
        a.np = 8
    return {"memory": memory, "longest": longest, "efficiency": efficiency, "scans": scans, "run": single}[a.what](a) or 0


if __name__ == "__main__":
    sys.exit(main())
