"""What the two local executors share: a job is one client process in its own process
group (killed whole on hang, timeout or Ctrl-C), its output appended to the job log, GPUs
handed out in disjoint slices (a job waits PENDING for its slice)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.packing import Capacity
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

KILL_GRACE_SECONDS = 3.0


class LocalJob:
    """One batch and its client process."""

    def __init__(self, spec: JobSpec, name: str = "") -> None:
        self.spec = spec
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.gpus: list[int] = []
        self.cancelled = False
        self.removed = False
        self.fresh = False  # True: a process of its own runs it (the warm session did not)


class LocalProcessExecutor(Executor):
    """Job bookkeeping for executors whose jobs are local process groups."""

    def __init__(self, gpu_ids: Sequence[int] | None = None) -> None:
        self.shell: Shell = LocalShell()
        self._all_gpus = list(gpu_ids or [])
        self._free_gpus = list(self._all_gpus)
        self._jobs: dict[str, LocalJob] = {}
        self._ids = itertools.count(1)

    def capacity(self) -> Capacity:
        """This machine's GPUs (a CPU-only batch runs one at a time)."""
        return Capacity(local_gpus=len(self._all_gpus))

    def _launch(self, job: LocalJob) -> None:
        """Start ``job`` (its GPUs are taken already): call ``_spawn``."""
        raise NotImplementedError

    def _submitted(self, job_id: str, job: LocalJob) -> JobHandle:
        """``job`` started if its GPUs are free, else left PENDING."""
        self._jobs[job_id] = job
        self._try_start(job_id)
        return JobHandle(job_id=job_id, spec=job.spec, submitted_at=time.time(),
                         nodelist="localhost")

    def _exit_reason(self, code: int) -> str | None:
        """Why a client's nonzero exit code failed the job (None: the code says it)."""
        return f"killed by signal {signal.Signals(-code).name}" if code < 0 else None

    def _try_start(self, job_id: str) -> None:
        job = self._jobs[job_id]
        if job.proc is not None or job.cancelled:
            return
        need = job.spec.total_devices
        if self._all_gpus and need:
            if need > len(self._free_gpus):
                return  # stays PENDING until a running job gives its GPUs back
            job.gpus, self._free_gpus = self._free_gpus[:need], self._free_gpus[need:]
        self._launch(job)

    def _spawn(self, job: LocalJob, argv: Sequence[str], *, cwd: str,
               env: Mapping[str, str], banner: str | None = None,
               pass_fds: Sequence[int] = ()) -> None:
        os.makedirs(job.spec.work_dir, exist_ok=True)
        job.log = open(job.spec.log_path, "ab")  # noqa: SIM115 - closed when the job ends
        if banner:
            job.log.write(banner.encode())
            job.log.flush()
        job.proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                                    stdout=job.log, stderr=subprocess.STDOUT,
                                    start_new_session=True, pass_fds=tuple(pass_fds))

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

    def _state(self, job: LocalJob) -> JobState:
        if job.proc is None:
            if job.cancelled:
                return JobState(status=JobStatus.CANCELLED)
            return JobState(status=JobStatus.PENDING, reason="waiting for free GPUs")
        code = job.proc.poll()
        if code is None:
            return JobState(status=JobStatus.RUNNING, nodelist="localhost")
        if job.cancelled or code == 0:
            status = JobStatus.CANCELLED if job.cancelled else JobStatus.COMPLETED
            return JobState(status=status, exit_code=code, nodelist="localhost")
        return JobState(status=JobStatus.FAILED, exit_code=code, nodelist="localhost",
                        reason=self._exit_reason(code))

    def _release(self, job: LocalJob) -> None:
        if job.log is not None:
            job.log.close()
            job.log = None
        if job.gpus:
            self._free_gpus.extend(job.gpus)
            job.gpus = []

    def _stop_group(self, job: LocalJob) -> None:
        """TERM the job's process group, KILL it after a grace period."""
        proc = job.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
