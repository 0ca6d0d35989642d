"""An executor standing for a cluster that could not be set up, in a run of several.

Why: with one cluster, a connection, preflight or sync that fails stops the run before
anything runs (a usage error). With several, the other clusters' tests should still run:
the failed cluster's batches fail instead, each test with the cluster's name and what went
wrong, and the summary shows them beside the others' results.
"""

from __future__ import annotations

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell


class UnreachableCluster(Executor):
    """Refuses every submission with the set-up error (the run loop fails the batch's
    tests with it); nothing is ever running, so there is nothing to poll or cancel."""

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
