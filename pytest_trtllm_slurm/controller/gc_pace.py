"""The cyclic garbage collector's pace while this process replays: the replay makes a few
hundred short-lived objects per test (decoded records, reports, hook arguments) and keeps
the reports, so Python's default thresholds (700, 10, 10) collected the old generation 37
times while 100,000 tests were replayed (4.6 s of CPU here, against 0.4 s below). Tests
that run in this process (``--trtllm-dispatch=needed``) run at Python's own pace."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# the youngest generation every 10,000 allocations, the middle every 20 of those, the old
# one every 100 of those (and, as always, only once it grew by a quarter)
REPLAY_THRESHOLDS = (10_000, 20, 100)


@contextlib.contextmanager
def replay_pace() -> Iterator[tuple[int, int, int]]:
    """``REPLAY_THRESHOLDS`` inside; yields the thresholds it replaced (``own_pace``)."""
    before = gc.get_threshold()
    gc.set_threshold(*REPLAY_THRESHOLDS)
    try:
        yield before
    finally:
        gc.set_threshold(*before)


@contextlib.contextmanager
def own_pace(thresholds: tuple[int, int, int] | None) -> Iterator[None]:
    """``thresholds`` (those ``replay_pace`` replaced) while a test runs in this process."""
    if thresholds is None:
        yield
        return
    during = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*during)
