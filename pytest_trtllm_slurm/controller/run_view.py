"""What the user sees of a dispatched run besides pytest's own lines: the run loop tells
its ``record`` what happened and knows nothing of how it is shown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from pytest_trtllm_slurm.controller.efficiency import (
    Efficiency,
    cluster_lines,
    efficiency,
    summary_lines,
    write_run_json,
)
from pytest_trtllm_slurm.controller.run_observer import PLUGIN_NAME, RunObserver
from pytest_trtllm_slurm.controller.status_line import PLUGIN_NAME as STATUS_NAME
from pytest_trtllm_slurm.controller.status_line import StatusLine
from pytest_trtllm_slurm.controller.timeline import write_timeline
from pytest_trtllm_slurm.planning.batching import Batch, BatchKey
from pytest_trtllm_slurm.planning.packing import Estimates, Pool, lower_bound
from pytest_trtllm_slurm.planning.settings import Settings

SUMMARY_NAME = "trtllm-slurm-run-summary"


class RunView:
    """One per dispatched run (a session; under xdist, nothing: a worker has no terminal)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.enabled = not hasattr(config, "workerinput")
        self.record = RunObserver()
        self.status: StatusLine | None = None
        self.summary: list[str] = []
        self.files: list[str] = []

    def planned(self, batches: Sequence[Batch], dispatched: list[tuple[str, BatchKey]],
                pools: Callable[[BatchKey], Pool], estimates: Estimates) -> None:
        if not self.enabled:
            return
        bound = lower_bound(dispatched, pools, estimates) if dispatched else None
        self.record.plan(batches, pools, bound, guessed=estimates.guessed(dispatched, pools))
        manager = self.config.pluginmanager
        if not manager.has_plugin(PLUGIN_NAME):
            manager.register(self.record, PLUGIN_NAME)
        self.status = StatusLine(self.config, self.record)
        if not manager.has_plugin(STATUS_NAME):
            manager.register(self.status, STATUS_NAME)

    def tick(self) -> None:
        if self.status is not None:
            self.status.tick()

    def finish(self) -> None:
        """The dispatch is over: the status line goes, the summary and files are made
        (shown in pytest's terminal summary)."""
        if not self.enabled or self.status is None:
            return
        self.record.finish()
        self.status.close()
        manager = self.config.pluginmanager
        for name in (PLUGIN_NAME, STATUS_NAME):
            if manager.get_plugin(name) is not None:
                manager.unregister(name=name)
        if not self.record.batches:
            return
        eff = efficiency(self.record)
        self.summary = summary_lines(eff) + cluster_lines(self.record)
        self._write_files(eff)
        if not manager.has_plugin(SUMMARY_NAME):
            manager.register(self, SUMMARY_NAME)  # the run's section of the terminal summary

    def _write_files(self, eff: Efficiency) -> None:
        base = Path(self.config.invocation_params.dir)
        if self.settings.timeline:
            try:
                trace, picture = write_timeline(base / self.settings.timeline, self.record,
                                                ["pytest-trtllm-slurm run timeline",
                                                 *self.summary])
                self.files += [f"timeline (Perfetto / chrome://tracing): {trace}",
                               f"timeline picture: {picture}"]
            except OSError as exc:
                self.files.append(f"timeline not written: {exc}")
        if self.settings.summary_json:
            try:
                path = write_run_json(base / self.settings.summary_json, self.record, eff)
                self.files.append(f"summary JSON: {path}")
            except OSError as exc:
                self.files.append(f"summary JSON not written: {exc}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_sep("-", "trtllm-slurm: GPU use")
        for line in [*self.summary, *self.files]:
            terminalreporter.write_line(line)
