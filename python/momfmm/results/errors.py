"""The results report's errors (docs/design.md §8.8). Library code raises them; only the entry
points (momfmm.results.cli.main, momfmm.report.main) turn them into a message and an exit code."""


class ReportError(Exception):
    """The report cannot be written: a malformed suite line, no run to report, a digest that
    cannot be saved. str() is the one-line message; status is the exit code (docs/cli.md §5:
    2 for a suite or command-line error, 1 when an output cannot be written)."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


class UsageError(ReportError):
    """A command-line option that does not fit: the entry point shows it with the usage line."""
