"""What the backends of one SlurmExecutor share: the shell, the scheduler client, the
run's record and its batches (one place, so a backend never keeps its own copy)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pytest_trtllm_slurm.execution.pushed_files import SmallFiles
from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.execution.slurm.tracking import TrackedJob
from pytest_trtllm_slurm.transport.shell import Shell


@dataclass
class Backends:
    """Shared by the one-shot, step and warm-worker backends and the allocation watch."""

    shell: Shell
    jobs: SlurmJobs
    runs: RunRegistry | None
    warn: Callable[[str], None]
    wake: Callable[[], None]  # ask the scheduler at the next poll (something changed)
    batches: dict[str, TrackedJob] = field(default_factory=dict)  # this run's, by job id
    seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # for local ids
    files: SmallFiles = field(init=False)  # exit codes and pids, pushed where the shell pushes

    def __post_init__(self) -> None:
        self.files = SmallFiles(self.shell)
