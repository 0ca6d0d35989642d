"""TensorRT-LLM's other sizing conventions: named markers (``gpu2``/``gpu4``, through the
ini table ``trtllm_marker_devices``), ``skip_less_host_memory(MiB)`` as the job's memory
request, and a launcher prefix (the clusters file's ``launcher`` or the marker's) that runs
a multi-node test the way ``trtllm-llmapi-launch`` does: every rank starts the launcher,
pytest runs on rank 0 only. Unit checks of the pure parts, then one run on the dev cluster
with the FAKE launcher of tests/fakes (it says so in its docstring)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.controller.options import build_settings
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.render.scripts import render_sbatch, render_step_command
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Launch, Scenario
from pytest_trtllm_slurm.planning.requirements import (
    TestConfig,
    launcher_for,
    parse_marker_devices,
    size_marks,
)
from pytest_trtllm_slurm.planning.settings import ClusterConfig, Settings

# the suite's own markers (gpu2, gpu8...) are made here without a pytest.ini declaring them
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")

FAKE_LAUNCHER = Path(__file__).parent / "fakes" / "trtllm-llmapi-launch"


def marks(**by_name: Any) -> Any:
    return {name: getattr(pytest.mark, name)(*args).mark for name, args in by_name.items()}.get


def req(settings: Settings | None = None, **by_name: Any):  # type: ignore[no-untyped-def]
    return size_marks("t.py::t", marks(**by_name), settings or Settings())[1]


# --------------------------------------------------------------------------- named markers


def test_gpu2_and_gpu4_need_that_many_gpus_of_one_node_by_default() -> None:
    two, four = req(gpu2=()), req(gpu4=())
    assert (two.total, two.per_node, two.source) == (2, 2, "gpu2")
    assert (four.total, four.per_node, four.nodes(4)) == (4, 4, 1)
    assert req(gpu2=(), gpu4=()).total == 4  # the largest named marker wins
    assert req(gpu4=(), skip_less_device=(1,)).total == 1  # the explicit markers come first
    assert req(cpu_only=()).total == 0  # not in the table: a CPU test


def test_the_ini_table_replaces_the_default(tmp_path: Path) -> None:
    def settings(ini: list[str]) -> Settings:
        raw = {"marker_devices": (ini, "ini")}
        return build_settings(lambda opt: raw.get(opt.name, (None, None)),
                              bases={"ini": tmp_path}, rootdir=tmp_path)[0]

    table = settings(["gpu2:2 gpu8:8", "big:16"])
    assert table.marker_devices == {"gpu2": 2, "gpu8": 8, "big": 16}
    assert req(table, gpu8=()).total == 8
    assert req(table, gpu4=()).total == 0  # no longer in the table
    with pytest.raises(ConfigError, match=r"ini trtllm_marker_devices.*'gpu8=8'.*NAME:COUNT"):
        settings(["gpu8=8"])
    with pytest.raises(ConfigError, match="plugin's own markers"):
        parse_marker_devices(["skip_less_device:2"], "ini")


# --------------------------------------------------------------------------- host memory


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(scenario=Scenario.LOCAL_SLURM, name="b", job_name="trtllm.b",
                                command=["python", "-m", "pytest"], rootdir="/r",
                                work_dir="/w", log_path="/w/job.log",
                                reports_path="/w/reports.jsonl", node_count=1,
                                total_devices=2, devices_per_node=2)
    return JobSpec(**{**base, **kw})


def test_host_memory_is_the_jobs_memory_request() -> None:
    need = req(skip_less_host_memory=(3000,))
    assert need.host_memory_mib == 3000
    script = render_sbatch(spec(mem_mb=need.host_memory_mib))
    assert "#SBATCH --mem=3000M" in script.splitlines()
    assert "--mem=3000M" in render_step_command(spec(mem_mb=3000), "77")


# --------------------------------------------------------------------------- launcher


def test_the_launcher_of_a_test_a_marker_then_the_cluster_for_multi_node() -> None:
    cluster = ClusterConfig(launcher=["trtllm-llmapi-launch"]).launcher
    assert launcher_for(TestConfig(), cluster, nodes=2) == ("trtllm-llmapi-launch",)
    assert launcher_for(TestConfig(), cluster, nodes=1) == ()  # one node: pytest as usual
    assert launcher_for(TestConfig(launcher="mpi-wrap --x 1"), (), 1) == ("mpi-wrap", "--x", "1")
    assert launcher_for(TestConfig(launcher=[]), cluster, nodes=2) == ()  # opted out
    with pytest.raises(ValueError, match="launcher"):
        TestConfig(launcher="--not-a-program")


def test_every_rank_runs_the_launcher_and_only_it_runs_pytest() -> None:
    batch = spec(launch=Launch.MPI, node_count=2, total_devices=8, devices_per_node=4,
                 launcher_prefix=["trtllm-llmapi-launch"])
    srun = render_sbatch(batch).splitlines()[-1]
    assert srun.startswith("srun ") and "--ntasks=8 --ntasks-per-node=4" in srun
    assert " trtllm-llmapi-launch python -m pytest" in srun
    step = render_step_command(batch, "77")
    assert step[step.index("trtllm-llmapi-launch") + 1:][:3] == ["python", "-m", "pytest"]
    assert not spec(nodeids=["t.py::t"], rerun_argv=["python", "-m", "pytest"],
                    launch=Launch.MPI, total_devices=1, devices_per_node=1,
                    launcher_prefix=["trtllm-llmapi-launch"]).serves_by_fork()


# --------------------------------------------------------------------------- dev cluster

INI = """[pytest]
markers =
    gpu2: this test uses 2 GPUs
    gpu4: this test uses 4 GPUs
"""

CONFTEST = '''import os
from pathlib import Path


def pytest_configure(config):
    """Each pytest session the launcher started (it sets FAKE_LAUNCH_RANK) says so."""
    out, rank = os.environ.get("FAKE_LAUNCH_DIR"), os.environ.get("FAKE_LAUNCH_RANK")
    if out and rank is not None:
        with open(Path(out) / "pytest-sessions", "a") as f:
            f.write(f"rank {rank}\\n")
'''

TESTS = '''import os
from pathlib import Path

import pytest


def gpus():
    return [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]


@pytest.mark.gpu2
def test_gpu2():
    assert len(gpus()) == 2, os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.gpu4
def test_gpu4():
    assert len(gpus()) == 4, os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.skip_less_host_memory(3000)
def test_host_memory():
    assert os.environ.get("SLURM_MEM_PER_NODE") == "3000", os.environ.get("SLURM_MEM_PER_NODE")


@pytest.mark.skip_less_mpi_world_size(8)
def test_multi_node():
    with open(Path(os.environ["FAKE_LAUNCH_DIR"]) / "pytest-test", "a") as f:
        f.write(f"rank {os.environ.get('FAKE_LAUNCH_RANK')}\\n")
'''


def test_named_markers_memory_and_the_launcher_on_the_dev_cluster(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    proof = tmp_path / "launch"
    proof.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_sizes.py").write_text(TESTS)
    name = devcluster["cluster_name"]
    (suite / "trtllm-slurm.toml").write_text(
        f'[clusters.{name}]\nlauncher = ["{FAKE_LAUNCHER}"]\n\n'
        f'[clusters.{name}.env]\nFAKE_LAUNCH_DIR = "{proof}"\n')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRTLLM_SLURM_", "FAKE_LAUNCH")) and k != "PYTEST_ADDOPTS"}
    env["HOME"] = str(suite)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         f"--slurm-cluster={name}", "--slurm-partition=batch", "--trtllm-dispatch=all",
         "--trtllm-one-shot"],
        cwd=suite, env=env, capture_output=True, text=True, timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "4 passed" in out, out
    ranks = {p.name: p.read_text().split() for p in proof.glob("rank-*")}
    assert sorted(ranks) == [f"rank-{r}" for r in range(8)], out  # every rank ran the launcher
    assert {node for node, _ in ranks.values()} == {"n1", "n2"}  # on both nodes
    assert {size for _, size in ranks.values()} == {"8"}
    # pytest ran once, on rank 0, and the test with it
    assert (proof / "pytest-sessions").read_text() == "rank 0\n"
    assert (proof / "pytest-test").read_text() == "rank 0\n"
