"""An executor standing for a cluster that could not be set up, in a run of several: its
batches fail with the reason while the other clusters' tests run.
"""

from __future__ import annotations

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell


class UnreachableCluster(Executor):
    """Refuses every submission with the set-up error; nothing runs, nothing to poll."""

    def __init__(self, cluster: str, why: str) -> None:
        self.cluster = cluster
        self.why = why
        self.shell: Shell = LocalShell()  # never used: no job of it exists

    def submit(self, spec: JobSpec) -> JobHandle:
        raise ExecutionError(f"cluster {self.cluster!r} could not be set up: {self.why}")

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        return {}

    def cancel(self, handle: JobHandle) -> None:
        return None

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        return f"# cluster {self.cluster} could not be set up: {self.why}"

    def close(self) -> None:
        return None
