#!/usr/bin/env python3
"""Where a dispatched run's GPU-seconds went, from its ``--trtllm-timeline`` trace (issue 30:
"where a gap remains, say where the seconds go, measured").

    python benchmarks/timeline_gaps.py TRACE.json [--gpus N]

The window (the first batch's start to the last test's stop) times the GPUs is cut into:
``tests`` (each test's own start to stop, times its batch's GPUs), ``between tests`` (inside a
batch, one test's stop to the next one's start: the worker's per-test cost), ``start-up`` (a
batch's start to its first test), ``before its first batch`` and ``after its last test`` (per
GPU track: the run's head and the tail the packing left), and ``between batches``, the rest:
a GPU with no test from one batch's last test to the next batch's first (the dispatch's
latency, a batch's end seen late, the packer's holes). The first three come from each batch's
own span and tests (by job id) and are exact; the head and tail use the picture's tracks,
which ``controller/timeline.py`` lays lowest free slot first, so their split with ``between
batches`` is approximate. ``--gpus`` above the trace's track count adds the GPUs never used
to the head.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

ROWS = ("tests", "between tests", "start-up", "before its first batch", "between batches",
        "after its last test")


def gaps(trace: dict[str, Any], gpus: int | None = None) -> dict[str, Any]:
    """GPU-seconds per row of ``ROWS`` over the window (the first batch's start to the last
    test's stop), from each batch's own span and tests (by job id, not by the picture's
    tracks, which are laid heuristically) times the GPUs it held."""
    spans: dict[str, tuple[float, float]] = {}
    width: dict[str, set[tuple[int, int]]] = defaultdict(set)
    tests: dict[str, set[tuple[float, float]]] = defaultdict(set)
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev.get("cat") not in ("batch", "test"):
            continue
        a, job = ev["ts"] / 1e6, str(ev.get("args", {}).get("job_id", ""))
        if ev["cat"] == "batch":
            spans[job] = (a, a + ev["dur"] / 1e6)
            width[job].add((ev["pid"], ev["tid"]))
        else:
            tests[job].add((a, a + ev["dur"] / 1e6))
    t0 = min(a for a, _ in spans.values())
    t1 = max(b for runs in tests.values() for _, b in runs)
    tracks = {t for w in width.values() for t in w}
    total_gpus = max(len(tracks), gpus or 0)
    out = dict.fromkeys(ROWS, 0.0)
    first: dict[tuple[int, int], float] = {}
    last: dict[tuple[int, int], float] = {}
    for job, (a, _) in spans.items():
        n = len(width[job])
        runs = sorted(tests.get(job, ()))
        if not runs:
            continue
        out["tests"] += n * sum(y - x for x, y in runs)
        out["start-up"] += n * max(0.0, runs[0][0] - a)
        out["between tests"] += n * sum(max(0.0, x - y)
                                        for (_, y), (x, _) in zip(runs, runs[1:], strict=False))
        for track in width[job]:
            first[track] = min(first.get(track, a), a)
            last[track] = max(last.get(track, runs[-1][1]), runs[-1][1])
    out["before its first batch"] = (sum(first.get(t, t1) - t0 for t in tracks)
                                     + (total_gpus - len(tracks)) * (t1 - t0))
    out["after its last test"] = sum(t1 - last.get(t, t1) for t in tracks)
    out["between batches"] = total_gpus * (t1 - t0) - sum(out.values())
    return {"seconds": out, "window": t1 - t0, "gpus": total_gpus, "batches": len(spans)}


def table(result: dict[str, Any]) -> str:
    gpus, window = result["gpus"], result["window"]
    total = gpus * window
    lines = [f"window {window:.1f} s (first batch's start to the last test's stop) x {gpus} "
             f"GPUs = {total:.0f} GPU-s", "",
             "| where | GPU-s | share | makespan s (GPU-s / GPUs) |", "|---|---|---|---|"]
    for row in ROWS:
        v = result["seconds"][row]
        lines.append(f"| {row} | {v:.0f} | {100 * v / total:.1f}% | {v / gpus:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--gpus", type=int, default=None, help="the GPUs of the allocation")
    args = ap.parse_args()
    result = gaps(json.loads(args.trace.read_text()), args.gpus)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
