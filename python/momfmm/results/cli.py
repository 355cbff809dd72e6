"""The results report's command line: `momfmm_report.py --results` (docs/design.md §8.8).

    momfmm_report.py --results [--runs runs/experiments] [--suite configs/experiments/suite.list]
                     [--out FILE] [--figures DIR | --no-figures] [--allow-empty]
                     [--digests DIR | --no-digests] [--save-digests]

Reads every run of the suite (run directory RUNS/NAME, through momfmm.results.runs), groups the
runs of one configuration (suite lines that differ only in train.seed: mean ± sample std over
the seeds), and writes one Markdown report (momfmm.results.document): tables beside the
references' numbers with the command that reproduces each row, figures (momfmm.plot, one seed per
configuration), a claims section (each claim of the references, tested on the numbers), and the
exact commands of every run.

Where it goes: stdout, or FILE with --out; figures into --figures DIR, by default the
directory figures/ beside FILE (none on stdout without --figures). Nothing in the source tree
changes unless named: the repository's RESULTS.md is rewritten by
`--results --out RESULTS.md` (its figures then go to figures/, which RESULTS.md links).

A run that is missing is a row saying "not run"; a run that stopped early shows the step it
reached. Works on any subset of the suite, but not on none of it: when no run of the suite
exists under --runs (a mistyped --runs, or nothing run yet) it writes nothing and exits 2,
unless --allow-empty. Paths in the suite are relative to the repository root. Exit 0 when the
report was written, 1 when --save-digests could not write a digest, 2 for a command-line or
suite error or no run.

Runs made on another machine come from their results digests (momfmm.digest), by default
results/experiments/NAME.json with the default --runs; --save-digests first writes the digest of
every finished run under --runs, to be committed (docs/design.md §8.8).
"""
import os
import sys

from momfmm import files, tool
from momfmm.digest import write_digest
from momfmm.results.claims import Verdict
from momfmm.results.context import DEFAULT_DIGESTS, DEFAULT_RUNS, Context, root_relative
from momfmm.results.document import write_report
from momfmm.results.errors import ReportError, UsageError
from momfmm.results.runs import complete, load_entries
from momfmm.results.suite import PROG, default_suite, parse_suite

RESULTS_DEFAULTS = {"runs": DEFAULT_RUNS, "suite": None, "figures": None,
                    "no_figures": False, "allow_empty": False, "digests": None, "no_digests": False,
                    "save_digests": False}


def add_arguments(ap):
    """The --results mode's options (momfmm_report.py adds them to its own parser, with --out)."""
    ap.add_argument("--runs", metavar="DIR", help="parent of the run directories (default runs/experiments)")
    ap.add_argument("--suite", metavar="FILE", help="suite list (default configs/experiments/suite.list)")
    ap.add_argument("--figures", metavar="DIR",
                    help="directory for the figures (default: figures/ beside --out; without --out "
                         "no figures)")
    ap.add_argument("--no-figures", action="store_true", help="skip the figures")
    ap.add_argument("--allow-empty", action="store_true",
                    help="write the report even when no run of the suite exists (every row "
                         "'not run'); without it that is an error, exit 2")
    ap.add_argument("--digests", metavar="DIR",
                    help=f"results digests (NAME.json, momfmm.digest) of runs that --runs lacks or has "
                         f"not finished (default {DEFAULT_DIGESTS} with the default --runs, else none)")
    ap.add_argument("--no-digests", action="store_true", help="read no results digests")
    ap.add_argument("--save-digests", action="store_true",
                    help="first write the digest of every finished run under --runs into --digests "
                         "(commit them: they outlive the machine's runs/)")


def options_given(args):
    """The --results options set on the command line, as "--name" (for the table mode's error)."""
    return [f"--{k.replace('_', '-')}" for k in RESULTS_DEFAULTS if getattr(args, k, None) not in (None, False)]


def fill_defaults(args):
    for key, default in RESULTS_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, default)
    if args.suite is None:
        args.suite = default_suite()
    if args.no_digests:
        args.digests = None
    elif args.digests is None and os.path.normpath(args.runs) == DEFAULT_RUNS:
        args.digests = DEFAULT_DIGESTS
    if args.figures is None and args.out is not None and not args.no_figures:
        args.figures = os.path.join(os.path.dirname(args.out), "figures")
    return args


# (an option's value, the switch that turns it off): given both, the value would be ignored
CONTRARIES = (("figures", "no_figures"), ("digests", "no_digests"))


def check_contraries(args):
    """Raises UsageError for a value given beside the switch that turns it off (--figures DIR with
    --no-figures, --digests DIR with --no-digests): one of the two would be ignored without a word.
    Before fill_defaults, which fills the values the user did not give."""
    for value, off in CONTRARIES:
        if getattr(args, value) is not None and getattr(args, off):
            raise UsageError(f"--{value} {getattr(args, value)} and --{off.replace('_', '-')} contradict each "
                             "other: give one of them")


def check_options(args):
    """Raises UsageError for options that do not fit together or name no usable file."""
    if not os.path.isfile(args.suite):
        raise UsageError(f"--suite {args.suite}: {'not a regular file' if os.path.exists(args.suite) else 'no such file'}")
    if args.save_digests and args.digests is None:
        raise UsageError("--save-digests needs --digests DIR (no default with --runs or --no-digests)")
    digests = args.digests
    if digests == "" or (digests is not None and os.path.exists(digests) and not os.path.isdir(digests)):
        raise UsageError(f"--digests '{digests}': not a directory")


def emit(text, out, inputs=()):
    """Markdown to stdout, or to the file out (its directory created): the only place a report
    goes, so a committed file changes only when named with --out. Written through
    momfmm.files.output_path: whole or not at all, never through a symbolic link or onto a FIFO,
    a device or one of `inputs` (files.ArgumentError)."""
    if out is None:
        sys.stdout.write(text)
        return
    files.write_text(out, text, inputs=inputs, flag="--out")


def save_digests(entries, directory):
    """Writes DIR/NAME.json for every finished run read from its directory (docs/design.md §8.8);
    raises ReportError (exit 1) naming the file when one cannot be written (a full disk)."""
    saved = [e for e in entries if complete(e) and not e.from_digest]
    for e in saved:
        path = os.path.join(directory, e.name + ".json")
        try:
            write_digest(path, e.run, e.wall_s, e.wall_unlogged)
        except (files.RunError, files.ArgumentError) as exc:
            raise ReportError(f"cannot write {path}: {exc}", status=1) from None
    print(f"{PROG}: saved {len(saved)} results digest{'s' if len(saved) != 1 else ''} in {directory}",
          file=sys.stderr)


def write_results(args):
    """The results report of args.suite's runs under args.runs, to args.out (stdout if None),
    figures into args.figures (none if None). Refuses (ReportError) when no run exists: a report
    of nothing but "not run" rows is what a mistyped --runs produces, not something to keep."""
    check_contraries(args)
    fill_defaults(args)
    check_options(args)
    if args.out is not None:  # before reading anything
        files.check_output(args.out, flag="--out")
    entries = parse_suite(args.suite)
    load_entries(entries, args.runs, args.digests)
    if args.save_digests:
        save_digests(entries, args.digests)
    if not any(e.run is not None for e in entries) and not args.allow_empty:
        where = args.runs if os.path.isdir(args.runs) else f"{args.runs} (no such directory)"
        raise ReportError(f"no run of {root_relative(args.suite)} under {where}: nothing to report "
                          "(check --runs; --allow-empty writes the all-'not run' report anyway)")
    if args.figures is None and not args.no_figures:
        print(f"{PROG}: note: no figures without --out FILE or --figures DIR (the links point to ./figures)",
              file=sys.stderr)
    text, claims = write_report(Context(args, entries), entries)
    emit(text, args.out)
    n_ran = sum(1 for e in entries if e.run is not None)
    n_done = sum(1 for e in entries if complete(e))
    count = {v: sum(1 for c in claims if c.verdict is v) for v in Verdict}
    changed = sum(1 for c in claims if c.changed)
    print(f"{'wrote ' + args.out if args.out else 'results'}: {n_done} finished, {n_ran - n_done} partial, "
          f"{len(entries) - n_ran} not run; claims {count[Verdict.HELD]} held, {count[Verdict.NOT_HELD]} did not hold, "
          f"{count[Verdict.NOT_SHOWN]} not shown, {count[Verdict.MISSING]} not run, "
          f"{count[Verdict.NOT_JUDGED]} not judged; {changed} changed from the 2-s.e. rule",
          file=sys.stderr if args.out is None else sys.stdout)


def run(args, ap):
    """write_results for an entry point: a UsageError becomes ap.error (exit 2, one line), any
    other ReportError a one-line message and its status, and the package's file and argument
    errors exit 3 and 2 (momfmm.tool.run); returns the exit code."""
    def body():
        write_results(args)
        return 0
    try:
        return tool.run(PROG, body)
    except UsageError as exc:
        ap.error(str(exc))
    except ReportError as exc:
        return tool.fail(PROG, exc, exc.status)


def main(argv=None):
    """`python3 -m momfmm.results ...`: the same as `momfmm_report.py --results ...`."""
    ap = tool.Parser(prog=f"{PROG} --results", description="Results report of the experiment suite's HDF5 files")
    ap.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    add_arguments(ap)
    return run(ap.parse_args(sys.argv[1:] if argv is None else argv), ap)
