"""Job ids that name their cluster, for a run that spans several Slurm clusters.

Why: each cluster numbers its jobs on its own, so two clusters can hand out the same id,
while the controller keys what it watches and records by job id. Wrapped this way a
cluster's jobs are ``NAME:ID`` for the controller (and in the messages a user reads,
which then say where a job ran); the wrapped executor still sees its own ids.
"""

from __future__ import annotations

from typing import Any

from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.shell import Shell


class ClusterJobIds:
    """An Executor whose handles are ``cluster:ID``; everything else is the wrapped one's
    (attributes the controller reads, such as ``slurm_env`` or ``allocations``, too)."""

    def __init__(self, wrapped: Executor, cluster: str) -> None:
        self.wrapped = wrapped
        self.cluster = cluster
        self.shell: Shell = wrapped.shell
        self._own: dict[str, JobHandle] = {}  # qualified id -> the wrapped executor's handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def _qualified(self, job_id: str) -> str:
        return f"{self.cluster}:{job_id}"

    def submit(self, spec: JobSpec) -> JobHandle:
        own = self.wrapped.submit(spec)
        handle = own.model_copy(update={"job_id": self._qualified(own.job_id)})
        self._own[handle.job_id] = own
        return handle

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        states = self.wrapped.poll([self._own.get(h.job_id, h) for h in handles])
        return {self._qualified(job_id): state for job_id, state in states.items()}

    def cancel(self, handle: JobHandle) -> None:
        self.wrapped.cancel(self._own.get(handle.job_id, handle))

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        return self.wrapped.rerun_command(spec, nodeid)

    def close(self) -> None:
        self.wrapped.close()
