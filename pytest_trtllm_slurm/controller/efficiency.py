"""Is the allocation used well? How much of the GPU time held tests ran, and how far the
run was from the packer's plan: a few numbers at the end of every dispatched run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.controller.run_observer import RunObserver
from pytest_trtllm_slurm.node.files import write_atomic


class Efficiency(BaseModel):
    """The summary (seconds; GPU-seconds). ``ratio``: busy / allocated."""

    model_config = ConfigDict(extra="forbid")

    batches: int
    tests: int
    gpu_seconds_allocated: float
    gpu_seconds_busy: float
    ratio: float | None
    queue_seconds_total: float
    queue_seconds_max: float
    startup_seconds_total: float
    startup_seconds_max: float
    makespan_seconds: float | None
    expected_makespan_seconds: float | None
    # the packer's bound; None when its durations were guesses (``estimates_guessed``)
    lower_bound_seconds: float | None
    # why the packer's figures are guesses (no earlier durations); None: from earlier runs
    estimates_guessed: str | None = None
    # no packing ends sooner at the test times measured in this run (start-up left out)
    measured_bound_seconds: float | None = None


def efficiency(record: RunObserver) -> Efficiency:
    spans = list(record.batches.values())
    end_of_run = record.finished_at or record.clock()
    first = min((s.submitted for s in spans), default=None)
    last = max((s.ended or end_of_run for s in spans), default=None)
    allocated = 0.0
    held: dict[str, tuple[int, float, float]] = {}  # persistent pool -> GPUs, from, to
    for span in spans:
        if span.running is None:
            continue
        end = span.ended or end_of_run
        if span.persistent:
            gpus, since, until = held.get(span.pool.name, (span.pool.gpus, span.running, end))
            held[span.pool.name] = (gpus, min(since, span.running), max(until, end))
        else:
            allocated += span.width * max(0.0, end - span.running)
    allocated += sum(gpus * max(0.0, until - since) for gpus, since, until in held.values())
    busy = 0.0
    queue: list[float] = []
    startup: list[float] = []
    for span in spans:
        tests = record.tests_of(span)
        busy += sum(span.width * max(0.0, t.stop - t.start) for t in tests
                    if t.start is not None and t.stop is not None)
        if span.running is not None:
            queue.append(max(0.0, span.running - span.submitted))
            starts = [t.start for t in tests if t.start is not None]
            if starts:
                startup.append(max(0.0, min(starts) - span.running))
    return Efficiency(
        batches=len(spans), tests=len(record.job_of),
        gpu_seconds_allocated=round(allocated, 1), gpu_seconds_busy=round(busy, 1),
        ratio=round(busy / allocated, 3) if allocated > 0 else None,
        queue_seconds_total=round(sum(queue), 1), queue_seconds_max=round(max(queue, default=0), 1),
        startup_seconds_total=round(sum(startup), 1),
        startup_seconds_max=round(max(startup, default=0), 1),
        makespan_seconds=round(last - first, 1) if first is not None and last is not None
        else None,
        expected_makespan_seconds=_round(record.expected_makespan),
        lower_bound_seconds=None if record.guessed else _round(record.lower_bound),
        estimates_guessed=record.guessed,
        # to the millisecond: a run of quick tests needs a bound of 0.03 s, not 0.0
        measured_bound_seconds=None if (bound := record.measured_bound()) is None
        else round(bound, 3),
    )


def _num(value: float) -> str:
    """Whole GPU-seconds, tenths below 10 (a short run is not all zeros)."""
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def summary_lines(eff: Efficiency) -> list[str]:
    """The few lines of the terminal summary."""
    ratio = f"{eff.ratio:.0%}" if eff.ratio is not None else "-"
    lines = [
        f"{eff.batches} batch(es), {eff.tests} dispatched test(s)",
        f"GPU-seconds allocated {_num(eff.gpu_seconds_allocated)}, busy in tests "
        f"{_num(eff.gpu_seconds_busy)} ({ratio} used)",
        f"in queue {eff.queue_seconds_total:.1f} s (longest {eff.queue_seconds_max:.1f} s), "
        f"in start-up {eff.startup_seconds_total:.1f} s (longest {eff.startup_seconds_max:.1f} s)",
    ]
    if eff.makespan_seconds is not None:
        lines.append(_makespan_line(eff, eff.makespan_seconds))
    return lines


def _makespan_line(eff: Efficiency, makespan: float) -> str:
    """The makespan against the packer's figures (a guess named) and the measured bound."""
    against = []
    if eff.estimates_guessed:
        if eff.expected_makespan_seconds is not None:
            against.append(f"the packer's guess {eff.expected_makespan_seconds:.1f} s "
                           f"({eff.estimates_guessed})")
    else:
        planned = [f"{name} {value:.1f} s" for name, value in
                   (("packer expected", eff.expected_makespan_seconds),
                    ("lower bound", eff.lower_bound_seconds)) if value is not None]
        if eff.lower_bound_seconds:
            planned.append(f"{makespan / eff.lower_bound_seconds:.2f}x the lower bound")
        if planned:
            against.append(", ".join(planned))
    if eff.measured_bound_seconds:
        need = eff.measured_bound_seconds
        shown = f"{need:.1f}" if need >= 0.1 else f"{need:.3f}"  # quick tests: not "0.0 s"
        against.append(f"this run's test times alone need {shown} s, {makespan / need:.2f}x that")
    return f"makespan {makespan:.1f} s" + (f" ({'; '.join(against)})" if against else "")


def cluster_lines(record: RunObserver) -> list[str]:
    """One line per cluster when the run spanned several: where its tests went, how they ended."""
    if len(record.clusters) < 2:
        return []
    lines = []
    for cluster in record.clusters:
        spans = [s for s in record.batches.values() if s.cluster == cluster]
        parts = sorted({s.key.partition for s in spans if s.key.partition})
        counts = record.counts(cluster)
        tests = sum(counts.values())
        ended = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
        lines.append(f"cluster {cluster}" + (f" ({', '.join(parts)})" if parts else "")
                     + f": {len(spans)} batch(es), {tests} test(s)"
                     + (f": {ended}" if ended else ""))
    return lines


def run_json(record: RunObserver, eff: Efficiency) -> dict[str, Any]:
    """What --trtllm-summary-json writes: the summary, the clusters and each batch as it ran."""
    batches = [{
        "job_id": span.job_id, "label": span.label, "attempt": span.attempt,
        "scenario": span.key.scenario.value, "cluster": span.key.cluster,
        "partition": span.key.partition, "pool": span.pool.name,
        "gpus_per_node": span.key.devices_per_node, "nodes": span.key.node_count,
        "nodelist": span.nodelist, "status": span.status,
        "nodeids": span.nodeids, "expected_seconds": span.expected_seconds,
        "submitted": span.submitted, "running": span.running, "ended": span.ended,
        "pending_reasons": [reason for _, reason in span.reasons],
    } for span in record.batches.values()]
    return {"efficiency": eff.model_dump(mode="json"), "clusters": record.clusters,
            "batches": batches}


def write_run_json(path: str | Path, record: RunObserver, eff: Efficiency) -> Path:
    """Written privately and atomically (a CI step may read it while nothing else does)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps(run_json(record, eff), indent=2) + "\n")
    return target
