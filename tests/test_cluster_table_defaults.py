"""A cluster's table in the clusters file sets its jobs' defaults: ``env`` reaches every
test run there (a marker's env wins), ``time_limit`` is their walltime (a marker's and
``--slurm-time-limit`` win). Over SSH nothing of the controller's environment is forwarded,
so a variable the suite needs on the cluster (at import too: a warm worker imports the
suite before any batch comes) can only come from there. On the dev cluster and its sshd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from devcluster import publish_ssh_suite

pytestmark = pytest.mark.devcluster

INI = "[pytest]\nmarkers =\n    trtllm_slurm: resources (pytest-trtllm-slurm)\n"

TESTS = '''import os
import subprocess

import pytest


@pytest.mark.trtllm_slurm(devices=1)
def test_the_cluster_env_is_there():
    assert os.environ.get("FROM_THE_TABLE") == "table value"
    assert os.environ.get("BOTH") == "table"


@pytest.mark.trtllm_slurm(devices=1, env={"BOTH": "marker"})
def test_the_markers_env_wins():
    assert os.environ.get("FROM_THE_TABLE") == "table value"
    assert os.environ.get("BOTH") == "marker"


@pytest.mark.trtllm_slurm(devices=1)
def test_walltime():
    job = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                         capture_output=True, text=True, check=True).stdout
    print("walltime of this job:", job.split("TimeLimit=")[1].split()[0])
'''

# a worker (in a Slurm job) that imports the suite without the variable fails at once
CONFTEST = '''import os

if os.environ.get("SLURM_JOB_ID"):
    assert os.environ.get("FROM_THE_TABLE") == "table value", "imported without the table's env"
'''

TABLE = '''time_limit = "25m"

[clusters.{name}.env]
FROM_THE_TABLE = "table value"
BOTH = "table"
'''


def make_suite(base: Path) -> Path:
    suite = base / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "test_defaults.py").write_text(TESTS)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    return suite


def run(suite: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k not in ("PYTEST_ADDOPTS", "BOTH",
                                                               "FROM_THE_TABLE")}
    env["HOME"] = str(suite)  # no clusters file of the machine's user
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           *args], cwd=suite, capture_output=True, text=True,
                          timeout=900, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 passed" in out, out
    return out


def test_the_local_clusters_table_sets_env_and_walltime(devcluster: dict[str, Any],
                                                       tmp_path: Path) -> None:
    suite = make_suite(tmp_path)
    name = devcluster["cluster_name"]
    (suite / "trtllm-slurm.toml").write_text(f"[clusters.{name}]\n" + TABLE.format(name=name))
    out = run(suite, f"--slurm-cluster={name}", "--trtllm-one-shot")
    assert "walltime of this job: 00:25:00" in out
    out = run(suite, f"--slurm-cluster={name}", "--trtllm-one-shot", "--slurm-time-limit=7m")
    assert "walltime of this job: 00:07:00" in out  # the run's option beats the file


def test_a_bad_time_limit_in_the_table_names_the_file_and_cluster(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    suite = make_suite(tmp_path)
    name = devcluster["cluster_name"]
    (suite / "trtllm-slurm.toml").write_text(f'[clusters.{name}]\ntime_limit = "soon"\n')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           f"--slurm-cluster={name}", "--trtllm-plan"], cwd=suite,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert f"clusters.{name}.time_limit" in proc.stderr and "'soon'" in proc.stderr, (
        proc.stderr)


def test_over_ssh_the_table_env_reaches_the_warm_workers(devcluster: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """Twice: the first run starts the allocation and its sessions, the second finds them
    warm and starts its sessions while it imports the suite (early sessions)."""
    suite = make_suite(tmp_path)
    publish_ssh_suite(suite, tmp_path, devcluster["ssh"], partition="gb200")
    with (suite / "trtllm-slurm.toml").open("a") as toml:
        toml.write(TABLE.format(name="devssh"))
    subprocess.run(["git", "-C", str(suite), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qam", "table"], check=True)
    try:
        for _ in range(2):
            out = run(suite, "--slurm-cluster=devssh")
            assert "walltime of this job" in out
    finally:
        subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc",
                        "release", "--rootdir", str(suite), "--cluster", "devssh"],
                       cwd=suite, capture_output=True, text=True, timeout=120, check=False)
