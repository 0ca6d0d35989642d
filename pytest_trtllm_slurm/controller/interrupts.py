"""SIGTERM (CI) and SIGHUP (a closed terminal) take Ctrl-C's path while a run dispatches:
dying at once would leave the run's jobs queued."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                if s is not None)


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, taken as Ctrl-C (pytest reports it as an interruption)."""


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """The first SIGTERM/SIGHUP raises Terminated; later ones are ignored (cleanup finishes).
    Outside the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if received:
            return  # already cleaning up: let it finish
        received.append(signum)
        raise Terminated(f"{signal.Signals(signum).name} received: cancelling this run's "
                         "jobs (the persistent allocation stays)")

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
