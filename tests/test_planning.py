"""planning.py: the per-batch choices made from a route (image, device type)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trtllm_slurm.controller.item_plans import (
    PlanningContext,
    batch_image,
    target_device_type,
)
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings


def context(tmp_path: Path, runtime: str) -> PlanningContext:
    (tmp_path / "jenkins").mkdir()
    (tmp_path / "jenkins" / "current_image_tags.properties").write_text(
        "# tags\nLLM_DOCKER_IMAGE=registry.example/ns/x86:1\n"
        "LLM_SBSA_DOCKER_IMAGE=registry.example/ns/sbsa:1\n"
    )
    env = SlurmEnv(partitions=[
        PartitionInfo(name="batch", arch="x86_64", gpu_type="h200", gpus_per_node=4),
        PartitionInfo(name="gb200", arch="aarch64", gpu_type="gb200", gpus_per_node=4),
    ])
    clusters = ClustersFile(clusters={"devcluster": ClusterConfig(
        name="devcluster", container_runtime=runtime)})  # type: ignore[arg-type]
    return PlanningContext(settings=Settings(), local=LocalEnv(cluster_name="devcluster"),
                           clusters=clusters, slurm_env=env, rootdir=tmp_path)


@pytest.mark.parametrize(
    ("runtime", "partition", "explicit", "expected"),
    [
        ("pyxis", "batch", None, "registry.example/ns/x86:1"),
        ("pyxis", "gb200", None, "registry.example/ns/sbsa:1"),
        ("pyxis", "gb200", "mine:2", "mine:2"),
        ("none", "batch", None, None),  # no container runtime: no image from the file
    ],
)
def test_batch_image_by_partition_arch(tmp_path, runtime, partition, explicit, expected) -> None:
    ctx = context(tmp_path, runtime)
    decision = RouteDecision(scenario=Scenario.LOCAL_SLURM, partition=partition,
                             cluster="devcluster")
    table = ctx.clusters.table_of(decision.scenario, decision.cluster, ctx.local.cluster_name)
    assert batch_image(explicit, decision, DeviceRequirement(total=1, per_node=1), ctx,
                       table) == expected


def test_local_tests_never_get_an_image_from_the_file(tmp_path) -> None:
    ctx = context(tmp_path, "pyxis")
    here = RouteDecision(scenario=Scenario.LOCAL_DIRECT, dispatched=False)
    table = ctx.clusters.table_of(here.scenario, here.cluster, ctx.local.cluster_name)
    assert table is None  # a test run here has no cluster's defaults
    assert batch_image(None, here, DeviceRequirement(), ctx, table) is None


def test_target_device_type_of_a_partition(tmp_path) -> None:
    ctx = context(tmp_path, "none")
    decision = RouteDecision(scenario=Scenario.LOCAL_SLURM, partition="gb200")
    assert target_device_type(decision, ctx) == "GB200"
