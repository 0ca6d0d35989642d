"""What an early remote session runs: made by the main thread while the early connection's
thread connects (``early_connect``), used by that thread (``early_start``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionAsk:
    """What an early session runs, in the controller's local terms (mapped there)."""

    base: list[str]  # pytest_base_argv: the local interpreter first
    cwd: str
    targets: list[str]
    env: dict[str, str]
    capture_no: bool
    local_work_root: str
