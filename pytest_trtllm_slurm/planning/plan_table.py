"""The plan: one row per test saying what it needs and where it would run (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.node.files import SHARED, write_atomic
from pytest_trtllm_slurm.planning.models import DeviceRequirement, RouteDecision, Scenario

_SLURM = (Scenario.LOCAL_SLURM, Scenario.REMOTE_SLURM)


class PlanRow(BaseModel):
    """Where one test goes. ``scenario`` None: nothing can serve it (see ``reason``), or
    its markers / perf-sanity id cannot be read (see ``error``: the test errors)."""

    model_config = ConfigDict(extra="forbid")

    nodeid: str
    name: str | None = None  # as the user wrote it, when pytest renamed a long id
    devices: int
    devices_per_node: int
    nodes: int
    device_type: str | None = None
    scenario: str | None = None
    partition: str | None = None
    cluster: str | None = None  # the Slurm cluster it goes to (local or clusters-file name)
    batch: str | None = None
    source: str = "default"  # which marker / YAML the device count came from
    reason: str | None = None
    error: str | None = None


def plan_row(nodeid: str, req: DeviceRequirement, decision: RouteDecision,
             partition: str | None = None, batch: str | None = None, *,
             name: str | None = None, error: str | None = None) -> PlanRow:
    """One row from a requirement and its routing decision (node math on the target's GPUs)."""
    target = decision.target_gpus_per_node
    return PlanRow(
        nodeid=nodeid, name=name if name and name != nodeid else None, error=error,
        devices=req.total, devices_per_node=req.resolve_per_node(target),
        nodes=req.nodes(target), device_type=req.device_type,
        scenario=decision.scenario.value if decision.scenario is not None else None,
        partition=decision.partition or partition,
        cluster=decision.cluster if decision.scenario in _SLURM else None,
        batch=batch, source=req.source, reason=None if error else decision.reason,
    )


def format_plan_lines(rows: Iterable[PlanRow]) -> list[str]:
    """One human-readable line per test."""
    lines = []
    for row in rows:
        shown = f"{row.name} (pytest id {row.nodeid})" if row.name else row.nodeid
        if row.error is not None:  # the message leads with the name the line shows already
            error = next((row.error[len(n) + 2:] for n in (row.name, row.nodeid)
                          if n and row.error.startswith(f"{n}: ")), row.error)
            lines.append(f"{shown}: ERROR {error}")
            continue
        need = (f"{row.devices} x {row.device_type or 'any GPU'} = {row.nodes} node(s) x "
                f"{row.devices_per_node}" if row.devices else "CPU only")
        where = row.scenario or f"not served ({row.reason or 'no route'})"
        extras = "".join(f" {key}={value}" for key, value in (
            ("partition", row.partition), ("cluster", row.cluster), ("batch", row.batch)) if value)
        lines.append(f"{shown}: {need} -> {where}{extras}")
    return lines


class BatchRow(BaseModel):
    """One batch as the run will submit it (the packer's chunk): where, how wide, which
    tests, and the packer's expected start and length (seconds from the first submission)."""

    model_config = ConfigDict(extra="forbid")

    label: str
    target: str  # the partition, cluster or local scenario it runs on
    scenario: str
    pool: str  # where it competes for GPUs (packing.Pool.name)
    gpus_per_node: int
    nodes: int
    tests: int
    nodeids: list[str]
    expected_start: float | None = None
    expected_seconds: float | None = None  # start-up + the tests' expected durations


def expected_makespan(batches: Iterable[BatchRow]) -> float | None:
    """When the packer expects the last batch to end (pools run side by side)."""
    ends = [(b.expected_start or 0.0) + b.expected_seconds
            for b in batches if b.expected_seconds is not None]
    return round(max(ends), 3) if ends else None


def format_batch_lines(batches: Sequence[BatchRow]) -> list[str]:
    """The table by batch (submission order) and the expected makespan."""
    header = ("batch", "target", "GPUs x nodes", "tests", "start s", "expected s")
    table = [header] + [
        (b.label, b.target, f"{b.gpus_per_node} x {b.nodes}", str(b.tests),
         _seconds(b.expected_start), _seconds(b.expected_seconds)) for b in batches]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i >= 2 else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in table]
    makespan = expected_makespan(batches)
    lines.append(f"{len(batches)} batch(es); expected makespan "
                 + (f"{makespan:.1f} s" if makespan is not None else "unknown"))
    return lines


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_plan_json(rows: Iterable[PlanRow], path: Path | str,
                    batches: Sequence[BatchRow] = ()) -> Path:
    """Write the plan as JSON (``tests``, ``batches``, ``expected_makespan_seconds``); the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "tests": [row.model_dump(mode="json") for row in rows],
        "batches": [batch.model_dump(mode="json") for batch in batches],
        "expected_makespan_seconds": expected_makespan(batches),
    }
    write_atomic(target, json.dumps(payload, indent=2) + "\n", mode=SHARED)  # a report
    return target
