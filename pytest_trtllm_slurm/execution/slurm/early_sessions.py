"""Sessions this run started on live agents before it collected (``warm_start``): the pool
takes each for its node's first batch; the run's end stops those no batch took."""
from __future__ import annotations

from collections.abc import Iterator

from pytest_trtllm_slurm.node.paths import AGENTS


class EarlySessions:
    """The open early sessions of one run, by agent folder."""

    def __init__(self) -> None:
        self._open: dict[str, str] = {}

    def remember(self, agent_dir: str, session_dir: str) -> None:
        self._open[agent_dir] = session_dir

    def has(self, agent_dir: str) -> bool:
        return agent_dir in self._open

    def take(self, agent_dir: str | None) -> str | None:
        """The session started early on this agent, handed out once."""
        return self._open.pop(agent_dir, None) if agent_dir else None

    def on_allocation(self, alloc_job_id: str) -> bool:
        """Any open on an agent of that allocation (alive when started)."""
        return any(f"/{AGENTS}/{alloc_job_id}/" in adir for adir in self._open)

    def drain(self) -> Iterator[str]:
        """Every session still open, forgotten as it is handed out (to be stopped)."""
        while self._open:
            _, session_dir = self._open.popitem()
            yield session_dir
