"""What the Slurm executor tracks per batch and its backends share; how end states are
derived (squeue/sacct rows and exit codes in), and when one may be shown: once its reports
file is complete (shared file systems lag; only a batch that exited 0 waits for it)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pytest_trtllm_slurm.execution.outcome import (
    CRASH_SIGNALS,
    JobState,
    JobStatus,
    map_slurm_state,
    signal_name,
    signal_of_exit_code,
)
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.pushed_files import SmallFiles
from pytest_trtllm_slurm.execution.render.scripts import SlurmOptions, StepShare
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.jobs import AcctRow, SlurmJobs
from pytest_trtllm_slurm.execution.slurm.lifecycle import FollowsState, Lifecycle, Phase
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.execution.slurm.warm_pool import WarmJob
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.node.records import SESSION_FINISH
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Launch
from pytest_trtllm_slurm.transport.shell import Shell

#: workflows whose command writes no reports file (its exit code is all there is)
NO_REPORTS = frozenset({"build"})


@dataclass(frozen=True)
class WalltimePolicy:
    """--trtllm-negotiate-walltime: a job pending over ``pending_after`` s whose start is
    over ``far_start`` s away (or unknown) gets the shorter ``new_limit`` once, and is told."""

    pending_after: float = 30.0
    far_start: float = 600.0
    new_limit: str = "01:00:00"


class TrackedJob(FollowsState):
    """One submitted batch and what the executor knows of it (``life``: its WarmJob's too)."""

    def __init__(self, handle: JobHandle, opts: SlurmOptions, *,
                 alloc: AllocationState | None = None, share: StepShare | None = None,
                 state: JobState | None = None, step_id: str | None = None,
                 life: Lifecycle | None = None) -> None:  # ``alloc``: set for steps
        self.handle, self.opts, self.alloc, self.share = handle, opts, alloc, share
        self.life = life or Lifecycle(Phase.SUBMITTED)
        self.state = state or JobState(status=JobStatus.PENDING)
        self.step_id = step_id  # "<alloc>.<step>" once the task recorded it
        self.left_at: float | None = None  # when it left the queue without a final state yet
        self.launched_at = 0.0
        self.cancelled = False  # a cancel we asked for (it wins over FAILED)
        self.negotiated = False  # the walltime policy looked at it (once)
        self.settle_since: float | None = None  # since when its reports are waited for
        self.warm: WarmJob | None = None  # placed by the allocation's AgentPool (warm workers)
        self.extra_env: dict[str, str] = {}  # the launch's, not the batch's
        self.ended_wall: float | None = None  # when a batch in the allocation was seen to end

    @property
    def served(self) -> bool:
        """Run by a warm worker (no step of its own)."""
        return self.warm is not None and self.warm.warm

    @property
    def files(self) -> Batch[str]:
        """The names of its work dir's files."""
        return Batch(self.handle.spec.work_dir)


@dataclass
class Backends:
    """What the backends and the allocation watch share (one place: none keeps a copy)."""

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


def visible_state(job: TrackedJob) -> JobState:
    """What the monitor sees: a finished job stays RUNNING until its reports settled."""
    if job.state.status.finished and not job.life.settled:
        return JobState(status=JobStatus.RUNNING, nodelist=job.state.nodelist,
                        reason="waiting for reports.jsonl (shared file system lag)")
    return job.state


def final_state(job: TrackedJob, row: AcctRow, exit_code: int | None = None) -> JobState:
    """The end state from sacct/scontrol (a cancel we asked for wins over FAILED; a step
    ended by a crash signal that nobody sent, e.g. SIGSEGV, is CRASHED, not CANCELLED)."""
    status = map_slurm_state(row.state)
    code = exit_code if exit_code is not None else row.exit_code
    sig = row.signal or signal_of_exit_code(code)
    if job.cancelled and status is JobStatus.FAILED:
        status = JobStatus.CANCELLED
    crashed = (not job.cancelled and sig in CRASH_SIGNALS
               and status in (JobStatus.CANCELLED, JobStatus.FAILED))
    if crashed:
        status = JobStatus.CRASHED
    if sig:  # srun and the shell turn a signal into an exit code: name the signal instead
        code = None
    reason = None
    if status is not JobStatus.COMPLETED:
        where = f"step {job.step_id}" if job.step_id else f"job {job.handle.job_id}"
        what = f"killed by {signal_name(sig)}" if crashed and sig else row.state
        reason = f"{where}: {what}" + (f" (exit {code})" if code else "") + (
            f", {signal_name(sig)}" if sig and not crashed else "") + (
            f"; {row.reason}" if row.reason and row.reason != "None" else "")
    return JobState(status=status, exit_code=code, signal=sig or None,
                    nodelist=row.nodelist or job.state.nodelist, reason=reason)


def exit_code_state(job: TrackedJob, code: int) -> JobState:
    """A step's end state from srun's exit code (-1: the launcher died without one)."""
    if code == 0:
        return JobState(status=JobStatus.COMPLETED, exit_code=0, nodelist=job.state.nodelist)
    sig = signal_of_exit_code(code) if code > 0 else None
    if job.cancelled:
        status = JobStatus.CANCELLED
    elif sig in CRASH_SIGNALS:
        status = JobStatus.CRASHED
    else:
        status = JobStatus.FAILED if code > 0 else JobStatus.ERROR
    where = f"step {job.step_id}" if job.step_id else "srun (no step was created)"
    how = f"was killed by {signal_name(sig)}" if sig else f"exited with {code}"
    return JobState(status=status, exit_code=code if code >= 0 and not sig else None,
                    signal=sig, nodelist=job.state.nodelist,
                    reason=f"{where} {how}; see {job.handle.spec.log_path}")


def step_share(spec: JobSpec, alloc: AllocationState) -> StepShare:
    """CPUs and memory for a step in proportion to its GPUs (whole allocation per node
    split by GPU count), so steps run side by side instead of waiting for each other."""
    gpus = alloc.gpus_per_node
    frac = spec.devices_per_node / gpus if gpus and spec.devices_per_node else (
        1 / gpus if gpus else 1.0)
    frac = min(1.0, frac)
    tasks_per_node = (spec.devices_per_node or 1) if spec.launch is Launch.MPI else 1
    cpus = max(1, int(alloc.cpus_per_node * frac) // tasks_per_node) \
        if alloc.cpus_per_node else None
    mem = max(64, int(alloc.mem_per_node_mb * frac)) if alloc.mem_per_node_mb else None
    return StepShare(cpus_per_task=cpus, mem_mb=mem)


def reports_settled(shell: Shell, job: TrackedJob, now: float, report_wait: float) -> bool:
    """True when the batch's reports are complete, or given up on."""
    if job.state.status not in (JobStatus.COMPLETED, JobStatus.FAILED) or (
            job.handle.spec.workflow in NO_REPORTS) or session_finished(shell, job):
        return True
    if job.settle_since is None:
        job.settle_since = now
        shell.run(["ls", "-a", job.handle.spec.work_dir], timeout=30)  # NFS refresh
        if session_finished(shell, job):
            return True
    if job.state.status is not JobStatus.COMPLETED:
        return True
    return now - job.settle_since >= report_wait


def session_finished(shell: Shell, job: TrackedJob) -> bool:
    """The worker wrote its last line (``session_finish``) to the reports file."""
    path = job.handle.spec.reports_path
    tail = shell.read_from(path, max(0, shell.size(path) - 4096))
    return f'"{SESSION_FINISH}"'.encode() in tail
