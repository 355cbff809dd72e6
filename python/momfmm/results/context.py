"""What the results report's sections share (docs/design.md §8.8): where the report and its
figures go, and the commands that rerun a run."""
import os
import re
import shlex

from momfmm.files import checkpoint_name
from momfmm.results.runs import target_steps
from momfmm.results.suite import default_suite, repository_root, setting

ENV_PREFIX = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1"
DEFAULT_RUNS = "runs/experiments"
DEFAULT_DIGESTS = "results/experiments"  # the committed results digests of the default --runs (momfmm.digest)


class Context:
    def __init__(self, args, entries):
        self.args = args
        self.entries = entries
        self.runs = args.runs
        # Figure links are relative to the report's directory (the current one on stdout).
        self.out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        # Where the figures go (--figures DIR, else figures/ beside --out or the current
        # directory): the links point there whether or not this report writes them.
        self.figure_dir = args.figures or os.path.join(self.out_dir, "figures")
        self.write_figures = args.figures is not None and not args.no_figures
        self.runner_flags = runner_flags(args.runs, args.suite)

    def reproduce(self, group, np_=None):
        """The runner command of a row; np_ when its family runs at another rank count than the
        runner's default (the chain recall families: one rank per run)."""
        flags = self.runner_flags + (f" --np {np_}" if np_ else "")
        return f"`tools/run_experiments.sh{flags} --only '{group.only_regex()}'`"

    def mpirun_command(self, e):
        np_ = e.world_size or 2
        config = e.config
        if "--full" in self.runner_flags:
            big = re.sub(r"\.ini$", "_full.ini", config)
            if os.path.exists(os.path.join(repository_root(), big)):
                config = big
        sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in e.sets)
        extra = ""
        if e.run is not None and e.run.has_config:
            steps = target_steps(e)
            try:
                base = int(setting(e, "train.steps", "0"))
            except ValueError:
                base = steps
            if steps and steps != base and "--full" not in self.runner_flags:
                extra = f" --set train.steps={steps}"
        out = os.path.join(self.runs, e.name)
        return (f"{ENV_PREFIX} mpirun --oversubscribe -np {np_} build/momfmm train {config} {sets}{extra} "
                f"--set train.out_dir={out} {self.start_option(e)}")

    def start_option(self, e):
        """--resume auto, or for a line with --init SOURCE (the runner's first start) --init
        with SOURCE's final checkpoint."""
        src = next((x for x in self.entries if x.name == e.init), None) if e.init else None
        if src is None:
            return "--resume auto"
        return f"--init {os.path.join(self.runs, src.name, checkpoint_name(target_steps(src)))}"

    def rel(self, path):
        return os.path.relpath(path, self.out_dir)

    def report_command(self):
        """The command that writes this report again, with the options that shaped it."""
        args = self.args
        words = ["/usr/bin/python3", "tools/momfmm_report.py", "--results"]
        default_runs = os.path.normpath(args.runs) == DEFAULT_RUNS
        if not default_runs:
            words += ["--runs", args.runs]
        if args.digests is None and default_runs:
            words += ["--no-digests"]
        elif args.digests is not None and (not default_runs or os.path.normpath(args.digests) != DEFAULT_DIGESTS):
            words += ["--digests", args.digests]
        if os.path.realpath(args.suite) != os.path.realpath(default_suite()):
            words += ["--suite", root_relative(args.suite)]
        if args.out:
            words += ["--out", args.out]
        return " ".join(shlex.quote(w) for w in words)


def runner_flags(runs, suite=None):
    """tools/run_experiments.sh's options that make runs under `runs` from `suite`, so the
    commands the report prints rerun exactly these runs."""
    norm = os.path.normpath(runs)
    flags = ""
    base = os.path.basename(norm)
    if base.startswith("experiments_full"):
        flags += " --full"
    m = re.search(r"_x([0-9.]+)$", base)
    if m:
        flags += f" --steps-scale {m.group(1)}"
    default = "runs/experiments_full" if "--full" in flags else DEFAULT_RUNS
    if m:
        default += f"_x{m.group(1)}"
    if norm != os.path.normpath(default):
        flags += f" --runs {shlex.quote(runs)}"
    if suite is not None and os.path.realpath(suite) != os.path.realpath(default_suite()):
        flags += f" --suite {shlex.quote(root_relative(suite))}"
    return flags


def root_relative(path):
    """path as tools/run_experiments.sh reads it: relative to the repository root (where the
    runner changes first) when inside it, else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, repository_root())
    return full if rel.startswith("..") else rel
