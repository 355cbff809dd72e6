"""The e2e harness itself (conftest.py, common.Report): a test that asks for
`report` fails when it made no check, when a check failed (naming every
failed check) and passes otherwise; a plain assert still fails as in pytest;
a fixture's own Report with no check fails too. Each case runs in a pytest
of its own (pytester) with this directory's conftest.py."""
import os
import re

E2E = os.path.dirname(os.path.abspath(__file__))
# what the inner pytest imports: common.py beside this file, then this one's
# PYTHONPATH made absolute now (pytester runs the test in a scratch directory)
PYTHONPATH = os.pathsep.join([E2E] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                      if p])
pytest_plugins = ["pytester"]

CASES = '''
from common import Report


def test_no_check(report):
    pass


def test_checks_pass(report):
    report.check("one", True)
    report.check("two", 1 + 1 == 2, "detail")


def test_one_check_fails(report):
    report.check("first", False, "first detail")
    report.check("second", True)
    report.check("third", False, "third detail")


def test_plain_assert():
    assert 1 == 2, "plain assert"


def test_fixture_report_without_checks():
    r = Report()
    r.assert_all()
'''


def failure_sections(out):
    """{test name: its section of pytest's FAILURES report}."""
    sections, name = {}, None
    for line in out.splitlines():
        m = re.match(r"^_{3,} (test_\w+) _{3,}$", line)
        if m:
            name = m.group(1)
        elif re.match(r"^={3,} ", line):
            name = None
        elif name:
            sections[name] = sections.get(name, "") + line + "\n"
    return sections


def test_harness(pytester, monkeypatch):
    with open(os.path.join(E2E, "conftest.py")) as f:
        pytester.makeconftest(f.read())
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = r.stdout.str()
    r.assert_outcomes(passed=1, failed=4)
    failed = failure_sections(out)
    assert sorted(failed) == ["test_fixture_report_without_checks", "test_no_check", "test_one_check_fails",
                              "test_plain_assert"], out
    for name, needles in (("test_no_check", ["no named check was made"]),
                          ("test_one_check_fails", ["2 of 3 checks failed", "first: first detail",
                                                    "third: third detail"]),
                          ("test_plain_assert", ["plain assert"]),
                          ("test_fixture_report_without_checks", ["no named check was made"])):
        missing = [n for n in needles if n not in failed[name]]
        assert not missing, f"{name}: {missing} not in its failure report:\n{failed[name]}"
    assert "named checks: 3 passed, 2 failed" in out, out
