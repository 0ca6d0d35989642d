"""Where a remote cluster's Slurm discovery is cached, and its refresh on a connected shell
(the early connection's last work, beside the suite's import; ``RemoteClusters`` reads it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.execution.slurm.client import SlurmClient, cached_discovery
from pytest_trtllm_slurm.node.paths import Cache
from pytest_trtllm_slurm.planning.settings import ClusterConfig


def remote_cache_path(cache_dir: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "x"
    return Cache(cache_dir).remote_env(safe)


def discovery_cache(cache_dir: Path, cluster: ClusterConfig) -> tuple[Path, str]:
    """Where ``cluster``'s discovery is cached, and its key: another name, login host, port
    or user misses the cache."""
    key = (f"remote|{cluster.name}|{cluster.user or ''}@{cluster.ssh_host or ''}:"
           f"{cluster.ssh_port or ''}")
    return remote_cache_path(cache_dir, cluster.name), key


def refresh_discovery(cache_dir: Path, cluster: ClusterConfig, shell: Any) -> None:
    """``cluster``'s discovery made again on ``shell`` if its cache is stale (the early
    connection's last work, beside the suite's import: planning then reads the cache)."""
    if cluster.partition and cluster.gpus_per_node:
        return  # the clusters file says enough: planning does not discover (routing)
    path, key = discovery_cache(cache_dir, cluster)
    cached_discovery(path, key, SlurmClient(shell).discover)
