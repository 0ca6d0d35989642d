"""The plugin loaded on the target (``-p pytest_trtllm_slurm.node.worker``): it runs the node
ids the controller sent and appends every event to ``reports.jsonl``, one JSON line a write."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.node import item_key, records
from pytest_trtllm_slurm.node.artefacts import BatchArtefacts, point_coverage_at
from pytest_trtllm_slurm.node.assignment import Assignment, key_path, loads
from pytest_trtllm_slurm.node.forkloop import LOG_MARK
from pytest_trtllm_slurm.node.gate import gate_from_env, rank_and_size
from pytest_trtllm_slurm.node.protocol import RECORD_VERSION, WORKER_OUTPUTS_FLAG  # noqa: F401
from pytest_trtllm_slurm.node.report_file import SYNC_EVERY, ReportFile

WORKER_ENV = "TRTLLM_SLURM_WORKER"
# json.dumps(record, default=repr) without making an encoder per record (six per test)
_encode = json.JSONEncoder(default=repr).encode


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trtllm-slurm-worker")
    group.addoption("--trtllm-worker-reports", default=None, help="(internal) reports.jsonl path")
    group.addoption("--trtllm-worker-nodeids", default=None, help="(internal) node ids file")
    group.addoption("--trtllm-worker-serve", default=None,
                    help="(internal) serve batch requests from this directory")
    group.addoption(WORKER_OUTPUTS_FLAG, action="append", default=[],
                    dest="trtllm_worker_outputs",
                    help="(internal) a folder of the batch's own output paths, made first")
    group.addoption("--trtllm-worker-collect", default=None,
                    help="(internal) write what was collected to this file (collection.json)")


class ReportWriter:
    """Appends events to reports.jsonl, one line per event."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self._file = ReportFile(path)
        self._last_start = time.monotonic()  # when the last test started
        # only rank 0 writes when several ranks run the same batch (launch=mpi)
        self.enabled = rank_and_size()[0] == 0
        self.wanted: Assignment = []  # (controller's node id, key) of the tests to run
        self.collected: list[pytest.Item] = []
        self.collect_errors: list[records.CollectErrorRecord] = []
        self.marked: MarkedLines | None = None  # pytest's terminal output, marked
        self._test: records.ItemRecord | None = None  # the running test's line, unwritten

    def _bundle(self, nodeid: str, *, unfinished: bool = False) -> records.ItemRecord:
        """The running test's line, begun for ``nodeid`` if need be (``unfinished``: also when
        its attempt ended)."""
        bundle = self._test
        if (bundle is None or bundle["nodeid"] != nodeid or bundle["done"]
                or (unfinished and bundle["finish"])):
            self.flush()
            bundle = self._test = records.item(nodeid, [], finish=False, done=False)
        return bundle

    def flush(self, *, sync: bool = False) -> None:
        """Write the running test's line, if any, before any other record (events in order)."""
        bundle, self._test = self._test, None
        if bundle is not None and (bundle["reports"] or bundle["finish"] or bundle["done"]):
            self._write(bundle, sync)

    def reopen(self, path: Path, notice: str | None = None) -> None:
        self._file.reopen(path, notice)

    def close(self) -> None:
        self.flush()
        self._file.close()

    def emit(self, record: Mapping[str, Any], *, sync: bool = False) -> None:
        """One record as one line, after the running test's; ``sync``: fsynced now."""
        self.flush()
        self._write(record, sync)

    def _write(self, record: Mapping[str, Any], sync: bool) -> None:
        if not self.enabled or self._file.closed:
            return
        self._file.append((_encode(record) + "\n").encode(), sync=sync)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """Every item, before any plugin selected: the controller's collection selects."""
        self.collected.append(item)

    def candidates(self, session: pytest.Session) -> dict[str, list[pytest.Item]]:
        """key -> items: all collected, and any a hook made at collection (perf tests)."""
        seen = {id(item) for item in self.collected}
        extra = [item for item in session.items if id(item) not in seen]
        return item_key.index([*self.collected, *extra])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """After every plugin's ``pytest_collection_modifyitems`` (their markers stay):
        the assigned tests in order under the controller's ids; one not found fails alone."""
        if not self.wanted:
            return
        items, missing = item_key.pick(self.wanted, self.candidates(session))
        session.items[:] = items
        if missing:
            self.emit(records.missing(missing, str(self.config.rootpath)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
            record = records.collect_error(data)
            self.collect_errors.append(record)  # a served batch repeats them (session_server)
            self.emit(record)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        now = time.monotonic()  # after a slow test, its end and this start are fsynced now
        self.emit(records.start(nodeid, location), sync=now - self._last_start >= SYNC_EVERY)
        self._last_start = now
        # a marked progress line in the job log, after pytest's own (-v: the node id)
        shown = nodeid.replace("\r", "\\r").replace("\n", "\\n")
        if self.marked is not None:
            self.marked.line(f"START {shown}")
        else:
            print(f"\n{LOG_MARK}START {shown}", file=sys.__stdout__, flush=True)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Written last, once every plugin here has seen the report (pytest's subtests
        change a verdict then, with a count kept in this process only)."""
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self._bundle(report.nodeid, unfinished=True)["reports"].append(data)
        if report.when != "teardown" and (report.failed or report.sections
                                          or report.duration >= SYNC_EVERY):
            # what a hang or crash would lose goes out now; a quick quiet phase waits
            self.flush()

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self._bundle(nodeid, unfinished=True)["finish"] = True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        """``done`` once the item's whole protocol returned: no attempt follows (a plugin
        such as pytest-rerunfailures logs start..finish once per attempt)."""
        try:
            return (yield)
        finally:
            self._bundle(item.nodeid)["done"] = True
            self.flush()

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str,
                                location: Any) -> None:
        category = warning_message.category
        self.emit(records.warning(
            when, nodeid, str(warning_message.message),
            f"{category.__module__}.{category.__qualname__}", warning_message.filename,
            warning_message.lineno))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.emit(records.session_finish(int(exitstatus)))
        self.close()


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Any:
    """Before pytest-cov starts measuring: its data files go into the work dir."""
    for folder in getattr(early_config.known_args_namespace, "trtllm_worker_outputs", None) or []:
        os.makedirs(folder, mode=0o700, exist_ok=True)  # before the suite's conftests run
    reports = getattr(early_config.known_args_namespace, "trtllm_worker_reports", None)
    if reports:
        point_coverage_at(Path(reports).parent, rank_and_size()[0])
    return (yield)


def forward_suite_properties(config: pytest.Config, writer: ReportWriter) -> None:
    """Each suite property (via the junit writer's ``add_global_property``) also goes to the
    controller; a session without a junit file gets ``SuiteProperties`` instead."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        stand_in: Any = SuiteProperties(writer, config.getini("junit_family"))
        config.stash[xml_key] = stand_in
        # registered as pytest's own writer is: its unconfigure unregisters what it finds
        config.pluginmanager.register(stand_in, "trtllm-slurm-suite-properties")
        return
    own = xml.add_global_property

    def add_global_property(name: str, value: object) -> None:
        own(name, value)
        writer.emit(records.suite_property(str(name), str(value)))

    xml.add_global_property = add_global_property  # type: ignore[method-assign]


class SuiteProperties:
    """pytest's junit writer for a session without a junit file: all to the controller."""

    def __init__(self, writer: ReportWriter, family: str) -> None:
        self.writer = writer
        self.family = family

    def add_global_property(self, name: str, value: object) -> None:
        self.writer.emit(records.suite_property(str(name), str(value)))

    def node_reporter(self, report: object) -> _NoTestcase:
        return _NoTestcase()


class _NoTestcase:
    """A testcase no file holds: what is recorded on it reaches the controller another way."""

    def add_attribute(self, name: str, value: object) -> None:
        """``record_xml_attribute``: sent by ``JunitRecorders``."""

    def add_property(self, name: str, value: object) -> None:
        """``record_property``: the report's user properties carry it."""


class JunitRecorders:
    """pytest's ``record_xml_attribute``, wrapped: also sent to the controller."""

    def __init__(self, writer: ReportWriter) -> None:
        self.writer = writer

    @pytest.fixture
    def record_xml_attribute(
        self, record_xml_attribute: Callable[[str, object], None], request: pytest.FixtureRequest
    ) -> Callable[[str, object], None]:
        nodeid = request.node.nodeid

        def record(name: str, value: object) -> None:
            record_xml_attribute(name, value)
            self.writer.emit(records.xml_attribute(nodeid, str(name), str(value)))

        return record


class MarkedLines:
    """pytest's own terminal output, each line marked (``LOG_MARK``): the hang scan skips it."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._at_line_start = True

    def write(self, text: str) -> int:
        out: list[str] = []
        for index, part in enumerate(text.split("\n")):
            if index:
                out.append("\n")
                self._at_line_start = True
            if part:
                if self._at_line_start:
                    out.append(LOG_MARK)
                out.append(part)
                self._at_line_start = False
        self._file.write("".join(out))
        return len(text)

    def line(self, text: str) -> None:
        """A marked line of the plugin's own, on a line of its own."""
        self._file.write(("" if self._at_line_start else "\n") + LOG_MARK + text + "\n")
        self._file.flush()
        self._at_line_start = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def drop_absent_files(config: pytest.Config) -> None:
    """Files this side lacks leave the command line: their tests fail alone as missing."""
    here = Path(config.invocation_params.dir)
    absent = {arg for arg in config.args if not (here / key_path(str(arg))).exists()}
    for arg in sorted(absent):
        print(f"[trtllm-slurm] not on this side, its tests are missing: {arg}", flush=True)
    config.args[:] = [arg for arg in config.args if arg not in absent]


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    collect = config.getoption("trtllm_worker_collect")
    if collect:  # a collect-only run for a controller that cannot import the suite
        from pytest_trtllm_slurm.node.collection import CollectionWriter

        os.environ[WORKER_ENV] = "1"
        config.pluginmanager.register(CollectionWriter(config, Path(collect)),
                                      "trtllm-slurm-collection-writer")
    reports = config.getoption("trtllm_worker_reports")
    if not reports:
        return
    os.environ[WORKER_ENV] = "1"
    writer = ReportWriter(config, Path(reports))
    ids_file = config.getoption("trtllm_worker_nodeids")
    if ids_file:
        writer.wanted = loads(Path(ids_file).read_text("utf-8"))
        drop_absent_files(config)
    config.pluginmanager.register(writer, "trtllm-slurm-report-writer")
    timeout_plugin = config.pluginmanager.get_plugin("timeout")
    if timeout_plugin is not None and hasattr(timeout_plugin, "timeout_timer"):
        from pytest_trtllm_slurm.node.timeouts import ThreadTimeouts

        config.pluginmanager.register(ThreadTimeouts(writer, timeout_plugin),
                                      "trtllm-slurm-thread-timeouts")
    config.pluginmanager.register(  # coverage and benchmark data come back
        BatchArtefacts(config, Path(reports).parent, enabled=writer.enabled),
        "trtllm-slurm-artefacts")
    # registered after every other plugin, so these fixtures override theirs
    config.pluginmanager.register(JunitRecorders(writer), "trtllm-slurm-junit-recorders")
    forward_suite_properties(config, writer)
    if config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        from pytest_trtllm_slurm.node import xdist_identity

        config.pluginmanager.register(xdist_identity, "trtllm-slurm-xdist-identity")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    terminal = getattr(reporter, "_tw", None)
    if terminal is not None and hasattr(terminal, "_file"):
        terminal._file = writer.marked = MarkedLines(terminal._file)
    gate = gate_from_env()  # a step launched before its GPUs were free
    if gate is not None:
        config.pluginmanager.register(gate, "trtllm-slurm-gate")
    serve_dir = config.getoption("trtllm_worker_serve")
    if serve_dir:
        from pytest_trtllm_slurm.node.session_server import SessionServer

        config.pluginmanager.register(SessionServer(config, Path(serve_dir), writer),
                                      "trtllm-slurm-session-server")
