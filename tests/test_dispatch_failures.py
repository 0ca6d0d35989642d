"""A worker that crashes, hangs or runs too long: every test still gets exactly one outcome,
naming the status, and the tests that had not started run again in a new job."""

from __future__ import annotations

import pytest
from dispatch_helpers import copy_suite, run_suite

DISPATCH = ["-p", "no:cacheprovider", "--trtllm-remote", "--trtllm-dispatch=all",
            "--trtllm-scenario=local_direct"]
REST = ["test_before", "test_after_one", "test_after_two"]


def _final_outcomes(run) -> dict[str, str]:
    """nodeid's test name -> the outcome a user sees (failed if any phase failed)."""
    result = {}
    for nodeid, phases in run.outcomes().items():
        name = nodeid.split("::")[-1]
        outcomes = [o for _, o in phases]
        result[name] = "failed" if "failed" in outcomes else outcomes[min(1, len(outcomes) - 1)]
    return result


def _assert_one_outcome_each(run) -> None:
    for nodeid, phases in run.outcomes().items():
        whens = [w for w, _ in phases]
        assert len(whens) == len(set(whens)), f"{nodeid} reported twice: {phases}"


@pytest.mark.parametrize(
    ("mode", "victim", "status", "extra"),
    [
        ("crash", "test_crash", "CRASHED", []),
        ("hang", "test_hang", "HANG_DETECTED", []),
        ("timeout", "test_slow", "TIMEOUT", ["--trtllm-monitor-timeout=8s"]),
    ],
)
def test_status_and_redispatch(tmp_path, mode, victim, status, extra) -> None:
    suite = copy_suite("crash_suite", tmp_path)
    run = run_suite(suite, *DISPATCH, *extra, env={"CRASH_MODE": mode}, tag=mode, timeout=180)
    _assert_one_outcome_each(run)
    outcomes = _final_outcomes(run)
    assert outcomes[victim] == "failed", run.stdout
    assert f"[{status}]" in run.stdout, run.stdout
    assert "last lines of the job log" in run.stdout
    for name in REST:
        assert outcomes[name] == "passed", (name, run.stdout)
    assert run.returncode == 1
    assert len(run.outcomes()) == 6


def test_no_retry_when_disabled(tmp_path) -> None:
    suite = copy_suite("crash_suite", tmp_path)
    run = run_suite(suite, *DISPATCH, "--trtllm-max-retries=0", env={"CRASH_MODE": "crash"},
                    tag="noretry", timeout=180)
    _assert_one_outcome_each(run)
    outcomes = _final_outcomes(run)
    assert outcomes["test_before"] == "passed"
    assert outcomes["test_crash"] == "failed"
    for name in ("test_hang", "test_slow", "test_after_one", "test_after_two"):
        assert outcomes[name] == "failed", run.stdout
    assert run.stdout.count("[CRASHED]") >= 5
