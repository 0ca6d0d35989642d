"""Job ids that name their cluster (``NAME:ID``) when a run spans several Slurm clusters,
each numbering its jobs on its own; the wrapped executor still sees its own ids.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.packing import Capacity
from pytest_trtllm_slurm.transport.shell import Shell


class ClusterJobIds(Executor):
    """An Executor whose handles are ``cluster:ID``; everything else is the wrapped one's
    (what the controller and the packer read of it, too)."""

    def __init__(self, wrapped: Executor, cluster: str) -> None:
        self.wrapped = wrapped
        self.cluster = cluster
        self.shell: Shell = wrapped.shell
        # what the controller and the packer read of it: set once when an executor is made
        self.poll_hint, self.slurm_env = wrapped.poll_hint, wrapped.slurm_env
        self.allocations, self.prepares = wrapped.allocations, wrapped.prepares
        self._own: dict[str, JobHandle] = {}  # qualified id -> the wrapped executor's handle

    def expect(self, tests: Mapping[str, str]) -> None:
        self.wrapped.expect(tests)

    def prepare(self) -> None:
        self.wrapped.prepare()

    def capacity(self) -> Capacity:
        return self.wrapped.capacity()

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
