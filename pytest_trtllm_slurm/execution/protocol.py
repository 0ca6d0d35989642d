"""The executor protocol every scenario implements.

Executors read only the JobSpec; they submit without waiting, report state for
all their jobs in one call, and can cancel a job (never an allocation).
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.shell import Shell


class JobHandle(BaseModel):
    """A submitted job: enough to poll it, read its files and cancel it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job_id: str
    spec: JobSpec
    submitted_at: float
    started_at: float | None = None
    nodelist: str | None = None


class Executor(Protocol):
    shell: Shell

    def submit(self, spec: JobSpec) -> JobHandle: ...

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        """States of all ``handles`` in one round (one scheduler query where there is one)."""
        ...

    def cancel(self, handle: JobHandle) -> None: ...

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        """A copy-pasteable command that re-runs just ``nodeid`` on the same target."""
        ...

    def close(self) -> None: ...
