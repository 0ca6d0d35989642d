"""local_direct: run a batch as a subprocess of this machine (the embedded default), in its
own process group, with a disjoint CUDA_VISIBLE_DEVICES slice when there are GPUs; forked by
the run's warm local session (``session``) when one was started and can run it."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from pytest_trtllm_slurm.execution.local.process import (
    KILL_GRACE_SECONDS,
    LocalJob,
    LocalProcessExecutor,
)
from pytest_trtllm_slurm.execution.local.session import LocalSession, ServedBatch
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec


class DirectExecutor(LocalProcessExecutor):
    """Runs JobSpecs as local subprocesses, or as forks of the run's warm local session."""

    def __init__(self, gpu_ids: Sequence[int] | None = None,
                 session: LocalSession | None = None) -> None:
        super().__init__(gpu_ids)
        self.session = session

    def submit(self, spec: JobSpec) -> JobHandle:
        job_id = f"local-{os.getpid()}-{next(self._ids)}"
        return self._submitted(job_id, LocalJob(spec, name=job_id))

    def _launch(self, job: LocalJob) -> None:
        if self.session is not None and not job.fresh and self.session.serves(job.spec):
            job.proc = self.session.send(job.spec, job.name, job.gpus)  # type: ignore[assignment]
            return
        env = {**os.environ, **job.spec.env}
        if job.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpus))
        self._spawn(job, job.spec.command, cwd=job.spec.invocation_dir or job.spec.rootdir,
                    env=env)

    def _state(self, job: LocalJob) -> JobState:
        proc = job.proc
        if isinstance(proc, ServedBatch) and proc.poll() == ServedBatch.NOT_RUN:
            # the session did not run it (it ended, or did not collect these tests): a fresh
            # worker does, on the GPUs the batch holds
            job.fresh, job.proc = True, None
            self._launch(job)
        return super()._state(job)

    def _stop_group(self, job: LocalJob) -> None:
        if isinstance(job.proc, ServedBatch):
            job.proc.stop(KILL_GRACE_SECONDS)
            return
        super()._stop_group(job)

    def cancel(self, handle: JobHandle) -> None:
        """Kill the job's whole process group: TERM, then KILL after a grace period."""
        job = self._jobs[handle.job_id]
        job.cancelled = True
        if job.proc is None or job.proc.poll() is not None:
            return
        self._stop_group(job)
        self._release(job)

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        from pytest_trtllm_slurm.execution.render.scripts import rerun_argv

        cwd = spec.invocation_dir or spec.rootdir
        return f"cd {shlex.quote(cwd)} && {shlex.join(rerun_argv(spec, nodeid))}"

    def close(self) -> None:
        for job_id, job in self._jobs.items():
            if job.proc is not None and job.proc.poll() is None:
                self.cancel(JobHandle(job_id=job_id, spec=job.spec, submitted_at=0))
        if self.session is not None:
            self.session.stop()
