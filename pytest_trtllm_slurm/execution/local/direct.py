"""local_direct: run a batch as a subprocess of this machine (the embedded default), in its
own process group, with a disjoint CUDA_VISIBLE_DEVICES slice when there are GPUs."""

from __future__ import annotations

import os
import shlex

from pytest_trtllm_slurm.execution.local.process import LocalJob, LocalProcessExecutor
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec


class DirectExecutor(LocalProcessExecutor):
    """Runs JobSpecs as local subprocesses."""

    def submit(self, spec: JobSpec) -> JobHandle:
        return self._submitted(f"local-{os.getpid()}-{next(self._ids)}", LocalJob(spec))

    def _launch(self, job: LocalJob) -> None:
        env = {**os.environ, **job.spec.env}
        if job.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpus))
        self._spawn(job, job.spec.command, cwd=job.spec.invocation_dir or job.spec.rootdir,
                    env=env)

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
