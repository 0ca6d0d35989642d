"""`trtllm-slurm run` end to end on the REAL dev cluster (tests/cluster/up), with the FAKE
trtllm-bench / trtllm-eval of tests/fakes on the job's PATH: every workflow (test, bench,
eval, custom, custom script), every status (PASSED, FAILED, TIMEOUT, CANCELLED,
OUT_OF_MEMORY, HANG_DETECTED, ERROR), the JSON result, --job-spec re-runs, a YAML case file
run through pytest, and one persistent-allocation run (released at the end).

The one-shot runs are started together by a module fixture (they are independent jobs),
then each test waits for its own; jobs are short, and every job of this module is named
``<account>.<TAG>_...`` so the teardown can cancel whatever is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devcluster import run as sh
from devcluster import wait_for_job

FAKES = Path(__file__).resolve().parent / "fakes"
TAG = f"ct{os.getpid()}"
BENCH = "trtllm-bench --model llama throughput"

pytestmark = pytest.mark.devcluster


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    # the fakes, then this interpreter's scripts (the job's `pytest` is the one with the
    # plugin installed, in a venv that is not activated too), then the user's PATH
    env["PATH"] = os.pathsep.join([str(FAKES), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    env.update(extra)
    return env


class Run:
    """One ``trtllm-slurm run`` started in the background."""

    def __init__(self, name: str, args: list[str], cwd: Path) -> None:
        self.name = f"{TAG}_{name}"
        self.json = "--json" in args
        named = [] if "--job-spec" in args else ["--model-name", self.name]
        argv = [sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "run", *named, *args]
        self.proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        self._done: tuple[int, Any, str] | None = None

    def wait(self, timeout: float = 240) -> tuple[int, Any, str]:
        """(exit code, parsed JSON or stdout text, stderr)."""
        if self._done is None:
            try:
                out, err = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our child only; its job is cancelled by the teardown
                out, err = self.proc.communicate()
                raise AssertionError(f"{self.name}: no result after {timeout}s\n{err}") from None
            if self.json:
                try:
                    parsed: Any = json.loads(out)
                except ValueError:
                    raise AssertionError(f"not JSON:\n{out}\n{err}") from None
            else:
                parsed = out
            self._done = (self.proc.returncode, parsed, err)
        return self._done


def run_cli(args: list[str], cwd: Path, name: str, timeout: float = 240) -> tuple[int, Any, str]:
    return Run(name, args, cwd).wait(timeout)


def job_id_by_name(name: str, state: str = "RUNNING", timeout: float = 120) -> str:
    """The id of our job named ``name`` once squeue shows it in ``state``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = sh(["squeue", "-h", "-n", name, "-o", "%i|%T"], check=False).stdout.strip()
        for line in out.splitlines():
            job_id, _, st = line.partition("|")
            if st == state:
                return job_id
        time.sleep(0.3)
    raise AssertionError(f"no {state} job named {name} after {timeout}s")


@pytest.fixture(scope="module")
def root(devcluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("cli_run")
    (base / "pytest.ini").write_text("[pytest]\n")
    (base / "test_gpu.py").write_text(textwrap.dedent("""\
        import os
        import pytest

        @pytest.mark.skip_less_device(2)
        def test_two():
            assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 2

        def test_cpu():
            pass
    """))
    scripts = base / "my scripts"
    scripts.mkdir()
    (scripts / "bench.sh").write_text(textwrap.dedent("""\
        #!/bin/bash
        echo "script dir: $(cd "$(dirname "$0")" && pwd) ARG=$ARG"
        trtllm-bench --model scripted throughput --tp 1
    """))
    yield base
    user = devcluster.get("user") or "root"
    out = sh(["squeue", "-h", "-u", user, "-o", "%i|%j"], check=False).stdout
    left = [line.split("|")[0] for line in out.splitlines() if TAG in line]
    if left:  # never leave a job of ours on the shared dev cluster
        sh(["scancel", *left], check=False)
    state = base / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # a re-run of a job spec may have made a persistent allocation here
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


@pytest.fixture(scope="module")
def runs(root: Path) -> Iterator[dict[str, Run]]:
    """The independent one-shot runs, started at once."""
    one = ["--one-shot"]
    specs: dict[str, list[str]] = {
        "test": ["--test-cmd", "pytest test_gpu.py::test_two -p no:cacheprovider", "--json"],
        "bench": ["--bench-cmd", "trtllm-bench --model llama prepare-dataset --output d.json && "
                  f"{BENCH} --dataset d.json --tp 2", "--success-pattern", "PERFORMANCE OVERVIEW",
                  "--check", "Total Output Throughput (tokens/sec) >= 1200 (tolerance 5%)",
                  "--json"],
        "eval": ["--eval-cmd", "trtllm-eval --model llama --tp_size 1 mmlu"],
        "custom": ["--custom-cmd", 'echo "value=$MY_VAR"; for i in $(seq 1 12); do echo l$i; done',
                   "--custom-env", 'MY_VAR="hello world"', "--json"],
        "script": ["--custom-script", str(root / "my scripts" / "bench.sh"), "--custom-env",
                   "ARG=7", "--json"],
        "failed": ["--eval-cmd", "trtllm-eval --model llama gsm8k --check_accuracy "
                   "--accuracy_threshold 90", "--json"],
        "timeout": ["--bench-cmd", BENCH, "--custom-env", "FAKE_TRTLLM_SLEEP=60",
                    "--monitor-timeout", "3s", "--json"],
        "cancel": ["--bench-cmd", BENCH, "--custom-env", "FAKE_TRTLLM_SLEEP=60", "--json"],
        "oom": ["--bench-cmd", BENCH, "--custom-env", "FAKE_TRTLLM_ALLOC_MB=400",
                "--mem-mb", "60", "--json"],
        "hang": ["--bench-cmd", BENCH, "--custom-env", "FAKE_TRTLLM_HANG=5", "--json"],
    }
    started = {name: Run(name, [*args, *one], root) for name, args in specs.items()}
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()


def _ok(run: Run) -> dict[str, Any]:
    code, result, err = run.wait()
    assert code == 0 and result["status"] == "PASSED", (result, err)
    return result


# --------------------------------------------------------------------------- workflows

def test_test_command_gets_the_collected_device_count(runs: dict[str, Run]) -> None:
    result = _ok(runs["test"])
    assert result["workflow"] == "pytest" and result["scenario"] == "local_slurm"
    assert result["devices"] == {"required": 2, "total": 2, "per_node": 2, "nodes": 1,
                                 "source": "skip_less_device (collected)"}
    assert result["summary"]["pytest"]["counts"] == {"passed": 1}
    assert result["metrics"]["passed"] == 1.0
    assert result["partition"] == "batch" and result["account"] == "acct_a"


def test_bench_chain_passes_with_its_performance_block_as_json(runs: dict[str, Run]) -> None:
    result = _ok(runs["bench"])
    assert result["devices"]["total"] == 2  # tp 2 of the last trtllm-bench (the fake checks)
    perf = result["summary"]["performance"]
    assert perf["Total Output Throughput (tokens/sec)"] == 1234.5678
    assert perf["Per GPU Output Throughput (tps/gpu)"] == 617.2839
    assert "[Latency] P99" in perf and result["metrics"]["Request Throughput (req/sec)"] > 0
    assert result["patterns"]["success"]["PERFORMANCE OVERVIEW"].endswith("= PERFORMANCE OVERVIEW")
    assert result["checks"][0]["ok"] is True
    assert result["exit_code"] == 0 and result["elapsed_seconds"] >= 0
    assert result["job_id"].isdigit() and result["job_name"] == f"acct_a.{TAG}_bench"
    for key in ("log", "job_spec", "result", "script"):
        assert Path(result["log_paths"][key]).is_file(), key
    assert json.loads(Path(result["log_paths"]["result"]).read_text()) == result
    spec = json.loads(Path(result["log_paths"]["job_spec"]).read_text())
    assert spec["workflow"] == "bench" and spec["total_devices"] == 2
    assert "--gres=gpu:h200:2" in Path(result["log_paths"]["script"]).read_text()


def test_eval_prints_the_accuracy_for_people(runs: dict[str, Run]) -> None:
    code, text, err = runs["eval"].wait()
    assert code == 0, text + err
    assert "Status:     PASSED (exit code 0)" in text
    assert "Workflow:   eval" in text and "MMLU: 79.09 (14042 samples)" in text
    assert "submitted (local_slurm, partition batch)" in err


def test_custom_command_env_and_last_ten_lines(runs: dict[str, Run]) -> None:
    result = _ok(runs["custom"])
    assert result["summary"] == {"last_lines": [f"l{i}" for i in range(3, 13)]}
    log = Path(result["log_paths"]["log"]).read_text()
    assert "value=hello world" in log


def test_custom_script_runs_with_bash_and_its_folder_mounted(runs: dict[str, Run],
                                                             root: Path) -> None:
    result = _ok(runs["script"])
    folder = root / "my scripts"
    assert result["command"] == f"bash '{folder / 'bench.sh'}'"
    log = Path(result["log_paths"]["log"]).read_text()
    assert f"script dir: {folder} ARG=7" in log
    spec = json.loads(Path(result["log_paths"]["job_spec"]).read_text())
    assert spec["mounts"] == [f"{folder}:{folder}"]


# --------------------------------------------------------------------------- statuses

def test_failed_eval_shows_the_first_and_last_lines(runs: dict[str, Run]) -> None:
    code, result, err = runs["failed"].wait()
    assert (code, result["status"], result["exit_code"]) == (1, "FAILED", 1), err
    assert result["errors"][0].startswith("FAILED: exit code 1")
    assert any("AssertionError: Expected accuracy >= 90.0" in line for line in result["log_tail"])
    assert result["log_head"][0].startswith("[trtllm-slurm] job ")
    assert result["summary"]["accuracy"][0]["value"] == 81.2


def test_monitor_timeout_gives_timeout(runs: dict[str, Run]) -> None:
    code, result, err = runs["timeout"].wait()
    assert (code, result["status"]) == (3, "TIMEOUT"), (result, err)
    assert "monitor timeout (3 s)" in result["errors"][0]
    assert result["elapsed_seconds"] < 30
    assert wait_for_job(result["job_id"], timeout=60)[0] == "CANCELLED"


def test_scancel_gives_cancelled(runs: dict[str, Run]) -> None:
    job_id = job_id_by_name(f"acct_a.{TAG}_cancel")
    sh(["scancel", job_id])
    code, result, err = runs["cancel"].wait()
    assert (code, result["status"], result["job_id"]) == (5, "CANCELLED", job_id), (result, err)


def test_memory_limit_gives_out_of_memory(runs: dict[str, Run]) -> None:
    code, result, err = runs["oom"].wait()
    assert (code, result["status"]) == (6, "OUT_OF_MEMORY"), (result, err)
    spec = json.loads(Path(result["log_paths"]["job_spec"]).read_text())
    assert spec["mem_mb"] == 60


def test_hang_message_gives_hang_detected(runs: dict[str, Run]) -> None:
    code, result, err = runs["hang"].wait()
    assert (code, result["status"]) == (7, "HANG_DETECTED"), (result, err)
    assert any("Hang detected after 5 seconds." in line for line in result["log_tail"])
    # cancelled, not left to sleep its 600 s (checked on the job's state, not on a clock)
    assert wait_for_job(result["job_id"], timeout=60)[0] == "CANCELLED"


# --------------------------------------------------------------------------- job spec re-runs

def test_job_spec_rerun_and_a_refused_submission(runs: dict[str, Run], root: Path,
                                                 tmp_path: Path) -> None:
    first = _ok(runs["bench"])
    code, again, err = run_cli(["--job-spec", first["log_paths"]["job_spec"], "--json"], root,
                               "rerun")
    assert code == 0 and again["status"] == "PASSED", (again, err)
    assert again["work_dir"] != first["work_dir"] and again["job_id"] != first["job_id"]
    assert Path(again["work_dir"]).name.startswith(f"{TAG}_bench_bench_rerun_")
    assert again["summary"] == {**first["summary"]}
    assert again["notes"] == [f"re-run of {first['log_paths']['job_spec']}"]

    spec = json.loads(Path(first["log_paths"]["job_spec"]).read_text())
    spec["account"] = "nosuch"
    bad = tmp_path / "job_spec.json"
    bad.write_text(json.dumps(spec))
    code, refused, err = run_cli(["--job-spec", str(bad), "--json"], root, "refused")
    assert (code, refused["status"]) == (2, "ERROR"), (refused, err)
    assert "Invalid account" in refused["errors"][0]


# --------------------------------------------------------------------------- case file

def test_case_file_items_with_metric_checks(devcluster: dict[str, Any],
                                            tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "fake.yaml").write_text(textwrap.dedent(f"""\
        defaults:
          time_limit: 5m
        cases:
          - name: {TAG}_bench_fast
            bench_cmd: {BENCH} --tp 2
            success_patterns: [PERFORMANCE OVERVIEW]
            checks:
              - Total Output Throughput (tokens/sec) >= 1200 (tolerance 5%)
              - Per GPU Output Throughput (tps/gpu) >= 600
          - name: {TAG}_eval_accuracy
            eval_cmd: trtllm-eval --model llama mmlu
            checks: ["accuracy >= 79.0"]
          - name: {TAG}_eval_too_low
            eval_cmd: trtllm-eval --model llama gsm8k
            env: {{FAKE_TRTLLM_ACCURACY: "70.5"}}
            checks: ["accuracy >= 79.0"]
    """))
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.cases.items",
         "--trtllm-cases", "cases/fake.yaml", "--trtllm-one-shot", "-p", "no:cacheprovider",
         "-rA", f"--junitxml={junit}"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"PASSED cases/fake.yaml::{TAG}_bench_fast" in out
    assert f"PASSED cases/fake.yaml::{TAG}_eval_accuracy" in out
    assert f"FAILED cases/fake.yaml::{TAG}_eval_too_low" in out
    assert "check failed: accuracy = 70.5, threshold >= 79: FAILED" in out
    assert "log: " in out and "_eval_too_low_eval.log" in out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value")
             for p in cases[f"{TAG}_bench_fast"].iter("property")}
    assert props["Total Output Throughput (tokens/sec)"] == "1234.5678"
    assert props["status"] == "PASSED" and props["scenario"] == "local_slurm"
    low = {p.get("name"): p.get("value") for p in cases[f"{TAG}_eval_too_low"].iter("property")}
    assert low["accuracy"] == "70.5" and low["status"] == "FAILED"
    assert cases[f"{TAG}_eval_too_low"].find("failure") is not None


# --------------------------------------------------------------------------- persistent

def _idle_partition() -> str | None:
    """A partition with an idle node right now: an exclusive allocation there starts at
    once instead of queueing behind other engineers' allocations on the shared cluster."""
    for partition in ("batch", "gb200"):
        out = sh(["sinfo", "-h", "-p", partition, "-t", "idle", "-o", "%D"], check=False).stdout
        if any(n.strip().isdigit() and int(n) > 0 for n in out.split()):
            return partition
    return None


def test_persistent_allocation_step(devcluster: dict[str, Any], tmp_path: Path) -> None:
    """One run as a step of a persistent allocation (whole node, exclusive): released here."""
    partition = _idle_partition()
    if partition is None:
        pytest.fail("every dev-cluster node is busy (other suites' allocations): an exclusive "
                    "allocation would queue for minutes")
    try:
        code, result, err = run_cli(
            ["--custom-cmd", "echo step $SLURM_STEP_ID on $SLURMD_NODENAME",
             "--persistent", "--slurm-partition", partition, "--alloc-time-limit", "10m",
             "--rootdir", str(tmp_path), "--json"], tmp_path, "persistent", timeout=180)
        assert code == 0 and result["status"] == "PASSED", (result, err)
        state = json.loads((tmp_path / "work_dirs" / ".slurm_alloc.json").read_text())
        assert result["job_id"].startswith(f"{state['job_id']}~"), (result["job_id"], err)
        assert result["summary"]["last_lines"][-1].startswith("step ")
    finally:
        release = subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc",
                                  "release", "--rootdir", str(tmp_path)], env=_env(),
                                 capture_output=True, text=True, timeout=120, check=False)
        assert release.returncode == 0, release.stderr
    assert not (tmp_path / "work_dirs" / ".slurm_alloc.json").exists()
    shutil.rmtree(tmp_path / "work_dirs", ignore_errors=True)
