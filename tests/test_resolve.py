"""resolve.py (and routing's account and partition choice): image, enroot URI, build arch, job name, work dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement
from pytest_trtllm_slurm.planning.resolve import (
    build_arch,
    enroot_uri,
    read_image_tags,
    resolve_container_image,
    target_arch,
)
from pytest_trtllm_slurm.planning.routing import resolve_account, select_partition
from pytest_trtllm_slurm.planning.settings import ClusterConfig

ENV = SlurmEnv(
    default_account="acct_a",
    accounts=["acct_a", "acct_b"],
    default_partition="batch",
    partitions=[
        PartitionInfo(name="batch", nodes=["n1", "n2"], gpu_type="h200", gpus_per_node=4,
                      arch="x86_64", default=True),
        PartitionInfo(name="gb200", nodes=["g1", "g2"], gpu_type="gb200", gpus_per_node=4,
                      arch="aarch64"),
        PartitionInfo(name="big", nodes=["b1"], gpu_type="h200", gpus_per_node=8),
        PartitionInfo(name="cpu", nodes=["c1", "c2"], gpus_per_node=0),
    ],
)
CFG = ClusterConfig(name="devcluster", account="acct_b", partition="gb200",
                    container_image="reg.example/cluster/img:2")

# --------------------------------------------------------------------------- account


@pytest.mark.parametrize(
    ("option", "cluster", "env", "expected"),
    [
        pytest.param("acct_b", CFG, ENV, "acct_b", id="option-wins"),
        pytest.param(None, CFG, ENV, "acct_b", id="cluster-file"),
        pytest.param(None, None, ENV, "acct_a", id="discovered-default"),
        pytest.param("anything", None, SlurmEnv(), "anything", id="no-accounting-no-check"),
        pytest.param(None, None, SlurmEnv(), None, id="no-accounting-no-account"),
        pytest.param(None, None, None, None, id="not-discovered"),
    ],
)
def test_resolve_account(option, cluster, env, expected) -> None:
    assert resolve_account(option, cluster, env) == expected


def test_unknown_account_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"'nosuch' \(from --slurm-account\).*acct_a, acct_b"):
        resolve_account("nosuch", None, ENV)
    bad_cfg = CFG.model_copy(update={"account": "typo"})
    with pytest.raises(ConfigError, match=r"'typo' \(from the clusters file\)"):
        resolve_account(None, bad_cfg, ENV)


def test_no_default_account_asks_for_one() -> None:
    env = ENV.model_copy(update={"default_account": None})
    with pytest.raises(ConfigError, match=r"choose one of acct_a, acct_b with --slurm-account"):
        resolve_account(None, None, env)


# --------------------------------------------------------------------------- partition


def req(total: int, per_node: int | None = -1, device_type: str | None = None):
    return DeviceRequirement(
        total=total, per_node=(total or None) if per_node == -1 else per_node,
        device_type=device_type,
    )


@pytest.mark.parametrize(
    ("requirement", "kwargs", "expected"),
    [
        pytest.param(req(2), {"explicit": "gb200"}, "gb200", id="explicit"),
        pytest.param(req(2), {"explicit": "batch", "cluster": CFG}, "batch",
                     id="explicit-beats-cluster-file"),
        pytest.param(req(2), {"cluster": CFG}, "gb200", id="cluster-file"),
        pytest.param(req(2), {"device_type": "GB200"}, "gb200", id="gpu-type"),
        pytest.param(req(2), {"device_type": "NVIDIA H200"}, "batch",
                     id="gpu-type-prefers-default"),
        pytest.param(req(8, 8), {}, "big", id="enough-gpus-per-node"),
        pytest.param(req(8, 8), {"device_type": "H200"}, "big", id="type-and-enough"),
        pytest.param(req(2), {}, "batch", id="default"),
        pytest.param(req(0), {}, "batch", id="cpu-only-default"),
        pytest.param(req(8, None), {}, "batch", id="spanning-fits-default"),
        pytest.param(req(12, None), {}, None, id="spanning-too-many-nodes"),
        pytest.param(req(16, 16), {}, None, id="too-big-per-node"),
        pytest.param(req(2), {"device_type": "B200"}, None, id="type-nowhere"),
    ],
)
def test_select_partition(requirement, kwargs, expected) -> None:
    assert select_partition(requirement, ENV, **kwargs) == expected


def test_select_partition_untyped_gres_not_ruled_out() -> None:
    env = SlurmEnv(default_partition="p", partitions=[PartitionInfo(name="p", gpus_per_node=8)])
    assert select_partition(req(4), env, device_type="H200") == "p"


def test_select_partition_partial_discovery_falls_back_to_default() -> None:
    env = SlurmEnv(default_partition="p", errors=["nodes: timed out"],
                   partitions=[PartitionInfo(name="p"), PartitionInfo(name="q")])
    assert select_partition(req(4), env) == "p"
    complete = env.model_copy(update={"errors": []})
    assert select_partition(req(4), complete) is None


def test_unknown_partition_names_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'nosuch' \(from --slurm-partition\).*batch, gb200"):
        select_partition(req(1), ENV, explicit="nosuch")
    with pytest.raises(ConfigError, match=r"'typo' \(from the clusters file\)"):
        select_partition(req(1), ENV, cluster=CFG.model_copy(update={"partition": "typo"}))


# --------------------------------------------------------------------------- image

TAGS = """\
# Image tags for the CI
LLM_DOCKER_IMAGE=reg.example/ci/tensorrt-llm:x86_64-2024
LLM_SBSA_DOCKER_IMAGE = "reg.example/ci/tensorrt-llm:sbsa-2024"

export LLM_ROCKYLINUX8_DOCKER_IMAGE=reg.example/ci/rocky:1
not a line
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "jenkins").mkdir()
    (tmp_path / "jenkins" / "current_image_tags.properties").write_text(TAGS)
    return tmp_path


def test_read_image_tags(repo: Path) -> None:
    tags = read_image_tags(repo / "jenkins" / "current_image_tags.properties")
    assert tags == {
        "LLM_DOCKER_IMAGE": "reg.example/ci/tensorrt-llm:x86_64-2024",
        "LLM_SBSA_DOCKER_IMAGE": "reg.example/ci/tensorrt-llm:sbsa-2024",
        "LLM_ROCKYLINUX8_DOCKER_IMAGE": "reg.example/ci/rocky:1",
    }


@pytest.mark.parametrize(
    ("option", "cluster", "device_type", "arch", "expected"),
    [
        pytest.param("reg.example/mine:1", CFG, "GB200", None, "reg.example/mine:1", id="option"),
        pytest.param(None, CFG, None, None, "reg.example/cluster/img:2", id="cluster-file"),
        pytest.param(None, None, "H200", None, "reg.example/ci/tensorrt-llm:x86_64-2024",
                     id="x86-by-device"),
        pytest.param(None, None, "GB200", None, "reg.example/ci/tensorrt-llm:sbsa-2024",
                     id="gb-is-aarch64"),
        pytest.param(None, None, "GH200", None, "reg.example/ci/tensorrt-llm:sbsa-2024",
                     id="gh-is-aarch64"),
        pytest.param(None, None, None, "aarch64", "reg.example/ci/tensorrt-llm:sbsa-2024",
                     id="partition-arch-aarch64"),
        pytest.param(None, None, "GB200", "x86_64", "reg.example/ci/tensorrt-llm:x86_64-2024",
                     id="known-arch-wins"),
        pytest.param(None, None, None, None, "reg.example/ci/tensorrt-llm:x86_64-2024",
                     id="default-x86"),
    ],
)
def test_resolve_container_image(repo, option, cluster, device_type, arch, expected) -> None:
    got = resolve_container_image(option, cluster, repo, device_type=device_type, arch=arch)
    assert got == expected
    assert "#" not in got  # canonical form is stored


def test_image_without_properties_file_is_none(tmp_path: Path) -> None:
    assert resolve_container_image(None, None, tmp_path, device_type="H200") is None


def test_image_missing_key_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "jenkins").mkdir()
    (tmp_path / "jenkins" / "current_image_tags.properties").write_text("LLM_DOCKER_IMAGE=x:1\n")
    with pytest.raises(ConfigError, match=r"no LLM_SBSA_DOCKER_IMAGE=.*--trtllm-container-image"):
        resolve_container_image(None, None, tmp_path, device_type="GB200")


@pytest.mark.parametrize(
    ("device_type", "arch", "expected"),
    [("GB200", None, "aarch64"), ("gh200", None, "aarch64"), ("H200", None, "x86_64"),
     (None, "arm64", "aarch64"), (None, None, "x86_64"), ("B200", "x86_64", "x86_64")],
)
def test_target_arch(device_type, arch, expected) -> None:
    assert target_arch(device_type, arch) == expected


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("registry.example/ns/img:tag", "registry.example#ns/img:tag"),
        ("registry.example:5005/ns/sub/img:tag", "registry.example:5005#ns/sub/img:tag"),
        ("localhost/img:1", "localhost#img:1"),
        ("docker://registry.example/ns/img:tag", "docker://registry.example#ns/img:tag"),
        ("registry.example#ns/img:tag", "registry.example#ns/img:tag"),  # already rewritten
        ("nvidia/cuda:12.4", "nvidia/cuda:12.4"),  # Docker Hub: no registry host
        ("ubuntu:22.04", "ubuntu:22.04"),
    ],
)
def test_enroot_uri(image: str, expected: str) -> None:
    assert enroot_uri(image) == expected


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("device_type", "expected"),
    [("H100", "90-real"), ("NVIDIA H200", "90-real"), ("B200", "100-real"),
     ("GB200", "100-real"), ("B300", "100-real"), ("GB300", "100-real"),
     ("NVIDIA A100-SXM4-80GB", "80-real"), ("L40S", "89-real"), ("V100", "100-real"),
     (None, "100-real")],
)
def test_build_arch(device_type, expected) -> None:
    assert build_arch(device_type) == expected
