"""The network probe (tools/net_probe.c) and its use by the cost model
(tools/scaling_model.py --probe; docs/design.md §8.11): on 2 ranks of one
host it prints one ping-pong line per size from 8 B to --max-bytes, the
fit of alpha and beta, and one all-reduce line per size beside the ring
model; scaling_model.py takes alpha and beta from that output; one rank,
a bad flag and a file without a fit line exit non-zero with one line."""
import os
import re
import sys

from common import MPIRUN, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tools", "scaling_model.py")


def probe_binary(momfmm):
    return os.path.join(os.path.dirname(os.path.abspath(momfmm)), "net_probe")


def test_probe_fits_and_model_reads_it(momfmm, workdir, report):
    r = run(MPIRUN + ["-np", "2", probe_binary(momfmm), "--max-bytes", "32768", "--seconds", "0.05"], timeout=120)
    report.check("net_probe on 2 ranks exits 0", r.returncode == 0, f"rc {r.returncode} {r.stderr[-300:]}")
    sizes = [int(m) for m in re.findall(r"^pingpong ranks=0,1 bytes=(\d+) one_way_us=[0-9.]+", r.stdout, re.M)]
    report.check("one ping-pong line per size 8, 32, ..., 32768 B", sizes == [8 * 4 ** i for i in range(7)], str(sizes))
    # on shared memory t(m) is no line (alpha may come out near 0): only beta > 0 is certain
    fit = re.search(r"^fit alpha_us=(-?[0-9.]+) beta_gbps=([0-9.]+) pairs=1 sizes=7", r.stdout, re.M)
    report.check("the fit line gives alpha and beta > 0", fit and float(fit.group(2)) > 0,
                 fit.group(0) if fit else r.stdout[-500:])
    ar = re.findall(r"^allreduce ranks=2 bytes=\d+ ms=[0-9.]+ ring_model_ms=[0-9.]+$", r.stdout, re.M)
    report.check("one all-reduce line per size beside the ring model", len(ar) == 7, str(len(ar)))
    if not fit:
        return
    out = os.path.join(workdir, "probe.txt")
    with open(out, "w") as f:
        f.write(r.stdout)
    m = run([sys.executable, MODEL, "--probe", out, "--compute-ms", "100", "--params", "1e6", "--ranks", "2"])
    report.check("scaling_model.py --probe uses the fitted alpha and beta",
                 m.returncode == 0 and f"α = {float(fit.group(1)):g} µs/message" in m.stdout
                 and f"β = {float(fit.group(2)):g} Gb/s" in m.stdout, m.stdout[:300] + m.stderr[-300:])


def test_bad_input(momfmm, workdir, report):
    r = run(MPIRUN + ["-np", "1", probe_binary(momfmm)], timeout=60)
    report.check("net_probe on one rank exits 2 saying it needs 2", r.returncode == 2 and
                 "needs at least 2 ranks" in r.stderr, f"rc {r.returncode} {r.stderr[-300:]}")
    for args in (("--seconds", "0"), ("--seconds", "0.1s"), ("--max-bytes", "1024x"), ("--max-bytes", "nan"),
                 ("--max-bytes", "nan", "--max-bytes", "1024"), ("--seconds", "-1", "--seconds", "0.1")):
        r = run(MPIRUN + ["-np", "2", probe_binary(momfmm), *args], timeout=60)
        report.check(f"net_probe {' '.join(args)} exits 2 with the usage (tools/tool_args.h: read whole; "
                     "a later good value does not undo a bad one)",
                     r.returncode == 2 and "usage: net_probe" in r.stderr, f"rc {r.returncode} {r.stderr[-300:]}")
    empty = os.path.join(workdir, "empty.txt")
    open(empty, "w").close()
    m = run([sys.executable, MODEL, "--probe", empty, "--compute-ms", "1", "--params", "1"])
    report.check("scaling_model.py --probe on a file without a fit line exits 2 naming it",
                 m.returncode == 2 and empty in m.stderr and "no 'fit" in m.stderr, m.stderr[-300:])
    fifo = os.path.join(workdir, "probe.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    m = run([sys.executable, MODEL, "--probe", fifo, "--compute-ms", "1", "--params", "1"], timeout=30)
    report.check("scaling_model.py --probe on a FIFO exits 2 at once, one line naming it",
                 m.returncode == 2 and fifo in m.stderr and "not a regular file" in m.stderr
                 and len(m.stderr.strip().splitlines()) == 1, m.stderr[-300:])
