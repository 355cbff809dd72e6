"""pytest set-up of the end-to-end tests (docs/design.md §8.9).

CTest runs one group per entry (tests/CMakeLists.txt), e.g.
    python3 -m pytest tests/e2e/test_checkpoint.py::TestResume --basetemp build/tests/e2e_checkpoint_resume
with MOMFMM_BIN (the binary under test), MPIEXEC (FindMPI's launcher) and
PYTHONPATH (<source>/python for the momfmm package) in the environment.
By hand: `--momfmm build/momfmm` instead of MOMFMM_BIN; scratch files go to
pytest's tmp_path (under --basetemp when given). Every test module takes the
binary from the `momfmm` fixture: without it the session stops (exit 4), it
is never skipped. A test that asks for `report` fails when it made no check.
"""
import os
import signal

import pytest

from common import Report

def pytest_addoption(parser):
    parser.addoption("--momfmm", default=os.environ.get("MOMFMM_BIN"),
                     help="the momfmm binary under test (default: $MOMFMM_BIN)")


def _interrupt(signo, frame):
    raise KeyboardInterrupt(f"signal {signo}")


def pytest_configure(config):
    # CTest's timeout sends SIGTERM first: unwind as for Ctrl-C, so that the
    # tests' finally blocks kill their mpirun sessions and unmount the tmpfs.
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def momfmm(request):
    path = request.config.getoption("--momfmm")
    if not path or not os.access(path, os.X_OK):
        pytest.exit(f"the momfmm binary is not given or not executable ({path!r}): "
                    "set MOMFMM_BIN or pass --momfmm", returncode=4)
    return os.path.realpath(path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """Scratch directory shared by one test module's tests (str)."""
    return str(tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_")))


@pytest.fixture
def report(request):
    """Named soft checks (common.Report); the test fails after it returns if
    any failed or if none was made."""
    r = Report()
    request.node.momfmm_report = r
    return r


@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item):
    r = getattr(item, "momfmm_report", None)
    if r is not None:
        r.assert_all()


def pytest_terminal_summary(terminalreporter):
    if Report.made:
        passed = sum(r.passed for r in Report.made)
        failed = sum(r.failed for r in Report.made)
        terminalreporter.write_line(f"named checks: {passed} passed, {failed} failed")
