"""The plugin end to end on the real dev cluster: conftest_examples dispatched to local Slurm,
a persistent allocation reused by a second run, one-shot mode, Ctrl-C, release."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from devcluster import run as sh

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"
GPU_TESTS = [
    "test_single_gpu.py::test_one_gpu[fp16]",
    "test_multi_gpu.py::test_tensor_parallel[4]",
    "test_multi_gpu.py::test_hopper_only",
    "test_perf_sanity.py::test_e2e[aggr-llama_8b_fp8-tp4]",
]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}


def pytest_in(suite: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=suite, capture_output=True, text=True, timeout=timeout, env=_env(), check=False,
    )


def alloc_state(suite: Path) -> dict | None:
    path = suite / "work_dirs" / ".slurm_alloc.json"
    return json.loads(path.read_text()) if path.exists() else None


def job_state(job_id: str) -> str:
    out = sh(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
    return out or "GONE"


@pytest.fixture(scope="module")
def suite(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    target = tmp_path_factory.mktemp("slurm") / "examples"
    shutil.copytree(EXAMPLES, target, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    yield target
    state = alloc_state(target)
    if state:  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", state["job_id"]], check=False)


def test_examples_run_on_local_slurm_and_reuse_the_allocation(suite: Path) -> None:
    first = pytest_in(suite, "--trtllm-remote")
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    for nodeid in GPU_TESTS:
        assert f"PASSED {nodeid}" in out, nodeid
    assert "SKIPPED [1] test_multi_gpu.py:12: needs 8 GPUs" in out  # nothing has 8 on one node
    assert "scenario: local_slurm" in out and "srun --jobid=" in out
    state = alloc_state(suite)
    assert state is not None and job_state(state["job_id"]) == "RUNNING"
    assert oct((suite / "work_dirs" / ".slurm_alloc.json").stat().st_mode & 0o777) == "0o600"

    spec = json.loads(next((suite / "work_dirs").glob("batch-4gpu-*/job_spec.json")).read_text())
    assert (spec["scenario"], spec["partition"], spec["account"]) == ("local_slurm", "batch", "acct_a")
    assert (spec["total_devices"], spec["devices_per_node"], spec["node_count"]) == (4, 4, 1)
    assert spec["job_name"].startswith("acct_a.") and spec["build_arch"] == "90-real"
    assert {p["name"] for p in spec["slurm_env"]["partitions"]} == {"batch", "gb200"}

    second = pytest_in(suite, "--trtllm-remote", "-k", "one_gpu")
    assert second.returncode == 0, second.stdout + second.stderr
    assert alloc_state(suite)["job_id"] == state["job_id"], "the allocation was not reused"
    assert f"job id:   {state['job_id']}~" in second.stdout


def test_ctrl_c_cancels_the_step_and_keeps_the_allocation(suite: Path) -> None:
    (suite / "test_slow_gpu.py").write_text(
        "import time, pytest\n\n"
        "@pytest.mark.skip_less_device(1)\n"
        "def test_sleeps():\n    import os, pathlib\n"
        "    pathlib.Path(__file__).with_name('sleeper.pid').write_text(str(os.getpid()))\n"
        "    print('sleeping', flush=True)\n    time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--trtllm-remote",
         "test_slow_gpu.py", "test_cpu.py"],
        cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    state = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = alloc_state(suite)
        logs = list((suite / "work_dirs").glob("*/job.log"))
        if state and any("sleeping" in p.read_text(errors="replace") for p in logs):
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the slow test never started")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "KeyboardInterrupt" in out
    assert "passed" in out  # the summary of what finished (test_cpu ran locally) is printed
    steps = sh(["squeue", "-h", "-s", "-j", state["job_id"], "-o", "%i %j"], check=False).stdout
    deadline = time.monotonic() + 20
    while steps.strip() and time.monotonic() < deadline:  # scancel of a step takes a moment
        time.sleep(0.5)
        steps = sh(["squeue", "-h", "-s", "-j", state["job_id"], "-o", "%i %j"],
                   check=False).stdout
    assert not [s for s in steps.splitlines() if "batch-1gpu" in s], steps
    pid = int((suite / "sleeper.pid").read_text())  # the test process itself is gone too
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"the interrupted test (pid {pid}) still runs"
        time.sleep(0.2)
    assert job_state(state["job_id"]) == "RUNNING"
    (suite / "test_slow_gpu.py").unlink()


def test_release_allocation_at_the_end(suite: Path) -> None:
    state = alloc_state(suite)
    assert state is not None
    result = pytest_in(suite, "--trtllm-remote", "--trtllm-release-allocation", "-k", "fp16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "released" in result.stdout
    assert alloc_state(suite) is None
    deadline = time.monotonic() + 20
    while job_state(state["job_id"]) not in ("GONE", "CANCELLED", "COMPLETING"):
        assert time.monotonic() < deadline, job_state(state["job_id"])
        time.sleep(0.5)


def test_one_shot_runs_each_batch_as_its_own_job(suite: Path) -> None:
    """After the release: the persistent allocation holds whole nodes while it lives."""
    result = pytest_in(suite, "--trtllm-remote", "--trtllm-one-shot", "-k", "one_gpu or tensor")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "PASSED test_single_gpu.py::test_one_gpu[fp8]" in out
    assert "sbatch" in out and "srun --jobid=" not in out


def test_alloc_nodes_grows_the_allocation_and_a_partition_too_small_is_a_usage_error(
        devcluster: dict, tmp_path: Path) -> None:
    """--trtllm-alloc-nodes: 1-GPU tests alone get a 1-node allocation (with its idle warm
    worker); asked for 2, that allocation is replaced by a 2-node one. More nodes than the
    partition has: a usage error."""
    suite = tmp_path / "alloc_nodes"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    trtllm_slurm: resources\n")
    (suite / "test_one.py").write_text(
        "import pytest\n\n\n@pytest.mark.trtllm_slurm(devices=1)\ndef test_one():\n    pass\n")
    jobs: list[str] = []
    try:
        first = pytest_in(suite, "--trtllm-remote", "--slurm-partition=batch")
        assert first.returncode == 0, first.stdout + first.stderr
        state = alloc_state(suite)
        assert state is not None and state["nodes"] == 1, state
        jobs.append(state["job_id"])
        second = pytest_in(suite, "--trtllm-remote", "--slurm-partition=batch",
                           "--trtllm-alloc-nodes=2")
        out = second.stdout + second.stderr
        assert second.returncode == 0, out
        assert "PASSED test_one.py::test_one" in out
        assert f"Allocation {jobs[0]} does not fit (1 node(s), wanted 2)" in out
        state = alloc_state(suite)
        assert state is not None and state["nodes"] == 2 and state["job_id"] != jobs[0], state
        jobs.append(state["job_id"])
        nodes = sh(["squeue", "-h", "-j", state["job_id"], "-o", "%D"], check=False).stdout
        assert nodes.strip() == "2"
        bad = pytest_in(suite, "--trtllm-remote", "--slurm-partition=batch",
                        "--trtllm-alloc-nodes=3")
        assert bad.returncode == 4, bad.stdout + bad.stderr
        assert "--trtllm-alloc-nodes 3: partition batch has 2 node(s)" in bad.stderr
    finally:
        if jobs:  # never leave our allocations behind on the shared dev cluster
            sh(["scancel", *jobs], check=False)
