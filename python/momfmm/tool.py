"""What the command-line tools' main() share (momfmm.report, momfmm.plot, momfmm.tokenizer,
momfmm.results.cli, and the benchmark scripts in tools/; docs/design.md §8.8): an argument parser
whose errors are one line, argument types that refuse a value out of range through it, what a
momfmm binary says cannot run on this CPU, and the
boundary that turns the package's errors into one line on stderr and the exit code of docs/cli.md
§5: 2 for a value or argument (files.ArgumentError, a bad option), 3 for a file (files.RunError,
an OSError of a file). Any other exception is a bug and keeps its traceback.
"""
import argparse
import math
import os
import re
import subprocess
import sys

from momfmm.files import EXIT_BAD_FILE, EXIT_USAGE, ArgumentError, RunError, escape_controls


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: "PROG: error: MESSAGE (see PROG --help)", exit 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, escape_controls(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")


# ---------------------------------------------------------------- argument types (refused by Parser)
def number(low, strict=False, high=math.inf):
    """An argparse type: a finite float at least `low` (above it if strict) and at most `high`."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low < value if strict else low <= value) or not value <= high or value == math.inf:
            bounds = f"{'above' if strict else 'at least'} {low:g}" + (f" and at most {high:g}" if high < math.inf else "")
            raise argparse.ArgumentTypeError(f"'{text}': expected a finite number {bounds}")
        return value
    return parse


def integer(low, high=None):
    """An argparse type: an integer of at least `low` (and at most `high`)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            bounds = f"of at least {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"'{text}': expected an integer {bounds}")
        return value
    return parse


def counts(text):
    """An argparse type: positive integers separated by commas (rank counts, lengths)."""
    try:
        return [integer(1)(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}': expected positive integers separated by commas") from None


def names(*allowed):
    """An argparse type: some of `allowed`, separated by commas."""
    def parse(text):
        values = text.split(",") if text else []
        if any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"'{text}': expected some of {', '.join(allowed)}, separated by commas")
        return values
    return parse


def binary_cannot_run(binary, feature, **extra_env):
    """Why `binary --version` says `feature` ('bf16', 'avx512') cannot run here, on its line
    "feature:   unavailable: <why>", under the environment plus extra_env; None where it runs. The
    benchmark tools refuse such a set-up before running anything (docs/performance.md §9.9)."""
    env = dict(os.environ, **extra_env)
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, env=env).stdout
    m = re.search(rf"^{feature}:\s+unavailable: (.*)$", out, re.M)
    return m.group(1) if m else None


def fail(prog, message, code):
    """Prints "PROG: error: MESSAGE" (control bytes escaped) on stderr; returns code."""
    print(escape_controls(f"{prog}: error: {message}"), file=sys.stderr)
    return code


def run(prog, body, *args):
    """body(*args) as an exit code: its return value, or 2 for an ArgumentError, 3 for a RunError
    or an OSError (a file the tool could not read or write), each one line naming the value or
    the file."""
    try:
        return body(*args)
    except ArgumentError as exc:
        return fail(prog, exc, EXIT_USAGE)
    except RunError as exc:
        return fail(prog, exc, EXIT_BAD_FILE)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(prog, f"{where}{exc.strerror or exc}", EXIT_BAD_FILE)
