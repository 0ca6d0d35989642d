"""Seed routing rule: `--slurm-cluster <this machine's Slurm cluster>` means local_slurm, with
no clusters file; any other name must be a cluster of the clusters file (on the dev cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def _pytest(suite: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    env["HOME"] = str(suite)  # no ~/.config/trtllm-slurm/clusters.toml of the machine's user
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=suite, capture_output=True, text=True, timeout=300, env=env,
                          check=False)


@pytest.fixture
def suite(devcluster: dict, tmp_path: Path) -> Path:
    target = tmp_path / "examples"
    shutil.copytree(EXAMPLES, target, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    assert not list(target.glob("trtllm-slurm.toml")), "the example must have no clusters file"
    return target


def test_this_clusters_name_routes_to_local_slurm_without_a_clusters_file(
        suite: Path, devcluster: dict) -> None:
    name = devcluster["cluster_name"]
    plan = _pytest(suite, "--trtllm-plan", f"--slurm-cluster={name.upper()}")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "local_slurm" in plan.stdout and "remote_slurm" not in plan.stdout

    run = _pytest(suite, f"--slurm-cluster={name}", "--trtllm-one-shot", "-k", "test_one_gpu")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "PASSED test_single_gpu.py::test_one_gpu[fp16]" in out
    assert "scenario: local_slurm" in out


def test_another_name_without_a_clusters_file_is_a_usage_error_naming_this_cluster(
        suite: Path, devcluster: dict) -> None:
    run = _pytest(suite, "--trtllm-plan", "--slurm-cluster=elsewhere")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "unknown cluster 'elsewhere'" in run.stderr
    assert f"this machine's Slurm cluster is {devcluster['cluster_name']!r}" in run.stderr
