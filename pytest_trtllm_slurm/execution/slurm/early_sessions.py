"""Sessions this process started on live agents before it collected (see ``warm_start``).

One owner for that state: the warm start records each session here, the warm pool takes it
for the first batch that needs that node, the allocation asks whether any are open (so it
neither releases nor cleans up under them), and the end of the run stops the ones no batch
took. Keyed by agent folder; the value is the session folder.
"""
from __future__ import annotations

from collections.abc import Iterator

_OPEN: dict[str, str] = {}


def remember(agent_dir: str, session_dir: str) -> None:
    _OPEN[agent_dir] = session_dir


def has(agent_dir: str) -> bool:
    return agent_dir in _OPEN


def take(agent_dir: str | None) -> str | None:
    """The session started early on this agent, handed out once."""
    return _OPEN.pop(agent_dir, None) if agent_dir else None


def on_allocation(alloc_job_id: str) -> bool:
    """Any open on an agent of that allocation (alive when started)."""
    return any(f"/.agents/{alloc_job_id}/" in adir for adir in _OPEN)


def drain() -> Iterator[str]:
    """Every session still open, forgotten as it is handed out (to be stopped)."""
    while _OPEN:
        _, session_dir = _OPEN.popitem()
        yield session_dir
