"""RemoteClusters against the dev cluster's real sshd: discovery over SSH, its cache keyed
by cluster, one connection per cluster, a failed connection reported once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters
from pytest_trtllm_slurm.execution.remote.discovery_cache import remote_cache_path
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

pytestmark = pytest.mark.devcluster


def cluster(ssh: dict[str, Any], name: str = "far", **kw: Any) -> ClusterConfig:
    table = {"name": name, "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
             "user": ssh["user"], "identity_file": ssh["identity_file"],
             "known_hosts": ssh["known_hosts"], "mfa": False, **kw}
    return ClusterConfig.model_validate(table)


class CountingFactory:
    """The real shell_for_cluster, counting the shells it makes (a spy, not a fake)."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def __call__(self, cfg: ClusterConfig) -> Any:
        self.made.append(cfg.name)
        return shell_for_cluster(cfg, ssh_config_path=os.devnull)


def test_discovery_over_ssh_is_cached_per_cluster(devcluster: dict, tmp_path: Path) -> None:
    ssh = devcluster["ssh"]
    factory = CountingFactory()
    remotes = RemoteClusters(tmp_path, shell_factory=factory)
    env = remotes(cluster(ssh))
    assert {p.name: (p.gpus_per_node, p.gpu_type) for p in env.partitions} == {
        "batch": (4, "h200"), "gb200": (4, "gb200")}
    assert env.default_partition == "batch" and "acct_a" in env.accounts
    assert env.pmix.available
    shell = remotes.shell(cluster(ssh))  # the executor gets the same connection
    assert factory.made == ["far"] and remotes.shell(cluster(ssh)) is shell
    remotes.close()
    saved = json.loads(remote_cache_path(tmp_path, "far").read_text())
    assert saved["key"] == f"remote|far|{ssh['user']}@{ssh['host']}:{ssh['port_key']}"

    again = RemoteClusters(tmp_path, shell_factory=factory)  # the next run: from the cache
    assert again(cluster(ssh)).partitions == env.partitions and factory.made == ["far"]
    other_port = RemoteClusters(tmp_path, shell_factory=factory)  # another key: rediscovered
    other_port(cluster(ssh, ssh_port=ssh["port_otp"], mfa=True,
                       otp_command="echo " + ssh["otp_static"]))
    assert factory.made == ["far", "far"]
    other_port.close()


def test_unreachable_cluster_is_one_clear_usage_error(devcluster: dict, tmp_path: Path) -> None:
    ssh = devcluster["ssh"]
    factory = CountingFactory()
    remotes = RemoteClusters(tmp_path, shell_factory=factory)
    closed = cluster(ssh, name="down", ssh_port=1)  # nothing listens there
    with pytest.raises(ConfigError) as first:
        remotes(closed)
    assert "cluster 'down'" in str(first.value) and "gpus_per_node" in str(first.value)
    with pytest.raises(ConfigError) as second:
        remotes(closed)
    assert str(second.value) == str(first.value)
    assert factory.made == ["down"], "reconnected for every test"
    assert not remote_cache_path(tmp_path, "down").exists()
