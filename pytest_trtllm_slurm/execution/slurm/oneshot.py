"""One-shot batches: each its own sbatch job, followed with one squeue of all of them per
round and, once they left the queue, sacct (or scontrol without accounting)."""

from __future__ import annotations

import time

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, map_slurm_state
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.scripts import SlurmOptions, render_sbatch
from pytest_trtllm_slurm.execution.slurm.jobs import (
    WAITING_REASONS,
    AcctRow,
    QueueRow,
    blocker_note,
    epoch,
    parse_duration,
)
from pytest_trtllm_slurm.execution.slurm.tracking import (
    Backends,
    TrackedJob,
    WalltimePolicy,
    final_state,
)
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv

BLOCKER_AFTER = 5.0  # seconds a job waits before we look for the user's own allocation


class OneShotJobs:
    """Submits batches with sbatch and follows them in the queue."""

    def __init__(self, shared: Backends, *, slurm_env: SlurmEnv | None, persistent: bool,
                 walltime: WalltimePolicy | None, final_wait: float) -> None:
        self.shared = shared
        self.slurm_env = slurm_env
        self.persistent = persistent  # blockers: a one-shot run's own allocation is one
        self.walltime = walltime
        self.final_wait = final_wait
        self._blockers: dict[str, str] = {}  # job id -> who holds the nodes it waits for

    def submit(self, spec: JobSpec, opts: SlurmOptions) -> TrackedJob:
        script = render_sbatch(spec, gres_style=opts.gres_style, mpi=opts.mpi,
                               launcher_prefix=opts.launcher_prefix, gres_type=opts.gres_type,
                               container=opts.container)
        path = Batch(spec.work_dir).sbatch
        self.shared.shell.write_file(path, script)
        job_id = self.shared.jobs.sbatch(path, cwd=spec.work_dir, script=script,
                                         env=spec.env)
        if self.shared.runs is not None:
            self.shared.runs.add_job(job_id, spec.job_name)
        return TrackedJob(JobHandle(job_id=job_id, spec=spec, submitted_at=time.time()), opts)

    def cancel_ids(self, job: TrackedJob) -> list[str]:
        """What scancel is given for the batch (nothing for a refused submission)."""
        return [] if job.handle.job_id.startswith("unsubmitted-") else [job.handle.job_id]

    def refresh(self, jobs: list[TrackedJob]) -> None:
        """One squeue for all of them; those that left the queue get their final state."""
        rows = self.shared.jobs.squeue_jobs([j.handle.job_id for j in jobs])
        left: list[TrackedJob] = []
        for job in jobs:
            row = rows.get(job.handle.job_id)
            status = map_slurm_state(row.state) if row else None
            if row is not None and status is not None and not status.finished:
                reason = row.reason if status is JobStatus.PENDING else None
                if reason in WAITING_REASONS:
                    reason = self._with_blocker(job, reason)
                job.state = JobState(status=status, nodelist=row.nodelist, reason=reason)
                if status is JobStatus.PENDING and self.walltime and not job.negotiated:
                    self._negotiate(job, row)
                if status is JobStatus.RUNNING and job.handle.started_at is None:
                    job.handle.started_at = time.time()
            else:
                left.append(job)
        if left:
            self._finalize(left)

    def _with_blocker(self, job: TrackedJob, reason: str) -> str:
        """A waiting job's reason, plus the user's own allocation when one holds nodes of
        its partition (asked once per job, once it has waited BLOCKER_AFTER seconds)."""
        job_id = job.handle.job_id
        if (job_id not in self._blockers and self.slurm_env is not None
                and self.slurm_env.user
                and time.time() - job.handle.submitted_at >= BLOCKER_AFTER):
            self._blockers[job_id] = blocker_note(
                self.shared.jobs, self.slurm_env.user, job.handle.spec.partition,
                one_shot=not self.persistent) or ""
        note = self._blockers.get(job_id)
        return f"{reason}: {note}" if note else reason

    def _negotiate(self, job: TrackedJob, row: QueueRow) -> None:
        """Shorten the time limit of a job that would wait long (seed: walltime strategy)."""
        policy = self.walltime
        assert policy is not None
        if time.time() - job.handle.submitted_at < policy.pending_after:
            return
        job.negotiated = True
        start = epoch(row.start or "")
        wait = None if start is None else start - time.time()
        if wait is not None and wait <= policy.far_start:
            return
        have, want = parse_duration(row.time_limit), parse_duration(policy.new_limit)
        if have is None or want is None or want >= have:
            return
        res = self.shared.jobs.run(["scontrol", "update", f"JobId={job.handle.job_id}",
                                    f"TimeLimit={policy.new_limit}"])  # (while it pends)
        eta = f"estimated start {row.start}" if wait is not None else "no estimated start"
        if res.ok:
            self.shared.warn(
                f"Reduced the time limit of job {job.handle.job_id} ({job.handle.spec.name})"
                f" from {row.time_limit} to {policy.new_limit} for faster scheduling "
                f"({eta}); it now has less time to run.")
        else:
            self.shared.warn(f"Could not shorten job {job.handle.job_id}: {res.describe()}")

    def _finalize(self, jobs: list[TrackedJob]) -> None:
        """Jobs no longer queued: final state from sacct, else scontrol, within final_wait."""
        client = self.shared.jobs
        now = time.monotonic()
        for job in jobs:
            job.left_at = job.left_at or now
        rows: dict[str, AcctRow] = {}
        if client.accounting is not False:
            rows = client.sacct([j.handle.job_id for j in jobs])
        failed = [i for i, r in rows.items() if map_slurm_state(r.state) is JobStatus.FAILED]
        for job_id, step in (client.failed_steps(failed) if failed else {}).items():
            was = rows[job_id]
            if step.state.startswith("OUT_OF_MEMORY"):
                rows[job_id] = AcctRow(job_id, "OUT_OF_MEMORY", was.exit_code, was.signal,
                                       was.nodelist, f"step {step.job_id} ran out of memory")
            elif step.signal and not was.signal:  # srun's exit code is the task's signal
                rows[job_id] = AcctRow(job_id, was.state, None, step.signal, was.nodelist,
                                       f"step {step.job_id}: {step.state}")
        for job in jobs:
            row = rows.get(job.handle.job_id)
            if row is None and client.accounting is False:
                row = client.scontrol_job(job.handle.job_id)
            if row is not None and map_slurm_state(row.state).finished:
                job.state = final_state(job, row)
            elif now - (job.left_at or now) > self.final_wait:
                job.state = JobState(status=JobStatus.ERROR, nodelist=job.state.nodelist,
                                     reason=f"job {job.handle.job_id} left the queue but its "
                                     f"final state is unknown after {self.final_wait:.0f} s")
            else:
                job.state = JobState(status=JobStatus.RUNNING, nodelist=job.state.nodelist)
