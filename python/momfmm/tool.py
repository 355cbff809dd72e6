"""What the command-line tools' main() share (momfmm.report, momfmm.plot, momfmm.tokenizer,
momfmm.results.cli; docs/design.md §8.8): an argument parser whose errors are one line, and the
boundary that turns the package's errors into one line on stderr and the exit code of docs/cli.md
§5: 2 for a value or argument (files.ArgumentError, a bad option), 3 for a file (files.RunError,
an OSError of a file). Any other exception is a bug and keeps its traceback.
"""
import argparse
import sys

from momfmm.files import EXIT_BAD_FILE, EXIT_USAGE, ArgumentError, RunError, escape_controls


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: "PROG: error: MESSAGE (see PROG --help)", exit 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, escape_controls(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")


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
