"""Options of an 'unknown' plugin (this conftest): each must reach a dispatched test."""

import sys

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("invocation-suite")
    group.addoption("--suite-value", default=None)
    group.addoption("--from-ini", default=None)
    group.addoption("--from-env", default=None)
    group.addoption("--data-file", default=None, help="a path, relative to the invocation dir")
    if "--trtllm-worker-reports" not in sys.argv:
        # only where the user typed the command: a target whose plugins lack an option
        group.addoption("--only-here", action="store_true", default=False)


@pytest.fixture
def hostile_line(request):
    """Append a line to this batch's reports.jsonl (dispatched runs only)."""
    reports = request.config.getoption("trtllm_worker_reports", default=None)

    def write(line):
        if reports:
            with open(reports, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    return write
