#!/usr/bin/python3
"""Command-line behaviour of the analysis tools and the sweep scripts (docs/design.md §8.8),
without the momfmm binary: runs are small checkpoints written with h5py in the layout of
docs/files.md §4, mpirun is a stand-in script on PATH.

    PYTHONPATH=python /usr/bin/python3 -m pytest tests/python/test_tools_cli.py

1. tools/momfmm_report.py --results writes to stdout unless --out FILE: the source tree's
   RESULTS.md and figures/ stay as they are; with --out the report and its figures go there;
   with no run of the suite it refuses (exit 2, one line) unless --allow-empty; --help lists
   --results and its options; its figure links are the same with --no-figures.
2. --group-by KEY gives one row per value of KEY; --average-over KEY merges runs differing
   only in KEY.
3. Numbers print in their shortest round-trip form: 0.2, not 0.20000000000000001.
4. One override syntax, `--set section.key=value`, in suite lines (tools/run_experiments.sh,
   momfmm.results.suite) and sweep lines (jobs/sweep.sbatch, jobs/sweeps/*.txt); the old bare k=v is
   refused with a message.
5. run_experiments.sh's "next" command names the suite, the runs and an --out in the run
   directory; Slurm's .out files go under runs/ (gitignored), not the submit directory.
"""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from checkpoints import write_checkpoint

from momfmm import fmt
from momfmm.results import suite
from momfmm.results.errors import ReportError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PYTHON = "/usr/bin/python3"
REPORT = os.path.join(ROOT, "tools", "momfmm_report.py")
RUNNER = os.path.join(ROOT, "tools", "run_experiments.sh")
SWEEP = os.path.join(ROOT, "jobs", "sweep.sbatch")
CHAIN_CONFIG = "configs/experiments/chain_L10.ini"


def run(args, cwd=None, env=None, timeout=120):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def config_ini(gamma="0", seed="1", steps=4):
    """The INI text the checkpoint stores; gamma as written, e.g. %.17g's 0.20000000000000001."""
    return (f"[model]\nn_layers = 1\nn_heads = 2\nd_model = 8\n\n[attention]\nkind = softmax\n\n"
            f"[momentum]\ngamma = {gamma}\n\n[data]\ntask = chain\n\n"
            f"[train]\nsteps = {steps}\nseed = {seed}\nout_dir = x\n")


def write_run(run_dir, gamma="0", seed="1", l_rep=1.0, steps=4):
    """A run directory holding one checkpoint (docs/files.md §4) at its final step, with two
    eval rows whose last L_rep is l_rep."""
    os.makedirs(run_dir, exist_ok=True)
    train = {"step": np.arange(1, steps + 1), "loss": np.linspace(4.0, 3.0, steps), "lr": np.full(steps, 1e-3),
             "tokens_per_s": np.full(steps, 1000.0)}
    evals = {"step": [2, steps]}
    for name, last in (("loss", 2.5), ("L_new", 4.0), ("L_rep", l_rep), ("delta_12", 0.5), ("acc", 0.3)):
        evals[name] = [last + 1.0, last]
    write_checkpoint(os.path.join(run_dir, f"ckpt_{steps:08d}.h5"), config_ini(gamma, seed, steps), steps,
                     train, evals, attrs={"world_size": np.int32(2)})
    return run_dir


def parse_table(text):
    """The first Markdown table of text -> (header, [{column: cell}])."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    split = lambda ln: [c.strip() for c in ln.strip("|").split(" | ")]  # noqa: E731
    header = split(lines[0])
    return header, [dict(zip(header, split(ln))) for ln in lines[2:]]


@pytest.fixture
def tree(tmp_path):
    """A copy of the parts of the source tree the report reads (python/, tools/, configs/)
    with a RESULTS.md and a figures/ directory that must stay untouched."""
    copy = tmp_path / "tree"
    for part in ("python", "tools", "configs"):
        shutil.copytree(os.path.join(ROOT, part), copy / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "RESULTS.md").write_text("committed results\n")
    (copy / "figures").mkdir()
    (copy / "figures" / "keep.png").write_bytes(b"png")
    os.utime(copy / "RESULTS.md", (1_000_000_000, 1_000_000_000))
    return copy


def snapshot(directory):
    """{relative path: (size, mtime)} of every file under directory, __pycache__ aside."""
    out = {}
    for base, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            st = os.stat(os.path.join(base, name))
            out[os.path.relpath(os.path.join(base, name), directory)] = (st.st_size, st.st_mtime_ns)
    return out


def one_line_suite(path, name="chain_L10_g0_s1"):
    path.write_text(f"# one line\n{name} {CHAIN_CONFIG} --set momentum.gamma=0 --set train.seed=1 "
                    "--set train.steps=4\n")
    return str(path)


# ---------------------------------------------------------------- 1. --results
def test_help_lists_results_and_its_options():
    r = run([PYTHON, REPORT, "--help"])
    assert r.returncode == 0, r.stderr
    for option in ("--results", "--runs", "--suite", "--out", "--figures", "--no-figures",
                   "--allow-empty", "--group-by", "--average-over"):
        assert option in r.stdout, option


def test_results_without_out_writes_stdout_and_leaves_the_tree(tree, tmp_path):
    runs = tmp_path / "runs"
    write_run(str(runs / "chain_L10_g0_s1"))
    before = snapshot(tree)
    r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(runs)],
            cwd=tree)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# RESULTS"), r.stdout[:200]
    assert "1 finished" in r.stdout or "1 partial" in r.stdout
    assert (tree / "RESULTS.md").read_text() == "committed results\n"
    assert snapshot(tree) == before
    assert sorted(os.listdir(runs)) == ["chain_L10_g0_s1"]  # nothing written beside the runs


def test_results_with_out_writes_there_with_figures_beside(tree, tmp_path):
    runs = tmp_path / "runs"
    write_run(str(runs / "chain_L10_g0_s1"))
    before = snapshot(tree)
    out = tmp_path / "report" / "R.md"
    r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(runs),
             "--out", str(out)], cwd=tree)
    assert r.returncode == 0, r.stderr
    assert snapshot(tree) == before
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links, "the chain run has figures"
    for link in links:
        assert link.startswith("figures/"), link
        assert (out.parent / link).is_file(), link
    # The command that writes the report again names --runs and --out.
    assert f"--runs {runs}" in text and f"--out {out}" in text


def test_results_with_out_results_md_rewrites_it(tree, tmp_path):
    runs = tmp_path / "runs"
    write_run(str(runs / "chain_L10_g0_s1"))
    r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(runs),
             "--out", "RESULTS.md", "--no-figures"], cwd=tree)
    assert r.returncode == 0, r.stderr
    assert (tree / "RESULTS.md").read_text().startswith("# RESULTS")
    assert sorted(os.listdir(tree / "figures")) == ["keep.png"]


def test_results_refuses_an_empty_suite(tree, tmp_path):
    before = snapshot(tree)
    out = tmp_path / "R.md"
    for runs in (tmp_path / "no_such_dir", tmp_path):
        r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(runs),
                 "--out", str(out)], cwd=tree)
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1 and "--allow-empty" in r.stderr, r.stderr
        assert r.stdout == "" and not out.exists()
    r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(tmp_path),
             "--allow-empty"], cwd=tree)
    n_lines = len(suite.parse_suite(str(tree / "configs" / "experiments" / "suite.list")))
    assert r.returncode == 0 and f"0 finished, 0 partial, {n_lines} not run" in r.stdout
    assert snapshot(tree) == before


def test_results_takes_the_suite(tmp_path):
    runs = tmp_path / "runs"
    write_run(str(runs / "mine"))
    suite_file = one_line_suite(tmp_path / "mine.list", "mine")
    r = run([PYTHON, REPORT, "--results", "--runs", str(runs), "--suite", suite_file])
    assert r.returncode == 0, r.stderr
    assert "1 runs: 1 finished" in r.stdout
    # in the rerun and reproduce commands: relative to the repository root when the
    # suite lies inside it (a build tree in the source tree), else absolute
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shown = os.path.relpath(suite_file, root) if os.path.abspath(suite_file).startswith(root + os.sep) else suite_file
    assert f"--suite {shown}" in r.stdout


def test_modes_do_not_mix(tmp_path):
    r = run([PYTHON, REPORT, "--results", "--group-by", "train.seed"])
    assert r.returncode == 2 and "--group-by" in r.stderr
    r = run([PYTHON, REPORT, str(tmp_path), "--runs", str(tmp_path)])
    assert r.returncode == 2 and "--runs is an option of --results" in r.stderr
    r = run([PYTHON, REPORT])
    assert r.returncode == 2


def test_results_refuses_a_value_beside_its_off_switch(tmp_path):
    """--figures DIR with --no-figures, --digests DIR with --no-digests: exit 2 naming both, before
    anything is read or written (the value would otherwise be ignored without a word)."""
    for value, off in (("--figures", "--no-figures"), ("--digests", "--no-digests")):
        where = tmp_path / value.strip("-")
        r = run([PYTHON, REPORT, "--results", "--runs", str(tmp_path), "--allow-empty", value, str(where), off])
        assert r.returncode == 2 and f"{value} {where} and {off} contradict each other" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2 and not where.exists()


def test_figure_links_do_not_depend_on_writing_figures(tree, tmp_path):
    """RESULTS.md links the same figures whether it writes them or not (momfmm.plot's
    planned_figures is what write_figures writes)."""
    runs = tmp_path / "runs"
    write_run(str(runs / "chain_L10_g0_s1"))
    texts = []
    for extra in ([], ["--no-figures"]):
        out = tmp_path / ("with" if not extra else "without") / "R.md"
        r = run([PYTHON, str(tree / "tools" / "momfmm_report.py"), "--results", "--runs", str(runs),
                 "--out", str(out)] + extra, cwd=tree)
        assert r.returncode == 0, r.stderr
        texts.append(out.read_text().replace(str(out), "OUT"))
    assert texts[0] == texts[1]
    assert not (tmp_path / "without" / "figures").exists()
    from momfmm import plot, rundir
    for eval_keys in (None, ("loss",)):
        d = write_run(str(tmp_path / f"plot_{bool(eval_keys)}"), gamma="0.2")
        run_ = rundir.load_run(d)
        if eval_keys:
            run_.eval = {k: v for k, v in run_.eval.items() if k in eval_keys + ("step",)}
        written = plot.write_figures([run_], str(tmp_path / "figs" / os.path.basename(d)))
        assert sorted(os.path.basename(p) for p in written) == sorted(plot.planned_figures([run_]))


# ---------------------------------------------------------------- 2. --group-by, --average-over
@pytest.fixture
def four_runs(tmp_path):
    """γ ∈ {0, 0.2} × seed ∈ {1, 2}; the config stores γ = 0.2 as %.17g does."""
    dirs, l_rep = [], {("0", "1"): 1.0, ("0", "2"): 2.0,
                       ("0.20000000000000001", "1"): 3.0, ("0.20000000000000001", "2"): 5.0}
    for (gamma, seed), value in l_rep.items():
        name = f"g{'0.2' if gamma != '0' else '0'}_s{seed}"
        dirs.append(write_run(str(tmp_path / name), gamma=gamma, seed=seed, l_rep=value))
    return dirs


def table(*args):
    r = run([PYTHON, REPORT, *args])
    assert r.returncode == 0, r.stderr
    return parse_table(r.stdout)


def test_group_by_keeps_one_row_per_value(four_runs):
    header, rows = table(*four_runs, "--group-by", "momentum.gamma", "--metrics", "L_rep")
    assert header[:3] == ["momentum.gamma", "n", "runs"]
    assert [row["momentum.gamma"] for row in rows] == ["0", "0.2"]
    assert [row["n"] for row in rows] == ["2", "2"]
    assert rows[0]["L_rep"] == f"1.5000 ± {np.std([1.0, 2.0], ddof=1):.4f}"
    assert rows[1]["L_rep"] == f"4.0000 ± {np.std([3.0, 5.0], ddof=1):.4f}"
    assert rows[1]["runs"] == "g0.2_s1, g0.2_s2"


def test_group_by_seed_averages_over_the_rest(four_runs):
    _, rows = table(*four_runs, "--group-by", "train.seed", "--metrics", "L_rep")
    assert [row["train.seed"] for row in rows] == ["1", "2"]
    assert rows[0]["L_rep"].startswith("2.0000 ± ") and rows[1]["L_rep"].startswith("3.5000 ± ")
    assert rows[0]["γ"] == "0.2/off"  # what differs inside a group shows


def test_average_over_keeps_other_differences_apart(four_runs):
    header, rows = table(*four_runs, "--average-over", "train.seed", "--metrics", "L_rep")
    assert header[:3] == ["run", "n", "train.seed"]
    assert [row["run"] for row in rows] == ["g0.2_s*", "g0_s*"]
    assert [row["train.seed"] for row in rows] == ["1,2", "1,2"]
    assert [row["γ"] for row in rows] == ["0.2", "off"]
    assert rows[0]["L_rep"].startswith("4.0000 ± ")


def test_group_by_and_average_over_exclude_each_other(four_runs):
    r = run([PYTHON, REPORT, *four_runs, "--group-by", "a.b", "--average-over", "c.d"])
    assert r.returncode == 2 and "exclude" in r.stderr


# ---------------------------------------------------------------- 3. numbers
def test_shortest_round_trip():
    assert fmt.shortest(0.20000000000000001) == "0.2"
    assert fmt.shortest(0.1 + 0.2) == "0.30000000000000004"  # shortest, and still exact
    assert fmt.shortest(3.0) == "3" and fmt.shortest(-0.0) == "0"
    assert fmt.shortest(1e-7) == "1e-07" and float(fmt.shortest(0.123456789)) == 0.123456789
    assert fmt.config_value("0.20000000000000001") == "0.2"
    assert fmt.config_value(" elu,elu_flip ") == "elu,elu_flip"
    assert fmt.config_value("nan") == "nan"


def test_report_shows_config_floats_shortest(four_runs):
    r = run([PYTHON, REPORT, four_runs[2], "--metrics", "L_rep"])
    assert r.returncode == 0, r.stderr
    _, rows = parse_table(r.stdout)
    assert rows[0]["γ"] == "0.2"
    assert "0.2000000000" not in r.stdout


def test_suite_labels_show_shortest(tmp_path):
    path = tmp_path / "s.list"
    path.write_text(f"a {CHAIN_CONFIG} --set momentum.gamma=0.20000000000000001\n")
    entry = suite.parse_suite(str(path))[0]
    assert suite.momentum_label(entry) == "γ=0.2"
    assert suite.attention_label(entry) == "momentum softmax, γ=0.2"


# ---------------------------------------------------------------- 4. one override syntax
def test_suite_parser_takes_set_and_refuses_bare_pairs(tmp_path):
    assert suite.parse_overrides(["--set", "a.b=1", "--set", "c.d=x=y"]) == [("a.b", "1"), ("c.d", "x=y")]
    for words in (["a.b=1"], ["--set"], ["--set", "ab=1"], ["--set", "a.b"]):
        with pytest.raises(ValueError):
            suite.parse_overrides(words)
    bad = tmp_path / "bad.list"
    bad.write_text(f"a {CHAIN_CONFIG} momentum.gamma=0\n")
    with pytest.raises(ReportError, match="expected '--set section.key=value' at 'momentum.gamma=0'"):
        suite.parse_suite(str(bad))


def test_suite_parser_takes_init_of_an_earlier_line(tmp_path):
    path = tmp_path / "init.list"
    path.write_text(f"a {CHAIN_CONFIG}\nb {CHAIN_CONFIG} --set train.seed=2 --init a\n")
    b = suite.parse_suite(str(path))[1]
    assert (b.init, b.sets) == ("a", [("train.seed", "2")])
    runner_refuses = []
    for text, why in ((f"b {CHAIN_CONFIG} --init a\na {CHAIN_CONFIG}\n", "--init a: names no earlier line"),
                      (f"a {CHAIN_CONFIG} --init a\n", "--init a: names no earlier line"),
                      (f"a {CHAIN_CONFIG}\nb {CHAIN_CONFIG} --init a --init a\n", "--init given twice"),
                      (f"a {CHAIN_CONFIG} --init\n", "at '--init'")):
        path.write_text(text)
        with pytest.raises(ReportError, match=re.escape(why)):
            suite.parse_suite(str(path))
        r = run(["bash", RUNNER, "--suite", str(path), "--dry-run"])
        runner_refuses.append(r.returncode == 2 and why in r.stderr)
    assert all(runner_refuses), runner_refuses


def test_sweep_files_use_the_suite_syntax():
    sweeps = os.path.join(ROOT, "jobs", "sweeps")
    files = sorted(f for f in os.listdir(sweeps) if f.endswith(".txt"))
    assert files
    for name in files:
        with open(os.path.join(sweeps, name)) as f:
            lines = [ln.split() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        assert lines and all(suite.parse_overrides(words) for words in lines), name


def test_run_experiments_dry_run_parses_the_suite(tmp_path):
    good = one_line_suite(tmp_path / "good.list", "a")
    r = run(["bash", RUNNER, "--suite", good, "--runs", str(tmp_path / "runs"), "--dry-run"])
    assert r.returncode == 0, r.stderr
    assert "--set momentum.gamma=0 --set train.seed=1 --set train.steps=4" in r.stdout
    bad = tmp_path / "bad.list"
    bad.write_text(f"a {CHAIN_CONFIG} momentum.gamma=0\n")
    r = run(["bash", RUNNER, "--suite", str(bad), "--dry-run"])
    assert r.returncode == 2 and "expected '--set section.key=value' or '--init SOURCE' at 'momentum.gamma=0'" in r.stderr


def fake_bin(tmp_path):
    """A directory with a stand-in mpirun that logs its arguments and, like a finished run,
    leaves DIR/ckpt_<train.steps>.h5 for the --set train.out_dir=DIR it is given."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "mpirun").write_text(
        "#!/bin/sh\necho \"$*\" >>\"$FAKE_LOG\"\nsteps=1\n"
        "for a; do case $a in train.out_dir=*) out=${a#train.out_dir=};; "
        "train.steps=*) steps=${a#train.steps=};; esac; done\n"
        "[ -n \"$out\" ] && mkdir -p \"$out\" && : >\"$(printf '%s/ckpt_%08d.h5' \"$out\" \"$steps\")\"\n")
    (bindir / "mpirun").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "mpirun.log"))
    return env


def sweep_env(tmp_path, task):
    env = fake_bin(tmp_path)
    env.update(SLURM_JOB_ID="7", SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID=str(task),
               SLURM_JOB_NAME="sw", MOMFMM="/bin/true", MOMFMM_RUNS=str(tmp_path / "runs"))
    return env


def test_sweep_sbatch_lines_and_inline_entries(tmp_path):
    config = os.path.join(ROOT, CHAIN_CONFIG)
    gamma = os.path.join(ROOT, "jobs", "sweeps", "gamma.txt")
    r = run(["bash", SWEEP, config, gamma, "--set", "train.steps=2"], cwd=tmp_path,
            env=sweep_env(tmp_path, 3))
    assert r.returncode == 0, r.stderr
    r = run(["bash", SWEEP, config, "--set attention.kind=softmax",
             "--set attention.kind=fmm --set fmm.bandwidth=9", "--set", "train.steps=3"],
            cwd=tmp_path, env=sweep_env(tmp_path, 1))
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "mpirun.log").read_text().splitlines()
    assert calls[0].endswith(f"--set train.steps=2 --set momentum.gamma=0.2 "
                             f"--set train.out_dir={tmp_path}/runs/sw-7_3 --resume auto")
    assert calls[1].endswith(f"--set train.steps=3 --set attention.kind=fmm --set fmm.bandwidth=9 "
                             f"--set train.out_dir={tmp_path}/runs/sw-7_1 --resume auto")


def test_sweep_sbatch_refuses_bare_pairs(tmp_path):
    config = os.path.join(ROOT, CHAIN_CONFIG)
    r = run(["bash", SWEEP, config, "momentum.gamma=0.2"], cwd=tmp_path, env=sweep_env(tmp_path, 0))
    assert r.returncode == 2 and "'--set momentum.gamma=0.2'" in r.stderr
    old = tmp_path / "old.txt"
    old.write_text("momentum.gamma=0\n")
    r = run(["bash", SWEEP, config, str(old)], cwd=tmp_path, env=sweep_env(tmp_path, 0))
    assert r.returncode == 2 and "expected '--set section.key=value' at 'momentum.gamma=0'" in r.stderr
    assert not (tmp_path / "mpirun.log").exists()


# ---------------------------------------------------------------- 5. next step, .out files
def test_run_experiments_next_line_reruns_what_was_run(tmp_path):
    suite_file = one_line_suite(tmp_path / "mine.list", "mine")
    runs = tmp_path / "myruns"
    r = run(["bash", RUNNER, "--suite", suite_file, "--runs", str(runs), "--momfmm", "/bin/true"],
            cwd=tmp_path, env=fake_bin(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    next_line = [ln for ln in r.stdout.splitlines() if "next" in ln][-1]
    command = next_line.split(": ", 2)[2]
    assert command.startswith(f"cd {ROOT} && /usr/bin/python3 tools/momfmm_report.py --results")
    assert f"--suite {suite_file}" in command and f"--runs {runs}" in command
    assert f"--out {runs}/RESULTS.md" in command


def test_slurm_output_goes_under_runs():
    jobs = os.path.join(ROOT, "jobs")
    for name in sorted(f for f in os.listdir(jobs) if f.endswith(".sbatch")):
        with open(os.path.join(jobs, name)) as f:
            outputs = re.findall(r"^#SBATCH --output=(\S+)", f.read(), re.M)
        assert outputs and all(o.startswith("runs/slurm/") for o in outputs), (name, outputs)
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert "runs/" in f.read().split()


def test_collect_sweep_reports_the_tasks(tmp_path):
    runs = tmp_path / "runs"
    lines = {0: "--set momentum.gamma=0", 1: "--set momentum.gamma=0.2"}
    for task, gamma in ((0, "0"), (1, "0.20000000000000001")):
        write_run(str(runs / f"sw-7_{task}"), gamma=gamma)
    (runs / "sw-7.tasks").write_text("".join(f"{t}\t{runs}/sw-7_{t}\t{line}\n" for t, line in lines.items()))
    out = tmp_path / "sweep.md"
    r = run(["bash", os.path.join(ROOT, "jobs", "collect_sweep.sh"), "--runs", str(runs), "--out", str(out), "7"])
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert f"| 1 | --set momentum.gamma=0.2 | {runs}/sw-7_1 | ckpt_00000004.h5 |" in text
    _, rows = parse_table(text[text.index("| run |"):])
    assert [row["γ"] for row in rows] == ["off", "0.2"]
