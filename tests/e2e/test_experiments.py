"""The experiment suite cannot rot: every config of configs/experiments/ and every line of
its suite.list still loads and trains, and the tools that run it and report it still work.

One test per numbered item below (CTest entry e2e_experiments).

1. suite.list parses (unique names, readable configs, --set pairs) and covers what the issue
   asks: chain L = 10 and 30 with the gamma sweep and both ablations, copy at T = 128, 256,
   512 with the five attention variants, ListOps with three, text with four, several seeds;
   the seed-scale families: chain_seed at L = 10, 20, 30, 40 with gamma 0 and 0.2 (3 seeds,
   T holding eleven passes of the longest chain), the R runs at gamma 0, 0.1, 0.2, 0.3, and
   text_seed at gamma 0, 0.01, 0.05, 0.15, 0.3 (3 seeds); the chain recall families: a period per
   sample and the same with fillers at 1 and 2 layers, gamma 0 and 0.2, 3 seeds, the ablations,
   and the fixed L = 30 beside them, every one with the length eval.
2. Every suite line's overrides validate: `momfmm init CONFIG --set ... --out` (fast; the
   model is built and written, nothing trained); every *_full.ini too, with its first line.
3. A tiny version of every config file trains through tools/run_experiments.sh under mpirun
   (2 steps, batch 2, short sequences where the task allows; the model as configured), a
   rerun skips the finished runs, and --dry-run prints a command for every line.
4. jobs/experiments.sbatch runs one array task outside Slurm (SLURM_* set by hand) and skips
   it when resubmitted; its default --array matches the suite.
5. tools/momfmm_report.py --results over the tiny runs writes RESULTS.md with every family's table, the
   claims section, "not run" rows for the rest, and figures that exist; the "Reference scale" section
   renders from tiny seed-scale runs, and says "Not run yet" with the command when none exist; the
   "Chain recall" section renders from tiny recall runs.
6. Results digests (docs/design.md §8.8): --save-digests writes one per finished run, and the report
   from the digests alone, the run directories gone, is the same report.
Items 7 and 8 (stopping the runner, --init lines) are in test_experiment_runner.py.
momfmm_suite is the package's momfmm.results.suite (python/ on PYTHONPATH, set by CTest).
"""
import concurrent.futures
import glob
import os
import re
import sys
import time

import pytest

from momfmm.results import suite as momfmm_suite
from momfmm.results.errors import ReportError
from common import env, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = os.path.join(ROOT, "configs", "experiments", "suite.list")
RUNNER = os.path.join(ROOT, "tools", "run_experiments.sh")
REPORT = os.path.join(ROOT, "tools", "momfmm_report.py")
SBATCH = os.path.join(ROOT, "jobs", "experiments.sbatch")
PY = sys.executable
TINY = ["train.steps=2", "train.eval_interval=2", "train.eval_batches=1", "train.batch_size=2",
        "train.log_interval=1"]
# data.seq_len for the tiny runs where the task allows a short one (chain keeps its T: the
# chain of 30 tokens must repeat inside the sequence for L_rep to exist).
TINY_SEQ = {"copy": 32, "listops": 32, "listops_ft": 32, "text": 32, "text_seed": 32}
# listops_T2000.ini's (and listops_ft_T2000.ini's) expressions of 500..2000 tokens do not fit in 32
TINY_EXTRA = {k: ["data.listops_min_len=16", "data.listops_max_len=32"] for k in ("listops", "listops_ft")}
# The seed-scale chain runs of the tiny pass: two configurations x two seeds at L = 30 (mean ± std
# and computed claims) and two R runs (the R table over gamma).
TINY_SEED_CHAIN = r"^chain_seed_(L30_g0(\.2)?_s[12]|R_g0(\.2)?_s1)$"
# The recall runs of the tiny pass: gamma 0 vs 0.2 at 2 layers, two seeds (mean ± std, claims).
TINY_RECALL = r"^recall_varL_l2_g0(\.2)?_s[12]$"


def parse_suite(path):
    """The suite list through the report's own parser (momfmm.results.suite; one parser
    for both): ([(name, config, ["section.key=value", ...])], [problem])."""
    try:
        entries = momfmm_suite.parse_suite(path)
    except ReportError as e:
        return [], [str(e)]
    return [(e.name, e.config, [f"{k}={v}" for k, v in e.sets]) for e in entries], []


def family(config):
    return re.sub(r"(_T\d+|_L\d+)?(_full)?\.ini$", "", os.path.basename(config))


def setting(sets, key):
    for kv in sets:
        if kv.startswith(key + "="):
            return kv.split("=", 1)[1]
    return None


def check_coverage(report, lines):
    by_cfg = {}
    for name, config, sets in lines:
        by_cfg.setdefault(os.path.basename(config), []).append((name, sets))
    for L in (10, 30):
        rows = by_cfg.get(f"chain_L{L}.ini", [])
        plain = [s for _, s in rows if setting(s, "momentum.anchor") is None and setting(s, "momentum.placement") is None]
        gammas = {float(setting(s, "momentum.gamma") or 0) for s in plain}
        want = {0, 0.01, 0.05, 0.1, 0.15, 0.2, 0.3}
        report.check(f"suite: chain L={L} gamma sweep {sorted(want)}", want <= gammas, f"have {sorted(gammas)}")
        unanch = [s for _, s in rows if setting(s, "momentum.anchor") == "false" and setting(s, "momentum.gamma") == "0.2"]
        pre = [s for _, s in rows if setting(s, "momentum.placement") == "pre_rope" and setting(s, "momentum.gamma") == "0.2"]
        report.check(f"suite: chain L={L} ablations (anchor=false, pre_rope at gamma 0.2), several seeds each",
                     len(unanch) >= 2 and len(pre) >= 2, f"{len(unanch)} unanchored, {len(pre)} pre_rope lines")
        for g in ("0", "0.2"):
            seeds = {setting(s, "train.seed") for s in plain if setting(s, "momentum.gamma") == g}
            report.check(f"suite: chain L={L} gamma {g} has several seeds", len(seeds) >= 2, f"seeds {sorted(seeds)}")
    for T in (128, 256, 512):
        rows = by_cfg.get(f"copy_T{T}.ini", [])
        kinds = set()
        for _, s in rows:
            if setting(s, "attention.kind") != "fmm":
                kinds.add("softmax")
            elif setting(s, "fmm.bandwidth") == "0":
                kinds.add("linear")
            elif setting(s, "fmm.kernels") == "":
                kinds.add("band")
            else:
                kinds.add(f"fmm{len((setting(s, 'fmm.kernels') or 'elu').split(','))}")
        want = {"softmax", "linear", "band", "fmm1", "fmm2"}
        report.check(f"suite: copy T={T} has softmax, linear, band only, FMM 1 and 2 kernels", want <= kinds,
                     f"have {sorted(kinds)}")
    rows = by_cfg.get("listops.ini", [])
    variants = {(setting(s, "attention.kind"), setting(s, "momentum.gamma")) for _, s in rows}
    report.check("suite: ListOps softmax, FMM, momentum-FMM with several seeds",
                 {("softmax", None), ("fmm", None), ("fmm", "0.2")} <= variants and len(rows) >= 6,
                 f"{sorted(map(str, variants))}, {len(rows)} lines")
    rows = by_cfg.get("text.ini", [])
    variants = {(setting(s, "attention.kind"), setting(s, "momentum.gamma")) for _, s in rows}
    report.check("suite: text softmax, FMM, momentum, momentum-FMM with several seeds",
                 {("softmax", None), ("fmm", None), ("softmax", "0.2"), ("fmm", "0.2")} <= variants and len(rows) >= 8,
                 f"{sorted(map(str, variants))}, {len(rows)} lines")
    check_seed_scale_coverage(report, by_cfg)
    check_recall_coverage(report, by_cfg)
    check_listops_ft_coverage(report)


def check_listops_ft_coverage(report):
    """ListOps at T = 2000 from the short models: softmax, FMM and momentum-FMM x seeds 1..3,
    each starting from the listops.ini line of its variant and seed."""
    entries = {e.name: e for e in momfmm_suite.parse_suite(SUITE)}
    ft = [e for e in entries.values() if os.path.basename(e.config) == "listops_ft_T2000.ini"]
    have = {(momfmm_suite.attention_label(e), e.seed) for e in ft}
    report.check("suite: ListOps T = 2000 from the short models, 3 variants x seeds 1..3",
                 len(have) == 9 and len({lab for lab, _ in have}) == 3, f"{sorted(have)}")
    bad = [e.name for e in ft if e.init not in entries or os.path.basename(entries[e.init].config) != "listops.ini"
           or entries[e.init].key[1] != e.key[1] or entries[e.init].seed != e.seed]
    report.check("suite: each starts from the short-expression line of its variant and seed", ft and not bad,
                 ", ".join(bad[:3]))


def check_recall_coverage(report, by_cfg):
    """The chain recall families (configs/experiments/README.md, "Chain recall")."""
    for cfg in ("chain_recall.ini", "chain_recall_fillers.ini"):
        rows = by_cfg.get(cfg, [])
        plain = [s for _, s in rows if setting(s, "momentum.anchor") is None and setting(s, "momentum.placement") is None]
        have = {(setting(s, "model.n_layers"), setting(s, "momentum.gamma"), setting(s, "train.seed")) for s in plain}
        want = {(n, g, sd) for n in ("1", "2") for g in ("0", "0.2") for sd in ("1", "2", "3")}
        report.check(f"suite: {cfg} at 1 and 2 layers x gamma 0, 0.2 x seeds 1..3", want <= have,
                     f"missing {sorted(want - have)[:4]}")
        abl = {(setting(s, "momentum.anchor"), setting(s, "momentum.placement")) for _, s in rows} - {(None, None)}
        report.check(f"suite: {cfg} has both ablations", {("false", None), (None, "pre_rope")} <= abl, f"{abl}")
        cp = momfmm_suite.base_config(f"configs/experiments/{cfg}")
        report.check(f"{cfg}: a period per sample in [10, 40], the length eval outside it",
                     cp.get("data", "chain_len") == "10" and cp.get("data", "chain_len_max") == "40"
                     and int(cp.get("data", "eval_chain_len")) > 40)
    rows = by_cfg.get("chain_recall_fixedL.ini", [])
    have = {(setting(s, "momentum.gamma"), setting(s, "train.seed")) for _, s in rows}
    report.check("suite: the fixed L = 30 runs beside them, gamma 0, 0.2 x seeds 1..3",
                 {(g, sd) for g in ("0", "0.2") for sd in ("1", "2", "3")} <= have, f"{sorted(have)}")


def check_seed_scale_coverage(report, by_cfg):
    rows = by_cfg.get("chain_seed.ini", [])
    main = [(n, s) for n, s in rows if n.startswith("chain_seed_L")]
    have = {(setting(s, "data.chain_len"), setting(s, "momentum.gamma"), setting(s, "train.seed")) for _, s in main}
    want = {(L, g, s) for L in ("10", "20", "30", "40") for g in ("0", "0.2") for s in ("1", "2", "3")}
    report.check("suite: chain_seed L = 10, 20, 30, 40 x gamma 0, 0.2 x seeds 1..3", want <= have,
                 f"missing {sorted(want - have)[:4]}")
    cp = momfmm_suite.base_config("configs/experiments/chain_seed.ini")
    T = int(cp.get("data", "seq_len"))
    report.check("chain_seed.ini: T holds eleven passes of the longest chain (k bins up to 10)", T >= 11 * 40, f"T = {T}")
    r_gammas = {setting(s, "momentum.gamma") for n, s in rows if n.startswith("chain_seed_R_")}
    report.check("suite: chain_seed R runs at gamma 0, 0.1, 0.2, 0.3", {"0", "0.1", "0.2", "0.3"} <= r_gammas,
                 f"have {sorted(r_gammas)}")
    rows = by_cfg.get("text_seed.ini", [])
    have = {(setting(s, "momentum.gamma"), setting(s, "train.seed")) for _, s in rows}
    want = {(g, s) for g in ("0", "0.01", "0.05", "0.15", "0.3") for s in ("1", "2", "3")}
    report.check("suite: text_seed gamma 0, 0.01, 0.05, 0.15, 0.3 x seeds 1..3", want <= have,
                 f"missing {sorted(want - have)[:4]}")


def init_one(binary, config, sets, out):
    args = [binary, "init", os.path.join(ROOT, config), "--out", out]
    for kv in sets:
        args += ["--set", kv]
    r = run(args, timeout=120, cwd=ROOT)
    ok = r.returncode == 0 and os.path.exists(out)
    if os.path.exists(out):
        os.remove(out)
    tail = (r.stderr or r.stdout).strip().splitlines()
    return ok, ("" if ok else (tail[-1] if tail else f"exit {r.returncode}"))


@pytest.fixture(scope="module")
def suite():
    """The lines of configs/experiments/suite.list: [(name, config, sets)], [problems]."""
    return parse_suite(SUITE)


def test_suite_list(report, suite):
    """1. suite.list parses and covers what the issue asks."""
    lines, problems = suite
    report.check("suite.list parses, names unique", not problems and lines, "; ".join(problems[:3]))
    missing = sorted({c for _, c, _ in lines if not os.path.isfile(os.path.join(ROOT, c))})
    report.check("every suite config exists", not missing, ", ".join(missing))
    configs = sorted({c for _, c, _ in lines})
    no_full = [c for c in configs if not os.path.isfile(os.path.join(ROOT, c[:-4] + "_full.ini"))]
    report.check("every suite config has a cluster-size *_full.ini", not no_full, ", ".join(no_full))
    check_coverage(report, lines)
    text_cfg = open(os.path.join(ROOT, "configs", "experiments", "text.ini")).read()
    report.check("text.ini names its corpus's Debian package", "libpython3.11-stdlib" in text_cfg)


def test_init_validates(momfmm, workdir, report, suite):
    """2. every line's overrides validate (momfmm init), and every *_full.ini."""
    binary, work = momfmm, workdir
    lines, _ = suite
    configs = sorted({c for _, c, _ in lines})
    t0 = time.time()
    jobs = [(name, config, sets) for name, config, sets in lines]
    first = {}
    for name, config, sets in lines:
        first.setdefault(config, sets)
    fulls = [(os.path.basename(c)[:-4] + "_full", c[:-4] + "_full.ini", first[c]) for c in configs
             if os.path.isfile(os.path.join(ROOT, c[:-4] + "_full.ini"))]
    os.makedirs(os.path.join(work, "init"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {pool.submit(init_one, binary, c, s, os.path.join(work, "init", f"{n}.h5")): n for n, c, s in
                   jobs + fulls}
        results = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
    bad = [(n, results[n][1]) for n, _, _ in jobs if not results[n][0]]
    report.check(f"momfmm init validates all {len(jobs)} suite lines", not bad,
                 "; ".join(f"{n}: {m}" for n, m in bad[:3]))
    bad = [(n, results[n][1]) for n, _, _ in fulls if not results[n][0]]
    report.check(f"momfmm init validates all {len(fulls)} *_full.ini (with their first suite line)", not bad,
                 "; ".join(f"{n}: {m}" for n, m in bad[:3]))
    print(f"  .. init checks {time.time() - t0:.1f} s", flush=True)


@pytest.fixture(scope="module")
def tiny_runs(momfmm, workdir, suite):
    """3. tiny training of every config file through the runner: (runs directory,
    chosen names, {family: names}, {family: (ok, output)})."""
    binary, work = momfmm, workdir
    lines, _ = suite
    t0 = time.time()
    runs = os.path.join(work, "runs")
    picked = {}
    for name, config, sets in lines:
        picked.setdefault(config, []).append(name)
    chosen = []
    for config, names in picked.items():
        if os.path.basename(config) == "chain_L30.ini":
            # two configurations x two seeds: the report's mean ± std and a computed claim
            want = [n for n in names if re.match(r"^chain_L30_g0(\.2)?_s[12]$", n)]
            chosen += want or names[:1]
        elif os.path.basename(config) == "chain_seed.ini":
            chosen += [n for n in names if re.match(TINY_SEED_CHAIN, n)] or names[:1]
        elif os.path.basename(config) == "chain_recall.ini":
            chosen += [n for n in names if re.match(TINY_RECALL, n)] or names[:1]
        elif os.path.basename(config) == "text_seed.ini":
            chosen += [n for n in names if re.match(r"^text_seed_g0(\.01)?_s1$", n)] or names[:1]
        else:
            chosen.append(names[0])
    by_family = {}
    for name, config, _ in lines:
        if name in chosen:
            by_family.setdefault(family(config), []).append(name)
    results = {}
    for fam, names in sorted(by_family.items()):
        extra = []
        for kv in TINY + ([f"data.seq_len={TINY_SEQ[fam]}"] if fam in TINY_SEQ else []) + TINY_EXTRA.get(fam, []):
            extra += ["--set", kv]
        only = "^(" + "|".join(re.escape(n) for n in names) + ")$"
        r = run(["bash", RUNNER, "--np", "2", "--runs", runs, "--momfmm", binary, "--only", only] + extra,
                timeout=300)
        ok = r.returncode == 0 and all(os.path.exists(os.path.join(runs, n, "ckpt_00000002.h5")) and
                                       os.path.exists(os.path.join(runs, n, "metrics.h5")) and
                                       os.path.exists(os.path.join(runs, n, "train.log")) for n in names)
        results[fam] = (ok, (r.stdout + r.stderr)[-600:] if not ok else "")
    print(f"  .. tiny training {time.time() - t0:.1f} s", flush=True)
    return runs, chosen, by_family, results


def test_tiny_runs(momfmm, report, suite, tiny_runs):
    """3. the tiny runs trained, a rerun skips, --dry-run lists every line."""
    binary = momfmm
    lines, _ = suite
    runs, chosen, by_family, results = tiny_runs
    ok_all = True
    for fam, names in sorted(by_family.items()):
        ok, detail = results[fam]
        ok_all &= ok
        report.check(f"tiny run of {fam}: {', '.join(names)}", ok, detail)
    if ok_all:
        name = chosen[0]
        fam = [f for f, ns in by_family.items() if name in ns][0]
        extra = []
        for kv in TINY + ([f"data.seq_len={TINY_SEQ[fam]}"] if fam in TINY_SEQ else []) + TINY_EXTRA.get(fam, []):
            extra += ["--set", kv]
        r = run(["bash", RUNNER, "--np", "2", "--runs", runs, "--momfmm", binary, "--only", f"^{re.escape(name)}$"]
                + extra, timeout=120)
        report.check("run_experiments.sh skips a run whose final checkpoint exists",
                     r.returncode == 0 and "skipped" in r.stdout, r.stdout + r.stderr)
    r = run(["bash", RUNNER, "--dry-run", "--momfmm", binary], timeout=60)
    cmds = [c for c in r.stdout.splitlines() if c.startswith("mpirun")]
    report.check("run_experiments.sh --dry-run prints one mpirun command per suite line",
                 r.returncode == 0 and len(cmds) == len(lines) and all(
                     ("--resume auto" in c or "--init runs/experiments/" in c) and "train.out_dir=runs/experiments/" in c
                     for c in cmds),
                 f"{len(cmds)} commands for {len(lines)} lines")
    r = run(["bash", RUNNER, "--only", "no-such-run"], timeout=60)
    report.check("run_experiments.sh --only matching nothing exits 2", r.returncode == 2, r.stderr.strip())
    r = run(["bash", RUNNER, "--list", "--only", "chain_(L10"], timeout=60)
    report.check("run_experiments.sh --only with a pattern grep -E cannot read: exit 2, one line naming it",
                 r.returncode == 2 and r.stderr.count("\n") == 1 and "--only 'chain_(L10'" in r.stderr
                 and not r.stdout, r.stderr.strip())


def test_sbatch(momfmm, workdir, report, suite):
    """4. the Slurm array script, one task, outside Slurm."""
    binary, work = momfmm, workdir
    lines, _ = suite
    t0 = time.time()
    r = run(["bash", "-n", SBATCH])
    report.check("jobs/experiments.sbatch: bash -n", r.returncode == 0, r.stderr)
    m = re.search(r"^#SBATCH --array=0-(\d+)", open(SBATCH).read(), re.M)
    report.check("jobs/experiments.sbatch: default --array covers every suite line",
                 m is not None and int(m.group(1)) == len(lines) - 1,
                 f"--array=0-{m.group(1) if m else '?'} for {len(lines)} lines")
    tiny_suite = os.path.join(work, "tiny_suite.list")
    name0, config0, sets0 = [ln for ln in lines if family(ln[1]) == "copy"][0]
    with open(tiny_suite, "w") as f:
        f.write("# one tiny line\n" + " ".join([name0, config0] + [f"--set {kv}" for kv in sets0 + TINY +
                                                                     ["data.seq_len=32"]]) + "\n")
    sb_runs = os.path.join(work, "sbatch_runs")
    e = env(SLURM_JOB_ID=4242, SLURM_ARRAY_JOB_ID=4242, SLURM_ARRAY_TASK_ID=0, SLURM_JOB_NAME="exp-test",
            SLURM_SUBMIT_DIR=ROOT, MOMFMM_SUITE=tiny_suite, MOMFMM_RUNS=sb_runs, MOMFMM=binary,
            MPIRUN_FLAGS="-np 2 --oversubscribe", MOMFMM_REQUEUE=0)
    r = run(["bash", SBATCH], env=e, timeout=120, cwd=work)
    ok = r.returncode == 0 and os.path.exists(os.path.join(sb_runs, name0, "ckpt_00000002.h5"))
    report.check("experiments.sbatch: array task 0 trains its suite line", ok, (r.stdout + r.stderr)[-600:])
    r = run(["bash", SBATCH], env=e, timeout=60, cwd=work)
    report.check("experiments.sbatch: a finished task exits 0 without training",
                 r.returncode == 0 and "nothing to do" in r.stdout, (r.stdout + r.stderr)[-400:])
    e["SLURM_ARRAY_TASK_ID"] = "1"
    r = run(["bash", SBATCH], env=e, timeout=60, cwd=work)
    report.check("experiments.sbatch: a task without a line exits 2 naming the right --array",
                 r.returncode == 2 and "--array=0-0" in r.stderr, r.stderr.strip())
    print(f"  .. sbatch {time.time() - t0:.1f} s", flush=True)


def test_results_report(momfmm, workdir, report, suite, tiny_runs):
    """5. RESULTS.md from the tiny runs."""
    work = workdir
    lines, _ = suite
    runs = tiny_runs[0]
    t0 = time.time()
    out = os.path.join(work, "RESULTS.md")
    figs = os.path.join(work, "figures")
    r = run([PY, REPORT, "--results", "--runs", runs, "--out", out, "--figures", figs], timeout=300, cwd=ROOT)
    report.check("momfmm_report.py --results writes RESULTS.md from partial results", r.returncode == 0 and os.path.exists(out),
                 (r.stdout + r.stderr)[-800:])
    print(f"  .. results report {time.time() - t0:.1f} s", flush=True)
    text = open(out).read() if os.path.exists(out) else ""
    for heading in ("## Claims: held or not", "### Chain task, L = 10", "### Chain task, L = 30",
                    "### Copy task", "T = 128", "T = 256", "T = 512", "### ListOps", "### Text",
                    "## Commands of every run"):
        report.check(f"RESULTS.md has '{heading}'", heading in text)
    report.check("RESULTS.md shows the reference's L=30 numbers beside ours",
                 all(v in text for v in ("1.7451", "0.8288", "6.9860", "7.0202", "4.6262", "5.7893", "1.2785", "1.2262")))
    report.check("RESULTS.md marks missing runs 'not run'", "| not run |" in text)
    build = run([momfmm, "--version"], timeout=30).stdout.splitlines()[:1]
    report.check("RESULTS.md names the build that wrote the runs, with their count",
                 bool(build) and re.search(r"Builds that wrote the runs' checkpoints: " + re.escape(build[0])
                                           + r" \(\d+ runs\)\.", text) is not None,
                 (re.search(r"Builds that wrote[^.]*\.", text) or [text[:300]])[0] if text else "")
    row = re.search(r"^\| momentum γ=0\.2 \| 2/3 \|.*$", text, re.M)
    report.check("RESULTS.md aggregates two seeds (mean ± std) in the L=30 momentum row",
                 row is not None and "±" in row.group(0), row.group(0) if row else "row not found")
    claim = re.search(r"^- γ=0\.2 lowers L_rep at L=30.*$", text, re.M)
    report.check("the L=30 L_rep claim is computed from the numbers",
                 claim is not None and any(v in claim.group(0) for v in ("**held**", "**did not hold**", "**not shown**")),
                 claim.group(0) if claim else "claim line not found")
    report.check("every suite line's command is listed", all(f"train.out_dir={runs}/{n} " in text for n, _, _ in lines))
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    dangling = [p for p in links if not os.path.exists(os.path.join(work, p))]
    report.check("RESULTS.md links figures that exist", links and not dangling,
                 f"{len(links)} links, dangling: {dangling[:3]}")
    report.check("RESULTS.md links momfmm_plot.py's accuracy (copy, ListOps) and bits-per-byte (text) figures",
                 all(any(p.endswith(f) for p in links) for f in ("copy_T128/acc.png", "listops/acc.png", "text/bpb.png")),
                 f"{links}")
    report.check("RESULTS.md has L_rep during training for L=10 and L=30",
                 all(f"**L_rep during training, L = {L}**" in text for L in (10, 30)))
    report.check("figures per family", all(glob.glob(os.path.join(figs, d, "*.png")) for d in
                                           ("chain_L10_main", "chain_L30_main", "copy_T128", "copy_T256",
                                            "copy_T512", "listops", "text")))
    check_reference_scale_section(report, text, figs)
    check_recall_section(report, text, figs)


def check_recall_section(report, text, figs):
    """5. the "Chain recall" section from the tiny recall runs."""
    section = text.split("## Chain recall", 1)[-1].split("## Commands of every run", 1)[0] if "## Chain recall" in text \
        else ""
    report.check("RESULTS.md has the 'Chain recall' section with its three tasks",
                 all(h in section for h in ("### Chain recall, a period per sample:", "with fillers",
                                            "### The old task beside them")))
    report.check("recall: the section says how many of its runs finished", re.search(r"\*\*\d+ of \d+ runs finished\*\*",
                                                                                    section) is not None)
    row = re.search(r"^\| 2 \| momentum γ=0\.2 \| 2/3 \|.*$", section, re.M)
    report.check("recall: the 2-layer momentum row is a mean ± std over two seeds, with lengen L_rep",
                 row is not None and "±" in row.group(0), row.group(0)[:200] if row else "row not found")
    report.check("recall: rows not run yet say so", "| 1 | baseline γ=0 | not run |" in section)
    line = re.search(r"^- recall, variable L, 2 layers: γ=0\.2 raises Δ1→2.*$", text, re.M)
    report.check("recall claim judged: γ=0.2 raises Δ1→2 at 2 layers",
                 line is not None and any(v in line.group(0) for v in ("**held**", "**did not hold**", "**not shown**")),
                 line.group(0)[:200] if line else "claim line not found")
    line = re.search(r"^- recall, fillers, 1 layer: γ=0\.2 lowers L_rep at L=30.*$", text, re.M)
    report.check("recall claim without runs: not run", line is not None and "not run" in line.group(0),
                 line.group(0)[:200] if line else "claim line not found")
    report.check("recall figures exist, the attention read-out among them",
                 all(os.path.exists(os.path.join(figs, "chain_recall", f)) for f in
                     ("varL_l2/l_new_l_rep.png", "varL_l2/lengen.png", "varL_l2_attention/attention.png")))


def check_reference_scale_section(report, text, figs):
    """5. the "Reference scale" section from the tiny seed-scale runs."""
    section = (text.split("## Reference scale", 1)[-1].split("## Commands of every run", 1)[0]
               if "## Reference scale" in text else "")
    report.check("RESULTS.md has the 'Reference scale' section with its three parts",
                 all(h in section for h in ("### Chain task at reference scale", "### Energy ratio R",
                                            "### Text at reference scale")))
    report.check("seed scale: the reference's L = 30 loss-by-k and L_rep-improvement numbers beside ours",
                 all(v in section for v in ("2.3598", "1.2309", "1.5645", "0.6515", "1.4266", "0.5334", "52.5", "4.1")))
    row = re.search(r"^\| 30 \| momentum γ=0\.2 \| 2/3 \|.*$", section, re.M)
    report.check("seed scale: the L = 30 momentum row is a mean ± std over two seeds",
                 row is not None and "±" in row.group(0), row.group(0) if row else "row not found")
    row = re.search(r"^\| 0\.2 \| 1/1.*$", section, re.M)
    report.check("seed scale: the R table has gain_R and gain_R_attn per layer for gamma 0.2",
                 "gain_R_attn layer 1" in section and row is not None and
                 re.match(r"^\| 0\.2 \| 1/1[^|]* \| \d+ \| fp32 \| [0-9.]+ \|", row.group(0)) is not None,
                 row.group(0)[:200] if row else "row not found")
    spread = section.split("**R with seed spread", 1)[-1].split("###", 1)[0]
    row = re.search(r"^\| 0\.2 \| 2/3 \|.*$", spread, re.M)
    report.check("seed scale: R with seed spread from the L = 30 chain runs, mean ± std per layer",
                 "**R with seed spread" in section and row is not None and row.group(0).count("±") == 4,
                 row.group(0)[:200] if row else "row not found")
    report.check("seed scale: the R table with seed spread follows the R family's table",
                 section.find("**R with seed spread") > section.find("### Energy ratio R"))
    report.check("seed scale: each row says its precision, and the opening says fp32 throughout",
                 re.search(r"^\| 30 \| momentum γ=0\.2 \| 2/3 \| \d+ \| fp32 \|", section, re.M) is not None
                 and "fp32 in every run" in section)
    report.check("seed scale: the L_rep improvement table has a number at L = 30, in % and in nats, beside the reference's",
                 re.search(r"^\| 30 \| -?[0-9.]+( ± [0-9.]+)? \| 2 \| 52\.5 \| -?[0-9.]+( ± [0-9.]+)? \| 0\.9163 \|$",
                           section, re.M) is not None)
    for claim in ("γ=0.2 lowers L_rep at L=30", "R does not depend on γ (gain_R_attn", "text: γ=0.01 does not degrade",
                  "R does not depend on γ, against seed noise (gain_R_attn"):
        line = re.search(r"^- reference scale: " + re.escape(claim) + ".*$", text, re.M)
        report.check(f"seed-scale claim judged: {claim}",
                     line is not None and any(v in line.group(0) for v in ("**held**", "**did not hold**", "**not shown**")),
                     line.group(0)[:200] if line else "claim line not found")
    report.check("seed-scale figures exist", all(os.path.exists(os.path.join(figs, "reference_scale", f)) for f in
                                                 ("l_rep_improvement.png", "l_rep_difference.png", "energy_ratio.png", "text_bpb_vs_gamma.png",
                                                  "chain_L30/l_new_l_rep.png", "chain_L30/loss_by_k.png")))
    report.check("seed scale: L_rep at each eval step at L = 30, and at how many γ=0.2 is ahead",
                 "**L_rep during training, L = 30**" in section
                 and re.search(r"^- reference scale: L_rep during training at L=30: γ=0\.2 is below γ=0 at \d+ of \d+ eval steps",
                               text, re.M) is not None)
    line = re.search(r"^- reference scale: the advantage grows with L.*$", text, re.M)
    report.check("seed-scale claim listed: the advantage grows with L (larger and positive at L=30; the tiny "
                 "runs have no L = 10, tests/python/test_claims.py judges the rule)",
                 line is not None and "and positive" in line.group(0),
                 line.group(0)[:200] if line else "claim line not found")
    report.check("seed scale links its L = 30 training curves and loss by k",
                 all(f"reference_scale/chain_L30/{f})" in section for f in ("l_new_l_rep.png", "loss_by_k.png")))


def test_seed_scale_not_run(workdir, report):
    """5. without seed-scale runs the section says "Not run yet" with the command of each family."""
    empty = os.path.join(workdir, "no_runs")
    os.makedirs(empty, exist_ok=True)
    r = run([PY, REPORT, "--results", "--runs", empty, "--allow-empty", "--no-figures"], timeout=120, cwd=ROOT)
    text = r.stdout
    report.check("seed scale without runs: 'Not run yet' with the command, per family",
                 r.returncode == 0 and all(f"**Not run yet.** Run: `tools/run_experiments.sh --runs {empty} --only '{p}'`"
                                           in text for p in ("^chain_seed_L", "^chain_seed_R_", "^text_seed_")),
                 (r.stderr or text)[-400:])


def test_seed_scale_no_eval_yet(momfmm, workdir, report):
    """5. a run without an eval yet (stopped before its first, or, as here, with
    train.eval_interval = 0) reads "no eval yet", not "—" (no target with that k) and not an
    observation over 0 eval steps."""
    runs = os.path.join(workdir, "no_eval_runs")
    sets = [kv for kv in TINY if not kv.startswith("train.eval_interval=")] + ["train.eval_interval=0"]
    extra = [a for kv in sets for a in ("--set", kv)]
    r = run(["bash", RUNNER, "--np", "2", "--runs", runs, "--momfmm", momfmm,
             "--only", r"^chain_seed_L30_g0_s1$"] + extra, timeout=300)
    report.check("a 2-step seed-scale run without evals trains", r.returncode == 0, (r.stdout + r.stderr)[-600:])
    r = run([PY, REPORT, "--results", "--runs", runs, "--no-figures"], timeout=120, cwd=ROOT)
    text = r.stdout
    row = re.search(r"^\| 30 \| baseline γ=0 \| 1/3 \|.*$", text, re.M)
    report.check("seed scale: a run without an eval shows 'no eval yet'",
                 r.returncode == 0 and row is not None and "| no eval yet |" in row.group(0),
                 row.group(0)[:300] if row else (r.stderr or text)[-400:])
    report.check("loss-by-k of that run says 'no eval yet'", re.search(r"^\| γ=0 \| no eval yet \|", text, re.M) is not None)
    report.check("no observation over 0 eval steps", "at 0 of 0 eval steps" not in text)


def report_lines(path):
    """A report's lines but its source line ("Generated by ... from ..., date, commit")."""
    with open(path) as f:
        return [ln for ln in f.read().splitlines() if not ln.startswith("Generated by")]


def test_results_from_digests(workdir, report, tiny_runs):
    """6. --save-digests writes one results digest per finished run; with the run directories
    gone (another machine), the report from the digests alone is the report from the runs, but for
    its source line; a corrupt digest is named in a warning and its run reads "not run"."""
    runs, chosen = tiny_runs[0], tiny_runs[1]
    digests = os.path.join(workdir, "digests")
    out = os.path.join(workdir, "digests_report.md")  # one --out for both: the report names it
    base = [PY, REPORT, "--results", "--runs", runs, "--digests", digests, "--no-figures", "--out", out]
    r = run(base + ["--save-digests"], timeout=300, cwd=ROOT)
    from_runs = report_lines(out) if os.path.exists(out) else None
    saved = sorted(os.path.basename(p)[:-len(".json")] for p in glob.glob(os.path.join(digests, "*.json")))
    report.check("--save-digests writes a digest of every finished run",
                 r.returncode == 0 and saved == sorted(chosen) and f"saved {len(chosen)} results digests" in r.stderr,
                 f"{saved} vs {sorted(chosen)}: {r.stderr[-300:]}")
    away = runs + ".elsewhere"
    os.rename(runs, away)
    os.makedirs(runs)
    try:
        os.remove(out)
        r = run(base, timeout=300, cwd=ROOT)
        with open(os.path.join(digests, chosen[0] + ".json"), "w") as f:
            f.write('{"format": "momfmm-run-digest", "version": 1, "step": -3')  # cut short
        bad = run(base[:-2], timeout=300, cwd=ROOT)
    finally:
        os.rmdir(runs)
        os.rename(away, runs)
    same = r.returncode == 0 and os.path.exists(out) and report_lines(out) == from_runs
    report.check("the report from the digests alone equals the report from the runs", same,
                 (r.stdout + r.stderr)[-400:])
    text = open(out).read() if os.path.exists(out) else ""
    report.check("the report says how many runs came from digests",
                 f"and {len(chosen)} results digests in `{digests}`" in text, text[:400])
    report.check("a corrupt digest: a warning naming the file, its run 'not run', exit 0",
                 bad.returncode == 0 and f"{chosen[0]}.json: not a readable digest" in bad.stderr
                 and f"results: {len(chosen) - 1} finished" in bad.stderr, bad.stderr[-400:])
