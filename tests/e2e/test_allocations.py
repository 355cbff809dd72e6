"""No per-step allocation and no hidden quadratic (docs/design.md §8.10).

momfmm's own code makes no heap allocation in a training step, in
logging it or in evaluating, on every path a step can take (each attention kind and implementation, momentum,
micro-batches, recomputation, the classification head, text data and
token files, bf16,
the fp32 engines, two threads, and under MPI data parallelism, ZeRO-1 and
context parallelism) and every read-out an evaluation makes (the block
gains, the chain task's attention read-out, its length-generalisation eval), and a run that
never evaluates (no evaluator made).
Checkpoints, every ckpt_interval steps, allocate per file; here one is
written, at the last step, in every run.

tests/alloc_counter.c, preloaded, counts the allocations whose nearest
caller outside the C library is the momfmm executable, per calling site.
Each case trains the same run for N and 2N steps: every site's count must
be the same in both (the libraries' own allocations, e.g. Open MPI's
non-blocking collectives or oneDNN's gemm:jit packing, are theirs and not
counted: docs/design.md §8.10 says which). A site that grows is named
through addr2line.

Memory linear in the sequence length: the same run at T and 2T (one step
and the evaluation after it) must ask for at most 2.2x the bytes in all
(the engines' timing at start-up aside: without_tuning) and at each site (FMM, tiled softmax with and without momentum, bf16,
recomputation, micro-batches, context parallelism), where dense softmax,
which keeps the T x T probabilities, asks for more than 3x (the counter
sees a quadratic)."""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from common import MPIRUN, env, run, tiny_config, unavailable, write_config

STEPS = 3  # and 2 * STEPS


def counter_library(momfmm):
    return os.path.join(os.path.dirname(momfmm), "alloc_counter.so")


@pytest.fixture(scope="module")
def counter(momfmm):
    path = counter_library(momfmm)
    if not os.path.exists(path):
        pytest.fail(f"{path} is not built (tests/CMakeLists.txt builds it beside momfmm)")
    return path


def read_counts(directory):
    """[{(site, via): (calls, bytes, largest)}] from the counter's files, one per process in rank order."""
    runs = []
    for name in sorted(os.listdir(directory), key=lambda n: int(n.split(".")[1])):  # allocs.<rank>
        sites = {}
        with open(os.path.join(directory, name)) as f:
            for line in f:
                fields = line.split()
                assert fields[0] != "unplaced", f"{name}: the counter's table overflowed"
                sites[(fields[0], fields[1])] = tuple(int(x) for x in fields[2:5])
        runs.append(sites)
    return runs


def calls(sites):
    return {site: v[0] for site, v in sites.items()}


def total_bytes(sites):
    return sum(v[1] for v in sites.values())


def symbol(momfmm, offsets):
    """addr2line's function names for the offsets, 'a < b'."""
    names = []
    for offset in offsets:
        if offset == "0x0":
            continue
        try:
            out = subprocess.run(["addr2line", "-f", "-e", momfmm, offset], capture_output=True, text=True,
                                 timeout=30).stdout.split("\n")[0]
        except (OSError, subprocess.TimeoutExpired):
            out = "?"
        names.append(f"{out} ({offset})")
    return " < ".join(names)


def function_range(momfmm, name):
    """[start, end) of a function of the executable (nm -S), as ints; None when absent."""
    out = subprocess.run(["nm", "-S", "--defined-only", momfmm], capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[3] == name:
            return int(fields[0], 16), int(fields[0], 16) + int(fields[1], 16)
    return None


def without_tuning(momfmm, sites):
    """The sites but those called from gemm_tune_part: the GEMM engines' timing at start-up
    (docs/design.md §8.10) asks for its three operands, freed before the first step, only
    where some product reaches GEMM_AUTO_MIN_MACS, a line that doubling T can cross (0 MB at
    one length, 9 at the next), and never above TUNE_MAX_MACS' size."""
    span = function_range(momfmm, "gemm_tune_part")
    assert span, f"{momfmm} has no symbol gemm_tune_part (nm -S)"
    return {site: v for site, v in sites.items() if not any(span[0] <= int(o, 16) < span[1] for o in site[1:])}


def counted_run(momfmm, counter, workdir, name, steps, overrides, np_, extra_env):
    """Trains one case for `steps` steps under the counter, every step logged; returns
    read_counts() of its processes. bf16 where even MOMFMM_FORCE_BF16 cannot run it: skipped."""
    if overrides.get("train.precision") == "bf16":
        why = unavailable(momfmm, "bf16", MOMFMM_FORCE_BF16=1)
        if why:
            pytest.skip(f"bf16 cannot run on this CPU: {why}")
    case_dir = os.path.join(workdir, f"{name}-{steps}")
    shutil.rmtree(case_dir, ignore_errors=True)
    counts = os.path.join(case_dir, "counts")
    os.makedirs(counts)
    sections = tiny_config(os.path.join(case_dir, "run"), **{"train.steps": steps, **EVERY_STEP_LOGGED, **overrides})
    ini = write_config(os.path.join(case_dir, "run.ini"), sections)
    preload = {"LD_PRELOAD": counter, "MOMFMM_ALLOC_COUNTS": counts}
    if np_:
        cmd = MPIRUN + ["-np", str(np_)] + [a for k, v in preload.items() for a in ("-x", f"{k}={v}")]
        cmd += [momfmm, "train", ini]
        r = run(cmd, timeout=300, env=env(**extra_env))
    else:
        r = run([momfmm, "train", ini], timeout=300, env=env(**preload, **extra_env))
    assert r.returncode == 0, f"{name}, {steps} steps: exit {r.returncode}\n{r.stderr[-2000:]}"
    runs = read_counts(counts)
    assert len(runs) == (np_ or 1), f"{name}: {len(runs)} count files for {np_ or 1} processes"
    return runs


# Every step logged (to stdout, the history and metrics.h5) and evaluated;
# the one checkpoint at the last step.
EVERY_STEP_LOGGED = {"train.log_interval": 1, "train.eval_interval": 1, "train.ckpt_interval": 1000}

CASES = [
    ("tiled softmax", {}, None, {}),
    ("dense softmax", {"attention.impl": "dense"}, None, {}),
    ("momentum, learned gamma", {"momentum.gamma": 0.3, "momentum.learn_gamma": True, "momentum.beta": 0.2}, None, {}),
    ("length-generalisation eval", {"data.eval_chain_len": 3, "data.eval_chain_len_max": 5}, None, {}),
    ("fmm", {"attention.kind": "fmm", "fmm.bandwidth": 3, "fmm.chunk": 4}, None, {}),
    ("fmm with momentum", {"attention.kind": "fmm", "momentum.gamma": 0.3}, None, {}),
    ("micro-batches", {"train.micro_batch": 1}, None, {}),
    ("no evaluations", {"train.eval_interval": 0}, None, {}),
    ("recompute block", {"train.recompute": "block"}, None, {}),
    ("recompute mlp", {"train.recompute": "mlp"}, None, {}),
    ("classification head", {"model.head": "cls", "model.n_classes": 10, "model.causal": False,
                             "data.task": "listops"}, None, {}),
    ("onednn fp32 engine", {"train.gemm": "onednn"}, None, {}),
    ("two threads", {}, None, {"OMP_NUM_THREADS": 2}),
    ("bf16", {"train.precision": "bf16"}, None, {"MOMFMM_FORCE_BF16": 1}),
    ("bf16 fmm", {"train.precision": "bf16", "attention.kind": "fmm"}, None, {"MOMFMM_FORCE_BF16": 1}),
    # bf16 on OpenBLAS's sgemm (gemm_widen.c: an AVX2-only core played), its buffers on two threads
    ("bf16 widened", {"train.precision": "bf16"}, None,
     {"MOMFMM_FORCE_BF16": 1, "MOMFMM_FAKE_NO_BF16": 1, "MOMFMM_FAKE_NO_AVX512": 1, "OMP_NUM_THREADS": 2}),
    ("2 ranks", {}, 2, {}),
    ("2 ranks, ZeRO-1", {"dist.zero": 1}, 2, {}),
    ("2 ranks, no overlap", {"dist.overlap": False}, 2, {}),
    ("context parallel softmax", {"dist.context": 2}, 2, {}),
    ("context parallel fmm", {"dist.context": 2, "attention.kind": "fmm"}, 2, {}),
]


def check_case(momfmm, counter, workdir, report, name, overrides, np_, extra_env):
    short = counted_run(momfmm, counter, workdir, name, STEPS, overrides, np_, extra_env)
    long = counted_run(momfmm, counter, workdir, name, 2 * STEPS, overrides, np_, extra_env)
    for rank, (a, b) in enumerate(zip(map(calls, short), map(calls, long))):
        grew = sorted(site for site in set(a) | set(b) if a.get(site, 0) != b.get(site, 0))
        detail = "; ".join(f"{symbol(momfmm, site)}: {a.get(site, 0)} -> {b.get(site, 0)}" for site in grew[:8])
        report.check(f"{name}, process {rank}: no allocation grows with the steps ({STEPS} and {2 * STEPS} steps, "
                     f"{len(b)} sites, {sum(b.values())} calls)", not grew, detail)


@pytest.mark.parametrize("name,overrides,np_,extra_env", CASES, ids=[c[0].replace(" ", "_") for c in CASES])
def test_no_allocation_per_step(momfmm, counter, workdir, report, name, overrides, np_, extra_env):
    check_case(momfmm, counter, workdir, report, name, overrides, np_, extra_env)


def test_text_data(momfmm, counter, workdir, report):
    data = os.path.join(workdir, "corpus.txt")
    with open(data, "w") as f:
        f.write("".join(f"line {i}: the keys carry a little of their past.\n" for i in range(400)))
    overrides = {"model.vocab_size": 256, "data.task": "text", "data.path": data, "data.seq_len": 16}
    check_case(momfmm, counter, workdir, report, "text data", overrides, None, {})


def test_token_files(momfmm, counter, workdir, report):
    """The token files a text run reads (docs/tasks.md: nanoGPT's and llm.c's .bin, HDF5 tokens), and a
    separate eval file."""
    tokens = (np.arange(6000) * 37 % 500).astype(np.uint16)
    paths = {name: os.path.join(workdir, name) for name in ("nanogpt.bin", "llmc.bin", "tokens.h5")}
    tokens.tofile(paths["nanogpt.bin"])
    header = np.zeros(256, dtype=np.int32)
    header[:3] = 20240520, 1, len(tokens)  # llm.c's magic, version, token count
    with open(paths["llmc.bin"], "wb") as f:
        f.write(header.tobytes() + tokens.tobytes())
    with h5py.File(paths["tokens.h5"], "w") as f:
        f["tokens"] = tokens.astype(np.int32)
    text = {"model.vocab_size": 512, "data.task": "text", "data.seq_len": 16}
    for name, path in paths.items():
        check_case(momfmm, counter, workdir, report, name, {**text, "data.path": path}, None, {})
    check_case(momfmm, counter, workdir, report, "separate eval file",
               {**text, "data.path": paths["nanogpt.bin"], "data.eval_path": paths["llmc.bin"]}, None, {})


def test_own_engine(momfmm, counter, workdir, report):
    """momfmm's own fp32 product (train.gemm = avx512), where it runs (`momfmm --version`, 'avx512:')."""
    why = unavailable(momfmm, "avx512")
    if why:
        pytest.skip(f"train.gemm = avx512 cannot run here: {why}")
    check_case(momfmm, counter, workdir, report, "own avx512 engine", {"train.gemm": "avx512"}, None, {})


def probe_counts(momfmm, counter, workdir, turns):
    counts = os.path.join(workdir, f"probe-{turns}")
    shutil.rmtree(counts, ignore_errors=True)
    os.makedirs(counts)
    probe = os.path.join(os.path.dirname(momfmm), "alloc_counter_probe")
    r = run([probe, turns], timeout=60, env=env(LD_PRELOAD=counter, MOMFMM_ALLOC_COUNTS=counts))
    assert r.returncode == 0, r.stderr
    return read_counts(counts)[0]


def test_counter_sees_a_growing_site(momfmm, counter, workdir, report):
    """The counter itself: a loop that allocates once a turn (the probe
    beside momfmm) is seen at one site whose count follows the turns, and a
    training run's counts are charged to momfmm's sites, the same in two
    runs of the same length."""
    three, six = calls(probe_counts(momfmm, counter, workdir, 3)), calls(probe_counts(momfmm, counter, workdir, 6))
    grew = {site: (three.get(site, 0), n) for site, n in six.items() if three.get(site, 0) != n}
    report.check("the probe's loop: one site, 3 then 6 calls", list(grew.values()) == [(3, 6)], str(grew))
    a = calls(counted_run(momfmm, counter, workdir, "same", STEPS, {}, None, {})[0])
    b = calls(counted_run(momfmm, counter, workdir, "same-again", STEPS, {}, None, {})[0])
    report.check("a training run's calls are charged to momfmm's sites", sum(a.values()) > 10,
                 f"{sum(a.values())} calls at {len(a)} sites")
    report.check("two runs of the same length count the same", a == b)


# ---- Memory linear in T --------------------------------------------------
T = 2048  # and 2 * T: long enough that the huge pages' 2 MiB rounding is small beside the growth,
# and that a T x T buffer of bf16 at one site (8 MB, then 32) outgrows it
LINEAR_RATIO = 2.2
ROUNDING = 4 << 20  # a site's bytes may also grow by two huge pages

LINEAR_CASES = [
    ("tiled softmax", {}, None, {}),
    ("tiled softmax with momentum", {"momentum.gamma": 0.3, "momentum.learn_gamma": True}, None, {}),
    ("fmm", {"attention.kind": "fmm"}, None, {}),
    ("fmm, dense band", {"attention.kind": "fmm", "attention.impl": "dense"}, None, {}),
    ("fmm with momentum", {"attention.kind": "fmm", "momentum.gamma": 0.3}, None, {}),
    ("bf16 tiled softmax", {"train.precision": "bf16"}, None, {"MOMFMM_FORCE_BF16": 1}),
    ("bf16 fmm", {"train.precision": "bf16", "attention.kind": "fmm"}, None, {"MOMFMM_FORCE_BF16": 1}),
    ("recompute block", {"train.recompute": "block"}, None, {}),
    ("micro-batches", {"train.micro_batch": 1}, None, {}),
    ("context parallel softmax", {"dist.context": 2}, 2, {}),
    ("context parallel fmm", {"dist.context": 2, "attention.kind": "fmm"}, 2, {}),
]


def at_length(length, overrides):
    return {"data.seq_len": length, "model.max_seq_len": length, "train.batch_size": 2, "train.eval_batches": 1,
            **overrides}


def length_runs(momfmm, counter, workdir, name, overrides, np_, extra_env, length=T):
    return [counted_run(momfmm, counter, workdir, f"{name} T{t}", 1, at_length(t, overrides), np_, extra_env)
            for t in (length, 2 * length)]


@pytest.mark.parametrize("name,overrides,np_,extra_env", LINEAR_CASES, ids=[c[0].replace(" ", "_") for c in LINEAR_CASES])
def test_memory_linear_in_length(momfmm, counter, workdir, report, name, overrides, np_, extra_env):
    short, long = length_runs(momfmm, counter, workdir, name, overrides, np_, extra_env)
    for rank, (a, b) in enumerate(zip(short, long)):
        at_t, at_2t = total_bytes(without_tuning(momfmm, a)), total_bytes(without_tuning(momfmm, b))
        report.check(f"{name}, process {rank}: bytes asked for at T {2 * T} / at T {T} <= {LINEAR_RATIO}",
                     at_2t <= LINEAR_RATIO * at_t, f"{at_t / 1e6:.1f} -> {at_2t / 1e6:.1f} MB, {at_2t / at_t:.2f}x")
        steep = sorted((site for site in b if b[site][1] > LINEAR_RATIO * a.get(site, (0, 0, 0))[1] + ROUNDING),
                       key=lambda site: -b[site][1])
        detail = "; ".join(f"{symbol(momfmm, site)}: {a.get(site, (0, 0, 0))[1] / 1e6:.1f} -> {b[site][1] / 1e6:.1f} MB"
                           for site in steep[:5])
        report.check(f"{name}, process {rank}: no site's bytes grow faster than the length", not steep, detail)


def test_dense_softmax_is_seen_quadratic(momfmm, counter, workdir, report):
    """The check above can fail: dense softmax keeps the T x T probabilities (at half the length, whose
    3.5x is already past the line, in a third of the time)."""
    short, long = length_runs(momfmm, counter, workdir, "dense softmax", {"attention.impl": "dense"}, None, {},
                              length=T // 2)
    ratio = total_bytes(long[0]) / total_bytes(short[0])
    report.check(f"dense softmax: bytes at T {T} / at T {T // 2} > 3", ratio > 3, f"{ratio:.2f}x")
