"""End-to-end test of tools/bench_llmc.sh (docs/design.md §8.10) without llm.c: a fake
train_gpt2 (a Python script written here) checks the files the tool lays out for it against
llm.c's formats (checkpoint header and parameter count, LayerNorm weights and biases where
train_gpt2.c's order puts them, token files' headers and sizes) and prints llm.c's lines, with
step times and CPU time that tell which steps were timed and how many threads it was given;
momfmm is the real binary at a tiny shape. Checks the table (tokens/s, ratio per pair, the
ratio by CPU time, min and median), the alternation, that the run stops before train_gpt2's
first generation, and that bad arguments exit 2 and a failing train_gpt2 exits 1, each in one
line, the scratch directory removed."""
import os
import re
import stat

import pytest

from common import env, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "bench_llmc.sh")
SHAPE = ["--d-model", "32", "--layers", "2", "--heads", "4", "--vocab", "300"]
B, T = 4, 64

# Steps 2, 3, 4 are the timed ones (--warmup 2 --steps 3): their median is 1000 ms at one
# thread (256 tokens/s), 500 ms at two; a window one step off has another median. Each of them
# burns 100 ms of CPU time before its line (the tool reads train_gpt2's CPU time). From step 4
# on it takes its time, so that a run the tool does not stop reaches the generation at step 20.
FAKE = r'''#!/usr/bin/python3
import os, sys, time
import numpy as np

def fail(msg):
    print(msg, flush=True)
    sys.exit(1)

log = open(os.environ["FAKE_LOG"], "a")
threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
log.write(f"start omp={threads} openblas={os.environ.get('OPENBLAS_NUM_THREADS')} "
          f"mkl={os.environ.get('MKL_NUM_THREADS')}\n")
log.flush()
mode = os.environ.get("FAKE_MODE", "")
if mode == "badmagic":
    fail("Bad magic model file")
h = np.fromfile("gpt2_124M.bin", dtype=np.int32, count=256)
if h[0] != 20240326: fail("Bad magic model file")
if h[1] != 3: fail("Bad version in model file")
maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
         L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
n = sum(sizes)
if os.path.getsize("gpt2_124M.bin") != 256 * 4 + 4 * n: fail("checkpoint size is not header + parameters")
if Vp % 128 or Vp < V or maxT < 64 or C % NH: fail(f"bad header {h[:8]}")
p = np.fromfile("gpt2_124M.bin", dtype=np.float32, offset=1024)
offsets = np.cumsum([0] + sizes)
part = lambda i: p[offsets[i]:offsets[i + 1]]
if not all((part(i) == 1).all() for i in (2, 8, 14)): fail("LayerNorm weights are not 1 where llm.c reads them")
if not all((part(i) == 0).all() for i in (3, 5, 7, 9, 11, 13, 15)): fail("biases are not 0 where llm.c reads them")
if not 0.01 < part(4).std() < 0.03: fail("qkvw is not N(0, 0.02)")
counts = []
for which in ("train", "val"):
    path = f"dev/data/tinyshakespeare/tiny_shakespeare_{which}.bin"
    th = np.fromfile(path, dtype=np.int32, count=256)
    if th[0] != 20240520: fail("Bad magic in the data file")
    if th[1] != 1: fail("Bad version in data file")
    if os.path.getsize(path) != 1024 + 2 * int(th[2]): fail("Error: file size is not as expected")
    tokens = np.fromfile(path, dtype=np.uint16, offset=1024)
    if th[2] < 4 * 64 + 1 or tokens.max() >= V: fail(f"{path}: {th[2]} tokens, max {tokens.max()}")
    counts.append(int(th[2]))
log.write(f"files ok C={C} L={L} NH={NH} V={V} Vp={Vp} maxT={maxT}\n")
log.flush()
print("[GPT-2]")
for key, value in (("max_seq_len", maxT), ("vocab_size", V), ("padded_vocab_size", Vp),
                   ("num_layers", L), ("num_heads", NH), ("channels", C), ("num_parameters", n)):
    print(f"{key}: {value}")
print(f"train dataset num_batches: {counts[0] // (4 * 64) + (mode == 'batch')}")
print(f"val dataset num_batches: {counts[1] // (4 * 64)}")
if not os.path.exists("gpt2_tokenizer.bin"):
    print("---\nWARNING: Failed to open the tokenizer file gpt2_tokenizer.bin\n---")
print("num_activations: 12345", flush=True)
ms = {2: 1000.0, 3: 1024.0, 4: 1000.0}
for step in range(41):
    if step % 10 == 0:
        print("val loss 5.700000", flush=True)
    if step > 0 and step % 20 == 0:
        log.write("generation\n")     # the tool should have stopped it before: the test says so
        log.flush()
        print("generating:\n---", flush=True)
    if step in ms:                      # 100 ms of CPU time in each timed step
        t0 = time.process_time()
        while time.process_time() - t0 < 0.1:
            pass
    print(f"step {step}: train loss 5.7 (took {ms.get(step, 9000.0) / max(threads, 1):f} ms)", flush=True)
    if step >= 4:
        time.sleep(0.25)     # as a real step takes time: the tool stops it here, long before step 20
'''


@pytest.fixture(scope="module")
def fake(workdir):
    path = os.path.join(workdir, "llm.c", "train_gpt2")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(FAKE)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def bench(tmp, *args, **extra):
    """Runs the tool with TMPDIR and the fake's log in tmp; returns (result, log lines)."""
    os.makedirs(tmp, exist_ok=True)
    log = os.path.join(tmp, "fake.log")
    r = run([BENCH, *args], timeout=120, env=env(TMPDIR=tmp, FAKE_LOG=log, **extra))
    lines = open(log).read().splitlines() if os.path.exists(log) else []
    return r, lines


def table(text):
    """The tool's markdown table -> (header, rows as lists of cells)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return (cells[0], cells[2:]) if len(cells) > 2 else ([], [])


def scratch_left(tmp):
    return [n for n in os.listdir(tmp) if n.startswith("bench_llmc.")]


def test_table(workdir, momfmm, fake, report):
    """Two rounds at 1 and 2 threads: llm.c's figures are the fake's steps 2..4, each row's
    ratio is momfmm / llm.c, min and median are over the rounds, the programs alternate."""
    tmp = os.path.join(workdir, "table")
    r, log = bench(tmp, os.path.dirname(fake), "--momfmm", momfmm, *SHAPE, "--threads", "1,2",
                   "--rounds", "2", "--steps", "3", "--warmup", "2")
    report.check("exits 0", r.returncode == 0, f"rc {r.returncode}: {r.stderr.strip()[-500:]}")
    report.check("the fake found llm.c's files (checkpoint, token files)",
                 log.count("files ok C=32 L=2 NH=4 V=300 Vp=384 maxT=1024") == 4, str(log))
    starts = [ln for ln in log if ln.startswith("start")]
    report.check("train_gpt2 ran at 1, 2, 1, 2 threads (OMP, OpenBLAS, MKL variables)",
                 starts == [f"start omp={t} openblas={t} mkl={t}" for t in (1, 2, 1, 2)], str(starts))
    report.check("stopped before train_gpt2's first generation", "generation" not in log, str(log))
    report.check("the scratch directory is removed", scratch_left(tmp) == [], str(scratch_left(tmp)))
    firsts = re.findall(r"^round (\d), (\d) thread\(s\): (\S+) first", r.stdout, re.M)
    report.check("the first program alternates from round to round",
                 firsts == [("1", "1", "llm.c"), ("1", "2", "llm.c"), ("2", "1", "momfmm"), ("2", "2", "momfmm")],
                 str(firsts))
    report.check("states the CPU", re.search(r"^cpu: .+", r.stdout, re.M) is not None, r.stdout[:300])
    header, rows = table(r.stdout)
    report.check("table header", header == ["threads", "round", "llm.c tokens/s", "momfmm tokens/s",
                                            "momfmm/llm.c", "momfmm/llm.c by CPU time"], str(header))
    cpus = re.findall(r"^round \d, \d thread\(s\): .* llm\.c \S+ ms/step \(CPU (\S+)\) .* momfmm \S+ ms/step "
                      r"\(CPU (\S+)\)", r.stdout, re.M)
    report.check("each round states both CPU times per step, llm.c's the fake's 100 ms",
                 len(cpus) == 4 and all(90 <= float(c[0]) <= 300 and float(c[1]) > 0 for c in cpus), str(cpus))
    report.check("8 rows: 2 rounds, min and median per thread count",
                 [row[:2] for row in rows] == [[t, x] for t in ("1", "2") for x in ("1", "2", "min", "median")],
                 str(rows))
    if len(rows) != 8 or any(len(row) != 6 for row in rows) or len(cpus) != 4:
        return
    for row in rows:
        t, label, (llmc, mom, ratio, by_cpu) = row[0], row[1], map(float, row[2:])
        want = B * T * int(t)     # the fake's median step: 1000 ms / threads
        report.check(f"{t} thread(s) {label}: llm.c tokens/s from steps 2..4 = {want}", llmc == want, str(row))
        report.check(f"{t} thread(s) {label}: momfmm tokens/s > 0", mom > 0, str(row))
        if label != "min" and label != "median":
            report.check(f"{t} thread(s) round {label}: ratio = momfmm / llm.c",
                         abs(ratio - mom / llmc) <= 2e-3 * ratio + 1e-3, str(row))
            c = [float(x) for x in cpus[2 * (int(label) - 1) + (t == "2")]]
            report.check(f"{t} thread(s) round {label}: by CPU time = llm.c's CPU / momfmm's",
                         abs(by_cpu - c[0] / c[1]) <= 0.1 * by_cpu, f"{row} {c}")
    for k, t in enumerate(("1", "2")):
        rounds = [[float(c) for c in row[2:]] for row in rows[4 * k:4 * k + 2]]
        mins, meds = [float(c) for c in rows[4 * k + 2][2:]], [float(c) for c in rows[4 * k + 3][2:]]
        for i, name in enumerate(("llm.c", "momfmm", "ratio", "by CPU time")):
            col = [x[i] for x in rounds]
            report.check(f"{t} thread(s) {name}: min, median of the rounds",
                         abs(mins[i] - min(col)) <= 1e-3 * mins[i] + 0.1
                         and abs(meds[i] - sum(col) / 2) <= 1e-3 * meds[i] + 0.1, f"{rounds} {mins} {meds}")


@pytest.mark.parametrize("case", ("missing", "not executable", "dir without train_gpt2", "threads 0",
                                  "threads two", "rounds 0", "rounds x", "momfmm missing",
                                  "config missing", "config dir"))
def test_bad_arguments(workdir, momfmm, fake, case, report):
    """Exit 2, one line naming the value, no traceback; nothing runs."""
    tmp = os.path.join(workdir, "bad_" + case.replace(" ", "_"))
    plain = os.path.join(workdir, "not_executable")
    open(plain, "w").close()
    llmc, extra, named = fake, [], None
    if case == "missing":
        llmc = named = os.path.join(workdir, "no_such_train_gpt2")
    elif case == "not executable":
        llmc = named = plain
    elif case == "dir without train_gpt2":
        llmc = named = workdir
    elif case == "momfmm missing":
        extra, named = ["--momfmm", os.path.join(workdir, "no_momfmm")], os.path.join(workdir, "no_momfmm")
    elif case.startswith("config"):
        config = os.path.join(workdir, "no_such.ini") if case == "config missing" else workdir
        extra = ["--config", config]
        named = f"--config {config}: " + ("no such file" if case == "config missing" else "not a regular file")
    else:
        option, value = case.split()
        extra, named = [f"--{option}", value], f"--{option} '{value}'"
    if case != "momfmm missing":
        extra += ["--momfmm", momfmm]
    r, log = bench(tmp, llmc, *extra, *SHAPE)
    lines = r.stderr.strip().splitlines()
    report.check(f"{case}: exit 2", r.returncode == 2, f"rc {r.returncode} {r.stderr.strip()[-300:]}")
    report.check(f"{case}: one line naming {named}", len(lines) == 1 and named in lines[0], str(lines))
    report.check(f"{case}: no traceback", "Traceback" not in r.stderr, r.stderr[-300:])
    report.check(f"{case}: nothing ran", log == [] and r.stdout == "", f"{log} {r.stdout[:200]}")


@pytest.mark.parametrize("mode,says", (("badmagic", "Bad magic model file"),
                                       ("batch", "train dataset num_batches")))
def test_failing_train_gpt2(workdir, momfmm, fake, mode, says, report):
    """A train_gpt2 that fails, or reads another batch than the tool wrote for: exit 1, one line
    with what it printed, the scratch directory removed."""
    tmp = os.path.join(workdir, "fail_" + mode)
    r, log = bench(tmp, fake, "--momfmm", momfmm, *SHAPE, "--threads", "1", "--rounds", "1", "--steps", "3",
                   FAKE_MODE=mode)
    lines = r.stderr.strip().splitlines()
    report.check(f"{mode}: exit 1", r.returncode == 1, f"rc {r.returncode} {r.stderr.strip()[-300:]}")
    report.check(f"{mode}: one line with '{says}'", len(lines) == 1 and says in lines[0], str(lines))
    report.check(f"{mode}: no traceback", "Traceback" not in r.stderr, r.stderr[-300:])
    report.check(f"{mode}: the scratch directory is removed", scratch_left(tmp) == [], str(scratch_left(tmp)))
