"""Replay what a worker reported into the local items through their own hooks, as
pytest-xdist's controller does, so terminal, junitxml, --lf, -x and --durations read as
a local run. Every attempt is replayed; a test ends once, at ``done``; an attempt cut
short (no teardown report) gets its missing phases, failed."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_trtllm_slurm.controller.echoed_warnings import note_replayed
from pytest_trtllm_slurm.execution.records import warning_category

SECTION = "trtllm-slurm"
JUNIT_PROPERTY = "trtllm_slurm_"  # prefix of the testcase properties a dispatched test gets
_UNSET: Any = object()


@dataclass
class JobContext:
    """Where a batch ran, for the "trtllm-slurm" report section."""

    job_id: str
    scenario: str
    work_dir: str
    log_path: str
    nodelist: str | None = None
    rerun: Callable[[str], str | None] | None = None  # nodeid -> the command re-running it
    _head: tuple[str, str | None] | None = field(default=None, init=False, repr=False,
                                                 compare=False)

    def section_text(self, nodeid: str) -> str:
        # the batch's lines are made once per node list; only the re-run line is the test's own
        head = self._head
        if head is None or head[1] != self.nodelist:
            head = self._head = ("\n".join((
                f"scenario: {self.scenario}",
                f"job id:   {self.job_id}",
                f"nodes:    {self.nodelist or '?'}",
                f"work dir: {self.work_dir}",
                f"log:      {self.log_path}",
            )), self.nodelist)
        line = self.rerun(nodeid) if self.rerun is not None else None
        return head[0] if line is None else f"{head[0]}\nre-run:   {line}"

    def junit_properties(self) -> list[tuple[str, str]]:
        """What CI dashboards read from a dispatched testcase's <properties>."""
        return [(JUNIT_PROPERTY + name, value) for name, value in (
            ("job_id", self.job_id), ("nodes", self.nodelist or "?"),
            ("scenario", self.scenario), ("log", self.log_path))]


@dataclass(slots=True)
class TestProgress:
    started: bool = False  # an attempt was ever started
    attempt_open: bool = False  # logstart seen, logfinish not yet
    phases: list[tuple[str, str]] = field(default_factory=list)  # this attempt's (when, outcome)
    rerun: bool = False  # this attempt reported an outcome "rerun": another one follows
    finished: bool = False
    hooks: Any = None  # the item's hook proxy (``Replayer._hooks``), once looked up
    keywords: dict[str, Any] | None = None  # the last report's keywords, interned


class Replayer:
    """Turns worker records into hook calls on the matching local items."""

    def __init__(self, config: pytest.Config, items: dict[str, pytest.Item]) -> None:
        self.config = config
        self.items = items
        self.progress: dict[str, TestProgress] = {nodeid: TestProgress() for nodeid in items}
        self._suite_properties: dict[tuple[str, str], int] = {}  # added to the junit xml
        self._suite_seen: dict[tuple[str, tuple[str, str]], int] = {}  # (job, property) -> n
        self._xml: Any = _UNSET  # the session's junit writer, looked up once
        self._ihooks: dict[Any, Any] = {}  # folder -> the hook proxy of its items
        self._rebuild: Callable[[dict[str, Any]], Any] | None = _UNSET  # type: ignore[assignment]

    @property
    def xml(self) -> Any:
        """``--junitxml``'s writer or None (set at configure: one look-up per session)."""
        if self._xml is _UNSET:
            from _pytest.junitxml import xml_key

            self._xml = self.config.stash.get(xml_key, None)
        return self._xml

    def _hooks(self, item: pytest.Item, prog: TestProgress) -> Any:
        """``item.ihook``, looked up once per folder (each look finds its conftests again)."""
        if prog.hooks is None:
            # the item's collector (its module), where the item has the collector's path:
            # one hash of a node id instead of a Path's parent per test
            parent = item.parent
            folder = (parent if parent is not None and item.path is parent.path
                      else item.path.parent)
            if folder not in self._ihooks:
                self._ihooks[folder] = item.ihook
            prog.hooks = self._ihooks[folder]
        return prog.hooks

    def _from_serializable(self, data: dict[str, Any]) -> Any:
        """``pytest_report_from_serializable`` (a plain ``TestReport``: without the hook)."""
        if self._rebuild is _UNSET:
            self._rebuild = _direct_rebuild(self.config)
        if (self._rebuild is not None and data.get("$report_type") == "TestReport"
                and "_report_type" not in data):  # subtests' reports say "_report_type"
            return self._rebuild(data)
        return self.config.hook.pytest_report_from_serializable(config=self.config, data=data)

    # -- state -----------------------------------------------------------
    def is_finished(self, nodeid: str) -> bool:
        return self.progress[nodeid].finished

    def settle(self, nodeids: list[str]) -> None:
        """The job ended: a test whose last attempt was complete (no rerun) is finished, even
        without ``done``."""
        for nodeid in nodeids:
            prog = self.progress[nodeid]
            if prog.started and not prog.attempt_open and not prog.rerun and not _cut_short(prog):
                _finished(prog)

    def running_test(self, nodeids: list[str]) -> str | None:
        """The test of ``nodeids`` that started but did not finish (where a job died)."""
        return next(
            (n for n in nodeids if self.progress[n].started and not self.progress[n].finished),
            None,
        )

    # -- records (``record_handlers`` calls these, one per record type) -----
    def start(self, nodeid: str) -> None:
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or prog.attempt_open:
            return
        prog.started = prog.attempt_open = True
        prog.phases, prog.rerun = [], False
        item = self.items[nodeid]
        self._hooks(item, prog).pytest_runtest_logstart(nodeid=nodeid, location=item.location)

    def report(self, data: dict[str, Any], ctx: JobContext) -> None:
        if isinstance(data.get("longrepr"), list):
            # a skip's (path, lineno, reason) tuple came back from JSON as a list
            data = {**data, "longrepr": tuple(data["longrepr"])}
        report = self._from_serializable(data)
        if report is None or not isinstance(report, pytest.TestReport):
            return
        if "_subtest.context" in data:
            _keep_subtest_kwargs(report, data)
        nodeid = report.nodeid
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or not prog.attempt_open:
            return
        item = self.items[nodeid]
        _share_strings(report, item, prog)
        if report.when == "call" or report.failed:
            report.sections.append((SECTION, ctx.section_text(nodeid)))
        self._log(item, report, ctx, prog)

    def _log(self, item: pytest.Item, report: pytest.TestReport, ctx: JobContext | None,
             prog: TestProgress | None = None) -> None:
        if prog is None:
            prog = self.progress[item.nodeid]
        prog.phases.append((report.when, report.outcome))
        if report.outcome == "rerun":
            prog.rerun = True
        if report.when == "teardown" and ctx is not None and ctx.job_id != "-":
            xml = self.xml
            if xml is not None:
                # before the teardown report, which closes the junit testcase
                reporter = xml.node_reporter(report)
                for name, value in ctx.junit_properties():
                    reporter.add_property(name, value)
        self._hooks(item, prog).pytest_runtest_logreport(report=report)

    def finish(self, nodeid: str) -> None:
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or not prog.attempt_open:
            return
        prog.attempt_open = False
        item = self.items[nodeid]
        self._hooks(item, prog).pytest_runtest_logfinish(nodeid=nodeid, location=item.location)

    def done(self, nodeid: str, ctx: JobContext | None = None) -> None:
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or not prog.started:
            return
        if _cut_short(prog):
            self.fail_unreported(
                nodeid, "ERROR", "the worker ended this test without writing all of its "
                f"reports (phases reported: {', '.join(w for w, _ in prog.phases) or 'none'}); "
                "was the file system of its reports file full? See the job log"
                + (f": {ctx.log_path}" if ctx is not None and ctx.log_path != "-" else ""), ctx)
            return
        self.finish(nodeid)
        _finished(prog)

    def warning(self, record: dict[str, Any]) -> None:
        """A ``warning`` record (checked; its keys' defaults are ``WarningRecord``'s)."""
        category_name = record.get("category", "builtins.UserWarning")
        text, filename = record.get("message", ""), record.get("filename", "")
        lineno = record.get("lineno") or 0
        note_replayed(self.config, (category_name, text, filename, lineno))
        category = warning_category(category_name)
        message = warnings.WarningMessage(
            message=category(text),
            category=category,
            filename=filename,
            lineno=lineno,
        )
        self.config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": message,
                "when": record["when"],
                "nodeid": record.get("nodeid", ""),
                "location": None,
            }
        )

    def xml_attribute(self, nodeid: str, name: str, value: str) -> None:
        """``record_xml_attribute`` on the target: this test's junit testcase gets it."""
        xml = self.xml
        if xml is not None and not self.progress[nodeid].finished:
            xml.node_reporter(nodeid).add_attribute(name, value)

    def suite_property(self, job_id: str, name: str, value: str) -> None:
        """A suite property as often as the batch that recorded it most often did: a
        session fixture runs once per batch, once in a plain run."""
        xml = self.xml
        if xml is None:
            return
        key = (job_id, (name, value))
        self._suite_seen[key] = self._suite_seen.get(key, 0) + 1
        if self._suite_seen[key] > self._suite_properties.get((name, value), 0):
            self._suite_properties[(name, value)] = self._suite_seen[key]
            xml.add_global_property(name, value)

    # -- outcomes the worker never wrote ----------------------------------
    def fail_unreported(self, nodeid: str, status: str, text: str, ctx: JobContext | None) -> None:
        """Give ``nodeid`` a failed outcome naming ``status``; completes its missing phases."""
        prog = self.progress[nodeid]
        if prog.finished:
            return
        item = self.items[nodeid]
        if not prog.attempt_open:  # not started, or between two attempts
            self.start(nodeid)
        done = [when for when, _ in prog.phases]
        longrepr = f"[{status}] {text}"
        if not done:
            self._synth(item, "setup", "passed", None, ctx)
            self._synth(item, "call", "failed", longrepr, ctx)
            self._synth(item, "teardown", "passed", None, ctx)
        elif done == ["setup"] and prog.phases[0][1] == "passed":
            self._synth(item, "call", "failed", longrepr, ctx)
            self._synth(item, "teardown", "passed", None, ctx)
        elif "teardown" not in done:
            self._synth(item, "teardown", "failed", longrepr, ctx)
        self.finish(nodeid)
        _finished(prog)

    def skip_unsatisfied(self, item: pytest.Item, reason: str, *, fail: bool) -> None:
        """Report a test nothing can serve: skipped (as the suite would) or failed."""
        if fail:
            self._setup_only(item, "failed", f"[UNSATISFIED] {reason}")
        else:
            path, lineno, _ = item.location
            self._setup_only(item, "skipped",
                             (str(path), (lineno or 0) + 1, f"Skipped: {reason}"))
        self.done(item.nodeid)

    def planning_error(self, item: pytest.Item, message: str) -> None:
        """A test whose markers or perf-sanity id cannot be read: an error at setup, no
        traceback."""
        self._setup_only(item, "failed", message.removeprefix(f"{item.nodeid}: "))
        self.finish(item.nodeid)

    def _setup_only(self, item: pytest.Item, outcome: str, longrepr: Any) -> None:
        """A test reported without a job: its setup report and a passed teardown."""
        self.items[item.nodeid] = item
        self.progress.setdefault(item.nodeid, TestProgress())
        self.start(item.nodeid)
        self._synth(item, "setup", outcome, longrepr, None)
        self._synth(item, "teardown", "passed", None, None)

    def _synth(
        self, item: pytest.Item, when: str, outcome: str, longrepr: Any, ctx: JobContext | None
    ) -> None:
        sections = []
        if ctx is not None and outcome == "failed":
            sections.append((SECTION, ctx.section_text(item.nodeid)))
        report = pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={k: 1 for k in item.keywords},
            outcome=outcome,  # type: ignore[arg-type]
            longrepr=longrepr,
            when=when,  # type: ignore[arg-type]
            sections=sections,
            duration=0.0,
            user_properties=list(item.user_properties),
        )
        self._log(item, report, ctx)


def _cut_short(prog: TestProgress) -> bool:
    """The attempt has no teardown report (pytest always ends with one): the rest was lost."""
    return not prog.phases or prog.phases[-1][0] in ("setup", "call")


def _finished(prog: TestProgress) -> None:
    """The test has its one outcome: what its attempt reported is no longer needed."""
    prog.finished = True
    prog.phases.clear()
    prog.keywords = None


def _share_strings(report: pytest.TestReport, item: pytest.Item, prog: TestProgress) -> None:
    """The report holds the item's own strings and interned keywords, phase and outcome
    (JSON makes new ones per line, kept all session)."""
    report.nodeid = item.nodeid
    if tuple(report.location) == item.location:
        report.location = item.location
    report.when = sys.intern(report.when)  # type: ignore[assignment]
    report.outcome = sys.intern(report.outcome)  # type: ignore[assignment]
    keywords = report.keywords
    if isinstance(keywords, dict):
        shared = prog.keywords
        if shared is not None and keywords == shared:
            # same keywords as the earlier report: a copy of its interned dict (as pytest's)
            report.keywords = dict(shared)
        else:
            report.keywords = prog.keywords = {sys.intern(k) if type(k) is str else k: v
                                               for k, v in keywords.items()}


# the modules of pytest's own ``pytest_report_from_serializable`` implementations: of a
# "TestReport" they return ``TestReport._from_json(data)`` (reports) and nothing (subtests)
_OWN_REBUILDERS = frozenset({"_pytest.reports", "_pytest.subtests", "pytest_subtests.plugin"})


def _direct_rebuild(config: pytest.Config) -> Callable[[dict[str, Any]], Any] | None:
    """``TestReport._from_json`` when no other plugin implements the hook, else None."""
    impls = config.pluginmanager.hook.pytest_report_from_serializable.get_hookimpls()
    own = all(getattr(impl.plugin, "__name__", None) in _OWN_REBUILDERS for impl in impls)
    from_json = getattr(pytest.TestReport, "_from_json", None)
    return from_json if own and impls and from_json is not None else None


def _keep_subtest_kwargs(report: pytest.TestReport, data: dict[str, Any]) -> None:
    """A subtest's kwargs as the worker wrote them. pytest 9.2's ``SubtestContext`` reprs
    its kwargs when it is made, so one rebuilt from JSON (already repr'd on the worker) is
    repr'd twice: ``SUBFAILED(i='1')`` where a plain run says ``SUBFAILED(i=1)``."""
    context, sent = getattr(report, "context", None), data.get("_subtest.context")
    if (context is not None and hasattr(context, "kwargs") and isinstance(sent, dict)
            and isinstance(sent.get("kwargs"), dict)):
        object.__setattr__(context, "kwargs", dict(sent["kwargs"]))
