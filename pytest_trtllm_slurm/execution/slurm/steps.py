"""Batches as steps of the persistent allocation, each started by a detached launcher
(``setsid -f bash step.sh``: it outlives the controller); the task records its step id,
so a hang cancels exactly ``<alloc>.<step>``, never the allocation."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, map_slurm_state
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.scripts import (
    SlurmOptions,
    render_step_command,
    render_step_launcher,
)
from pytest_trtllm_slurm.execution.slurm.alloc_watch import AllocationWatch
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.jobs import AcctRow, SchedulerError
from pytest_trtllm_slurm.execution.slurm.tracking import (
    Backends,
    TrackedJob,
    exit_code_state,
    final_state,
    step_share,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import hidden_env
from pytest_trtllm_slurm.transport.file_ops import remove_files

CONTAINER_STOP_WAIT = 15.0  # seconds a cancelled wrapped step has to remove its container
LAUNCHER_START = 30.0  # seconds a launcher may take to start srun (its srun.pid)
# seconds after its step left the queue before a missing exit-code file sends us to sacct:
# the launcher writes it the moment srun returns, unless it cannot (a full disk, a killed
# launcher); then sacct's final state ends the batch instead of ``final_wait`` seconds later
EXIT_CODE_GRACE = 2.0


class AllocationSteps:
    """Launches batches as steps of an allocation and follows them."""

    def __init__(self, shared: Backends, *, watch: AllocationWatch, final_wait: float,
                 cancel: Callable[[list[TrackedJob]], None],
                 wraps: Callable[[JobSpec], bool]) -> None:
        self.shared = shared
        self.watch = watch
        self.final_wait = final_wait
        self.cancel = cancel  # the executor's (a gated step that never got ready)
        self.wraps = wraps  # a docker/podman-wrapped batch (its container must be stopped)

    def launch(self, spec: JobSpec, opts: SlurmOptions, alloc: AllocationState) -> TrackedJob:
        handle = JobHandle(job_id=f"{alloc.job_id}~{next(self.shared.seq)}", spec=spec,
                           submitted_at=time.time(), nodelist=alloc.nodelist)
        job = TrackedJob(handle, opts, alloc=alloc, share=step_share(spec, alloc))
        self.start(job)
        return job

    def start(self, job: TrackedJob) -> None:
        """Write the step's launcher to its work dir and start it detached."""
        spec, opts, alloc = job.handle.spec, job.opts, job.alloc
        assert alloc is not None
        shell = self.shared.shell
        # a re-used work dir must not show the previous launch's step id or exit code
        remove_files(shell, [job.files.stepid, job.files.srun_pid, job.files.exit_code])
        self.shared.files.watch(job.files.exit_code)  # its end wakes the monitor
        argv = render_step_command(
            spec, alloc.job_id, gres_style=opts.gres_style, mpi=opts.mpi,
            launcher_prefix=opts.launcher_prefix, gres_type=opts.gres_type, share=job.share,
            stepid_path=job.files.stepid, container=opts.container,
        )
        env = {**spec.env, **job.extra_env}
        launcher = render_step_launcher(
            argv, log_path=spec.log_path, pid_path=job.files.srun_pid,
            exit_path=job.files.exit_code, cwd=spec.invocation_dir or spec.rootdir, env=env,
        )
        step_sh = job.files.step_sh
        shell.write_file(step_sh, launcher)
        if self.shared.runs is not None:
            self.shared.runs.add_step(alloc.job_id, spec.work_dir)
        # a launch cut by a dropped connection may have started: never launch it twice.
        # The values step.sh does not hold reach it (and srun, the step) as its environment
        res = shell.run(["setsid", "-f", "bash", step_sh], timeout=30, retry_on_drop=False,
                        env=hidden_env(env) or None)
        if not res.ok:
            raise SchedulerError(res)
        job.launched_at = time.monotonic()

    def _step_id(self, job: TrackedJob, alloc_id: str) -> None:
        """``<alloc>.<step>`` once the task wrote its step id."""
        if job.step_id is None:
            text = self.shared.files.read(job.files.stepid).strip()
            if text.isdigit():
                job.step_id = f"{alloc_id}.{text}"

    def refresh(self, alloc_id: str, jobs: list[TrackedJob]) -> None:
        """One squeue of the allocation's steps; exit codes; final states of those ended."""
        read = self.shared.files.read
        # a gated step waiting at its gate is followed through its files alone
        steps = self.shared.jobs.squeue_steps(alloc_id) if any(
            j.warm is None or not j.warm.launched_early for j in jobs) else {}
        if steps is None and self.watch.check(alloc_id):
            return
        ended: list[tuple[TrackedJob, int]] = []
        now = time.monotonic()
        for job in jobs:
            self._step_id(job, alloc_id)
            code_text = read(job.files.exit_code).strip()
            if code_text.lstrip("-").isdigit():
                ended.append((job, int(code_text)))
                self.shared.files.forget(job.files.exit_code)
            elif job.warm is not None and job.warm.launched_early:
                self._hold_at_gate(job, now)
            elif job.step_id is not None and steps is not None and job.step_id in steps:
                row = steps[job.step_id]
                job.state = JobState(status=JobStatus.RUNNING, nodelist=row.nodelist)
                if job.handle.started_at is None:
                    job.handle.started_at = time.time()
            elif job.step_id is None:
                if not read(job.files.srun_pid) and now - job.launched_at > LAUNCHER_START:
                    job.state = JobState(status=JobStatus.ERROR, reason=(
                        f"the step launcher {job.files.step_sh} did not start"))
                elif steps is None:
                    job.state = JobState(status=JobStatus.PENDING,
                                         reason=f"allocation {alloc_id} is gone")
                else:
                    job.state = JobState(status=JobStatus.PENDING, reason="StepResources")
            else:  # step left the queue; the launcher writes the exit code any moment
                job.left_at = job.left_at or now
                waited = now - job.left_at
                if waited > self.final_wait or (
                        waited > EXIT_CODE_GRACE and self.shared.jobs.accounting is not False):
                    ended.append((job, -1))  # -1: no exit code; sacct may have the end
        if ended:
            self._finalize(ended)

    def _hold_at_gate(self, job: TrackedJob, now: float) -> None:
        """A gated step shows as pending until its gate opens; ranks not ready in time end it."""
        assert job.warm is not None
        limit = job.handle.spec.monitor_timeout_seconds
        if not job.warm.ready and job.launched_at and now - job.launched_at > limit:
            self.cancel([job])
            job.state = JobState(status=JobStatus.TIMEOUT, reason=(
                f"its ranks did not finish collecting within the monitor timeout ({limit} s);"
                f" see {job.handle.spec.log_path}"))
            return
        job.state = job.warm.state

    def _finalize(self, ended: list[tuple[TrackedJob, int]]) -> None:
        """Final step states: sacct of ``<alloc>.<step>`` (OOM, TIMEOUT...), else srun's code."""
        client = self.shared.jobs
        ids = [j.step_id for j, _ in ended if j.step_id]
        rows: dict[str, AcctRow] = {}
        if ids and client.accounting is not False:
            rows = client.sacct(ids, steps=True)
        # a step that Slurm ended without us asking: did its allocation end (a failed node)?
        suspects = {j.alloc.job_id for j, code in ended if j.alloc is not None and not j.cancelled
                    and (code != 0 or map_slurm_state(
                        rows[j.step_id].state if j.step_id in rows else "COMPLETED")
                        is not JobStatus.COMPLETED)}
        gone = {a for a in suspects if self.watch.check(a)}
        now = time.monotonic()
        for job, code in ended:
            if job.alloc is not None and job.alloc.job_id in gone:
                continue  # the watch gave it the allocation's end
            row = rows.get(job.step_id or "")
            if row is not None and map_slurm_state(row.state).finished:
                job.state = final_state(job, row, exit_code=code if code >= 0 else None)
                continue
            job.left_at = job.left_at or now
            # accounting lags srun's exit; without an exit code, wait up to ``final_wait``
            lag = self.final_wait if code < 0 else 10
            if job.step_id and client.accounting is not False and now - job.left_at < lag:
                job.state = JobState(status=JobStatus.RUNNING, nodelist=job.state.nodelist)
                continue
            job.state = exit_code_state(job, code)

    def cancel_ids(self, job: TrackedJob) -> list[str]:
        """The step for scancel; its srun (also one still waiting for its step) gets SIGTERM."""
        assert job.alloc is not None
        self._step_id(job, job.alloc.job_id)
        pid = self.shared.files.read(job.files.srun_pid).strip()
        if pid.isdigit():
            self.shared.shell.run(["kill", "-TERM", pid], timeout=30)
        return [job.step_id] if job.step_id else []

    def stop_containers(self, jobs: list[TrackedJob]) -> None:
        """SIGTERM to steps in a docker/podman run, so the wrapper removes its container (a
        plain cancel is SIGKILL)."""
        steps = []
        for job in jobs:
            if not (job.alloc is not None and self.wraps(job.handle.spec)
                    and not (job.warm is not None and (job.served or job.life.waiting))):
                continue
            self._step_id(job, job.alloc.job_id)
            if job.step_id:
                steps.append(job)
        if not steps:
            return
        self.shared.jobs.run(["scancel", "--signal=TERM", *(j.step_id or "" for j in steps)])
        end = time.monotonic() + CONTAINER_STOP_WAIT
        while time.monotonic() < end and any(
                not self.shared.files.read(j.files.exit_code).strip() for j in steps):
            time.sleep(0.2)
