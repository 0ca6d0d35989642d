"""Replay what a worker reported into the local items (the pytest face).

Records from reports.jsonl go through the item's own hooks
(logstart / logreport per phase / logfinish), exactly as pytest-xdist's
controller does, so terminal output, junitxml, --lf, -x and --durations behave
as for a local run. Each test ends with exactly one outcome: once a test is
finished, later records for it are ignored.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

SECTION = "trtllm-slurm"
PHASES = ("setup", "call", "teardown")


@dataclass
class JobContext:
    """Where a batch ran, for the "trtllm-slurm" report section."""

    job_id: str
    scenario: str
    work_dir: str
    log_path: str
    nodelist: str | None = None
    rerun: dict[str, str] = field(default_factory=dict)  # nodeid -> command

    def section_text(self, nodeid: str) -> str:
        lines = [
            f"scenario: {self.scenario}",
            f"job id:   {self.job_id}",
            f"nodes:    {self.nodelist or '?'}",
            f"work dir: {self.work_dir}",
            f"log:      {self.log_path}",
        ]
        if nodeid in self.rerun:
            lines.append(f"re-run:   {self.rerun[nodeid]}")
        return "\n".join(lines)


@dataclass
class TestProgress:
    started: bool = False
    phases: list[tuple[str, str]] = field(default_factory=list)  # (when, outcome)
    finished: bool = False


class Replayer:
    """Turns worker records into hook calls on the matching local items."""

    def __init__(self, config: pytest.Config, items: dict[str, pytest.Item]) -> None:
        self.config = config
        self.items = items
        self.progress: dict[str, TestProgress] = {nodeid: TestProgress() for nodeid in items}

    # -- state -----------------------------------------------------------
    def track(self, item: pytest.Item) -> None:
        """Add an item reported without a job (an unsatisfied test)."""
        self.items[item.nodeid] = item
        self.progress.setdefault(item.nodeid, TestProgress())

    def is_finished(self, nodeid: str) -> bool:
        return self.progress[nodeid].finished

    def running_test(self, nodeids: list[str]) -> str | None:
        """The test of ``nodeids`` that started but did not finish (where a job died)."""
        return next(
            (n for n in nodeids if self.progress[n].started and not self.progress[n].finished),
            None,
        )

    # -- records ---------------------------------------------------------
    def handle(self, record: dict[str, Any], ctx: JobContext) -> None:
        kind = record.get("type")
        if kind == "start":
            self._start(record["nodeid"], ctx)
        elif kind == "report":
            self._report(record["data"], ctx)
        elif kind == "finish":
            self._finish(record["nodeid"])
        elif kind == "warning" and record.get("when") == "runtest":
            # config/collect warnings were already seen by the local collection
            self._warning(record)

    def _start(self, nodeid: str, ctx: JobContext) -> None:
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or prog.started:
            return
        prog.started = True
        item = self.items[nodeid]
        item.ihook.pytest_runtest_logstart(nodeid=nodeid, location=item.location)

    def _report(self, data: dict[str, Any], ctx: JobContext) -> None:
        if isinstance(data.get("longrepr"), list):
            # a skip's (path, lineno, reason) tuple came back from JSON as a list
            data = {**data, "longrepr": tuple(data["longrepr"])}
        report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        if report is None or not isinstance(report, pytest.TestReport):
            return
        prog = self.progress.get(report.nodeid)
        if prog is None or prog.finished or not prog.started:
            return
        if report.when == "call" or report.failed:
            report.sections.append((SECTION, ctx.section_text(report.nodeid)))
        prog.phases.append((report.when, report.outcome))
        self.items[report.nodeid].ihook.pytest_runtest_logreport(report=report)

    def _finish(self, nodeid: str) -> None:
        prog = self.progress.get(nodeid)
        if prog is None or prog.finished or not prog.started:
            return
        prog.finished = True
        item = self.items[nodeid]
        item.ihook.pytest_runtest_logfinish(nodeid=nodeid, location=item.location)

    def _warning(self, record: dict[str, Any]) -> None:
        message = warnings.WarningMessage(
            message=_warning_category(record.get("category", ""))(record.get("message", "")),
            category=_warning_category(record.get("category", "")),
            filename=record.get("filename", ""),
            lineno=record.get("lineno") or 0,
        )
        self.config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": message,
                "when": record.get("when", "runtest"),
                "nodeid": record.get("nodeid", ""),
                "location": None,
            }
        )

    # -- outcomes the worker never wrote ----------------------------------
    def fail_unreported(self, nodeid: str, status: str, text: str, ctx: JobContext | None) -> None:
        """Give ``nodeid`` a failed outcome naming ``status``; completes its missing phases."""
        prog = self.progress[nodeid]
        if prog.finished:
            return
        item = self.items[nodeid]
        if not prog.started:
            self._start(nodeid, ctx or JobContext("-", "-", "-", "-"))
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
        self._finish(nodeid)

    def skip_unsatisfied(self, item: pytest.Item, reason: str, *, fail: bool) -> None:
        """Report a test nothing can serve: skipped (as the suite would) or failed."""
        self._start(item.nodeid, JobContext("-", "-", "-", "-"))
        if fail:
            self._synth(item, "setup", "failed", f"[UNSATISFIED] {reason}", None)
        else:
            path, lineno, _ = item.location
            self._synth(
                item, "setup", "skipped", (str(path), (lineno or 0) + 1, f"Skipped: {reason}"), None
            )
        self._synth(item, "teardown", "passed", None, None)
        self._finish(item.nodeid)

    def planning_error(self, item: pytest.Item, message: str) -> None:
        """A test whose markers or perf-sanity id cannot be read: an error at setup whose
        text is the message (no traceback: nothing of the test ran). The message leads with
        the test's name only where pytest renamed its id (the header shows the node id)."""
        self._start(item.nodeid, JobContext("-", "-", "-", "-"))
        self._synth(item, "setup", "failed", message.removeprefix(f"{item.nodeid}: "), None)
        self._synth(item, "teardown", "passed", None, None)
        self._finish(item.nodeid)

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
        self.progress[item.nodeid].phases.append((when, outcome))
        item.ihook.pytest_runtest_logreport(report=report)


def _warning_category(qualified: str) -> type[Warning]:
    module, _, name = qualified.rpartition(".")
    try:
        category = getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError, ValueError):
        return UserWarning
    return category if isinstance(category, type) and issubclass(category, Warning) else UserWarning
