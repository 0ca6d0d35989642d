"""benchmarks/timeline_gaps.py: a run's GPU-seconds cut into tests and the gaps between them
(the note's "where the seconds go"), on a trace whose every second is known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from timeline_gaps import gaps  # noqa: E402


def _x(cat: str, track: tuple[int, int], job: str, a: float, b: float) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": job, "pid": track[0], "tid": track[1],
            "ts": int(a * 1e6), "dur": int((b - a) * 1e6), "args": {"job_id": job}}


def test_every_gpu_second_of_a_known_run_is_placed() -> None:
    """Two GPUs for 10 s: a 2-GPU batch (start-up 1 s, tests 1-3 and 4-6) from 0 to 6.5,
    then on GPU 0 a 1-GPU batch from 7 to 10 (its test 7.5-10): GPU 1 idles from 6 to 10."""
    g0, g1 = (1, 0), (1, 1)
    events = []
    for track in (g0, g1):
        events += [_x("batch", track, "a", 0, 6.5), _x("test", track, "a", 1, 3),
                   _x("test", track, "a", 4, 6)]
    events += [_x("batch", g0, "b", 7, 10.2), _x("test", g0, "b", 7.5, 10)]
    got = gaps({"traceEvents": events}, gpus=3)
    rows = got["seconds"]
    assert got["window"] == pytest.approx(10) and got["gpus"] == 3
    assert rows["tests"] == pytest.approx(2 * 4 + 2.5)
    assert rows["between tests"] == pytest.approx(2 * 1)
    assert rows["start-up"] == pytest.approx(2 * 1 + 0.5)
    assert rows["before its first batch"] == pytest.approx(10)  # the third GPU, never used
    assert rows["after its last test"] == pytest.approx(4)  # GPU 1 after 6 s
    assert rows["between batches"] == pytest.approx(1)  # GPU 0 from 6 to 7
    assert sum(rows.values()) == pytest.approx(3 * 10)
