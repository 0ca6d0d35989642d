"""tests/cluster/up --nodes N --name NAME: a second, separate Slurm instance beside the dev
cluster (its own ClusterName, config, state and ports; 8 fake GPUs per node), and the
plugin running a 2-node, 16-GPU test on it through SLURM_CONF. The default instance
(which other tests use at the same time) must not change.

REAL: both instances are real slurmctld/slurmd on this machine (GPUs are the dev
cluster's fakes: /dev/null clones Slurm hands out as GRES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
UP, DOWN = REPO / "tests" / "cluster" / "up", REPO / "tests" / "cluster" / "down"
NAME = "inst2"  # its own name: the benchmark's instances (big, mid) are left alone

SUITE = '''import os

import pytest


@pytest.mark.trtllm_slurm(devices=16, nodes=2)
def test_two_nodes_sixteen_gpus():
    assert os.environ["SLURM_JOB_NUM_NODES"] == "2"
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 8  # per node
    assert os.environ["SLURM_CLUSTER_NAME"] == "inst2"
'''


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False, **kw)


@pytest.fixture(scope="module")
def instance(devcluster: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The named instance, up for this module and stopped after it."""
    default_conf = Path(devcluster["slurm_conf"]).read_text()
    proc = _run([sys.executable, str(UP), "--nodes", "2", "--name", NAME])
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        yield json.loads(proc.stdout)
    finally:
        down = _run([sys.executable, str(DOWN), "--name", NAME])
        assert down.returncode == 0, down.stderr[-3000:]
        # the default instance was neither rewritten nor stopped
        assert Path(devcluster["slurm_conf"]).read_text() == default_conf
        assert _run(["sinfo", "-h", "-o", "%P"]).returncode == 0


def test_a_named_instance_is_separate_from_the_dev_cluster(
        instance: dict[str, Any], devcluster: dict[str, Any]) -> None:
    assert instance["cluster_name"] == NAME != devcluster["cluster_name"]
    assert [p["gpus_per_node"] for p in instance["partitions"]] == [8]
    assert len(instance["nodes"]) == 2
    assert instance["slurm_conf"] != devcluster["slurm_conf"]
    assert instance["state_dir"] != devcluster["state_dir"]
    assert instance["ports"]["slurmctld"] != devcluster["ports"]["slurmctld"]
    mine = {n["port"] for n in instance["nodes"]}
    assert not mine & {n["port"] for n in devcluster["nodes"]}
    env = {**os.environ, "SLURM_CONF": instance["slurm_conf"]}
    nodes = _run(["sinfo", "-h", "-N", "-o", "%N %G"], env=env).stdout.split("\n")
    assert sorted(line for line in nodes if line) == [
        f"{n['name']} gpu:h200:8" for n in instance["nodes"]]
    # a second `up` is the idempotent fast path and prints the same description
    again = _run([sys.executable, str(UP), "--nodes", "2", "--name", NAME])
    assert again.returncode == 0 and json.loads(again.stdout) == instance


def test_the_plugin_runs_a_two_node_sixteen_gpu_test_on_it(
        instance: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "test_sixteen.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env["SLURM_CONF"] = instance["slurm_conf"]
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                 "--trtllm-remote", "--trtllm-one-shot"], cwd=tmp_path, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PASSED test_sixteen.py::test_two_nodes_sixteen_gpus" in out
    deadline = time.monotonic() + 60  # slurmctld sends the job's end to slurmdbd a bit later
    while True:
        acct = _run(["sacct", "-X", "-n", "-P", "--format=Cluster,State,NNodes",
                     "-S", "now-10minutes"], env=env).stdout.split()
        if f"{NAME}|COMPLETED|2" in acct or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert f"{NAME}|COMPLETED|2" in acct, acct
