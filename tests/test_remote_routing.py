"""routing.route for remote clusters sized by discovery: the clusters file overrides it.

The discovery is a fixed SlurmEnv (what the dev cluster reports), handed to route() the
way planning does; the real discovery over SSH is tested in test_remote_dispatch.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.routing import route
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings

LAPTOP = LocalEnv()
REMOTE_ENV = SlurmEnv(
    cluster_name="far",
    default_partition="batch",
    accounts=["acct_a", "acct_b"],
    default_account="acct_a",
    partitions=[
        PartitionInfo(name="batch", nodes=["n1", "n2"], gpu_type="h200", gpus_per_node=4,
                      requires_gres=True, default=True),
        PartitionInfo(name="gb200", nodes=["g1", "g2"], arch="aarch64", gpu_type="gb200",
                      gpus_per_node=4, requires_gres=True),
    ],
)


class Discovery:
    """A stand-in for RemoteClusters: returns a fixed SlurmEnv and counts the clusters asked."""

    def __init__(self, env: SlurmEnv) -> None:
        self.env = env
        self.asked: list[str] = []

    def __call__(self, cluster: ClusterConfig) -> SlurmEnv:
        self.asked.append(cluster.name)
        return self.env


def far(**keys: Any) -> ClustersFile:
    table = {"ssh_host": "login.far", **keys}
    return ClustersFile(clusters={"far": ClusterConfig(name="far", **table)})


def go(req: DeviceRequirement, clusters: ClustersFile, discovery: Discovery | None,
       **settings: Any) -> RouteDecision:
    return route(req, settings=Settings(slurm_cluster="far", **settings), local=LAPTOP,
                 clusters=clusters, slurm_env=None, remote_env=discovery)


def world(total: int, **kw: Any) -> DeviceRequirement:
    return DeviceRequirement(total=total, per_node=None, source="skip_less_mpi_world_size", **kw)


def test_world_of_eight_is_two_nodes_of_four_from_discovery() -> None:
    discovery = Discovery(REMOTE_ENV)
    d = go(world(8), far(), discovery)
    assert (d.scenario, d.cluster, d.partition, d.account) == (
        Scenario.REMOTE_SLURM, "far", "batch", "acct_a")
    assert d.target_gpus_per_node == 4
    assert world(8).nodes(d.target_gpus_per_node) == 2
    assert discovery.asked == ["far"]


def test_without_discovery_the_clusters_file_alone_decides_as_before() -> None:
    d = go(world(8), far(), None)
    assert (d.scenario, d.partition, d.target_gpus_per_node) == (Scenario.REMOTE_SLURM, None, None)


def test_clusters_file_overrides_discovery() -> None:
    d = go(world(16), far(gpus_per_node=8, partition="gb200", account="acct_b"),
           Discovery(REMOTE_ENV))
    assert (d.partition, d.target_gpus_per_node, d.account) == ("gb200", 8, "acct_b")
    typed = go(DeviceRequirement(total=1, per_node=1, device_type="B200"),
               far(device_type="B200"), Discovery(REMOTE_ENV))
    assert typed.scenario is Scenario.REMOTE_SLURM and typed.partition == "batch"


def test_device_type_picks_the_discovered_partition() -> None:
    d = go(DeviceRequirement(total=4, per_node=4, device_type="GB200"), far(),
           Discovery(REMOTE_ENV))
    assert (d.partition, d.target_gpus_per_node) == ("gb200", 4)


def test_too_big_for_any_discovered_partition_is_unsatisfied_with_what_exists() -> None:
    d = go(DeviceRequirement(total=8, per_node=8), far(), Discovery(REMOTE_ENV))
    assert d.scenario is None
    assert d.reason is not None and "cluster 'far'" in d.reason and "4x h200" in d.reason


def test_unknown_account_or_partition_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="valid accounts: acct_a, acct_b"):
        go(world(8), far(account="nosuch"), Discovery(REMOTE_ENV))
    with pytest.raises(ConfigError, match="valid partitions: batch, gb200"):
        go(world(8), far(partition="nosuch"), Discovery(REMOTE_ENV))


def test_discovery_without_partitions_falls_back_to_the_clusters_file() -> None:
    partial = SlurmEnv(errors=["Slurm client tools not found on login.far"])
    d = go(world(8), far(gpus_per_node=4), Discovery(partial))
    assert (d.scenario, d.target_gpus_per_node) == (Scenario.REMOTE_SLURM, 4)


def test_auto_selection_by_type_uses_discovery_only_when_the_file_cannot_tell() -> None:
    clusters = ClustersFile(clusters={
        "far": ClusterConfig(name="far", ssh_host="login.far"),  # no device_type: discovered
        "eos": ClusterConfig(name="eos", ssh_host="eos", device_type="H100", gpus_per_node=8),
    })
    discovery = Discovery(REMOTE_ENV)
    d = route(DeviceRequirement(total=4, per_node=4, device_type="GB200"), settings=Settings(),
              local=LAPTOP, clusters=clusters, slurm_env=None, remote_env=discovery)
    assert (d.scenario, d.cluster, d.partition) == (Scenario.REMOTE_SLURM, "far", "gb200")
    assert "eos" not in discovery.asked  # its table says enough


def test_a_table_that_says_enough_is_used_as_given_without_connecting() -> None:
    discovery = Discovery(REMOTE_ENV)
    d = go(world(8), far(partition="batch", gpus_per_node=2), discovery)
    assert (d.partition, d.target_gpus_per_node) == ("batch", 2)
    assert world(8).nodes(d.target_gpus_per_node) == 4
    assert discovery.asked == []


def test_device_keywords_resolve_against_the_named_remote_cluster() -> None:
    """skip_device_not_contain(["H100", "H200"]) from a laptop, --slurm-cluster far whose table
    names no device_type: the type comes from far's discovery, then far serves it."""
    from pathlib import Path

    from pytest_trtllm_slurm.execution.context import RunContext
    from pytest_trtllm_slurm.planning.requirements import TestConfig
    from pytest_trtllm_slurm.planning.routing import route_item

    ctx = RunContext(settings=Settings(slurm_cluster="far"), local=LAPTOP, clusters=far(),
                     remote_env=Discovery(REMOTE_ENV), rootdir=Path("."))
    req = DeviceRequirement(total=4, per_node=4, device_keywords=("H100", "H200"))
    routed = route_item(req, TestConfig(), ctx)
    assert routed.requirement.device_type == "H200"
    d = routed.decision
    assert (d.scenario, d.partition) == (Scenario.REMOTE_SLURM, "batch")
