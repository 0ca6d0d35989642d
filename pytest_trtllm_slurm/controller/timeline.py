"""--trtllm-timeline PATH: the run as a Chrome trace-event JSON and an ``.svg`` sibling, to
see why it took as long as it did. Which GPU of a node a batch had is not known: batches
are laid on a node's tracks lowest free first."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from pytest_trtllm_slurm.controller.run_observer import BatchSpan, RunObserver, TestSpan
from pytest_trtllm_slurm.execution.slurm.parse import expand_hostlist
from pytest_trtllm_slurm.node.files import write_atomic

COLOURS = {"passed": "#4caf50", "failed": "#e53935", "skipped": "#fbc02d", None: "#9e9e9e",
           "startup": "#b0bec5", "queue": "#90caf9", "gate": "#ce93d8", "batch": "#eceff1"}


@dataclass
class Laid:
    """One batch placed on tracks: (node, GPU slot) pairs, and its time span."""

    span: BatchSpan
    tracks: list[tuple[str, int]]
    start: float
    end: float
    tests: list[tuple[TestSpan, float, float]] = field(default_factory=list)
    first_test: float | None = None


QueueRows = list[list[tuple[float, float, str, str]]]  # rows of (from, to, label, kind)
GATED = ("launched early", "ranks ready")  # the warm pool's reasons for a gated step


def lay_out(record: RunObserver) -> tuple[list[Laid], dict[str, int], QueueRows]:
    """Batches on GPU tracks (lowest free slot of each node), the slot count per node, and
    the queue waits packed into as few rows as do not overlap."""
    end_of_run = record.finished_at or record.clock()
    laid: list[Laid] = []
    for span in record.batches.values():
        tests = []
        for test in record.tests_of(span):
            if test.start is None:
                continue
            tests.append((test, test.start, max(test.start, test.stop or test.start)))
        starts = [t[1] for t in tests]
        stops = [t[2] for t in tests]
        running = span.running if span.running is not None else min(starts, default=None)
        if running is None:  # never ran (cancelled while pending)
            continue
        start = min([running, *starts])
        end = max([span.ended or end_of_run, *stops, start])
        laid.append(Laid(span, [], start, end, sorted(tests, key=lambda t: t[1]),
                         min(starts, default=None)))
    busy: dict[str, list[float]] = {}  # node -> busy-until per slot
    several = len(record.clusters) > 1  # node names are a cluster's own: say whose
    for item in sorted(laid, key=lambda x: (x.start, x.span.submitted)):
        nodes = expand_hostlist(item.span.nodelist or "") or ["localhost"]
        need = max(1, item.span.key.devices_per_node)
        for node in nodes[:max(1, item.span.key.node_count)]:
            node = f"{item.span.cluster}:{node}" if several else node
            name = node if item.span.width else f"{node} (CPU)"
            slots = busy.setdefault(name, [])
            free = [i for i, until in enumerate(slots) if until <= item.start + 1e-6]
            capacity = item.span.pool.gpus_per_node if item.span.width else 0
            while len(free) < need and (not capacity or len(slots) < capacity):
                slots.append(0.0)
                free.append(len(slots) - 1)
            if len(free) < need:  # the node is full: the previous batch's end was seen late
                free += sorted((i for i in range(len(slots)) if i not in free),
                               key=lambda i: slots[i])[:need - len(free)]
            for slot in free[:need]:
                slots[slot] = item.end
                item.tracks.append((name, slot))
    rows: QueueRows = []
    for span in sorted(record.batches.values(), key=lambda s: s.submitted):
        ran = next((x for x in laid if x.span is span), None)
        until = ran.start if ran else (span.ended or end_of_run)
        if until - span.submitted <= 0:
            continue
        row = next((r for r in rows if r[-1][1] <= span.submitted), None)
        if row is None:
            rows.append(row := [])
        row += waits(span, until)
    return laid, {n: len(s) for n, s in busy.items()}, rows


def waits(span: BatchSpan, until: float) -> list[tuple[float, float, str, str]]:
    """A batch's wait to run, cut where the scheduler's reason changed (``queue``, ``gate``)."""
    cuts = [t for t, _ in span.reasons if span.submitted < t < until]
    bounds = [span.submitted, *cuts, until]
    out: list[tuple[float, float, str, str]] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        seen = [r for t, r in span.reasons if t <= a + 1e-9] or [r for _, r in span.reasons[:1]]
        reason = seen[-1] if seen else ""
        kind = "gate" if reason.startswith(GATED) else "queue"
        name = f"{'gate wait' if kind == 'gate' else 'queue'} {span.label} (job {span.job_id})"
        label = name + (f": {reason}" if reason else "")
        if out and out[-1][2] == label:  # the same reason again: one segment
            out[-1] = (out[-1][0], b, label, kind)
        else:
            out.append((a, b, label, kind))
    return out


# -- Chrome trace events ------------------------------------------------------------------
def trace_events(record: RunObserver) -> dict[str, Any]:
    """The trace: "X" events (microseconds from the run's start), a process per node (its GPUs
    are threads) and one for the queue."""
    laid, slots, rows = lay_out(record)
    t0 = min([s.submitted for s in record.batches.values()] + [record.started])
    pids = {node: i + 1 for i, node in enumerate(sorted(slots))}
    events: list[dict[str, Any]] = []

    def us(t: float) -> int:
        return int(round((t - t0) * 1e6))

    def slice_(name: str, cat: str, pid: int, tid: int, a: float, b: float,
               args: dict[str, Any]) -> None:
        events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                       "ts": us(a), "dur": max(0, us(b) - us(a)), "args": args})

    for node, pid in pids.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": node}})
        for slot in range(slots[node]):
            label = f"GPU {slot}" if not node.endswith("(CPU)") else f"slot {slot}"
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": slot,
                           "args": {"name": label}})
    queue_pid = len(pids) + 1
    events.append({"name": "process_name", "ph": "M", "pid": queue_pid,
                   "args": {"name": "queue (submitted, not yet running)"}})
    for item in laid:
        span = item.span
        info = {"job_id": span.job_id, "cluster": span.cluster, "status": span.status,
                "nodes": span.nodelist,
                "tests": len(span.nodeids), "attempt": span.attempt, "pool": span.pool.name}
        for node, slot in item.tracks:
            pid = pids[node]
            slice_(f"batch {span.label}", "batch", pid, slot, item.start, item.end, info)
            if item.first_test is not None and item.first_test > item.start:
                slice_("start-up", "startup", pid, slot, item.start, item.first_test,
                       {"job_id": span.job_id, "what": "interpreter, imports, collection"})
            for test, a, b in item.tests:
                slice_(test.nodeid, "test", pid, slot, a, b,
                       {"job_id": span.job_id, "outcome": test.outcome})
    for tid, row in enumerate(rows):
        for a, b, label, kind in row:
            slice_(label, kind, queue_pid, tid, a, b, {})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "pytest-trtllm-slurm", "started": t0}}


# -- SVG ----------------------------------------------------------------------------------
ROW = 18
LEFT = 170
WIDTH = 1200


def svg(record: RunObserver, title_lines: list[str]) -> str:
    """The picture: one ``<g class="batch">`` per batch that ran (its slice on each GPU
    track, its start-up and tests inside), queue rows below the GPU tracks."""
    laid, slots, rows = lay_out(record)
    t0 = min([s.submitted for s in record.batches.values()] + [record.started])
    t1 = max([x.end for x in laid] + [t0 + 1.0] + [w[1] for r in rows for w in r])
    scale = (WIDTH - LEFT - 20) / max(1e-6, t1 - t0)
    head = 24 + ROW * len(title_lines)
    track_y: dict[tuple[str, int], float] = {}
    y = head + 20
    labels = []
    for node in sorted(slots):
        for slot in range(slots[node]):
            track_y[(node, slot)] = y
            labels.append(_text(8, y + 13, f"{node} GPU {slot}" if not node.endswith("(CPU)")
                                else f"{node} slot {slot}"))
            y += ROW
    queue_y = y + 10
    height = queue_y + ROW * max(1, len(rows)) + 40

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{int(height)}" '
             f'viewBox="0 0 {WIDTH} {int(height)}" font-family="monospace" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>']
    for i, line in enumerate(title_lines):
        parts.append(_text(8, 18 + ROW * i, line, bold=i == 0))
    parts += labels
    parts.append(_text(8, queue_y + 13, "queue / gate waits"))
    for second in _ticks(t1 - t0):
        tx = x(t0 + second)
        parts.append(f'<line x1="{tx:.1f}" y1="{head + 14}" x2="{tx:.1f}" '
                     f'y2="{height - 24}" stroke="#e0e0e0"/>')
        parts.append(_text(tx - 10, height - 10, f"{second:g}s"))
    for item in laid:
        span = item.span
        tip = (f"batch {span.label}, job {span.job_id} on {span.nodelist or 'localhost'}: "
               f"{span.status}, {len(span.nodeids)} test(s), {item.end - item.start:.1f} s")
        group = [f'<g class="batch" id={quoteattr("batch-" + span.job_id)}>',
                 f"<title>{escape(tip)}</title>"]
        for track in item.tracks:
            ty = track_y[track]
            group.append(_rect(x(item.start), ty, x(item.end) - x(item.start), ROW - 2,
                               COLOURS["batch"], stroke="#607d8b"))
            if item.first_test is not None and item.first_test > item.start:
                group.append(_rect(x(item.start), ty + 2, x(item.first_test) - x(item.start),
                                   ROW - 6, COLOURS["startup"],
                                   tip=f"start-up {item.first_test - item.start:.1f} s"))
            for test, a, b in item.tests:
                group.append(_rect(x(a), ty + 2, max(0.5, x(b) - x(a)), ROW - 6,
                                   COLOURS.get(test.outcome, COLOURS[None]),
                                   tip=f"{test.nodeid}: {test.outcome or '?'}, {b - a:.1f} s"))
        group.append("</g>")
        parts += group
    for r, row in enumerate(rows):
        for a, b, label, kind in row:
            parts.append(_rect(x(a), queue_y + r * ROW + 2, max(0.5, x(b) - x(a)), ROW - 6,
                               COLOURS[kind], tip=f"{label}: {b - a:.1f} s"))
    legend = [("test passed", "passed"), ("test failed", "failed"), ("skipped", "skipped"),
              ("start-up", "startup"), ("queue wait", "queue"),
              ("gated step: collecting / waiting for its nodes", "gate")]
    lx = LEFT
    for name, key in legend:
        parts.append(_rect(lx, head - 2, 10, 10, COLOURS[key]))
        parts.append(_text(lx + 14, head + 7, name))
        lx += 30 + 7 * len(name)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _ticks(span: float) -> list[float]:
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
                 if span / s <= 12), 14400)
    return [float(i * step) for i in range(int(span // step) + 1)]


def _text(x: float, y: float, text: str, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{weight}>{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, *, stroke: str | None = None,
          tip: str | None = None) -> str:
    line = f' stroke="{stroke}" stroke-width="0.5"' if stroke else ""
    body = f"<title>{escape(tip)}</title>" if tip else ""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(0.0, w):.1f}" height="{h:.1f}" '
            f'fill="{fill}"{line}>{body}</rect>')


def write_timeline(path: str | Path, record: RunObserver, title_lines: list[str]
                   ) -> tuple[Path, Path]:
    """Both files, each written privately and atomically; returns (trace, svg)."""
    trace = Path(path)
    if trace.suffix == ".svg":  # PATH names the picture: the trace is its .json sibling
        picture, trace = trace, trace.with_suffix(".json")
    else:
        picture = trace.with_suffix(".svg")
    write_atomic(trace, json.dumps(trace_events(record)) + "\n", parents=True)
    write_atomic(picture, svg(record, title_lines))
    return trace, picture
