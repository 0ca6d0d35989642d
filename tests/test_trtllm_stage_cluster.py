"""The TensorRT-LLM-shaped stage (see test_trtllm_stage.py) plain versus dispatched to the
REAL dev cluster: its local Slurm in a persistent allocation with warm workers (served
sessions: the first run's collect by key, the second run's start before the controller
collects and collect the run's own arguments), and its sshd as a remote cluster's login
node. Same exit code, summary, reports under the same ids, junit; each test run once, in
the controller's order; a test a session cannot find fails alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from devcluster import publish_ssh_suite
from devcluster import run as sh
from dispatch_helpers import DATA, run_suite
from test_invocation_fidelity import summary
from test_remote_early_sessions import cancel_allocation
from test_trtllm_stage import PREFIX, SPLIT, STAGE, assert_same_run, copy_stage

pytestmark = pytest.mark.devcluster

SLURM = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_slurm",
         "--slurm-partition=gb200"]
WARM = {"TRTLLM_SLURM_WARM_WORKERS": "1"}


@pytest.fixture
def slurm_suite(devcluster: dict, tmp_path: Path):
    suite = copy_stage(tmp_path)
    yield suite
    state = suite / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def fresh_work_dirs(suite: Path) -> None:
    """Each run's batches alone under work_dirs (the allocation's state and agents stay)."""
    for batch in suite.glob("work_dirs/*_*"):
        if batch.is_dir() and not batch.name.startswith("."):
            shutil.rmtree(batch)


def test_a_stage_in_a_warm_allocation_reads_as_the_plain_run(slurm_suite: Path) -> None:
    suite = slurm_suite
    args = [*STAGE, *SPLIT]
    plain = run_suite(suite, *args, env=WARM, tag="plain")
    assert plain.returncode == 1 and plain.outcomes(), plain.stdout
    for run in ("first", "early"):  # the second run's sessions start before it collects
        fresh_work_dirs(suite)
        dispatched = run_suite(suite, *args, *SLURM, env=WARM, tag=run, timeout=600)
        assert "file or directory not found" not in dispatched.stdout, dispatched.stdout
        assert_same_run(plain, dispatched, suite)
    # a parameter the target's code does not make: that test fails, the others run
    fresh_work_dirs(suite)
    missing = run_suite(suite, "-p", "no:cacheprovider", "-v", f"--test-prefix={PREFIX}",
                        "accuracy/test_drift.py", "llmapi/test_llm.py::test_generate", *SLURM,
                        env={**WARM, "DRIFT": "1"}, tag="missing", timeout=600)
    calls = {n: o for n, r in missing.outcomes().items() for w, o in r if w == "call"}
    assert calls == {
        f"{PREFIX}/accuracy/test_drift.py::test_drift[kept]": "passed",
        f"{PREFIX}/accuracy/test_drift.py::test_drift[gone]": "failed",
        f"{PREFIX}/llmapi/test_llm.py::test_generate[]": "passed",
        f"{PREFIX}/llmapi/test_llm.py::test_generate[2]": "passed",
    }, missing.stdout
    assert (f"the target could not collect {PREFIX}/accuracy/test_drift.py::test_drift[gone]"
            in missing.stdout), missing.stdout
    assert summary(missing).startswith("1 failed, 3 passed"), missing.stdout


def test_a_stage_over_ssh_reads_as_the_plain_run(devcluster: dict, tmp_path: Path) -> None:
    suite = copy_stage(tmp_path)
    shutil.copy(DATA / "report_recorder.py", suite)  # the worker loads it too (-p)
    (suite / ".gitignore").write_text(
        "__pycache__/\n.pytest_cache/\nwork_dirs/\n*.jsonl\n*.xml\n")
    publish_ssh_suite(suite, tmp_path, devcluster["ssh"])
    try:
        plain = run_suite(suite, *STAGE, tag="plain")
        assert plain.returncode == 1 and plain.outcomes(), plain.stdout
        dispatched = run_suite(suite, *STAGE, "--slurm-cluster=devssh", "--trtllm-dispatch=all",
                               tag="ssh", timeout=900)
        assert "scenario: remote_slurm" in dispatched.stdout, dispatched.stdout
        assert "file or directory not found" not in dispatched.stdout, dispatched.stdout
        # the batches ran in the cluster's checkout: their reports.jsonl are there
        assert_same_run(plain, dispatched, tmp_path / "cluster_home" / suite.name)
    finally:
        cancel_allocation(tmp_path / "cluster_home")
