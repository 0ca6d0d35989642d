"""Job end states and what they mean for the tests of a batch."""

from __future__ import annotations

import signal as _signal
from enum import Enum

from pydantic import BaseModel


class JobStatus(str, Enum):
    """One vocabulary for every executor (Slurm states map onto it)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CRASHED = "CRASHED"
    TIMEOUT = "TIMEOUT"
    HANG_DETECTED = "HANG_DETECTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    CANCELLED = "CANCELLED"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BUILD_FAILED = "BUILD_FAILED"
    ERROR = "ERROR"

    @property
    def finished(self) -> bool:
        return self not in (JobStatus.PENDING, JobStatus.RUNNING)


# Slurm's job states (sacct/squeue) onto ours; anything unknown and final is ERROR.
SLURM_STATE_MAP: dict[str, JobStatus] = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"),
                    JobStatus.PENDING),
    **dict.fromkeys(("RESIZING", "SUSPENDED", "RUNNING", "COMPLETING", "STAGE_OUT",
                     "SIGNALING"), JobStatus.RUNNING),
    **dict.fromkeys(("FAILED", "SPECIAL_EXIT"), JobStatus.FAILED),
    **dict.fromkeys(("BOOT_FAIL", "NODE_FAIL"), JobStatus.NODE_FAIL),
    **dict.fromkeys(("TIMEOUT", "DEADLINE"), JobStatus.TIMEOUT),
    **dict.fromkeys(("CANCELLED", "REVOKED"), JobStatus.CANCELLED),
    **{state: JobStatus(state) for state in ("COMPLETED", "OUT_OF_MEMORY", "PREEMPTED")},
}


def map_slurm_state(state: str) -> JobStatus:
    """Map a Slurm state such as ``CANCELLED by 0`` or ``OUT_OF_MEMORY`` to a JobStatus."""
    word = state.strip().split(" ", 1)[0].rstrip("+").upper()
    return SLURM_STATE_MAP.get(word, JobStatus.ERROR)


class JobState(BaseModel):
    """What an executor knows about one job right now."""

    status: JobStatus
    exit_code: int | None = None
    nodelist: str | None = None
    reason: str | None = None  # pending reason, or why it ended
    signal: int | None = None  # the signal that killed the job's process, when one did
    # epoch seconds: when the scheduler ended it (reports stamped later do not count), when
    # it last said its allocation runs (warm batches: reports stamped later wait)
    ended_at: float | None = None
    alive_at: float | None = None


# signals of a process's own fault: a CANCELLED or FAILED step ended by one is a crash
CRASH_SIGNALS = frozenset(int(s) for s in (
    _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGABRT, _signal.SIGFPE, _signal.SIGILL,
    _signal.SIGSYS, _signal.SIGTRAP))


def signal_name(number: int) -> str:
    """``11`` -> ``signal 11 (SIGSEGV)``."""
    try:
        return f"signal {number} ({_signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def signal_of_exit_code(code: int | None) -> int | None:
    """The shell's convention (128 + N, or -N from Python): the signal, else None."""
    if code is None:
        return None
    if code < 0 and -code < 65:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None
