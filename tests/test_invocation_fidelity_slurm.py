"""The invocation suite plain versus dispatched to the REAL dev cluster's local Slurm, in
its persistent allocation with warm workers (served sessions, forked batches): the same
exit code, summary, reports (every rerun attempt), junit; no hang for a test id naming
the hang pattern. See test_invocation_fidelity.py for the suite and local_direct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from devcluster import run as sh
from dispatch_helpers import copy_suite, run_suite
from test_invocation_fidelity import USER_ARGS, USER_ENV, compare, summary

SLURM = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_slurm",
         "--slurm-partition=gb200"]


@pytest.fixture
def suite(devcluster: dict, tmp_path: Path):
    suite = copy_suite("invocation_suite", tmp_path)
    yield suite
    state = suite / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def test_warm_workers_run_the_invocation_as_the_plain_run_does(suite: Path) -> None:
    env = {**USER_ENV, "TRTLLM_SLURM_WARM_WORKERS": "1"}
    here = suite / "sub"
    plain = run_suite(suite, *USER_ARGS, env=env, tag="plain", cwd=here)
    assert summary(plain) == "2 failed, 3 passed, 1 warning, 3 rerun", plain.stdout
    dispatched = run_suite(suite, *USER_ARGS, *SLURM, env=env, tag="slurm", cwd=here,
                           timeout=600)
    assert "Starting a warm worker on" in dispatched.stdout, dispatched.stdout
    compare(plain, dispatched)
    assert "HANG_DETECTED" not in dispatched.stdout
