"""TRTLLM_SLURM_OTP, read once and taken out of the environment (standard library only).

In ``os.environ`` a one-time code would reach every worker, job and test the run starts:
it is taken out at start-up into a ``HeldCode`` the run owns (``config.stash``), and
xdist workers get it through their ``workerinput`` (a pipe)."""

from __future__ import annotations

import os

OTP_ENV = "TRTLLM_SLURM_OTP"
WORKERINPUT_KEY = "trtllm_slurm_otp"


class HeldCode:
    """One run's code from TRTLLM_SLURM_OTP, in memory only; repr() never shows it."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value: str | None = None

    def take_from_environ(self) -> HeldCode:
        """Move TRTLLM_SLURM_OTP from the environment into this holder."""
        value = os.environ.pop(OTP_ENV, None)
        if value is not None and value.strip():
            self._value = value.strip()
        return self

    def hold(self, value: str | None) -> None:
        """Keep ``value`` as this run's code (an xdist worker, from its controller)."""
        if value:
            self._value = value

    def current(self) -> str | None:
        """The code, if one was given (a caller that set TRTLLM_SLURM_OTP after start-up,
        such as a program using the API, is read as it is)."""
        return os.environ.get(OTP_ENV, "").strip() or self._value

    def __repr__(self) -> str:
        return f"HeldCode({'***' if self._value else None})"
