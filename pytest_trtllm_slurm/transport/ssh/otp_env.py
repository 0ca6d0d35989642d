"""TRTLLM_SLURM_OTP, read once and taken out of the environment (standard library only).

A one-time code in ``os.environ`` would reach every process this run starts: local
workers, every srun/sbatch job (Slurm exports the submitter's environment), the tests
themselves. The plugin takes it out before any of them starts (``take_from_environ``, at
start-up) and keeps it in this process's memory only; pytest-xdist workers get it from
the controller through their ``workerinput`` (a pipe, not the environment or a file).
"""

from __future__ import annotations

import os

OTP_ENV = "TRTLLM_SLURM_OTP"
WORKERINPUT_KEY = "trtllm_slurm_otp"

_held: list[str] = []


def take_from_environ() -> None:
    """Move TRTLLM_SLURM_OTP from the environment into this process's memory."""
    value = os.environ.pop(OTP_ENV, None)
    if value is not None and value.strip():
        _held[:] = [value.strip()]


def hold(value: str | None) -> None:
    """Keep ``value`` as this run's code (an xdist worker, from its controller)."""
    if value:
        _held[:] = [value]


def current() -> str | None:
    """This run's code from TRTLLM_SLURM_OTP, if one was given (a caller that set it
    after start-up, such as a program using the API, is read as it is)."""
    value = os.environ.get(OTP_ENV, "").strip()
    return value or (_held[0] if _held else None)
