"""The quick tier (``-m "not slow"``) keeps its promise: a test that starts a process is in the slow tier, by the
helpers it uses or by the failure of a quick run that names it."""

from __future__ import annotations

import json

CONFTEST = """
from tiers import (
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_unconfigure,
)
"""

TESTS = """
import importlib
import subprocess
import sys

import pytest


def python():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.fixture
def server():
    return python()


def test_pure():
    assert sum(range(4)) == 6


def test_through_a_helper():
    python()


def test_through_a_fixture(server):
    pass


@pytest.mark.parametrize("start", [python])
def test_through_a_parameter(start):
    start()


def test_hidden_from_the_scan():
    importlib.import_module("sub" + "process").run([sys.executable, "-c", "pass"])


def test_hidden_and_caught():
    try:
        importlib.import_module("sub" + "process").run([sys.executable, "-c", "pass"])
    except RuntimeError:
        pass
"""


def test_a_test_that_starts_a_process_is_slow_or_fails_the_quick_tier_naming_itself(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_tiers_example=TESTS)
    result = pytester.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2, deselected=3)
    result.stdout.fnmatch_lines(
        [
            "*test_hidden_from_the_scan is in the quick tier and started a process (Popen.__init__): mark it*",
            "*test_hidden_and_caught is in the quick tier and started a process (Popen.__init__): mark it*",
        ]
    )


def test_a_verdict_kept_from_an_earlier_run_is_scanned_again_once_the_sources_change(pytester):
    """The scan's verdicts are kept in pytest's cache (it reads the bytecode of every test: seconds a process), for
    the sources they were read from only."""
    pytester.makeconftest(CONFTEST)
    quick = "def test_one():\n    assert True\n"
    pytester.makepyfile(test_tiers_example=quick)
    pytester.runpytest_inprocess("-m", "not slow").assert_outcomes(passed=1)
    starts = "import subprocess, sys\n\n\ndef test_one():\n    subprocess.run([sys.executable, '-c', 'pass'])\n"
    pytester.makepyfile(test_tiers_example=starts)
    for _ in range(2):  # scanned again, then from the cache: slow both times
        pytester.runpytest_inprocess("-m", "not slow").assert_outcomes(deselected=1)
    kept = json.loads((pytester.path / ".pytest_cache" / "v" / "mem" / "test-tiers").read_text())
    assert kept["reasons"] == {"test_tiers_example.py::test_one": "subprocess starts a process"}
