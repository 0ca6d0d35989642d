"""--trtllm-collect=target against the REAL dev cluster and its sshd.

The suite (tests/data/gpu_import_suite) is shaped like TensorRT-LLM's integration tests:
its conftest asks ``nvidia-smi`` for the GPU's architecture at import (module-level
``skipif``), a test module reads its model path at import (``llm_models_root()``), another
skips itself at import on Blackwell, and the conftest's own options (``--test-list``,
``--waives-file``, ``--output-dir``, ``--perf-log-formats``) select, reorder and waive.

The reference is a plain run on a dev-cluster node (pytest inside ``srun``, where the
cluster's TaskProlog puts its FAKE nvidia-smi on PATH and LLM_MODELS_ROOT is set); the
run under test is typed on this machine, which has neither (as a laptop or a CPU-only CI
agent), and dispatched locally (local Slurm) and over SSH (the dev sshd as login node).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from devcluster import run as sh
from dispatch_helpers import SuiteRun, copy_suite, junit_cases, run_suite, without_addresses

SUITE = "gpu_import_suite"
TEST_LIST = """\
check_arch.py::test_hopper_only
accuracy/check_accuracy.py::test_llama_fails
accuracy/check_accuracy.py::test_llama_tp[tp2]
accuracy/check_accuracy.py::TestLlama::test_in_class
accuracy/check_accuracy.py::test_llama_fp8
accuracy/check_accuracy.py::test_llama_waived
"""
WAIVES = "accuracy/check_accuracy.py::test_llama_waived SKIP (bug 4242)\n"
COLLECT = ["--trtllm-remote", "--trtllm-collect=target"]


def ci_args(suite: Path) -> list[str]:
    """A CI stage's command line (TensorRT-LLM's jenkins/L0_Test.groovy, in small)."""
    return ["-vv", "--timeout-method=thread", "--timeout=3600",
            f"--test-list={suite / 'test_list.txt'}", f"--waives-file={suite / 'waives.txt'}",
            f"--output-dir={suite.parent / 'output'}", "--perf-log-formats", "csv",
            "--perf-log-formats", "yaml", "-o", "junit_logging=out-err"]


@pytest.fixture(scope="module")
def suite(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("collect")
    suite = copy_suite(SUITE, base)
    (base / "models" / "llama-3.1-8b").mkdir(parents=True)
    (suite / "test_list.txt").write_text(TEST_LIST)
    (suite / "waives.txt").write_text(WAIVES)
    (suite / "trtllm-slurm.toml").write_text(
        f'[clusters.{devcluster["cluster_name"]}]\ncontainer_runtime = "none"\n'
        f'models_root = "{base / "models"}"\n')
    yield suite
    subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc", "release",
                    "--rootdir", str(suite)], cwd=suite, capture_output=True, text=True,
                   timeout=120, check=False)


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine: no nvidia-smi on PATH, no models root, no plugin settings."""
    assert shutil.which("nvidia-smi") is None, "this test needs a machine without nvidia-smi"
    monkeypatch.delenv("LLM_MODELS_ROOT", raising=False)
    for name in [n for n in os.environ if n.startswith("TRTLLM_SLURM_")]:
        monkeypatch.delenv(name)


def on_node(suite: Path, partition: str, gpu: str) -> tuple[str, ...]:
    return ("srun", "-p", partition, "-N1", f"--gres=gpu:{gpu}:2", "-t", "5",
            f"--chdir={suite}", f"--export=ALL,LLM_MODELS_ROOT={suite.parent / 'models'}")


def plain_on_node(suite: Path, *args: str, tag: str, partition: str = "batch",
                  gpu: str = "h200") -> SuiteRun:
    return run_suite(suite, *args, tag=tag, launcher=on_node(suite, partition, gpu),
                     timeout=900)


def closing(run: SuiteRun) -> str:
    """pytest's closing line without its time."""
    lines = [line for line in run.stdout.splitlines() if line.startswith("=")]
    return re.sub(r" in [\d.]+s.*", "", lines[-1]).strip("= ") if lines else run.stdout


def reports(run: SuiteRun, paths: tuple[str, str] = ("", "")) -> list[tuple]:
    """What each report says; ``paths``: a remote checkout's folder, read as the local one
    (a skip's location names the file where the test ran)."""
    return sorted((r["nodeid"], r["when"], r["outcome"],
                   without_addresses(r["longrepr"]).replace(*paths) if paths[0]
                   else without_addresses(r["longrepr"]),
                   tuple(r["location"])) for r in run.reports)


def assert_same(plain: SuiteRun, dispatched: SuiteRun, paths: tuple[str, str] = ("", "")) -> None:
    assert dispatched.returncode == plain.returncode, dispatched.stdout
    assert closing(dispatched) == closing(plain), (plain.stdout, dispatched.stdout)
    assert reports(dispatched, paths) == reports(plain), dispatched.stdout
    cases = json.dumps(junit_cases(dispatched.junit))  # as text: paths read as local ones
    assert json.loads(cases.replace(*paths) if paths[0] else cases) == json.loads(
        json.dumps(junit_cases(plain.junit)))


def test_without_the_mode_the_run_says_how_to_collect_on_the_target(suite: Path) -> None:
    run = run_suite(suite, *ci_args(suite), "--trtllm-remote", tag="here")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout
    assert "nvidia-smi --query-gpu=name --format=csv,noheader' returned non-zero exit " \
           "status 127" in run.stdout
    assert "collect the tests on the target instead: --trtllm-collect=target (ini " \
           "trtllm_collect = target, env TRTLLM_SLURM_COLLECT=target)" in run.stdout


def test_test_files_that_cannot_be_imported_name_the_setting_too(tmp_path: Path) -> None:
    """A conftest that imports here, a test module that reads its model path at import."""
    suite = copy_suite(SUITE, tmp_path)
    (suite / "conftest.py").write_text("import os\nfrom pathlib import Path\n\n\n"
                                       "def llm_models_root():\n"
                                       "    root = Path(os.environ.get('LLM_MODELS_ROOT', '/no'))\n"
                                       "    assert root.exists(), 'set LLM_MODELS_ROOT'\n"
                                       "    return root\n\n\n"
                                       "def get_sm_version():\n    return 90\n\n\n"
                                       "skip_pre_hopper = skip_post_blackwell = "
                                       "__import__('pytest').mark.skip_less_device(1)\n")
    run = run_suite(suite, "--trtllm-remote", tag="files")
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout
    assert "AssertionError: set LLM_MODELS_ROOT" in run.stdout
    assert "trtllm-slurm: 1 test file cannot be imported here (a GPU, torch or model paths " \
           "needed at import?); collect the tests on the target instead: " \
           "--trtllm-collect=target" in run.stdout, run.stdout


@pytest.mark.parametrize("partition,gpu,collected", [
    ("batch", "h200", "node n[12], NVIDIA H200"),
    ("gb200", "gb200", "node g[12], NVIDIA GB200"),  # check_arch.py skips itself there
])
def test_a_stage_typed_here_equals_the_plain_run_on_a_node(
        suite: Path, partition: str, gpu: str, collected: str) -> None:
    args = ci_args(suite)
    plain = plain_on_node(suite, *args, tag=f"plain-{gpu}", partition=partition, gpu=gpu)
    assert "1 deselected" in closing(plain), plain.stdout  # the test list's
    where = ["--trtllm-persistent"] if gpu == "h200" else [
        "--trtllm-one-shot", "--device-type=GB200"]
    dispatched = run_suite(suite, *args, *COLLECT, *where, tag=f"collect-{gpu}", timeout=900)
    assert_same(plain, dispatched)
    assert re.search(rf"tests collected on local_slurm, partition {partition}, {collected} "
                     r"\(job \S+\)", dispatched.stdout), dispatched.stdout
    if gpu == "gb200":
        assert "check_arch.py" not in closing(dispatched) and not any(
            r["nodeid"].startswith("check_arch.py") for r in dispatched.reports)


def test_a_stage_prefix_reads_as_in_the_plain_run(suite: Path) -> None:
    """--test-prefix rewrites every node id on the target (after the suite's own selection):
    the run shows, records in junit and dispatches under the prefixed ids."""
    args = [*ci_args(suite), "--test-prefix=H200-PyTorch-1"]
    plain = plain_on_node(suite, *args, tag="plain-prefix")
    assert any(r["nodeid"].startswith("H200-PyTorch-1/") for r in plain.reports), plain.stdout
    dispatched = run_suite(suite, *args, *COLLECT, tag="collect-prefix", timeout=900)
    assert_same(plain, dispatched)


def test_selection_is_the_controllers_on_the_targets_collection(suite: Path) -> None:
    """-k, -m and --deselect select among the placeholders as among a plain run's items."""
    select = ["-k", "llama and not fp8", "-m", "not timeout",
              "--deselect", "accuracy/check_accuracy.py::TestLlama"]
    args = [*ci_args(suite), *select]
    plain = plain_on_node(suite, *args, tag="plain-select")
    dispatched = run_suite(suite, *args, *COLLECT, tag="collect-select", timeout=600)
    assert_same(plain, dispatched)
    ran = {r["nodeid"] for r in dispatched.reports}
    assert ran == {"accuracy/check_accuracy.py::test_llama_tp[tp2]",
                   "accuracy/check_accuracy.py::test_llama_waived"}


def test_last_failed_and_exitfirst(suite: Path, tmp_path: Path) -> None:
    cache = ["-p", "cacheprovider", "-o", f"cache_dir={tmp_path / 'cache'}"]
    first = run_suite(suite, *ci_args(suite), *COLLECT, *cache, tag="lf-1", timeout=600)
    assert "1 failed, 4 passed, 1 skipped, 1 deselected" in closing(first), first.stdout
    again = run_suite(suite, *ci_args(suite), *COLLECT, *cache, "--lf", tag="lf-2",
                      timeout=600)
    assert {r["nodeid"] for r in again.reports} == {
        "accuracy/check_accuracy.py::test_llama_fails"}, again.stdout
    assert "run-last-failure: rerun previous 1 failure" in again.stdout
    stop = run_suite(suite, *ci_args(suite), *COLLECT, "-x", tag="x", timeout=600)
    assert stop.returncode == 1 and "stopping after 1 failures" in stop.stdout, stop.stdout


def test_the_plan_is_made_from_the_targets_collection(suite: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    run = run_suite(suite, *ci_args(suite), *COLLECT, f"--trtllm-plan-json={plan}",
                    "-k", "not fails", tag="plan", timeout=600)
    assert run.returncode == 0, run.stdout
    rows = {row["nodeid"]: row for row in json.loads(plan.read_text())["tests"]}
    assert set(rows) == {
        "check_arch.py::test_hopper_only", "accuracy/check_accuracy.py::test_llama_tp[tp2]",
        "accuracy/check_accuracy.py::TestLlama::test_in_class",
        "accuracy/check_accuracy.py::test_llama_fp8",
        "accuracy/check_accuracy.py::test_llama_waived"}, run.stdout
    assert not run.reports  # nothing ran
    tp2 = rows["accuracy/check_accuracy.py::test_llama_tp[tp2]"]
    assert (tp2["devices"], tp2["source"], tp2["scenario"]) == (
        2, "skip_less_device", "local_slurm"), tp2


# ---------------------------------------------------------------------------- over SSH
def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def remote_suite(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("collect_ssh")
    suite = copy_suite(SUITE, base)
    (base / "models" / "llama-3.1-8b").mkdir(parents=True)
    (suite / "test_list.txt").write_text(TEST_LIST)
    (suite / "waives.txt").write_text(WAIVES)
    # the report recorder (-p report_recorder) reaches the remote worker with the code
    shutil.copy(Path(__file__).parent / "data" / "report_recorder.py", suite)
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n*.xml\n"
                                      "*.jsonl\n")
    ssh = devcluster["ssh"]
    remote_root = base / "cluster_home"
    (suite / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{remote_root}"\n'
        f'python = "{sys.executable}"\npartition = "batch"\ncontainer_runtime = "none"\n'
        f'models_root = "{base / "models"}"\n')
    origin = base / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git(suite, "init", "-q", "-b", "main")
    git(suite, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(suite, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "suite")
    git(suite, "remote", "add", "origin", str(origin))
    git(suite, "push", "-q", "origin", "main")
    yield suite
    state = remote_root / ".trtllm-state" / "local" / ".slurm_alloc.json"
    if state.exists():  # never leave an allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def test_over_ssh_the_stage_equals_the_plain_run_on_a_node(remote_suite: Path) -> None:
    args = ci_args(remote_suite)
    plain = plain_on_node(remote_suite, *args, tag="plain")
    dispatched = run_suite(remote_suite, *args, *COLLECT, "--slurm-cluster=devssh",
                           "--trtllm-one-shot", tag="ssh", timeout=900)
    checkout = remote_suite.parent / "cluster_home" / remote_suite.name
    assert_same(plain, dispatched, (str(checkout), str(remote_suite)))
    assert re.search(r"tests collected on remote_slurm:devssh, partition batch, node n[12], "
                     r"NVIDIA H200 \(job \d+\)", dispatched.stdout), dispatched.stdout
    selected = run_suite(remote_suite, *args, *COLLECT, "--slurm-cluster=devssh",
                         "--trtllm-one-shot", "-k", "tp or class", "--deselect",
                         "check_arch.py", tag="ssh-k", timeout=900)
    assert {r["nodeid"] for r in selected.reports} == {
        "accuracy/check_accuracy.py::test_llama_tp[tp2]",
        "accuracy/check_accuracy.py::TestLlama::test_in_class"}, selected.stdout
    assert selected.returncode == 0, selected.stdout
