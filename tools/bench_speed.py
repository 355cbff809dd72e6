#!/usr/bin/python3
"""A training step's speed in several set-ups, side by side (docs/performance.md §9.9):
`momfmm bench CONFIG` once per set-up and round, the order rotating each round so that a
noisy neighbour on a shared machine hits every set-up alike.

    tools/bench_speed.py CONFIG [--setups fp32,bf16,fp32@2,fp32@np2] [--rounds 3] [--steps 5]
                         [--binary build/momfmm] [--cores 0,1] [--mpirun mpirun]
                         [--set section.key=value ...]

A set-up is a precision (fp32: train.gemm = auto, the default; fp32-openblas, fp32-onednn,
fp32-avx512: that engine alone; bf16: train.precision = bf16; fp32-avx2: fp32 on an AVX2 core
played on an AVX-512 one, MOMFMM_FAKE_NO_AVX512=1, judged against the AVX2 FMA peak that bench
then measures, docs/design.md §8.10) and after '@' a thread count
(default 1), set as OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, or 'np' and a count of ranks
of one thread each under mpirun (the batch split between them, as data parallelism runs it):
`fp32@2` against `fp32@np2` tells what two threads of one process leave on the table that two
processes on the same cores do not. For each set-up it prints, as medians over
the rounds: tokens/s; the attention phases (forward + backward) and the products' phases in
ms; the non-product phases' share; the achieved GFLOP/s as a fraction of the measured peak of
its own precision (bench's fp32 FMA loop, or its vdpbf16ps loop for bf16) per thread; and,
pair by pair within a round, each set-up against the first one (tokens/s ratio and attention
time ratio, median and range). Then the goals of docs/performance.md §9.9 that the set-ups
allow (bf16's only on a core whose bf16 peak is at least 1.5x its fp32 one, as they are set;
elsewhere one line says they are not judged), each with 'met' or 'MISSED' (its figure with the
decimals that keep it on its verdict's side of the line: 1.8996x, not 1.90x, beside MISSED for
1.9x). The CPU (lscpu's model name and flags) and the commands are printed first.

--cores pins the runs: a set-up of t threads runs on the first t cores listed (its commands
are printed as `taskset -c ...`), one of r ranks binds them to the first r (mpirun's
`--cpu-set ... --bind-to core`). On a shared machine the cores need not be equal (a neighbour
on one core's hardware slowed it by 7-18% here, docs/performance.md §9.9); without --cores a
one-thread set-up runs wherever the system puts it, so its rounds mix the cores.
"""
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

from momfmm_launcher import use_source_package

use_source_package()  # this tree's momfmm package: its one-line argument errors
from momfmm.tool import Parser, binary_cannot_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECISIONS = {
    "fp32": [],
    "fp32-openblas": ["--set", "train.gemm=openblas"],
    "fp32-onednn": ["--set", "train.gemm=onednn"],
    "fp32-avx512": ["--set", "train.gemm=avx512"],
    "bf16": ["--set", "train.precision=bf16"],
    "fp32-avx2": [],
}
# The environment a precision adds: fp32-avx2 hides AVX-512F from momfmm (src/base/cpu.h).
PRECISION_ENV = {"fp32-avx2": {"MOMFMM_FAKE_NO_AVX512": "1"}}
# The feature a precision needs, as `momfmm --version` names it on its line
# ("bf16:     unavailable: <why>" where the CPU or the build lacks it).
FEATURE = {"bf16": "bf16", "fp32-avx512": "avx512"}
FIGURE = re.compile(r"\b([a-z_0-9]+)=(-?[0-9]+(?:\.[0-9]*)?)")
PHASE = re.compile(r"([a-z][a-z ]+?) ([0-9.]+) ms \(")


def refuse(message):
    print(f"bench_speed.py: {message}", file=sys.stderr)
    sys.exit(2)


def parse_setup(text):
    """(label, precision, threads, ranks)."""
    precision, _, after = text.partition("@")
    if precision not in PRECISIONS:
        refuse(f"--setups: '{text}': the precision must be one of {', '.join(PRECISIONS)}")
    count = after[2:] if after.startswith("np") else after
    if (after or "@" in text) and not (count.isdigit() and 1 <= int(count) <= 256):
        refuse(f"--setups: '{text}': after @ a thread count 1 ... 256, or np and a rank count 1 ... 256")
    if after.startswith("np"):
        return text, precision, 1, int(count)
    return text, precision, int(after or 1), 1


def cpu():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = re.search(r"^Model name:\s*(.+)$", out, re.M)
    flags = re.search(r"^Flags:\s*(.+)$", out, re.M)
    have = set(flags.group(1).split()) if flags else set()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in have]
    return f"{name.group(1).strip() if name else 'unknown CPU'} ({' '.join(isa)})", "avx512f" in have


def parse_cores(text, setups):
    """--cores: distinct cores this process may run on, at least as many as the largest set-up's threads."""
    allowed = os.sched_getaffinity(0)
    cores = []
    for item in text.split(","):
        if not item.isdigit() or int(item) not in allowed:
            refuse(f"--cores: '{item}': not a core this process may run on (allowed: "
                   f"{','.join(str(c) for c in sorted(allowed))})")
        if int(item) in cores:
            refuse(f"--cores: '{item}' is listed twice")
        cores.append(int(item))
    most = max(threads * ranks for _, _, threads, ranks in setups)
    if len(cores) < most:
        refuse(f"--cores: {len(cores)} core(s) listed, and a set-up runs {most} threads or ranks")
    return cores


def run(a, precision, threads, ranks):
    """One bench run: its figures, or exits with bench's own message."""
    cmd = [a.binary, "bench", a.config, "--steps", str(a.steps), *PRECISIONS[precision]]
    for s in a.set:
        cmd += ["--set", s]
    played = PRECISION_ENV.get(precision, {})
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), **played)
    pinned = a.cores[:threads] if a.cores else None
    if ranks > 1:
        # rank 0 prints the job's figures; mpirun binds the ranks itself
        bind = ["--cpu-set", ",".join(str(c) for c in a.cores[:ranks]), "--bind-to", "core"] if a.cores else []
        cmd = [a.mpirun, "--oversubscribe", "-np", str(ranks), *bind, *cmd]
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        pinned = None
    pin = (lambda: os.sched_setaffinity(0, pinned)) if pinned else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)
    if r.returncode != 0:
        line = next((l for l in r.stderr.splitlines() if l.startswith("momfmm:")), r.stderr.strip()[-300:])
        print(f"bench_speed.py: {' '.join(cmd)}: exit {r.returncode}: {line}", file=sys.stderr)
        sys.exit(1)
    out = r.stdout
    figures = {k: float(v) for k, v in FIGURE.findall(out)}
    if "tokens_per_s" not in figures:
        print(f"bench_speed.py: {' '.join(cmd)}: exit 0 without a `bench tokens_per_s=` line", file=sys.stderr)
        sys.exit(1)
    phases_line = next((l for l in out.splitlines() if l.startswith("bench phases")), "")
    phases = {name.strip(): float(ms) for name, ms in PHASE.findall(phases_line.split(":", 1)[-1])}
    step = sum(phases.values()) or float("nan")
    products = phases.get("forward linear", 0) + phases.get("backward linear", 0)
    attention = phases.get("forward attention", 0) + phases.get("backward attention", 0)
    other = step - products - attention - phases.get("reduce wait", 0)
    peak = figures.get("bf16_gflops") if precision == "bf16" else figures.get("fp32_fma_gflops")
    return {
        "tokens_per_s": figures["tokens_per_s"],
        "attention_ms": attention,
        "products_ms": products,
        "other_share": other / step,
        "of_peak": figures["gflops"] / peak if peak else float("nan"),
        # the bf16 peak against the fp32 one (0 without vdpbf16ps): whether the bf16 goals are set here
        "bf16_over_fp32": figures.get("bf16_gflops", 0) / figures["fp32_fma_gflops"]
        if figures.get("fp32_fma_gflops") else 0.0,
        "command": "".join(f"{k}={v} " for k, v in played.items()) + f"OMP_NUM_THREADS={threads} "
                   + (f"taskset -c {','.join(str(c) for c in pinned)} " if pinned else "") + " ".join(cmd),
    }


def cannot_run(a, precision):
    """Why the binary says `precision` cannot run here (its --version line), or None: a set-up is
    refused before any round runs, not after the others' rounds (bf16 on an AVX2-only core)."""
    feature = FEATURE.get(precision)
    return binary_cannot_run(a.binary, feature, **PRECISION_ENV.get(precision, {})) if feature else None


def spread(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main():
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--setups", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "momfmm"))
    ap.add_argument("--cores", metavar="0,1")
    ap.add_argument("--mpirun", default="mpirun", help="launcher of the set-ups with ranks (@npN)")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value")
    a = ap.parse_args()
    setups = [parse_setup(s) for s in a.setups.split(",") if s]
    if not setups or len({s[0] for s in setups}) != len(setups):
        refuse(f"--setups: '{a.setups}': name one or more distinct set-ups")
    a.cores = parse_cores(a.cores, setups) if a.cores is not None else []
    if not 1 <= a.rounds <= 100 or not 1 <= a.steps <= 1000:
        refuse("--rounds must be 1 ... 100 and --steps 1 ... 1000")
    if not (os.path.isfile(a.binary) and os.access(a.binary, os.X_OK)):
        refuse(f"{a.binary}: not an executable momfmm binary (--binary)")
    if not os.path.exists(a.config):
        refuse(f"{a.config}: no such config file")
    if not os.path.isfile(a.config):
        refuse(f"{a.config}: not a regular file (a config is INI text)")
    if any(ranks > 1 for _, _, _, ranks in setups) and not shutil.which(a.mpirun):
        refuse(f"--mpirun {a.mpirun}: not an executable launcher (the set-ups with ranks run under it)")
    asked = set()  # one --version a precision: bf16 and bf16@2 ask the same question
    for label, precision, _, _ in setups:
        why = cannot_run(a, precision) if precision not in asked else None
        asked.add(precision)
        if why:
            refuse(f"--setups: '{label}' cannot run here: {why} ({a.binary} --version)")
    name, avx512 = cpu()
    print(f"CPU: {name}; {a.config}, {a.rounds} rounds, bench --steps {a.steps}; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = {s[0]: [] for s in setups}
    for r in range(a.rounds):
        order = setups[r % len(setups):] + setups[:r % len(setups)]
        for label, precision, threads, ranks in order:
            got = run(a, precision, threads, ranks)
            if r == 0:
                print(f"  {label}: {got['command']}")
            results[label].append(got)
            print(f"round {r + 1} {label}: {got['tokens_per_s']:.1f} tokens/s, attention {got['attention_ms']:.1f} ms, "
                  f"{100 * got['of_peak']:.1f}% of its peak")
    first = setups[0][0]
    print(f"\n| set-up | tokens/s | attention ms | products ms | other phases | of its peak (all threads) "
          f"| tokens/s vs {first} | attention vs {first} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {}
    for label, _, _, _ in setups:
        runs = results[label]
        med = {k: statistics.median(x[k] for x in runs) for k in ("tokens_per_s", "attention_ms", "products_ms",
                                                                    "other_share", "of_peak")}
        speed = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs, results[first])]
        att = [x["attention_ms"] / y["attention_ms"] for x, y in zip(runs, results[first]) if y["attention_ms"] > 0]
        ratios[label] = (statistics.median(speed), statistics.median(att) if att else float("nan"), med)
        of_peak = "—" if math.isnan(med["of_peak"]) else f"{100 * med['of_peak']:.1f}%"
        print(f"| {label} | {med['tokens_per_s']:,.1f} | {med['attention_ms']:.1f} | {med['products_ms']:.1f} "
              f"| {100 * med['other_share']:.1f}% | {of_peak} | {spread(speed)} "
              f"| {spread(att) if att else '—'} |")
    goals(ratios, results, avx512)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def beside(value, line, decimals):
    """value printed with `decimals` decimals, or more where those would round it onto or over `line`:
    a ratio of 1.8996 against a goal of 1.9 prints 1.8996, not 1.90 beside MISSED."""
    for places in range(decimals, 10):
        text = f"{value:.{places}f}"
        if (float(text) < line) == (value < line) and (float(text) > line) == (value > line):
            return text
    return repr(value)


def goal(subject, op, line, unit, what, value, decimals):
    """One goal's line and verdict, both from the one `line`: 'bf16 >= 1.75x fp32 tokens/s (measured 1.88x)'."""
    met = value >= line if op == ">=" else value <= line
    return f"{subject} {op} {line:g}{unit} {what} (measured {beside(value, line, decimals)}{unit})", met


def goals(ratios, results, avx512):
    """docs/performance.md §9.9's goals that these set-ups measure."""
    lines = []
    full_rate = "bf16" in results and statistics.median(x["bf16_over_fp32"] for x in results["bf16"]) >= 1.5
    if "fp32" in ratios and "bf16" in ratios and not full_rate:
        over = statistics.median(x["bf16_over_fp32"] for x in results["bf16"])
        print("goal: bf16's goals are set for a core with full-rate bf16, its bf16 peak at least 1.5x its fp32 one: "
              + (f"here {over:.2f}x" if over > 0 else "this core has no vdpbf16ps (bf16 forced)") + ": not judged")
    if "fp32" in ratios and "bf16" in ratios and full_rate:
        speed, att, med = ratios["bf16"]
        lines.append(goal("bf16", ">=", 1.75, "x", "fp32 tokens/s", speed, 2))
        lines.append(goal("bf16 attention", "<=", 0.6, "x", "fp32's", att, 2))
        lines.append(goal("bf16", ">=", 75, "%", "of the bf16 peak", 100 * med["of_peak"], 1))
    if "fp32" in ratios:
        of_peak = 100 * ratios["fp32"][2]["of_peak"]
        lines.append(goal("fp32", ">=", 80 if avx512 else 85, "%", "of the FMA peak", of_peak, 1))
    if "fp32-avx2" in ratios:
        of_peak = 100 * ratios["fp32-avx2"][2]["of_peak"]
        played = " (an AVX2 core played on this AVX-512 one)" if avx512 else ""
        lines.append(goal("fp32-avx2", ">=", 85, "%", "of the AVX2 FMA peak" + played, of_peak, 1))
    for label in ratios:
        if label.endswith("@2") and label[:-2] in ratios:
            speed = statistics.median(x["tokens_per_s"] / y["tokens_per_s"]
                                      for x, y in zip(results[label], results[label[:-2]]))
            lines.append(goal(label, ">=", 1.9, "x", label[:-2], speed, 2))
    for text, ok in lines:
        print(f"goal: {text}: {'met' if ok else 'MISSED'}")
    for label in ratios:
        threads = label.replace("@np", "@")
        if "@np" in label and threads in ratios:
            speed = statistics.median(x["tokens_per_s"] / y["tokens_per_s"]
                                      for x, y in zip(results[threads], results[label]))
            print(f"compare: {threads} (threads of one process) against {label} (as many ranks): {speed:.3f}x")


if __name__ == "__main__":
    main()
