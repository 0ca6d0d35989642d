"""On the real dev cluster (issue 19): the plan's batches are the batches the run submits
(conftest_examples and the benchmark suite), and a dispatched run on Slurm shows its GPU
use, writes its timeline and logs every scheduler command it issues."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from devcluster import run as sh
from timeline_checks import check_svg, check_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "conftest_examples"

pytestmark = pytest.mark.devcluster


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    return {**env, **extra}


def pytest_in(suite: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 2400) -> subprocess.CompletedProcess:
    """pytest in ``suite``; past ``timeout`` (a busy shared cluster) it gets Ctrl-C, so it
    cancels its own jobs, and the test fails saying so."""
    argv = [sys.executable, "-m", "pytest", "-rA", *args]
    proc = subprocess.Popen(argv, cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or _env())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"pytest did not finish within {timeout} s (the shared cluster busy?); "
                    f"interrupted:\n{out[-3000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def plan_batches(suite: Path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    out = suite / "plan.json"
    proc = pytest_in(suite, "--trtllm-plan-json", str(out), *args, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())["batches"]


def run_batches(suite: Path) -> Counter:
    """(name, node ids) of every batch the run wrote a job spec for (not build jobs)."""
    found: Counter = Counter()
    for path in (suite / "work_dirs").glob("*/job_spec.json"):
        spec = json.loads(path.read_text())
        if spec.get("workflow", "pytest") == "pytest" and spec.get("nodeids"):
            found[(spec["name"], frozenset(spec["nodeids"]))] += 1
    return found


def planned(batches: list[dict]) -> Counter:
    return Counter((b["label"], frozenset(b["nodeids"])) for b in batches)


def release(suite: Path) -> None:
    state = suite / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


# the examples that need one node: a run that finishes on a busy shared cluster
ONE_NODE = ("-k", "not allreduce and not two_nodes and not tp4pp2",
            "--deselect", "test_perf_sanity.py::test_e2e[aggr-llama_8b_fp8]")


def copy_examples(tmp_path: Path) -> Path:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    return suite


@pytest.fixture(scope="module")
def examples_run(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    """The one-node examples planned, then run on local Slurm (a persistent allocation,
    warm workers: the default) with the timeline, the summary JSON and a debug log file."""
    suite = copy_examples(tmp_path_factory.mktemp("plan_is_run"))
    try:
        plan = plan_batches(suite, *ONE_NODE)
        # a short allocation: the scheduler can backfill it on a busy shared cluster
        proc = pytest_in(suite, *ONE_NODE, "--trtllm-remote", "--trtllm-alloc-time-limit=30m",
                         "--trtllm-timeline=out/timeline.json",
                         "--trtllm-summary-json=out/summary.json", "--log-file=out/run.log",
                         "--log-file-level=DEBUG")
        yield suite, plan, proc
    finally:
        release(suite)


def test_examples_plan_batches_are_the_run_batches(examples_run) -> None:
    suite, plan, proc = examples_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(plan) > 1 and run_batches(suite) == planned(plan)
    summary = json.loads((suite / "out" / "summary.json").read_text())
    assert Counter((b["label"], frozenset(b["nodeids"])) for b in summary["batches"]) == \
        planned(plan)


def submitted_then_interrupted(suite: Path, plan: list[dict], *args: str,
                               env: dict[str, str] | None = None) -> Counter:
    """Run ``suite`` until it has written a job spec for as many batches as ``plan`` has
    (it writes each as it submits it), then Ctrl-C it (it cancels its jobs); its batches."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--trtllm-remote", *args],
                            cwd=suite, env=env or _env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while sum(run_batches(suite).values()) < len(plan) and proc.poll() is None:
            assert time.monotonic() < deadline, "the batches were not all submitted"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    return run_batches(suite)


def test_all_examples_plan_batches_are_the_run_batches(devcluster: dict, tmp_path: Path) -> None:
    """Every example (2-node MPI batches too), one-shot: compared once all are submitted."""
    suite = copy_examples(tmp_path)
    plan = plan_batches(suite, "--trtllm-one-shot")
    assert any(b["nodes"] == 2 for b in plan)
    assert submitted_then_interrupted(suite, plan, "--trtllm-one-shot") == planned(plan)


def test_examples_gpu_use_and_timeline(examples_run) -> None:
    suite, plan, proc = examples_run
    out = proc.stdout
    assert "trtllm-slurm: GPU use" in out, out
    eff = json.loads((suite / "out" / "summary.json").read_text())["efficiency"]
    assert eff["batches"] == len(plan)
    assert 0 < eff["gpu_seconds_busy"] <= eff["gpu_seconds_allocated"]
    assert 0 < eff["ratio"] <= 1
    # a first run (no earlier durations): the packer's figures are a guess, never a bound;
    # the bound shown is the one on the test times this run measured
    assert eff["lower_bound_seconds"] is None, eff
    assert "no earlier duration" in eff["estimates_guessed"]
    assert 0 < eff["measured_bound_seconds"] <= eff["makespan_seconds"]
    summary = json.loads((suite / "out" / "summary.json").read_text())
    tests = check_trace(suite / "out" / "timeline.json", summary)
    assert {t["name"] for t in tests} == {n for b in plan for n in b["nodeids"]}
    check_svg(suite / "out" / "timeline.svg", summary)
    trace = json.loads((suite / "out" / "timeline.json").read_text())["traceEvents"]
    nodes = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"n1", "n2"} & nodes, nodes  # a node's GPUs are its tracks
    assert "trtllm-slurm: batches " in out  # the plain status line (no terminal here)


def test_examples_log_every_scheduler_command(examples_run) -> None:
    suite, _, proc = examples_run
    log = (suite / "out" / "run.log").read_text()
    lines = [line for line in log.splitlines() if "pytest_trtllm_slurm" in line
             or "localhost: `" in line]
    commands = [line.split("`")[1].split()[0] for line in lines if "`" in line]
    # the persistent allocation (salloc, started detached), its warm workers (srun), polls
    assert {"squeue", "srun"} <= set(commands), log[-3000:]
    assert any(" salloc --no-shell " in line for line in lines), log[-3000:]
    assert all(" in " in line and (" exit code " in line or " timed out " in line)
               for line in lines if "localhost: `" in line)


# -- the benchmark suite -------------------------------------------------------------------
def benchmark_suite(suite: Path) -> list[tuple[str, int]]:
    """benchmarks/bench_makespan's 64-test suite (16 each of 1, 2, 4, 8 GPUs) in ``suite``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_makespan import make_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return make_suite(suite, per_shape=16)


def test_benchmark_suite_plan_batches_are_the_run_batches(
        devcluster: dict, tmp_path: Path) -> None:
    """The 64-test suite of benchmarks/bench_makespan (1, 2, 4, 8 GPUs), one-shot, compared
    once every batch is submitted (whatever the shared cluster's queue)."""
    suite = tmp_path / "suite"
    tests = benchmark_suite(suite)
    env = _env(BENCH_TEST_SECONDS="0", BENCH_IMPORT_SECONDS="0")
    args = ("-q", "--slurm-partition=batch", "--trtllm-one-shot")
    plan = plan_batches(suite, *args, env=env)
    assert sum(len(b["nodeids"]) for b in plan) == len(tests) == 64
    assert len(plan) > 4  # the packer split the shapes
    assert submitted_then_interrupted(suite, plan, *args, env=env) == planned(plan)


def test_over_ssh_a_persistent_run_packs_as_locally(devcluster: dict, tmp_path: Path) -> None:
    """The same 64-test suite planned for the dev cluster reached locally and over its sshd
    (``--slurm-cluster``): the same batches, packed into the warm allocation, even after a
    cold run measured a long start-up (its allocation's wait) for the cluster."""
    from devcluster import publish_ssh_suite

    suite = tmp_path / "suite"
    tests = benchmark_suite(suite)
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    publish_ssh_suite(suite, tmp_path, devcluster["ssh"], partition="gb200")
    cache = suite / ".pytest_cache" / "v" / "cache"
    cache.mkdir(parents=True)
    (cache / "trtllm-slurm-durations").write_text(json.dumps({n: 3.0 for n, _ in tests}))
    # what a cold run records: from its first submission to its first test, 60 s
    (cache / "trtllm-slurm-startup").write_text(json.dumps(
        {"remote_slurm/devssh/gb200/one-shot": 60.0, "local_slurm/gb200/one-shot": 60.0}))
    env = _env()
    local = plan_batches(suite, "-q", "--slurm-partition=gb200", env=env)
    remote = plan_batches(suite, "-q", "--slurm-cluster=devssh", env=env)
    assert len(local) > 4  # the packer split the shapes across the allocation's GPUs
    assert planned(remote) == planned(local)
    assert {b["pool"] for b in remote} == {"remote_slurm/devssh/gb200/allocation/warm"}
