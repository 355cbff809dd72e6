#!/usr/bin/python3
"""Training throughput of llm.c's CPU trainer (train_gpt2.c) next to `momfmm bench`.

Run through tools/bench_llmc.sh (this file does the work):

    tools/bench_llmc.sh LLMC [--momfmm build/momfmm] [--threads 1,2] [--rounds 3]
        [--steps 10] [--warmup 2] [--config configs/bench_d768.ini]

LLMC is a train_gpt2 binary you built yourself in your own llm.c checkout
with llm.c's Makefile (`make train_gpt2`: -Ofast -march=native, OpenMP when
the compiler has it), or that checkout's directory. This tool neither
fetches nor builds llm.c.

train_gpt2 takes no arguments: it reads gpt2_124M.bin and
dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin from its working
directory and trains B = 4 rows of T = 64 tokens (fixed in its main). So the
tool writes, in a scratch directory laid out that way:

  - gpt2_124M.bin: a random-weight GPT-2 checkpoint in llm.c's format, 256
    int32 header (magic 20240326, version 3, maxT, V, L, NH, C, padded V)
    then float32 parameters in train_gpt2.c's order (wte, wpe, ln1w, ln1b,
    qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb,
    lnfw, lnfb); matrices N(0, 0.02), LayerNorm weights 1, biases 0.
    GPT-2 124M by default (C 768, L 12, NH 12, V 50,257 padded to 50,304,
    maxT 1,024: 124,475,904 parameters, 498 MB).
  - the two token files: 256 int32 header (magic 20240520, version 1, token
    count) then uint16 tokens, uniform over the vocabulary.

No tokenizer file (gpt2_tokenizer.bin): train_gpt2 prints a warning and
goes on; it needs one only to print the samples it generates at step 20.

train_gpt2 runs steps 0 .. 40 and prints `step N: train loss X (took Y ms)`,
the clock around one training step alone (batch, forward, backward, AdamW).
Before steps 0, 10, 20, 30, 40 it computes a validation loss (5 forward
passes) and before steps 20 and 40 it generates 63 tokens (63 forward
passes), both outside that clock. The tool times steps warmup .. warmup +
steps - 1 (step 0 also allocates the gradients and AdamW's moments), takes
their median, and stops train_gpt2 once it printed the last of them, before
the generation at step 20 (so warmup + steps <= 20). It checks what
train_gpt2 printed about the model (channels, layers, heads, vocabulary,
parameters) and the batch count of the train file (tokens / (B T)) against
what it wrote.

momfmm runs `momfmm bench CONFIG --steps N` (its own two warm-up steps, the
median step) with the same shape set over CONFIG: d_model C, n_heads NH,
n_layers L, d_ff 4 C, vocab_size V, seq_len T, batch_size B. The models are
not the same model: GPT-2 has learned positions and ties its head to the
embedding (its logits span the padded vocabulary), momfmm's model has RoPE
and an untied head (docs/model.md §1); the products, which are most of a
step, have the same shapes but for the 47 padding columns.

Threads: each run gets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
MKL_NUM_THREADS = t (train_gpt2 is OpenMP; momfmm runs on one OpenMP pool,
docs/design.md §8.10), for each t of --threads. Each round runs every thread
count, and the two programs of a pair alternate which goes first from round
to round, so that a noisy neighbour on a shared machine hits both alike.
The table gives tokens/s (B T / median step) of each, the ratio
momfmm / llm.c per pair, and min and median over the rounds. Its last
column is the same ratio by CPU time (user + system, all threads): llm.c's
median CPU time per timed step over momfmm's (`cpu_ms_per_step` of its
median step). Where other work shares the cores, wall time includes the
waits for a free core and CPU time does not, so at one thread that column
is the steadier figure; with more threads it includes OpenMP's spinning.
llm.c's CPU time per step is read from /proc when each step's line arrives
(steps after a validation loss left out), so it is good to a few percent.

Bad arguments exit 2 with one line naming the value; a program that fails
or prints no step times exits 1 with one line and the end of its output.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
MODEL_MAGIC, MODEL_VERSION = 20240326, 3
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1
HEADER_INTS = 256
CHECKPOINT = "gpt2_124M.bin"
TRAIN_TOKENS = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
VAL_TOKENS = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
FIRST_GENERATION_STEP = 20       # train_gpt2.c: generation before step 20 (step > 0 && step % 20 == 0)
STEP_LINE = re.compile(r"^step (\d+): train loss (\S+) \(took (\S+) ms\)")
BENCH_LINE = re.compile(r"bench\s+tokens_per_s=(\S+)\s+ms_per_step=(\S+).*\scpu_ms_per_step=(\S+)")
RANKS_LINE = re.compile(r"momfmm: (\d+) ranks? x (\d+) threads?")
ENGINE_LINE = re.compile(r"^bench precision (.*)$", re.M)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USAGE = """usage: tools/bench_llmc.sh LLMC [options]
  LLMC                 llm.c's train_gpt2 binary, built by you in your llm.c checkout with its own
                       Makefile (`make train_gpt2`), or that checkout's directory; not fetched or built here
  --momfmm PATH        momfmm binary (default $MOMFMM or build/momfmm)
  --config INI         momfmm config the shape is set over (default configs/bench_d768.ini)
  --threads LIST       thread counts, comma-separated (default 1,2)
  --rounds N           alternating rounds (default 3)
  --steps N            timed steps per run, both programs (default 10)
  --warmup N           train_gpt2 steps not timed, from step 0 (default 2; momfmm bench always
                       runs 2); warmup + steps <= 20, the step before train_gpt2's first generation
  --batch B, --seq-len T
                       the batch train_gpt2.c's main fixes (default 4, 64: change them only for a
                       train_gpt2.c you edited); momfmm runs the same
  --d-model C, --layers L, --heads NH, --vocab V
                       the checkpoint written for train_gpt2 and momfmm's shape
                       (default GPT-2 124M: 768, 12, 12, 50257)
  --workdir DIR        where to write the checkpoint and token files (default: a temporary
                       directory, removed at the end)
  --timeout S          seconds one run of either program may take (default 1800)"""


class BadArgument(Exception):
    """A bad command-line value: one line, exit 2."""


class RunFailed(Exception):
    """A program that failed or printed no figures: one line, exit 1."""


def positive_int(option, text, minimum=1):
    if not re.fullmatch(r"[0-9]+", text or "") or int(text) < minimum:
        raise BadArgument(f"{option} {text!r}: expected an integer >= {minimum}")
    return int(text)


def thread_list(text):
    parts = (text or "").split(",")
    if not all(re.fullmatch(r"[0-9]+", p) and int(p) >= 1 for p in parts):
        raise BadArgument(f"--threads {text!r}: expected thread counts >= 1, comma-separated (e.g. 1,2)")
    return [int(p) for p in parts]


def executable(option, path):
    if not os.path.exists(path):
        raise BadArgument(f"{option} {path}: no such file")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise BadArgument(f"{option} {path}: not an executable file")
    return os.path.abspath(path)


class Args:
    pass


def parse_args(argv):
    """The command line (see USAGE); raises BadArgument."""
    a = Args()
    a.momfmm = os.environ.get("MOMFMM") or "build/momfmm"
    a.config = os.path.join(ROOT, "configs", "bench_d768.ini")
    a.workdir, a.llmc = None, None
    text = {"--threads": "1,2", "--rounds": "3", "--steps": "10", "--warmup": "2", "--batch": "4",
            "--seq-len": "64", "--d-model": "768", "--layers": "12", "--heads": "12", "--vocab": "50257",
            "--timeout": "1800"}
    paths = {"--momfmm": "momfmm", "--config": "config", "--workdir": "workdir"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        name, eq, value = arg.partition("=")
        if name in text or name in paths:
            if not eq:
                if i + 1 >= len(argv):
                    raise BadArgument(f"{name}: expected a value after it")
                i += 1
                value = argv[i]
            if name in text:
                text[name] = value
            else:
                setattr(a, paths[name], value)
        elif arg.startswith("-"):
            raise BadArgument(f"{arg}: unknown option (--help lists them)")
        elif a.llmc is None:
            a.llmc = arg
        else:
            raise BadArgument(f"{arg}: one train_gpt2 binary or llm.c checkout only (the first was {a.llmc})")
        i += 1
    if a.llmc is None:
        raise BadArgument("no train_gpt2 given: tools/bench_llmc.sh LLMC (--help)")
    a.threads = thread_list(text["--threads"])
    a.rounds = positive_int("--rounds", text["--rounds"])
    a.steps = positive_int("--steps", text["--steps"])
    a.warmup = positive_int("--warmup", text["--warmup"], minimum=0)
    a.B = positive_int("--batch", text["--batch"])
    a.T = positive_int("--seq-len", text["--seq-len"])
    a.C = positive_int("--d-model", text["--d-model"])
    a.L = positive_int("--layers", text["--layers"])
    a.NH = positive_int("--heads", text["--heads"])
    a.V = positive_int("--vocab", text["--vocab"], minimum=2)
    a.timeout = positive_int("--timeout", text["--timeout"])
    if a.warmup + a.steps > FIRST_GENERATION_STEP:
        raise BadArgument(f"--warmup {a.warmup} --steps {a.steps}: at most {FIRST_GENERATION_STEP} steps "
                          f"together (train_gpt2 generates text before step {FIRST_GENERATION_STEP})")
    if a.C % a.NH:
        raise BadArgument(f"--d-model {a.C}: not a multiple of --heads {a.NH}")
    if a.V > 65536:
        raise BadArgument(f"--vocab {a.V}: llm.c's token files hold uint16 tokens (at most 65536)")
    a.maxT = max(1024, a.T)
    a.Vp = (a.V + 127) // 128 * 128     # llm.c pads the vocabulary to a multiple of 128 (50257 -> 50304)
    candidate = a.llmc
    if os.path.isdir(candidate):
        candidate = os.path.join(candidate, "train_gpt2")
        if not os.path.exists(candidate):
            raise BadArgument(f"{a.llmc}: no train_gpt2 in this directory (build it there: make train_gpt2)")
    a.llmc = executable("train_gpt2", candidate)
    a.momfmm = executable("--momfmm", a.momfmm)
    if not os.path.exists(a.config):
        raise BadArgument(f"--config {a.config}: no such file")
    if not os.path.isfile(a.config):
        raise BadArgument(f"--config {a.config}: not a regular file (a config is INI text)")
    return a


def parameter_sizes(C, L, maxT, Vp):
    """train_gpt2.c's fill_in_parameter_sizes: (name, count) in the checkpoint's order."""
    return [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C),
            ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C),
            ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C), ("fcb", L * 4 * C),
            ("fcprojw", L * C * 4 * C), ("fcprojb", L * C), ("lnfw", C), ("lnfb", C)]


def write_checkpoint(path, a):
    """A random-weight checkpoint in llm.c's format; returns the parameter count."""
    import numpy as np
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [MODEL_MAGIC, MODEL_VERSION, a.maxT, a.V, a.L, a.NH, a.C, a.Vp]
    rng = np.random.default_rng(0)
    total = 0
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, n in parameter_sizes(a.C, a.L, a.maxT, a.Vp):
            if name.endswith("b"):                       # biases (ln*b too)
                x = np.zeros(n, dtype=np.float32)
            elif name.startswith("ln"):                  # LayerNorm weights
                x = np.ones(n, dtype=np.float32)
            else:
                x = rng.standard_normal(n, dtype=np.float32)
                x *= 0.02
            f.write(x.tobytes())
            total += n
    return total


def write_tokens(path, count, V, seed):
    import numpy as np
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = [TOKENS_MAGIC, TOKENS_VERSION, count]
    tokens = np.random.default_rng(seed).integers(0, V, size=count, dtype=np.uint16)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def thread_environment(threads):
    return dict(os.environ, **{name: str(threads) for name in THREAD_VARIABLES})


def tail(text, lines=8):
    return " | ".join(text.strip().splitlines()[-lines:])


def cpu_seconds(pid):
    """User + system CPU time of a live process (all its threads), from /proc; None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_llmc(a, workdir, threads, expect):
    """One train_gpt2 run; returns the median of the timed steps' own times (ms) and the median
    CPU time of those steps (ms, or None): train_gpt2's CPU time read when a step's line
    arrives, less that read at the line before, for the timed steps not preceded by a
    validation loss (steps 10 ...)."""
    cmd = [a.llmc]
    if shutil.which("stdbuf"):
        cmd = ["stdbuf", "-oL"] + cmd      # line-buffered stdout, so that the run can stop at the last timed step
    last = a.warmup + a.steps - 1
    p = subprocess.Popen(cmd, cwd=workdir, env=thread_environment(threads), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def stop():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its own session: train_gpt2 (stdbuf execs it)

    timed_out = threading.Event()
    watchdog = threading.Timer(a.timeout, lambda: (timed_out.set(), stop()))
    watchdog.start()
    out, times, cpu = [], {}, {}
    try:
        for line in p.stdout:
            out.append(line)
            m = STEP_LINE.match(line)
            if m:
                times[int(m.group(1))] = float(m.group(3))
                cpu[int(m.group(1))] = cpu_seconds(p.pid)
                if int(m.group(1)) >= last:
                    break
    finally:
        watchdog.cancel()
        stop()
        p.stdout.close()
        p.wait()
    if timed_out.is_set():
        raise RunFailed(f"train_gpt2 ({threads} threads) ran past --timeout {a.timeout} s")
    text = "".join(out)
    timed = [times[s] for s in range(a.warmup, last + 1) if s in times]
    if len(timed) < a.steps:
        raise RunFailed(f"train_gpt2 ({threads} threads) stopped (exit {p.returncode}) after "
                        f"{len(times)} step lines, before step {last}: {tail(text)}")
    for key, want in expect.items():
        m = re.search(rf"^{key}: (\d+)", text, re.M)
        if not m or int(m.group(1)) != want:
            raise RunFailed(f"train_gpt2 printed {key}: {m.group(1) if m else 'nothing'}, the files "
                            f"written say {want}: {tail(text)}")
    cpu_ms = [1e3 * (cpu[s] - cpu[s - 1]) for s in range(a.warmup, last + 1)
              if s % 10 and cpu.get(s) is not None and cpu.get(s - 1) is not None]
    return median(timed), median(cpu_ms) if cpu_ms else None


def run_momfmm(a, threads):
    """One `momfmm bench`; returns (median ms per step, CPU ms of that step, its ranks x threads,
    its precision and GEMM engines)."""
    cmd = [a.momfmm, "bench", a.config, "--steps", str(a.steps)]
    for kv in (f"model.vocab_size={a.V}", f"model.d_model={a.C}", f"model.n_heads={a.NH}",
               f"model.n_layers={a.L}", f"model.d_ff={4 * a.C}", f"data.seq_len={a.T}",
               f"train.batch_size={a.B}"):
        cmd += ["--set", kv]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=thread_environment(threads),
                           stdin=subprocess.DEVNULL, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"momfmm bench ({threads} threads) ran past --timeout {a.timeout} s") from None
    m = BENCH_LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise RunFailed(f"momfmm bench ({threads} threads) exited {p.returncode} with no "
                        f"`bench tokens_per_s=` line: {tail(p.stderr or p.stdout)}")
    ranks = RANKS_LINE.search(p.stdout)
    engines = ENGINE_LINE.search(p.stdout)
    return (float(m.group(2)), float(m.group(3)), f"{ranks.group(1)} x {ranks.group(2)}" if ranks else "?",
            engines.group(1) if engines else "?")


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    field = lambda key: next((ln.split(":", 1)[1].strip() for ln in out.splitlines()  # noqa: E731
                              if ln.startswith(key + ":")), "?")
    flags = field("Flags").split()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
    return f"{field('Model name')}, {field('CPU(s)')} CPUs, {' '.join(isa) or 'no avx2'}"


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def bench(a, workdir):
    n_params = write_checkpoint(os.path.join(workdir, CHECKPOINT), a)
    count = 16 * a.B * a.T + 1            # 16 batches (train_gpt2 needs B T + 1 tokens at least)
    write_tokens(os.path.join(workdir, TRAIN_TOKENS), count, a.V, 1)
    write_tokens(os.path.join(workdir, VAL_TOKENS), count, a.V, 2)
    expect = {"channels": a.C, "num_layers": a.L, "num_heads": a.NH, "vocab_size": a.V,
              "num_parameters": n_params, "train dataset num_batches": count // (a.B * a.T)}
    tokens = a.B * a.T
    print(f"cpu: {cpu_name()}; load average: {os.getloadavg()[0]:.2f}")
    print(f"model: GPT-2 C={a.C} L={a.L} NH={a.NH} V={a.V} (llm.c padded {a.Vp}) B={a.B} T={a.T}, "
          f"{n_params} llm.c parameters; threads {','.join(map(str, a.threads))}; rounds {a.rounds}; "
          f"steps {a.steps} (llm.c steps {a.warmup}..{a.warmup + a.steps - 1}, momfmm bench after its 2 warm-up)")
    print(f"llm.c: {a.llmc}\nmomfmm: {a.momfmm} bench {os.path.relpath(a.config)}", flush=True)
    rows = {t: [] for t in a.threads}
    engines = {}
    for r in range(a.rounds):
        for t in a.threads:
            order = ("llm.c", "momfmm") if r % 2 == 0 else ("momfmm", "llm.c")
            ms, cpu = {}, {}
            for prog in order:
                if prog == "llm.c":
                    ms[prog], cpu[prog] = run_llmc(a, workdir, t, expect)
                else:
                    ms[prog], cpu[prog], ranks, engine = run_momfmm(a, t)
                    engines.setdefault(engine, []).append(t)
            tl, tm = 1e3 * tokens / ms["llm.c"], 1e3 * tokens / ms["momfmm"]
            by_cpu = cpu["llm.c"] / cpu["momfmm"] if cpu["llm.c"] and cpu["momfmm"] else None
            rows[t].append((tl, tm, tm / tl, by_cpu))
            cpu_text = {k: "?" if v is None else f"{v:.1f}" for k, v in cpu.items()}
            print(f"round {r + 1}, {t} thread(s): {order[0]} first | llm.c {ms['llm.c']:.1f} ms/step "
                  f"(CPU {cpu_text['llm.c']}) {tl:.1f} tokens/s | momfmm {ms['momfmm']:.1f} ms/step "
                  f"(CPU {cpu_text['momfmm']}) {tm:.1f} tokens/s ({ranks}: ranks x threads, its start-up "
                  f"line) | momfmm/llm.c {tm / tl:.3f} | load average {os.getloadavg()[0]:.2f}", flush=True)
    for engine, ts in engines.items():
        print(f"momfmm precision {engine} (runs at {', '.join(map(str, ts))} threads)")
    print()
    print("| threads | round | llm.c tokens/s | momfmm tokens/s | momfmm/llm.c | momfmm/llm.c by CPU time |")
    print("|---|---|---|---|---|---|")
    cell = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    for t in a.threads:
        for r, (tl, tm, q, c) in enumerate(rows[t]):
            print(f"| {t} | {r + 1} | {tl:.1f} | {tm:.1f} | {q:.3f} | {cell(c, '.3f')} |")
        for label, f in (("min", min), ("median", median)):
            cols = [[row[i] for row in rows[t] if row[i] is not None] for i in range(4)]
            cols = [f(col) if col else None for col in cols]
            print(f"| {t} | {label} | {cols[0]:.1f} | {cols[1]:.1f} | {cols[2]:.3f} | {cell(cols[3], '.3f')} |")
    return 0


def main(argv):
    try:
        a = parse_args(argv)
    except BadArgument as e:
        print(f"bench_llmc: {e}", file=sys.stderr)
        return 2
    workdir = a.workdir or tempfile.mkdtemp(prefix="bench_llmc.")
    try:
        os.makedirs(workdir, exist_ok=True)
        return bench(a, workdir)
    except RunFailed as e:
        print(f"bench_llmc: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"bench_llmc: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_llmc: interrupted", file=sys.stderr)
        return 130
    finally:
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
