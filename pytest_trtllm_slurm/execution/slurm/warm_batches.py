"""Batches in an allocation with warm workers, placed by its AgentPool: a pytest batch runs in
a fork of the node's warm worker (followed through files), an MPI batch as a (gated) step."""

from __future__ import annotations

import time
from collections.abc import Mapping

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.folder_watch import FolderWatch
from pytest_trtllm_slurm.execution.news import NewsFolder
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.scripts import SlurmOptions, StepShare
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
from pytest_trtllm_slurm.execution.slurm.jobs import SchedulerError
from pytest_trtllm_slurm.execution.slurm.lifecycle import Lifecycle, Phase
from pytest_trtllm_slurm.execution.slurm.steps import AllocationSteps
from pytest_trtllm_slurm.execution.slurm.tracking import Backends, TrackedJob, step_share
from pytest_trtllm_slurm.execution.slurm.warm_pool import (
    AgentPool,
    Delivery,
    WarmJob,
)
from pytest_trtllm_slurm.node.protocol import GATE_ENV, GATE_WAIT_ENV
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.file_ops import FileOp
from pytest_trtllm_slurm.transport.shell import LocalShell


class WarmBatches:
    """This run's pools (one per allocation) and the batches they place."""

    def __init__(self, shared: Backends, *, steps: AllocationSteps,
                 early: EarlySessions | None = None) -> None:
        self.shared = shared
        self.early = early  # the run's sessions started before it collected
        self.steps = steps  # a step the pool gave nodes to is launched there
        self.pools: dict[str, AgentPool] = {}
        self.expected: dict[str, str] = {}  # node id -> key (``node.item_key``)
        self._recorded: set[str] = set()  # batches noted in this run's record (``_note``)
        self.news: dict[str, NewsFolder] = {}  # news folder -> its reader (files here only)

    def expect(self, tests: Mapping[str, str]) -> None:
        self.expected.update(tests)  # (every pool shares this dict)

    def enqueue(self, spec: JobSpec, opts: SlurmOptions, alloc: AllocationState, *,
                gated: bool) -> TrackedJob:
        """The pool places the batch (now or once GPUs free up); ``gated``: launched early."""
        pool = self.pools.get(alloc.job_id)
        if pool is None:
            pool = AgentPool(self.shared.shell, alloc, gres_style=opts.gres_style,
                             gres_type=opts.gres_type, warn=self.shared.warn,
                             list_steps=self.shared.jobs.squeue_steps, early=self.early,
                             files=self.shared.files, notes=self._note)
            pool.expected = self.expected
            self.pools[alloc.job_id] = pool
        handle = JobHandle(job_id=f"{alloc.job_id}~w{next(self.shared.seq)}", spec=spec,
                           submitted_at=time.time(), nodelist=alloc.nodelist)
        job = TrackedJob(handle, opts, alloc=alloc, share=step_share(spec, alloc),
                         life=Lifecycle(Phase.WAITING))
        warm = spec.serves_by_fork() and pool.carries(spec)
        job.warm = pool.add(handle.job_id, spec, warm=warm, gated=not warm and gated,
                            life=job.life)
        if not pool.warmed and job.warm.warm:
            pool.warmed = True
            pool.warm_up(spec)
        self.shared.batches[handle.job_id] = job
        pool.place_waiting(self._start_granted_step)
        self.sync(job)
        return job

    def _start_granted_step(self, job_id: str, warm: WarmJob) -> None:
        """A step the pool gave (or set aside) whole nodes: pinned there, overlapping the agents."""
        job = self.shared.batches[job_id]
        assert warm.placement is not None or warm.gated
        nodes = ",".join(n.name for n in (warm.placement.nodes if warm.placement
                                          else warm.reserved))
        base = job.share or StepShare()
        job.share = StepShare(cpus_per_task=base.cpus_per_task, mem_mb=base.mem_mb,
                              overlap=True, extra=(*base.extra, f"--nodelist={nodes}"))
        try:
            if warm.gated:
                self.shared.shell.mkdir(warm.gate_dir)
                job.extra_env = {GATE_ENV: warm.gate_dir,
                                 GATE_WAIT_ENV: str(job.handle.spec.monitor_timeout_seconds)}
            self.steps.start(job)
            self.shared.wake()
        except (SchedulerError, ExecutionError, OSError) as exc:
            job.state = JobState(status=JobStatus.ERROR, reason=str(exc))
            warm.state = job.state

    def sync(self, job: TrackedJob) -> None:
        """A served or waiting batch shows the pool's view of it."""
        warm = job.warm
        if warm is None or not (job.served or job.life.waiting) or job.state.status.finished:
            return
        job.state = warm.state
        if warm.placement is not None:
            job.handle.nodelist = warm.placement.names
        if job.state.status is JobStatus.RUNNING and job.handle.started_at is None:
            job.handle.started_at = time.time()

    def _note(self, job_id: str, sent: Delivery) -> list[FileOp]:
        """The run record's note of a batch, written with its request and ahead of it (one
        round trip), so that the next run can cancel it if this controller is killed."""
        runs = self.shared.runs
        if runs is None or not sent.session or job_id in self._recorded:
            return []
        self._recorded.add(job_id)
        return [runs.warm_note(sent.session, sent.request_name)]

    def poll(self, jobs: list[TrackedJob]) -> None:
        """Every call (files only): served batches' states, ended steps' slots, placements."""
        if not self.pools:
            return
        for job in jobs:
            warm = job.warm
            if warm is None or job.alloc is None:
                continue
            if job.served and not job.state.status.finished:
                self.pools[job.alloc.job_id].refresh(warm)
                self.sync(job)
            elif not job.state.status.finished and warm.placement is not None:
                pool = self.pools[job.alloc.job_id]
                if pool.ranks_exited(warm):  # its state still comes from srun and sacct
                    pool.release(warm)
                elif self.shared.files.read(job.files.exit_code).strip() == "0":
                    # a step of the pool that srun says succeeded: its nodes are needed
                    # now, not after the next squeue and sacct (a failure still goes that way)
                    job.state = JobState(status=JobStatus.COMPLETED, exit_code=0,
                                         nodelist=job.state.nodelist)
                    self.shared.files.forget(job.files.exit_code)
        self._place_waiting()
        for job in jobs:
            self.sync(job)

    def quiet(self, jobs: list[TrackedJob]) -> set[str]:
        """Served batches with no news since the last call, and those waiting for GPUs."""
        if not isinstance(self.shared.shell, LocalShell):
            return set()
        by_folder: dict[str, dict[str, TrackedJob]] = {}
        quiet: set[str] = set()
        for job in jobs:
            warm = job.warm
            if (warm is None or not warm.warm or job.state.status.finished
                    or warm.state.status.finished):
                continue
            if warm.sent is None:  # waits for GPUs: placed by any round's poll, then its
                if warm.placement is None and not warm.cancelled:  # notices count
                    quiet.add(job.handle.job_id)
                continue
            by_folder.setdefault(warm.sent.news, {})[warm.sent.notice] = job
        for folder, named in by_folder.items():
            news = self.news.setdefault(folder, NewsFolder(folder)).take(set(named))
            if news is not None:
                quiet.update(j.handle.job_id for n, j in named.items() if n not in news)
        return quiet

    def end_watches(self) -> list[FolderWatch]:
        """Wake-ups on a batch's end in the news folders read here (``folder_watch``)."""
        return [w for w in (news.watch() for news in self.news.values()) if w is not None]

    def _place_waiting(self) -> None:
        """Give back the nodes of every pool step that ended, then start what now fits."""
        for job in self.shared.batches.values():
            warm = job.warm
            if (warm is None or job.alloc is None or job.served
                    or not job.state.status.finished):
                continue
            if warm.placement and warm.placement.gpus:
                self.pools[job.alloc.job_id].release(warm)
            elif warm.reserved and warm.placement is None and not warm.cancelled:
                self.pools[job.alloc.job_id].drop(warm)  # a gated step ended at its gate
        for pool in self.pools.values():  # a step it launches wakes the scheduler polls
            pool.place_waiting(self._start_granted_step)

    def cancel(self, job: TrackedJob) -> None:
        """A served or waiting batch: its worker is told (or it never starts)."""
        assert job.warm is not None and job.alloc is not None
        self.pools[job.alloc.job_id].cancel(job.warm)
        self.sync(job)

    def allocation_ended(self, alloc_id: str) -> None:
        """Stop this run's sessions in an allocation the scheduler ended."""
        pool = self.pools.get(alloc_id)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for news in self.news.values():
            news.close()
        for pool in self.pools.values():
            pool.close()
