"""Fault drills on the real dev cluster, in each mode they apply to (warm workers, steps
without warm workers, one-shot jobs): each checks one junit outcome per collected test,
the status a user reads, what is left in the queue, and that the next run works.

Detection times are printed (``-s`` shows them), never asserted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fault_drill import (
    MODES,
    alloc_id,
    assert_one_outcome_each,
    detection_seconds,
    finish,
    make_suite,
    our_jobs,
    our_steps,
    run,
    start,
    wait_until,
)
from devcluster import run as sh


@pytest.fixture
def suite(devcluster: dict, tmp_path: Path):
    target = make_suite(tmp_path)
    yield target
    job_id = alloc_id(target)
    if job_id:  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", job_id], check=False)


def _nothing_of_ours_left(suite: Path, mode: str) -> None:
    if mode == "one-shot":
        wait_until(lambda: not our_jobs(suite), "the run's one-shot jobs to leave the queue", 30)
    else:
        job_id = alloc_id(suite)
        assert job_id is not None
        wait_until(lambda: not our_steps(job_id), f"the run's steps in {job_id} to end", 30)


def _next_run_passes(suite: Path, mode: str) -> None:
    again = run(suite, mode, tag="again")
    assert again.returncode == 0, again.out
    assert_one_outcome_each(again)
    assert {k[0] for k in again.outcomes.values()} == {"passed"}, again.out


@pytest.mark.parametrize("mode", list(MODES))
def test_a_segfault_is_a_crash_with_its_signal_and_the_rest_run_again(suite: Path,
                                                                       mode: str) -> None:
    result = run(suite, mode, fault="segv")
    assert_one_outcome_each(result)
    assert result.status_of("test_fault.py::test_2_fault") == "failure", result.out
    for name in ("test_1_first", "test_3_after", "test_4_after"):
        assert result.status_of(f"test_fault.py::{name}") == "passed", (name, result.out)
    assert "[CRASHED]" in result.out and "[CANCELLED]" not in result.out, result.out
    assert "killed by signal 11 (SIGSEGV)" in result.out, result.out
    assert "exit code 11" not in result.out and "exit code 139" not in result.out, result.out
    assert result.returncode == 1
    fault_at = float((suite / "marks" / "fault_at").read_text())
    print(f"\n[drill] segfault, {mode}: detected after "
          f"{detection_seconds(suite, fault_at):.1f} s, run took {result.wall:.1f} s")
    _nothing_of_ours_left(suite, mode)
    _next_run_passes(suite, mode)


def test_a_lost_warm_worker_is_noticed_at_once_and_a_new_one_runs_the_rest(suite: Path) -> None:
    marks = suite / "marks"
    started = time.monotonic()
    proc, junit = start(suite, "warm", fault="wait")
    try:
        wait_until(lambda: (marks / "waiting").exists(), "the faulting test to start", 120)
        job_id = alloc_id(suite)
        assert job_id is not None
        beat = next((suite / "work_dirs" / ".agents" / job_id).glob("*/heartbeat.json"))
        killed_at = time.time()
        os.kill(json.loads(beat.read_text())["pid"], signal.SIGKILL)  # the agent, not srun
        result = finish(proc, junit, started)
    finally:
        (marks / "release").write_text("")
        if proc.poll() is None:
            proc.kill()
    assert_one_outcome_each(result)
    assert result.status_of("test_fault.py::test_2_fault") == "failure", result.out
    for name in ("test_1_first", "test_3_after", "test_4_after"):
        assert result.status_of(f"test_fault.py::{name}") == "passed", (name, result.out)
    assert "[CRASHED]" in result.out and "warm worker on" in result.out, result.out
    assert "was lost" in result.out, result.out
    assert result.out.count("Starting a warm worker on") == 2, result.out
    assert result.returncode == 1
    print(f"\n[drill] lost agent, warm: detected after "
          f"{detection_seconds(suite, killed_at):.1f} s, run took {result.wall:.1f} s")
    _nothing_of_ours_left(suite, "warm")
    _next_run_passes(suite, "warm")
