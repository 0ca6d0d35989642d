"""The build job: compile once before any test batch, through the same executor and monitor."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.monitor import Monitor, log_tail
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.planning.jobspec import JobSpec

DEFAULT_BUILD_CMD = "python3 ./scripts/build_wheel.py -a {arch} && pip install -e ."
BUILD_LOG_LINES = 100


def build_command(build_cmd: str | None, arch: str) -> list[str]:
    """argv of the build: ``build_cmd`` (``{arch}`` quoted) or TensorRT-LLM's wheel build."""
    text = (build_cmd or DEFAULT_BUILD_CMD).replace("{arch}", shlex.quote(arch))
    return ["bash", "-c", text]


def run_build(executor: Executor, spec: JobSpec, *, progress: Callable[[str], None],
              poll_interval: float = CADENCE.build) -> tuple[JobState, str, str]:
    """Submit the build and wait: its final state, its log's last lines and the log's
    path; ``progress`` gets a new last line of the log every few seconds."""
    monitor = Monitor(spec.hang_patterns, poll_interval=poll_interval)
    handle = executor.submit(spec)
    monitor.add(handle, executor)
    shown, last_shown = "", 0.0
    while True:
        for event in monitor.poll():
            if event.final is not None:
                tail = log_tail(executor, handle.spec.log_path, BUILD_LOG_LINES)
                return event.final, tail, handle.spec.log_path
        now = time.monotonic()
        if now - last_shown > 5:
            line = log_tail(executor, handle.spec.log_path, 1).strip()
            if line and line != shown:
                progress(f"build {handle.job_id}: {line[:160]}")
                shown, last_shown = line, now
        time.sleep(poll_interval)


def build_failed(state: JobState) -> bool:
    return state.status is not JobStatus.COMPLETED or (state.exit_code or 0) != 0
