"""The executor contract every scenario implements: everything the controller and the
planner read of an executor, typed, with defaults (no probing for optional attributes)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.execution.folder_watch import FolderWatch
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.packing import Capacity
from pytest_trtllm_slurm.transport.shell import Shell


class JobHandle(BaseModel):
    """A submitted job: enough to poll it, read its files and cancel it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    job_id: str
    spec: JobSpec
    submitted_at: float
    started_at: float | None = None
    nodelist: str | None = None


class PersistentAllocation(Protocol):
    """A target's persistent allocation, as the end of a run reads it (AllocationManager)."""

    def release(self) -> str:
        """Free it; what was done, in words."""
        ...


class Executor(ABC):
    """One target of a run (a scenario, or a remote cluster)."""

    shell: Shell
    # seconds between monitor rounds this target wants; None: the monitor's own pace
    poll_hint: float | None = None
    # the target's Slurm discovery (written into job_spec.json); None: not Slurm
    slurm_env: SlurmEnv | None = None
    # the persistent allocation (--trtllm-release-allocation frees it); None: none
    allocations: PersistentAllocation | None = None
    # whether ``prepare`` does anything (a run prepares such targets side by side)
    prepares: bool = False

    @abstractmethod
    def submit(self, spec: JobSpec) -> JobHandle: ...

    @abstractmethod
    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        """States of all ``handles`` in one round (one scheduler query where there is one)."""

    @abstractmethod
    def cancel(self, handle: JobHandle) -> None: ...

    @abstractmethod
    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        """A copy-pasteable command that re-runs just ``nodeid`` on the same target."""

    @abstractmethod
    def close(self) -> None: ...

    def expect(self, tests: Mapping[str, str]) -> None:
        """All tests the run will send here (node id -> key), before the first submit."""
        return None

    @property
    def vouched(self) -> int:
        """Changes whenever the executor learnt, without a job's files, that reports it held
        back (``JobState.alive_at``) may be shown: a quiet job with held reports is read then."""
        return 0

    def quiet(self, handles: list[JobHandle]) -> set[str]:
        """The ids among ``handles`` with no news since the last call: a round may skip them."""
        return set()

    def end_watches(self) -> list[FolderWatch]:
        """What wakes the run loop's idle wait when one of this target's batches ends."""
        return []

    def prepare(self) -> None:
        """What the first submit would do first (``prepares`` says whether there is any)."""
        return None

    def capacity(self) -> Capacity:
        """What the packer may pack this target's batches into."""
        return Capacity()
