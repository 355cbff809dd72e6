"""The benchmark tools beside momfmm (tools/bench_attention.c,
tools/bench_gemm.c, tools/fma_peak.c; docs/design.md §8.10): each runs a
small case and prints its figures in the lines the docs quote, and a bad
argument — a number with trailing text, out of range, not a number, one
too many — exits 2 with one line naming it instead of running another
benchmark than the one asked for (tools/tool_args.h)."""
import os
import re

from common import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(momfmm, name):
    return os.path.join(os.path.dirname(os.path.abspath(momfmm)), name)


NUMBER = r"[0-9]+(?:\.[0-9]+)?"


def test_bench_attention(momfmm, report):
    for path in ("fp32", "bf16"):
        r = run([tool(momfmm, "bench_attention"), "200", "24", path], timeout=120)
        causal = re.search(rf"^T=200 dh=24 causal: forward ({NUMBER}) us {NUMBER} GFLOP/s \(\d+%\) \| "
                           rf"backward ({NUMBER}) us {NUMBER} GFLOP/s \(\d+%\)$", r.stdout, re.M)
        products = re.findall(rf"^  (forward|backward) .+ {NUMBER} GFLOP/s \(\d+%\)$", r.stdout, re.M)
        report.check(f"bench_attention 200 24 {path}: the head's times in microseconds and the seven products",
                     r.returncode == 0 and causal and float(causal.group(1)) > 0 and float(causal.group(2)) > 0
                     and len(products) == 7, f"rc {r.returncode} {r.stdout[-600:]} {r.stderr[-300:]}")


def test_bench_gemm(momfmm, report):
    config = os.path.join(ROOT, "configs", "quickstart.ini")
    r = run([tool(momfmm, "bench_gemm"), config, "2"], timeout=120)
    # a cell per engine: GFLOP/s, or "-" for an engine this CPU lacks (AVX-512, bf16); OpenBLAS always runs
    row = rf"^\S+ (?:fwd NT|bwdD NN|bwdW TN)\s+\d+\s+\d+\s+\d+((?:\s+(?:{NUMBER}|-))+)$"
    rows = [cells.split() for cells in re.findall(row, r.stdout, re.M)]
    report.check("bench_gemm quickstart.ini 2: 1 round counted, a row per product, a cell per engine, "
                 "OpenBLAS's a number",
                 r.returncode == 0 and "median GFLOP/s over 1 rounds" in r.stdout and len(rows) >= 9
                 and all(len(row) == 5 and float(row[0]) > 0 for row in rows),
                 f"rc {r.returncode} {r.stdout[-600:]} {r.stderr[-300:]}")


def refuses(report, args, naming, timeout=60):
    r = run(args, timeout=timeout)
    lines = r.stderr.strip().splitlines()
    report.check(f"{os.path.basename(args[0])} {' '.join(args[1:])}: exit 2, one line naming {naming!r}",
                 r.returncode == 2 and len(lines) == 1 and naming in lines[0] and not r.stdout,
                 f"rc {r.returncode} stdout {r.stdout[-200:]!r} stderr {r.stderr[-300:]!r}")


def test_bad_arguments(momfmm, workdir, report):
    config = os.path.join(ROOT, "configs", "quickstart.ini")
    attention, gemm, peak = (tool(momfmm, n) for n in ("bench_attention", "bench_gemm", "fma_peak"))
    for args in (["0"], ["2x"], ["256", "0"], ["256", "300"], ["256", "32", "bogus"], ["256", "32", "bf16", "extra"]):
        refuses(report, [attention] + args, "usage: bench_attention")
    for rounds in ("x", "2x", "1", "65", "nan", ""):
        refuses(report, [gemm, config, rounds], f"rounds '{rounds}'")
    refuses(report, [gemm, config, "2", "extra"], "unexpected argument 'extra'")
    refuses(report, [gemm, os.path.join(workdir, "absent.ini")], "absent.ini")
    for flag, value in (("--threads", "2x"), ("--threads", "0"), ("--seconds", "nan"), ("--seconds", "0.1s")):
        refuses(report, [peak, flag, value], f"{flag} '{value}'")
    refuses(report, [peak, "--bogus"], "usage: fma_peak")
