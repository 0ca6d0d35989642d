"""A pytest plugin (-p report_recorder) that records every report the user's session sees,
so tests can compare a plain run with a dispatched one report by report."""

import json
import os

_IS_WORKER = False


def pytest_configure(config):
    global _IS_WORKER
    trtllm_worker = bool(config.getoption("trtllm_worker_reports", default=None))
    _IS_WORKER = trtllm_worker or hasattr(config, "workerinput")  # xdist workers forward theirs


def pytest_runtest_logreport(report):
    dump = os.environ.get("REPORT_DUMP")
    if not dump or _IS_WORKER:  # only what the user's session sees counts
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
