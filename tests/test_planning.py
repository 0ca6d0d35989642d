"""item_routes.py and routing.route_item: the per-batch choices made from a route (image,
device type)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trtllm_slurm.controller.item_routes import batch_image
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, Scenario
from pytest_trtllm_slurm.planning.requirements import TestConfig
from pytest_trtllm_slurm.planning.routing import route_item
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings


def context(tmp_path: Path, runtime: str) -> RunContext:
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
    local = LocalEnv(cluster_name="devcluster", slurm_available=True)
    return RunContext(settings=Settings(), local=local, clusters=clusters, slurm_env=env,
                      rootdir=tmp_path)


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
    route = route_item(DeviceRequirement(total=1, per_node=1), TestConfig(partition=partition),
                       ctx)
    assert (route.decision.scenario, route.decision.partition) == (Scenario.LOCAL_SLURM,
                                                                   partition)
    assert batch_image(route, explicit, ctx.rootdir) == expected


def test_local_tests_never_get_an_image_from_the_file(tmp_path) -> None:
    ctx = context(tmp_path, "pyxis")
    here = route_item(DeviceRequirement(), TestConfig(local=True), ctx)
    assert here.decision.scenario is Scenario.LOCAL_DIRECT
    assert here.table is None  # a test run here has no cluster's defaults
    assert batch_image(here, None, ctx.rootdir) is None


def test_target_device_type_of_a_partition(tmp_path) -> None:
    ctx = context(tmp_path, "none")
    route = route_item(DeviceRequirement(total=1, per_node=1), TestConfig(partition="gb200"),
                       ctx)
    assert route.device_type == "GB200"
