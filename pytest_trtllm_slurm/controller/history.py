"""Expected durations for packing, in pytest's cache: per node id its last seconds, per
pool the shortest start-up. Without the cache provider nothing is recorded."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from pytest_trtllm_slurm.planning.batching import Batch, BatchKey
from pytest_trtllm_slurm.planning.packing import Estimates, Pool

DURATIONS_KEY = "cache/trtllm-slurm-durations"
STARTUP_KEY = "cache/trtllm-slurm-startup"
PLUGIN_NAME = "trtllm-slurm-durations"
WRITER_NAME = "trtllm-slurm-durations-writer"
_LOADED = pytest.StashKey[tuple[dict[str, float], dict[str, float]]]()


def _floats(value: Any) -> dict[str, float]:
    """A cache value as {str: float}; anything malformed is dropped."""
    if not isinstance(value, dict):
        return {}
    return {key: float(seconds) for key, seconds in value.items()
            if isinstance(key, str) and isinstance(seconds, (int, float)) and seconds >= 0}


class History:
    """Durations of earlier runs, and this run's, from the replayed reports (a plugin)."""

    def __init__(self, config: pytest.Config, nodeids: Iterable[str],
                 pools: Callable[[BatchKey], Pool]) -> None:
        self.config = config
        self.cache = getattr(config, "cache", None)
        self.pools = pools
        self.wanted = set(nodeids)
        self.known, self.known_startup = self._load()
        self.totals: dict[str, float] = {}
        self.first_start: dict[str, float] = {}  # nodeid -> epoch its setup began
        self.sent: list[tuple[str, float, list[str]]] = []  # (pool, submitted at, nodeids)

    @classmethod
    def start(cls, config: pytest.Config, planned: Iterable[tuple[str, BatchKey]],
              pools: Callable[[BatchKey], Pool]) -> History:
        history = cls(config, [nodeid for nodeid, _ in planned], pools)
        if not config.pluginmanager.has_plugin(PLUGIN_NAME):
            config.pluginmanager.register(history, PLUGIN_NAME)
        return history

    def _load(self) -> tuple[dict[str, float], dict[str, float]]:
        """The cached figures, read once per process (xdist: once per worker)."""
        if self.cache is None:
            return {}, {}
        if _LOADED not in self.config.stash:
            self.config.stash[_LOADED] = (_floats(self.cache.get(DURATIONS_KEY, {})),
                                          _floats(self.cache.get(STARTUP_KEY, {})))
        return self.config.stash[_LOADED]

    def estimates(self) -> Estimates:
        return Estimates(durations=self.known, startup=self.known_startup)

    def submitted(self, batch: Batch) -> None:
        """Call right after a batch was submitted (its start-up is measured from here)."""
        self.sent.append((self.pools(batch.key).name, time.time(), list(batch.nodeids)))

    # -- hook ------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if nodeid not in self.wanted:
            return
        duration = float(getattr(report, "duration", 0.0) or 0.0)
        if duration > 0:
            self.totals[nodeid] = self.totals.get(nodeid, 0.0) + duration
        start = getattr(report, "start", None)
        if report.when == "setup" and isinstance(start, (int, float)) and start > 0:
            self.first_start.setdefault(nodeid, float(start))

    # -- results ---------------------------------------------------------
    def measured_startup(self) -> dict[str, float]:
        """Per pool, the shortest time from a batch's submission to its first test."""
        found: dict[str, float] = {}
        for pool, sent_at, nodeids in self.sent:
            starts = [self.first_start[n] for n in nodeids if n in self.first_start]
            if starts:
                seconds = max(0.0, min(starts) - sent_at)
                found[pool] = min(seconds, found.get(pool, seconds))
        return found

    def finish(self) -> None:
        """Unregister and write this run's figures into the cache (merged, never lost)."""
        if self.config.pluginmanager.get_plugin(PLUGIN_NAME) is self:
            self.config.pluginmanager.unregister(self, PLUGIN_NAME)
        if self.cache is None or not (self.totals or self.sent):
            return
        durations = {n: round(s, 3) for n, s in self.totals.items()}
        startup = {p: round(s, 3) for p, s in self.measured_startup().items()}
        known, known_startup = self._load()
        known.update(durations)  # later dispatches of this process see them
        known_startup.update(startup)
        if hasattr(self.config, "workerinput"):
            writer = self.config.pluginmanager.get_plugin(WRITER_NAME)
            if writer is None:
                writer = _Writer(self.cache)
                self.config.pluginmanager.register(writer, WRITER_NAME)
            writer.durations.update(durations)
            writer.startup.update(startup)
            return
        _write(self.cache, durations, startup)


def _write(cache: Any, durations: dict[str, float], startup: dict[str, float]) -> None:
    """Merge into the cache, re-read first: another process may have written since."""
    for key, figures in ((DURATIONS_KEY, durations), (STARTUP_KEY, startup)):
        if figures:
            cache.set(key, {**_floats(cache.get(key, {})), **figures})


class _Writer:
    """An xdist worker's figures, written once when its session ends."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.durations: dict[str, float] = {}
        self.startup: dict[str, float] = {}

    def pytest_sessionfinish(self) -> None:
        _write(self.cache, self.durations, self.startup)
