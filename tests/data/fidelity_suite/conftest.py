"""Records every report the (controller) session sees, for the fidelity comparison."""

import json
import os

import pytest


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup exploded")


@pytest.fixture
def broken_teardown():
    yield 42
    raise RuntimeError("teardown exploded")


@pytest.fixture
def resource():
    print("resource setup output")
    yield {"value": 7}
    print("resource teardown output")


def pytest_runtest_logreport(report):
    dump = os.environ.get("REPORT_DUMP")
    if not dump:
        return
    sections = [(name, text) for name, text in report.sections if name != "trtllm-slurm"]
    record = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "longrepr": report.longreprtext,
        "sections": sections,
        "wasxfail": getattr(report, "wasxfail", None),
        "location": list(report.location),
        "keywords": sorted(report.keywords),
    }
    with open(dump, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
