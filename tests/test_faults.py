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
from devcluster import run as sh
from fault_drill import (
    MODES,
    alloc_id,
    assert_one_outcome_each,
    detection_seconds,
    fail_node,
    fill,
    finish,
    job_gone,
    make_env_suite,
    make_suite,
    our_jobs,
    our_steps,
    restore_node,
    run,
    seen_env,
    small_disk,
    start,
    wait_until,
)


@pytest.fixture
def suite(devcluster: dict, tmp_path: Path):
    target = make_suite(tmp_path)
    yield target
    # never leave our allocation (or a request for one) behind on the shared dev cluster
    ids = [line.split("|", 1)[0] for line in our_jobs(target)]
    job_id = alloc_id(target)
    if job_id or ids:
        sh(["scancel", *([job_id] if job_id else []), *ids], check=False)


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


# "agent": its launcher writes the step's exit code; "agent-and-launcher": nobody does
# (as on a full disk), so the pool learns it from the scheduler: the agent step left the queue
@pytest.mark.parametrize("killed", ["agent", "agent-and-launcher"])
def test_a_lost_warm_worker_is_noticed_at_once_and_a_new_one_runs_the_rest(
        suite: Path, killed: str) -> None:
    marks = suite / "marks"
    started = time.monotonic()
    proc, junit = start(suite, "warm", fault="wait")
    try:
        wait_until(lambda: (marks / "waiting").exists(), "the faulting test to start", 120)
        job_id = alloc_id(suite)
        assert job_id is not None
        beat = next((suite / "work_dirs" / ".agents" / job_id).glob("*/heartbeat.json"))
        if killed == "agent-and-launcher":
            launcher = sh(["pgrep", "-f", f"bash {beat.parent}/agent.sh"], check=False)
            pids = [int(p) for p in launcher.stdout.split()]
            assert pids, f"no launcher of {beat.parent} runs"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
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
    if killed == "agent-and-launcher":
        assert "its srun step left the queue without an exit code" in result.out, result.out
    assert result.out.count("Starting a warm worker on") == 2, result.out
    assert result.returncode == 1
    print(f"\n[drill] lost {killed}, warm: detected after "
          f"{detection_seconds(suite, killed_at):.1f} s, run took {result.wall:.1f} s")
    _nothing_of_ours_left(suite, "warm")
    _next_run_passes(suite, "warm")


# every mode with its slurmd killed; a node marked down with its processes alive is the
# same path in the controller once Slurm ends the job, so one mode (warm, the default) has it
@pytest.mark.parametrize("mode,how", [*((mode, "slurmd-killed") for mode in MODES),
                                      ("warm", "down-processes-alive")])
def test_a_failed_node_is_node_fail_and_the_unstarted_tests_run_elsewhere(
        suite: Path, mode: str, how: str) -> None:
    marks = suite / "marks"
    started = time.monotonic()
    proc, junit = start(suite, mode, fault="wait")
    node = None
    try:
        wait_until(lambda: (marks / "waiting").exists(), "the faulting test to start", 120)
        node = (marks / "waiting").read_text().strip()
        job_id = alloc_id(suite) if mode != "one-shot" else None
        time.sleep(2.5)  # test_1 ended well before the fault (Slurm's times are whole seconds)
        fault_at = time.time()
        fail_node(node, kill_slurmd=how == "slurmd-killed")
        if job_id:
            wait_until(lambda: job_gone(job_id), f"Slurm to end allocation {job_id}", 60)
        else:
            time.sleep(2)
        # the test on the failed node goes on if its processes live: it must not count
        (marks / "release").write_text("")
        time.sleep(1)
        restore_node(node)
        node = None
        result = finish(proc, junit, started)
    finally:
        (marks / "release").write_text("")
        if node is not None:
            restore_node(node)
        if proc.poll() is None:
            proc.kill()
    assert_one_outcome_each(result)
    assert result.status_of("test_fault.py::test_2_fault") == "failure", result.out
    assert "[NODE_FAIL]" in result.out, result.out
    for name in ("test_1_first", "test_3_after", "test_4_after"):
        assert result.status_of(f"test_fault.py::{name}") == "passed", (name, result.out)
    assert result.returncode == 1
    print(f"\n[drill] failed node ({how}), {mode}: detected after "
          f"{detection_seconds(suite, fault_at):.1f} s, run took {result.wall:.1f} s")
    if job_id:
        assert job_gone(job_id)
        assert alloc_id(suite) != job_id, "the next batches did not get a new allocation"
    _nothing_of_ours_left(suite, mode)
    _next_run_passes(suite, mode)


@pytest.fixture
def env_suite(devcluster: dict, tmp_path: Path):
    target = make_env_suite(tmp_path)
    yield target
    ids = [line.split("|", 1)[0] for line in our_jobs(target)]
    job_id = alloc_id(target)
    if job_id or ids:
        sh(["scancel", *([job_id] if job_id else []), *ids], check=False)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_dispatched_test_sees_the_slurm_variables_of_a_job_of_its_own_shape(
        env_suite: Path, mode: str) -> None:
    # a two-node allocation, so that a one-node test differs from the allocation
    result = run(env_suite, mode, "--trtllm-alloc-nodes=2")
    assert result.returncode == 0, result.out
    (one,) = seen_env(env_suite, "two_gpus")
    assert (one["SLURM_JOB_NUM_NODES"], one["SLURM_NNODES"], one["SLURM_NTASKS"]) == (
        "1", "1", "1"), one
    assert one["SLURM_JOB_NODELIST"] == one["SLURM_NODELIST"] == one["SLURMD_NODENAME"], one
    assert (one["SLURM_PROCID"], one["SLURM_LOCALID"]) == ("0", "0"), one
    assert len((one["CUDA_VISIBLE_DEVICES"] or "").split(",")) == 2, one
    ranks = seen_env(env_suite, "eight_ranks")
    assert len(ranks) == 8, ranks
    for rank, env in enumerate(ranks):
        assert (env["SLURM_JOB_NUM_NODES"], env["SLURM_NNODES"], env["SLURM_NTASKS"]) == (
            "2", "2", "8"), env
        assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == ranks[0]["SLURM_NODELIST"]
        assert (env["SLURM_PROCID"], env["SLURM_LOCALID"]) == (str(rank), str(rank % 4)), env
        assert len((env["CUDA_VISIBLE_DEVICES"] or "").split(",")) == 4, env
    assert len({env["SLURMD_NODENAME"] for env in ranks}) == 2, ranks


# the disk fills under the controller's work_dirs: both moments run here (local) and in the
# default mode (warm); the other modes write the same files, so each gets one moment
@pytest.mark.parametrize("mode,when", [("local", "from-the-start"), ("local", "mid-run"),
                                       ("warm", "from-the-start"), ("warm", "mid-run"),
                                       ("no-warm", "mid-run"), ("one-shot", "from-the-start")])
def test_a_full_disk_is_named_and_every_test_keeps_one_outcome(
        devcluster: dict, tmp_path: Path, mode: str, when: str) -> None:
    suite = make_suite(tmp_path, gpus=mode != "local")
    with small_disk(suite / "work_dirs"):
        try:
            if when == "from-the-start":
                fill(suite / "work_dirs")
            result = run(suite, mode, fault="fill" if when == "mid-run" else "")
        finally:
            ids = [line.split("|", 1)[0] for line in our_jobs(suite)]
            job_id = alloc_id(suite)
            if job_id or ids:
                sh(["scancel", *([job_id] if job_id else []), *ids], check=False)
    assert_one_outcome_each(result)
    assert result.returncode in (0, 1), result.out  # not 3: no INTERNALERROR in the controller
    if when == "from-the-start" or result.returncode == 1:  # a test the disk failed says why
        assert f"no space left on the file system of {suite / 'work_dirs'}" in result.out, (
            result.out)
        assert "a batch needs at least" in result.out, result.out
    if when == "mid-run":  # what finished before the disk filled is kept
        assert result.status_of("test_fault.py::test_1_first") == "passed", result.out
    else:
        assert result.returncode == 1, result.out
        assert all(kinds == ["failure"] for kinds in result.outcomes.values()), result.out


@pytest.mark.parametrize("mode", list(MODES))
def test_a_hang_is_named_without_the_cancelled_jobs_exit_code(suite: Path, mode: str) -> None:
    result = run(suite, mode, fault="hang")
    assert_one_outcome_each(result)
    assert result.status_of("test_fault.py::test_2_fault") == "failure", result.out
    assert "[HANG_DETECTED]" in result.out, result.out
    assert "exit code 0" not in result.out, result.out
    for name in ("test_1_first", "test_3_after", "test_4_after"):
        assert result.status_of(f"test_fault.py::{name}") == "passed", (name, result.out)
    _nothing_of_ours_left(suite, mode)
