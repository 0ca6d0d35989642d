"""SlurmExecutor (local_slurm; remote_slurm over an SSHShell): the facade over one backend
per kind of batch (``oneshot``, ``steps``, ``warm_batches``), polled adaptively (``cadence``)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.folder_watch import FolderWatch
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.execution.render.containers import CENV_PREFIX
from pytest_trtllm_slurm.execution.render.scripts import (
    ContainerOptions,
    render_rerun_sbatch,
    render_rerun_step,
    rerun_argv,
)
from pytest_trtllm_slurm.execution.slurm.alloc_watch import AllocationWatch
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationState
from pytest_trtllm_slurm.execution.slurm.jobs import SchedulerError, SlurmJobs
from pytest_trtllm_slurm.execution.slurm.launch_options import CONTAINER_SCRIPT, LaunchOptions
from pytest_trtllm_slurm.execution.slurm.oneshot import OneShotJobs
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry, reap_dead_runs
from pytest_trtllm_slurm.execution.slurm.steps import AllocationSteps
from pytest_trtllm_slurm.execution.slurm.tracking import (
    Backends,
    TrackedJob,
    WalltimePolicy,
    reports_settled,
    visible_state,
)
from pytest_trtllm_slurm.execution.slurm.warm_batches import WarmBatches
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.masking import is_masked, is_secret
from pytest_trtllm_slurm.planning.packing import Capacity
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

__all__ = ["SlurmExecutor", "SlurmSettings", "WalltimePolicy"]


@dataclass(frozen=True)
class SlurmSettings:
    """Where and how a SlurmExecutor launches batches, and how it asks the scheduler."""

    slurm_env: SlurmEnv | None = None
    persistent: bool = True
    warm_workers: bool = False  # persistent only: an agent per node serves batches by fork
    walltime: WalltimePolicy | None = None
    launcher_prefix: tuple[str, ...] = ()
    container: ContainerOptions | None = None
    container_runtime: str = "none"
    container_run_flags: tuple[str, ...] | None = None
    min_interval: float = CADENCE.scheduler_min  # the scheduler's adaptive interval
    max_interval: float = CADENCE.scheduler_max
    # a scheduler that fails max_failures times in a row over fail_grace seconds (a
    # slurmctld restart takes a few) turns the jobs into ERROR; fewer are ridden out
    max_failures: int = 5
    fail_grace: float = 30.0
    final_wait: float = 60.0  # seconds a batch that left the queue waits for its end state
    report_wait: float = 15.0  # ... and for its last reports


class SlurmExecutor(Executor):
    """Runs JobSpecs on Slurm through ``shell`` (LocalShell here, SSHShell for remote)."""

    prepares = True
    allocations: AllocationManager | None

    def __init__(self, shell: Shell, settings: SlurmSettings | None = None, *,
                 allocation_manager: AllocationManager | None = None,
                 jobs: SlurmJobs | None = None, runs: RunRegistry | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.settings = settings = settings or SlurmSettings()
        if settings.persistent and allocation_manager is None:
            raise ValueError("persistent=True needs an allocation_manager")
        self.shell = shell
        self.slurm_env = slurm_env = settings.slurm_env
        self.persistent = persistent = settings.persistent
        self.allocations = allocation_manager
        self.jobs = jobs or (allocation_manager.jobs if allocation_manager else SlurmJobs(shell))
        self.warn = warn or (lambda msg: None)
        # this run's record (what it submitted, for the next run after a SIGKILL)
        self.runs = runs or (allocation_manager.runs if allocation_manager else None)
        self.warm_workers = settings.warm_workers and persistent
        # seconds between monitor rounds (warm batches are files: see cadence)
        self.poll_hint = (CADENCE.warm_hint(local=isinstance(shell, LocalShell))
                          if self.warm_workers else None)
        self._warned: set[str] = set()
        self.launch = LaunchOptions(
            self.jobs, slurm_env=slurm_env, launcher_prefix=settings.launcher_prefix,
            container=settings.container, container_runtime=settings.container_runtime,
            container_run_flags=settings.container_run_flags, warn_once=self._warn_once)
        self._shared = Backends(shell=shell, jobs=self.jobs, runs=self.runs,
                                warn=lambda msg: self.warn(msg), wake=self._wake)
        self._jobs = self._shared.batches
        self._by_work_dir: dict[str, TrackedJob] = {}
        self.watch = AllocationWatch(self._shared, fail_grace=settings.fail_grace,
                                     warn_once=self._warn_once, on_end=self._allocation_ended)
        self.oneshot = OneShotJobs(self._shared, slurm_env=slurm_env, persistent=persistent,
                                   walltime=settings.walltime, final_wait=settings.final_wait)
        self.steps = AllocationSteps(self._shared, watch=self.watch,
                                     final_wait=settings.final_wait,
                                     cancel=self._cancel, wraps=self.launch.wraps)
        self.warm = WarmBatches(self._shared, steps=self.steps,
                                early=allocation_manager.early if allocation_manager else None)
        # the scheduler's adaptive interval and its outages
        self._interval = settings.min_interval
        self._next_at = 0.0
        self._failures = 0
        self._failing_since: float | None = None
        self._said_failing = 0.0
        self._alloc: AllocationState | None = None
        self._alloc_checked = False
        self._reaped = False

    def expect(self, tests: Mapping[str, str]) -> None:
        """The run's tests (node id -> key), before the first submit: one session collects all."""
        self.warm.expect(tests)

    def capacity(self) -> Capacity:
        """The persistent allocation as requested, else the partitions discovery saw."""
        manager = self.allocations if self.persistent else None
        return Capacity(allocation=manager.request.shape() if manager else None,
                        warm=self.warm_workers, slurm_env=self.slurm_env)

    def submit(self, spec: JobSpec) -> JobHandle:
        """Start the batch, not waiting; a refused one is a handle in state ERROR (its reason)."""
        self._reap_once()
        spec = self.launch.prepare(spec, self.shell)
        opts = self.launch.options(spec)
        alloc = self._allocation_for(spec) if self.persistent else None
        try:
            if alloc is not None and self.warm_workers:
                job = self.warm.enqueue(spec, opts, alloc, gated=self.launch.gates(spec))
            elif alloc is not None:
                job = self.steps.launch(spec, opts, alloc)
            else:
                job = self.oneshot.submit(spec, opts)
        except SchedulerError as exc:
            handle = JobHandle(job_id=f"unsubmitted-{next(self._shared.seq)}", spec=spec,
                               submitted_at=time.time())
            job = TrackedJob(handle, opts, state=JobState(status=JobStatus.ERROR, reason=str(exc)))
        self._jobs[job.handle.job_id] = job
        self._by_work_dir[spec.work_dir] = job
        if not (job.served or job.life.waiting):  # the scheduler knows of it: ask soon
            self._wake()
        return job.handle

    def prepare(self) -> None:
        """Reap killed runs and get the allocation now (several clusters prepare side by side)."""
        self._reap_once()
        if self.persistent:
            self._ensure_allocation()

    def _reap_once(self) -> None:
        if self.runs is not None and not self._reaped:
            self._reaped = True  # what killed runs left behind goes first
            reap_dead_runs(self.runs, self.jobs, self.shell,
                           self.slurm_env.user if self.slurm_env else None, self.warn)

    def _allocation_for(self, spec: JobSpec) -> AllocationState | None:
        """The persistent allocation when it can serve ``spec``; None -> run one-shot."""
        self._ensure_allocation()
        if self._alloc is None:
            return None
        why = self._alloc.serves(spec)
        if why is not None:
            self._warn_once(f"serves:{why}", f"Batch {spec.name} does not fit allocation "
                            f"{self._alloc.job_id} ({why}); it runs as a one-shot job.")
            return None
        if spec.time_limit and f"time:{spec.time_limit}" not in self._warned:
            assert self.allocations is not None  # an allocation came from it
            self._warned.add(f"time:{spec.time_limit}")
            self.allocations.check_time(self._alloc, spec)
        return self._alloc

    def _ensure_allocation(self) -> None:
        """Ask for the persistent allocation once (again after it ended)."""
        assert self.allocations is not None
        if not self._alloc_checked:
            self._alloc_checked = True
            try:
                self._alloc = self.allocations.ensure()
            except ExecutionError as exc:  # e.g. the queue is too busy: sbatch still queues
                self.warn(f"No persistent allocation ({exc}); batches run as one-shot jobs.")
                self._alloc = None
            if self._alloc is not None:
                self.allocations.check_gpu_processes(self._alloc)

    def _allocation_ended(self, alloc_id: str) -> None:
        """The scheduler ended an allocation: stop its sessions; the next batch asks anew."""
        self.warm.allocation_ended(alloc_id)
        if self._alloc is not None and self._alloc.job_id == alloc_id:
            self._alloc, self._alloc_checked = None, False

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        jobs = [self._jobs[h.job_id] for h in handles if h.job_id in self._jobs]
        self.warm.poll(jobs)
        now = time.monotonic()
        for job in jobs:
            if job.alloc is not None and job.state.status.finished and job.ended_wall is None:
                job.ended_wall = time.time()
        self.watch.watch(jobs, now)
        for job in jobs:  # served batches: files only, every call
            if job.served and job.state.status.finished and not job.life.settled:
                self._settle(job, now)
        # what the scheduler reports on, polled at the adaptive interval
        active = [j for j in jobs if not j.state.status.finished and not j.served
                  and not j.life.waiting]
        unsettled = [j for j in jobs if j.state.status.finished and not j.life.settled
                     and not j.served]
        if (active or unsettled) and now >= self._next_at:
            asked = [*active, *unsettled]
            before = {j.handle.job_id: visible_state(j).status for j in asked}
            try:
                if active:
                    self._refresh(active)
                self._failures, self._failing_since = 0, None
            except SchedulerError as exc:
                self._failures += 1
                self._failing_since = self._failing_since or now
                self._say_failing(exc, now)
                if self._failures >= self.settings.max_failures and (
                        now - self._failing_since >= self.settings.fail_grace):
                    for job in active:
                        job.state = JobState(status=JobStatus.ERROR, reason=(
                            f"scheduler not answering ({self._failures} tries): {exc}"))
            for job in jobs:  # those that ended just now too
                if job.state.status.finished and not job.life.settled and not job.served:
                    self._settle(job, now)
            # nodes of ended steps are given back by the next warm.poll (no hurry for reasons)
            changed = any(visible_state(j).status != before[j.handle.job_id] for j in asked)
            self._interval = CADENCE.next_scheduler_interval(
                self._interval, changed=changed, low=self.settings.min_interval,
                high=self.settings.max_interval)
            self._next_at = time.monotonic() + self._interval
        return {j.handle.job_id: self._shown(j) for j in jobs}

    @property
    def vouched(self) -> int:
        return self.watch.vouched

    def quiet(self, handles: list[JobHandle]) -> set[str]:
        return self.warm.quiet([self._jobs[h.job_id] for h in handles if h.job_id in self._jobs])

    def end_watches(self) -> list[FolderWatch]:
        return self.warm.end_watches()

    def _refresh(self, active: list[TrackedJob]) -> None:
        """Ask the scheduler about one-shot jobs, then about each allocation's steps."""
        oneshot = [j for j in active if j.alloc is None]
        if oneshot:
            self.oneshot.refresh(oneshot)
        for alloc_id in dict.fromkeys(j.alloc.job_id for j in active if j.alloc is not None):
            self.steps.refresh(alloc_id, [j for j in active
                                          if j.alloc is not None and j.alloc.job_id == alloc_id])

    def _settle(self, job: TrackedJob, now: float) -> None:
        """An ended batch is shown once its allocation's end is ruled out and its reports are in."""
        if self.watch.confirmed(job) and reports_settled(self.shell, job, now,
                                                         self.settings.report_wait):
            job.life.settle()

    def _shown(self, job: TrackedJob) -> JobState:
        """The monitor's view, with when its allocation was last seen running."""
        state = visible_state(job)
        if job.alloc is not None and not state.status.finished:
            state = state.model_copy(update={"alive_at": self.watch.alive.get(
                job.alloc.job_id, 0.0)})
        return state

    def _say_failing(self, exc: SchedulerError, now: float) -> None:
        """From the second scheduler failure in a row, a line at most every 30 s."""
        if self._failures < 2 or now - self._said_failing < 30.0:
            return
        self._said_failing = now
        since = time.strftime("%H:%M:%S", time.localtime(
            time.time() - (now - (self._failing_since or now))))
        first = (str(exc).splitlines() or ["?"])[0]
        self.warn(f"The scheduler has not answered since {since} ({self._failures} tries; "
                  f"last: {first}); still waiting for it.")

    def cancel(self, handle: JobHandle) -> None:
        """Cancel one batch: its job, or its step (never the allocation)."""
        job = self._jobs.get(handle.job_id)
        if job is None or job.state.status.finished:
            return
        self._cancel([job])

    def _cancel(self, jobs: list[TrackedJob]) -> None:
        """Each batch through its backend; one scancel for all of them."""
        self.steps.stop_containers(jobs)
        ids: list[str] = []
        for job in jobs:
            job.cancelled = True
            if job.warm is not None and (job.served or job.life.waiting):
                self.warm.cancel(job)
            elif job.alloc is not None:
                ids += self.steps.cancel_ids(job)
            else:
                ids += self.oneshot.cancel_ids(job)
        if ids:
            self.jobs.scancel(ids)
        self._wake()

    def close(self) -> None:
        """Cancel every unfinished job and step of this run; the allocation stays."""
        self._cancel([j for j in self._jobs.values() if not j.state.status.finished])
        self.warm.close()
        if self.allocations is not None:
            self.allocations.close()  # this run's lease on the allocation and its record
        elif self.runs is not None:
            self.runs.finish()

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        job = self._by_work_dir.get(spec.work_dir)
        opts = job.opts if job else self.launch.options(spec)
        assign = ""
        if self.launch.wraps(spec):
            # the same container around a plain pytest of ``nodeid``, with the launcher's env
            # where it may be shown (masked and secret values are left to your shell)
            base = self.launch.unwrapped.get(spec.work_dir, spec)
            script = str(PurePosixPath(base.work_dir) / CONTAINER_SCRIPT)
            env, argv = self.launch.wrapped(base.masked(), rerun_argv(base, nodeid),
                                      script if job is not None else None)
            assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
                              if not is_masked(v) and not is_secret(
                                  k, base.env.get(k.removeprefix(CENV_PREFIX), v)))
            spec = base.model_copy(update={"command": argv, "rerun_argv": []})
        if job is not None and job.alloc is not None:
            text = render_rerun_step(spec, nodeid, job.alloc.job_id, opts, job.share)
            if assign:  # "cd DIR && NAME=VALUE ... srun ..."
                head, sep, tail = text.partition(" && ")
                text = f"{head}{sep}{assign} {tail}"
            return text
        text = render_rerun_sbatch(spec, nodeid, opts)
        return f"{assign} {text}" if assign else text

    def _wake(self) -> None:
        self._interval = self.settings.min_interval
        self._next_at = 0.0

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warn(msg)
