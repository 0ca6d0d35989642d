"""The live status of a run that holds a cluster for hours: on a terminal one line below
pytest's output, redrawn in place and hidden while pytest writes; in CI a plain line every
``PLAIN_INTERVAL`` seconds plus retries, abnormal job ends and failed tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from pytest_trtllm_slurm.controller.run_observer import RunObserver

PLAIN_INTERVAL = 30.0  # seconds between plain progress lines
TTY_INTERVAL = 0.5  # seconds between redraws of the terminal line
PLUGIN_NAME = "trtllm-slurm-status-line"


def status_text(record: RunObserver, now: float) -> str:
    """``trtllm-slurm: batches 1 pending (Resources), 2 running, 3 done | tests 10 passed,
    1 failed, 5 left | GPUs 8 held, 4 busy | ETA ~2m10s``."""
    spans = list(record.batches.values())
    pending = [s for s in spans if not s.finished and s.running is None]
    running = [s for s in spans if not s.finished and s.running is not None]
    done = [s for s in spans if s.finished]
    reasons = sorted({s.reason for s in pending if s.reason})
    why = f" ({', '.join(reasons)})" if reasons else ""
    counts = record.counts()
    tests = f"tests {counts['passed']} passed, {counts['failed']} failed"
    tests += f", {counts['skipped']} skipped" if counts["skipped"] else ""
    tests += f", {counts['left']} left"
    # a persistent allocation holds all its GPUs once a batch of the run is in it
    pools = {s.pool.name: s.pool.gpus for s in spans if s.persistent and s.running is not None}
    held = sum(pools.values()) + sum(s.width for s in running if not s.persistent)
    busy = sum(s.width for s in running
               if any(t.start is not None and not t.finished for t in record.tests_of(s)))
    parts = [f"batches {len(pending)} pending{why}, {len(running)} running, {len(done)} done",
             tests, f"GPUs {held} held, {busy} busy"]
    eta = eta_text(record, now)
    if eta:
        parts.append(eta)
    return "trtllm-slurm: " + " | ".join(parts)


def eta_text(record: RunObserver, now: float) -> str:
    """``ETA ~2m10s`` from a plan resting on earlier runs, else from the pace of this
    run's finished tests, said so (no figure before the first one finished)."""
    if record.guessed is None:
        eta = eta_seconds(record, now)
        return f"ETA ~{_duration(eta)}" if eta is not None else ""
    if not record.batches:
        return ""
    learnt = record.learnt_eta(now)
    if learnt is None:
        return "ETA ? (no durations yet)"
    seconds, tests = learnt
    return f"ETA ~{_duration(seconds)} (from {tests} finished test{'s' if tests > 1 else ''})"


def eta_seconds(record: RunObserver, now: float) -> float | None:
    """The plan's expected makespan less the time gone, at least what a running batch needs."""
    if record.expected_makespan is None or not record.batches:
        return None
    first = min(s.submitted for s in record.batches.values())
    left = record.expected_makespan - (now - first)
    for span in record.batches.values():
        if not span.finished and span.running is not None and span.expected_seconds:
            left = max(left, span.expected_seconds - (now - span.running))
    return max(0.0, left)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class _Guard:
    """pytest's terminal file, wrapped: the status line goes before any write to it, so
    every line pytest (or a plugin) writes lands where it would without the status line."""

    def __init__(self, file: Any, before: Callable[[], None]) -> None:
        self._file = file
        self._before = before

    def write(self, text: str) -> int:
        self._before()
        return int(self._file.write(text) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class StatusLine:
    """Shows ``status_text`` while the run lasts (a pytest plugin for the run)."""

    def __init__(self, config: pytest.Config, record: RunObserver, *,
                 tty: bool | None = None, clock: Callable[[], float] = time.time) -> None:
        self.reporter: Any = config.pluginmanager.get_plugin("terminalreporter")
        self.record = record
        self.clock = clock
        quiet = config.getoption("verbose", 0) < -1  # -qq: pytest itself says little
        self.enabled = self.reporter is not None and not quiet
        self.tty = self.enabled and bool(
            tty if tty is not None else getattr(self.reporter, "isatty", False))
        self.shown = False  # the terminal line is on screen
        self.text = ""  # what it says
        self.last = -1e9
        self.said_events = 0
        self._file: Any = None
        if self.tty:
            writer: Any = self.reporter._tw  # type: ignore[union-attr]
            self._file = writer._file
            writer._file = _Guard(self._file, self.hide)

    # -- drawing ---------------------------------------------------------------------
    def tick(self, force: bool = False) -> None:
        """Called from the run loop's polls and after pytest's writes: redraw when due."""
        if not self.enabled or not self.record.batches:
            return
        now = self.clock()
        if self.tty:
            if force or now - self.last >= TTY_INTERVAL:
                text = status_text(self.record, now)
                if not self.shown or text != self.text:  # unchanged on screen: no bytes
                    self._draw(text)
                self.last = now
            return
        self._say_events()
        if not force and now - self.last >= PLAIN_INTERVAL:
            self.reporter.write_line(status_text(self.record, now))
            self.last = now

    def _raw(self, text: str) -> None:
        """Bytes for the terminal that pytest's writer does not count as line content
        (its idea of the current line stays that of pytest's own output)."""
        self._file.write(text)
        self._file.flush()

    def _draw(self, line: str) -> None:
        width = max(20, int(self.reporter._tw.fullwidth) - 1)
        column = int(self.reporter._tw.width_of_current_line)
        # on the line below pytest's current one; the cursor goes back where pytest left it
        self._raw(f"\n\r\x1b[2K{line[:width]}\x1b[1A\x1b[{column + 1}G")
        self.shown, self.text = True, line

    def hide(self) -> None:
        if self.shown:
            self.shown = False  # save the cursor, clear the line below, restore the cursor
            self._raw("\x1b7\x1b[1B\r\x1b[2K\x1b8")

    def _say_events(self) -> None:
        for _, text in self.record.events[self.said_events:]:
            if " pending (" not in text:  # the run loop says those as they happen
                self.reporter.write_line(f"trtllm-slurm: {text}")
        self.said_events = len(self.record.events)

    def close(self) -> None:
        """The run's dispatch is over: the line goes; CI gets the last events."""
        if not self.enabled:
            return
        if self.tty:
            self.hide()
            self.reporter._tw._file = self._file
        else:
            self._say_events()

    # -- after pytest's own writes -------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self) -> None:
        """Once per test: the hidden line comes back as it was; recounted only on a redraw."""
        if self.tty and self.clock() - self.last < TTY_INTERVAL:
            if not self.shown and self.text:
                self._draw(self.text)
            return
        self.tick(force=True)
