"""local_direct: run a batch as a subprocess of this machine (the embedded default).

Each job gets its own process group so a hang, a timeout or Ctrl-C kills the
whole tree. When the machine has GPUs, concurrent jobs get disjoint
CUDA_VISIBLE_DEVICES slices; a job waits (PENDING) until its slice is free.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
import time
from typing import IO

from ..jobspec import JobSpec
from .base import JobHandle
from .outcome import JobState, JobStatus
from .shell import LocalShell, Shell

KILL_GRACE_SECONDS = 3.0


class _Job:
    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.gpus: list[int] = []
        self.cancelled = False


class DirectExecutor:
    """Runs JobSpecs as local subprocesses."""

    def __init__(self, gpu_ids: list[int] | None = None) -> None:
        self.shell: Shell = LocalShell()
        self._free_gpus = list(gpu_ids or [])
        self._has_gpus = bool(gpu_ids)
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)

    def submit(self, spec: JobSpec) -> JobHandle:
        job_id = f"local-{os.getpid()}-{next(self._ids)}"
        self._jobs[job_id] = _Job(spec)
        self._try_start(job_id)
        return JobHandle(job_id=job_id, spec=spec, submitted_at=time.time(), nodelist="localhost")

    def _try_start(self, job_id: str) -> None:
        job = self._jobs[job_id]
        if job.proc is not None or job.cancelled:
            return
        need = job.spec.total_devices
        env = {**os.environ, **job.spec.env}
        if self._has_gpus and need:
            if need > len(self._free_gpus):
                return  # stays PENDING until a running job gives its GPUs back
            job.gpus, self._free_gpus = self._free_gpus[:need], self._free_gpus[need:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpus))
        os.makedirs(job.spec.work_dir, exist_ok=True)
        job.log = open(job.spec.log_path, "ab")  # noqa: SIM115 - closed when the job ends
        job.proc = subprocess.Popen(
            job.spec.command,
            cwd=job.spec.invocation_dir or job.spec.rootdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=job.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        states: dict[str, JobState] = {}
        for handle in handles:
            job = self._jobs[handle.job_id]
            if job.proc is None:
                self._try_start(handle.job_id)
            states[handle.job_id] = self._state(job)
            if states[handle.job_id].status.finished:
                self._release(job)
        return states

    def _state(self, job: _Job) -> JobState:
        if job.proc is None:
            status = JobStatus.CANCELLED if job.cancelled else JobStatus.PENDING
            return JobState(
                status=status, reason="waiting for free GPUs" if not job.cancelled else None
            )
        code = job.proc.poll()
        if code is None:
            return JobState(status=JobStatus.RUNNING, nodelist="localhost")
        if job.cancelled:
            return JobState(status=JobStatus.CANCELLED, exit_code=code, nodelist="localhost")
        if code < 0:
            reason = f"killed by signal {signal.Signals(-code).name}"
            return JobState(
                status=JobStatus.FAILED, exit_code=code, nodelist="localhost", reason=reason
            )
        status = JobStatus.COMPLETED if code == 0 else JobStatus.FAILED
        return JobState(status=status, exit_code=code, nodelist="localhost")

    def _release(self, job: _Job) -> None:
        if job.log is not None:
            job.log.close()
            job.log = None
        if job.gpus:
            self._free_gpus.extend(job.gpus)
            job.gpus = []

    def cancel(self, handle: JobHandle) -> None:
        """Kill the job's whole process group: TERM, then KILL after a grace period."""
        job = self._jobs[handle.job_id]
        job.cancelled = True
        proc = job.proc
        if proc is None or proc.poll() is not None:
            return
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        self._release(job)

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        from ..scripts import rerun_argv

        cwd = spec.invocation_dir or spec.rootdir
        return f"cd {shlex.quote(cwd)} && {shlex.join(rerun_argv(spec, nodeid))}"

    def close(self) -> None:
        for job_id, job in self._jobs.items():
            if job.proc is not None and job.proc.poll() is None:
                self.cancel(JobHandle(job_id=job_id, spec=job.spec, submitted_at=0))


def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
