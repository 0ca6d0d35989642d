"""The cyclic garbage collector's pace while this process replays: the replay makes a few
hundred short-lived objects per test (decoded records, reports, hook arguments) and keeps
the reports, so Python's default thresholds (700, 10, 10) collected the old generation 37
times while 100,000 tests were replayed (4.6 s of CPU here, against 0.4 s below). Tests
that run in this process (``--trtllm-dispatch=needed``) run at Python's own pace.

Inside one pump (``held_for_a_pump``) nothing is collected: a chunk's decoded records are
alive until it is replayed, and each young collection during it went over them and over
the reports replayed so far; after the pump, with the records dropped, one collection goes
over what stayed (0.55 s of collections in a 100,000-test replay became 0.10 s)."""

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


@contextlib.contextmanager
def held_for_a_pump() -> Iterator[None]:
    """No collection inside; at the end the one that came due meanwhile, if any: the young
    generation, with the middle one when that is due too (the old one stays Python's, with
    its rule of a quarter more). A collector turned off (by the suite) stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        young, middle, _ = gc.get_count()
        first, second, _ = gc.get_threshold()
        if young > first:
            gc.collect(1 if middle >= second else 0)
