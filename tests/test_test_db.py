"""A test-db stage in one command: the open renderer (planning/testdb.py) reads TensorRT-LLM's
test-db YAML, picks the blocks whose terms agree and, for each, a configured cluster whose
nodes meet its condition; ``pytest --trtllm-test-db=DIR --trtllm-test-db-context=CTX
--trtllm-test-db-terms stage=pre_merge`` then runs every such block there. The dev cluster
has batch (2 nodes x 4 h200, x86_64) and gb200 (2 nodes x 4 gb200, aarch64)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning import testdb

DATA = Path(__file__).parent / "data"
DB = DATA / "test_db"
H200 = testdb.Target("devcluster", "batch", "h200", 4, 2, "x86_64")
GB200 = testdb.Target("devcluster", "gb200", "gb200", 4, 2, "aarch64")


def test_entries_keep_their_id_timeout_and_what_is_not_supported() -> None:
    entry = testdb.parse_entry("a/b.py::T::t[x-y] TIMEOUT (90) ISOLATION")
    assert (entry.test, entry.timeout_minutes, entry.isolation) == ("a/b.py::T::t[x-y]", 90, True)
    keyword = testdb.parse_entry('unittest/_torch/modeling -k "modeling_mllama"')
    assert keyword.unsupported and "-k" in keyword.unsupported


def test_blocks_go_where_the_nodes_meet_their_condition() -> None:
    blocks = testdb.load_test_db(DB, ["l0_dev"])
    assert [b.index for b in blocks] == [1, 2, 3, 4, 5, 6]
    out = testdb.render(blocks, {"stage": "pre_merge", "backend": "pytorch"}, [H200, GB200])
    placed = [(s.block.index, s.target.partition, s.devices, s.nodes) for s in out.selections]
    assert placed == [(1, "batch", 4, 1), (2, "gb200", 1, 1), (3, "batch", 8, 2)]
    assert [b.index for b in out.unplaced] == [5]  # no b300 anywhere
    assert blocks[0].unchecked == ("wildcards.linux_distribution_name",)
    # only the stage asked: both backends
    stage = testdb.render(blocks, {"stage": "pre_merge"}, [H200, GB200])
    assert [s.block.index for s in stage.selections] == [1, 2, 3, 6]
    # a 1-node cluster cannot hold the 2-node block; an x86_64 one not the aarch64 block
    small = testdb.Target("c", "p", "H200", 4, 1, None)
    assert testdb.meets(blocks[2], small) is None
    assert testdb.meets(blocks[1], testdb.Target("c", "p", "gb200", 4, None, "x86_64")) is None


def test_sizes_within_a_range() -> None:
    block = testdb.parse_block("c", 1, {"condition": {"ranges": {
        "system_gpu_count": {"gte": 2}}}, "tests": []}, "f.yml")
    assert testdb.size_on(block, H200) == (2, 1)
    six = testdb.parse_block("c", 1, {"condition": {"ranges": {
        "system_gpu_count": {"gte": 6, "lte": 8}}}, "tests": []}, "f.yml")
    assert testdb.size_on(six, H200) == (8, 2)  # 6 and 7 are not whole nodes of 4


def test_bad_input_names_the_file_context_and_block(tmp_path: Path) -> None:
    (tmp_path / "l0_x.yml").write_text(
        "l0_x:\n- condition:\n    ranges:\n      system_gpu_count:\n        gte: many\n")
    with pytest.raises(ConfigError, match=r"l0_x.yml: l0_x block 1: system_gpu_count.gte"):
        testdb.load_test_db(tmp_path, ["l0_x"])
    with pytest.raises(ConfigError, match="no file has context"):
        testdb.load_test_db(DB, ["l0_nothing"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        testdb.parse_terms(["stage"])
    assert testdb.parse_terms(["stage=pre_merge backend=pytorch", "a=b"]) == {
        "stage": "pre_merge", "backend": "pytorch", "a": "b"}


def run_stage(suite: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    env["HOME"] = str(suite)  # no clusters file of the machine's user
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         f"--trtllm-test-db={DB}", "--trtllm-test-db-context=l0_dev", *args],
        cwd=suite, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_a_pre_merge_stage_runs_on_every_gpu_type_in_one_command(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(DATA / "test_db_suite", suite)
    proc = run_stage(suite, "--trtllm-test-db-terms", "stage=pre_merge backend=pytorch",
                     "--trtllm-one-shot")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    passed = sorted(re.findall(r"^PASSED (\S+)", proc.stdout, re.MULTILINE))
    assert passed == ["check_stage.py::TestParams::test_param[b]",
                      "check_stage.py::test_four_h200", "check_stage.py::test_one_gb200",
                      "check_stage.py::test_two_nodes"], out
    assert re.search(r"4 passed, 5 deselected", out), out
    # the plan says what ran where, and what did not
    assert "l0_dev#1 (4 x *h200*, cpu x86_64; stage=pre_merge backend=pytorch) -> " \
        "devcluster/batch (4x h200 per node): 4 GPUs on 1 node, 2 tests" in out, out
    assert "devcluster/gb200 (4x gb200 per node): 1 GPU on 1 node, 1 tests" in out, out
    assert "8 GPUs on 2 nodes, 1 tests" in out, out
    assert "l0_dev#5 (8 x *b300*; stage=pre_merge backend=pytorch): no configured cluster" \
        in out, out
    assert "not run: 'unittest/test_folder.py -k \"not slow\"'" in out, out
    assert "not checked: wildcards.linux_distribution_name" in out, out


def test_targets_are_the_local_partitions_then_the_remote_clusters() -> None:
    from test_routing import DEV_ENV, H200_A, LOGIN, clusters

    from pytest_trtllm_slurm.controller.test_db import targets_of
    from pytest_trtllm_slurm.execution.context import RunContext
    from pytest_trtllm_slurm.planning.settings import Settings

    ctx = RunContext(settings=Settings(), local=LOGIN, clusters=clusters(far=H200_A),
                     slurm_env=DEV_ENV)
    assert targets_of(ctx) == [H200, GB200, testdb.Target("far", None, "H200", 8)]
    only = RunContext(settings=Settings(slurm_cluster="far"), local=LOGIN,
                      clusters=clusters(far=H200_A), slurm_env=DEV_ENV)
    assert targets_of(only) == [testdb.Target("far", None, "H200", 8)]


def test_a_tests_cluster_key_routes_it_there_as_slurm_cluster_would() -> None:
    from test_routing import DEV_ENV, H200_A, LOGIN, clusters

    from pytest_trtllm_slurm.planning.models import DeviceRequirement, Scenario
    from pytest_trtllm_slurm.planning.routing import route
    from pytest_trtllm_slurm.planning.settings import Settings

    req = DeviceRequirement(total=4, per_node=4, device_type="H200")
    args = dict(settings=Settings(), local=LOGIN, clusters=clusters(far=H200_A),
                slurm_env=DEV_ENV)
    assert route(req, **args).scenario is Scenario.LOCAL_SLURM  # the local H200s first
    far = route(req, cluster="far", **args)
    assert (far.scenario, far.cluster) == (Scenario.REMOTE_SLURM, "far")
    here = route(req, cluster="devcluster", partition="batch", **args)
    assert (here.scenario, here.partition) == (Scenario.LOCAL_SLURM, "batch")


def test_a_stage_runs_on_a_remote_cluster_over_ssh(devcluster: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """--slurm-cluster=devssh: the targets are what discovery finds over SSH (its table
    names no partition), the tests run there."""
    from devcluster import publish_ssh_suite

    suite = tmp_path / "suite"
    shutil.copytree(DATA / "test_db_suite", suite)
    (suite / ".gitignore").write_text("__pycache__/\nwork_dirs/\n")
    publish_ssh_suite(suite, tmp_path, devcluster["ssh"])
    toml = suite / "trtllm-slurm.toml"
    toml.write_text(re.sub(r'(?m)^partition = .*\n', "", toml.read_text()))
    subprocess.run(["git", "-C", str(suite), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qam", "any partition"], check=True)
    try:
        proc = run_stage(suite, "--trtllm-test-db-terms", "stage=pre_merge backend=tensorrt",
                         "--slurm-cluster=devssh", "--trtllm-one-shot")
    finally:
        subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc",
                        "release", "--rootdir", str(suite), "--cluster", "devssh"],
                       cwd=suite, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "-> devssh/batch (4x h200 per node): 4 GPUs on 1 node, 1 tests" in out, out
    assert "scenario: remote_slurm" in out, out
    assert re.findall(r"^PASSED (\S+)", proc.stdout, re.MULTILINE) == [
        "check_stage.py::test_tensorrt_backend"], out
