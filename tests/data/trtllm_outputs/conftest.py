"""A TensorRT-LLM-shaped conftest (tests/integration/defs/conftest.py): ``--output-dir``
where tests write, ``--csv`` and the periodic JUnit writer, both fed by
``pytest_runtest_logreport`` (so in a dispatched run they also run in the controller,
which sees every replayed report). Written for this project's tests, not copied."""

import os
import xml.etree.ElementTree as ET

import pytest


def pytest_addoption(parser):
    parser.addoption("--output-dir", "-O", default=None, help="where tests write their files")
    parser.addoption("--csv", default=None, help="a CSV row per test")
    parser.addoption("--periodic-junit", action="store_true", default=False)
    parser.addoption("--periodic-junit-xmlpath", default=None)
    parser.addoption("--periodic-batch-size", type=int, default=1)
    parser.addoption("--periodic-save-unfinished-test", action="store_true", default=False)


def _atomic(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Results:
    """Each test's outcome from the reports this process sees."""

    def __init__(self):
        self.cases = {}  # nodeid -> (outcome, message, seconds)

    def add(self, report):
        outcome, message, seconds = self.cases.get(report.nodeid, ("passed", "", 0.0))
        seconds += report.duration
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            message = str(report.longrepr).splitlines()[-1] if report.longrepr else ""
        elif report.skipped and outcome == "passed":
            outcome, message = "skipped", str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        self.cases[report.nodeid] = (outcome, message, seconds)


class PeriodicJunit(Results):
    """The stand-in of TensorRT-LLM's periodic JUnit (utils/periodic_junit.py): the file is
    opened (truncated) at configure, each finished test is appended as it ends (every
    ``batch`` tests), and the closing tags are written at the end."""

    def __init__(self, path, batch):
        super().__init__()
        self.batch, self.pending = max(1, batch), []
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.file = open(path, "w", encoding="utf-8")
        self.file.write('<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="pytest">\n')
        self.file.flush()

    def pytest_runtest_logreport(self, report):
        self.add(report)
        if report.when == "teardown":
            self.pending.append(report.nodeid)
            if len(self.pending) >= self.batch:
                self.flush()

    def flush(self):
        for nodeid in self.pending:
            outcome, message, seconds = self.cases[nodeid]
            module, _, name = nodeid.rpartition("::")
            case = ET.Element("testcase", classname=module, name=name, time=f"{seconds:.3f}")
            if outcome in ("failed", "error", "skipped"):
                ET.SubElement(case, {"failed": "failure"}.get(outcome, outcome), message=message)
            self.file.write("  " + ET.tostring(case, encoding="unicode") + "\n")
        self.pending = []
        self.file.flush()

    def pytest_sessionfinish(self):
        self.flush()
        self.file.write("</testsuite>\n")
        self.file.close()


class CsvReport(Results):
    def __init__(self, path):
        super().__init__()
        self.path = path

    def pytest_runtest_logreport(self, report):
        self.add(report)

    def pytest_sessionfinish(self):
        rows = ["nodeid,outcome"] + [f"{n},{o}" for n, (o, _, _) in sorted(self.cases.items())]
        _atomic(self.path, "\n".join(rows) + "\n")


def pytest_configure(config):
    xmlpath = config.getoption("periodic_junit_xmlpath")
    if config.getoption("periodic_junit") and xmlpath:
        config.pluginmanager.register(
            PeriodicJunit(xmlpath, config.getoption("periodic_batch_size")), "periodic-junit")
    if config.getoption("csv"):
        config.pluginmanager.register(CsvReport(config.getoption("csv")), "csv-report")


@pytest.fixture
def output_dir(request):
    out = request.config.getoption("output_dir")
    assert out, "run with --output-dir"
    os.makedirs(out, exist_ok=True)
    return out
