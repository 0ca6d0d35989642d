"""pytest-timeout's thread method in a worker: its ``os._exit(1)`` would read as a crash, so
the worker sets the timer itself and, when it fires, reports the test's missing phases as
"Timeout" failures before pytest-timeout's handler ends the process."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Any

import pytest

from pytest_trtllm_slurm.node import records

MESSAGE = ("Failed: Timeout (>{timeout}s) from pytest-timeout (--timeout-method=thread ended "
           "the worker process; its other tests run again, every thread's stack is in the "
           "job log).")


class ThreadTimeouts:
    """Registered by the worker plugin when pytest-timeout is active."""

    def __init__(self, writer: Any, plugin: Any) -> None:
        self.writer = writer  # the worker's ReportWriter
        self.plugin = plugin  # the pytest_timeout module
        self.phases: dict[str, list[tuple[str, str]]] = {}  # the running test's reports

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.phases[nodeid] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases.setdefault(report.nodeid, []).append((report.when, report.outcome))

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.phases.pop(nodeid, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        method = settings.method
        on_main = threading.current_thread() is threading.main_thread()
        if method != "thread" and not (method == "signal" and not on_main):
            return None  # the signal method fails the test in place: pytest-timeout's own
        timer = threading.Timer(settings.timeout, self._expired, (item, settings))
        timer.name = f"pytest_timeout {item.nodeid}"

        def cancel() -> None:
            timer.cancel()
            timer.join()

        item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's cancel
        timer.start()
        return True

    def _expired(self, item: pytest.Item, settings: Any) -> None:
        if not settings.disable_debugger_detection and self.plugin.is_debugging():
            return  # pytest-timeout leaves a test in a debugger alone
        try:
            self._report(item, settings)
        except Exception:  # noqa: BLE001 - the process ends next, whatever happened here
            traceback.print_exc()
        self.plugin.timeout_timer(item, settings)  # dumps the stacks, then os._exit(1)

    def _report(self, item: pytest.Item, settings: Any) -> None:
        text = MESSAGE.format(timeout=settings.timeout)
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        if frame is not None:
            text += "\n\nThe test's (main) thread was at:\n" + "".join(
                traceback.format_stack(frame))
        # last as well: where a report's last line is read as its message (a JUnit writer)
        text += f"\nE   Failed: Timeout (>{settings.timeout}s) from pytest-timeout."
        done = self.phases.get(item.nodeid, [])
        whens = [when for when, _ in done]
        config = item.config
        if not whens:
            phases = [("setup", "failed"), ("teardown", "passed")]
        elif whens == ["setup"] and done[0][1] == "passed":
            phases = [("call", "failed"), ("teardown", "passed")]
        elif "teardown" not in whens:
            phases = [("teardown", "failed")]
        else:
            phases = []
        now = time.time()
        for when, outcome in phases:
            report = pytest.TestReport(
                nodeid=item.nodeid, location=item.location,
                keywords={k: 1 for k in item.keywords},
                outcome=outcome,  # type: ignore[arg-type]
                longrepr=text if outcome == "failed" else None,
                when=when,  # type: ignore[arg-type]
                sections=[], duration=float(settings.timeout) if outcome == "failed" else 0.0,
                start=now, stop=now, user_properties=list(item.user_properties))
            data = config.hook.pytest_report_to_serializable(config=config, report=report)
            self.writer.emit(records.report(data))
        self.writer.emit(records.finish(item.nodeid))
        self.writer.emit(records.done(item.nodeid), sync=True)
