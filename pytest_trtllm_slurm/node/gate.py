"""The start gate of a step launched before its GPUs are free (target side): a multi-node MPI
batch's ranks import the suite meanwhile (``TRTLLM_SLURM_GATE=DIR``), each writing
``ready.<rank>`` (rank 0 ``ready`` once all have), waiting for ``open``, and writing
``done.<rank>`` as it exits."""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from pathlib import Path

import pytest

from pytest_trtllm_slurm.node import paths
from pytest_trtllm_slurm.node.files import announce, write_atomic
from pytest_trtllm_slurm.node.protocol import GATE_ENV, GATE_WAIT_ENV  # noqa: F401

POLL = 0.05


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the number of ranks (srun, else Open MPI, else PMI)."""
    for rank_var, size_var in (("SLURM_PROCID", "SLURM_NTASKS"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        rank, size = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
        if rank.isdigit():
            return int(rank), int(size) if size.isdigit() else 1
    return 0, 1


def _touch(path: Path, text: str = "") -> None:
    write_atomic(path, text or f"{os.getpid()}\n")


def wait_at_gate(gate: Path, *, rank: int, size: int, max_wait: float,
                 poll: float = POLL) -> bool:
    """Say this rank is ready, then wait for ``open``; False when ``max_wait`` passed."""
    gate.mkdir(parents=True, exist_ok=True)
    names = paths.Gate(gate)
    _touch(names.ready_of(rank))
    opened, all_ready = names.open, names.ready
    deadline = time.monotonic() + max_wait
    while not opened.exists():
        if rank == 0 and not all_ready.exists() and (
                sum(1 for p in gate.glob("ready.*") if p.name[6:].isdigit()) >= size):
            _touch(all_ready, f"{size}\n")  # the controller counts done.<rank> up to it
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


class Gate:
    """Holds the session between collection and the first test until the gate opens."""

    def __init__(self, gate: Path, max_wait: float) -> None:
        self.gate = gate
        self.max_wait = max_wait
        # registered before the suite is imported: runs after its exit handlers (torch...)
        rank, _ = rank_and_size()
        atexit.register(_say_done, paths.Gate(gate).done_of(rank),
                        paths.Batch(gate.parent).end_notice)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        rank, size = rank_and_size()
        if not wait_at_gate(self.gate, rank=rank, size=size, max_wait=self.max_wait):
            pytest.exit(f"[trtllm-slurm] rank {rank}: the controller did not open {self.gate} "
                        f"within {self.max_wait:.0f} s; no test ran", returncode=3)


def _touch_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):  # the controller then waits for the step's end
        _touch(path)


def _say_done(done: Path, ended: Path) -> None:
    """``done.<rank>``, then the work root's end notice: it wakes a controller on this host
    that waits (``execution/folder_watch``), which then counts the ranks done."""
    _touch_quietly(done)
    announce(ended)


def gate_from_env() -> Gate | None:
    # popped: the tests and what they start are not gated
    path = os.environ.pop(GATE_ENV, "")
    wait = os.environ.pop(GATE_WAIT_ENV, "")
    if not path:
        return None
    try:
        max_wait = float(wait or 86400.0)
    except ValueError:
        max_wait = 86400.0
    return Gate(Path(path), max_wait)
