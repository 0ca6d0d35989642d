"""SlurmClient: the discovery and cluster-name commands over one Shell (local or SSH)."""

from __future__ import annotations

import pytest_trtllm_slurm.execution.slurm.discovery as slurm_discovery
from pytest_trtllm_slurm.execution.slurm.parse import parse_scontrol_config
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.transport.shell import Shell


class SlurmClient:
    """Slurm commands on one host (login node), through ``shell``."""

    def __init__(self, shell: Shell, *, timeout: float = 30) -> None:
        self.shell = shell
        self.timeout = timeout

    def tools_found(self) -> bool:
        """True when the Slurm client commands exist on the host (they may still fail)."""
        res = self.shell.run(["sinfo", "--version"], timeout=self.timeout)
        return not slurm_discovery.tools_missing(res)

    def cluster_name(self) -> str | None:
        """ClusterName from ``scontrol show config``; None when Slurm does not answer."""
        res = self.shell.run(["scontrol", "show", "config"], timeout=self.timeout)
        return parse_scontrol_config(res.stdout).get("ClusterName") if res.ok else None

    def discover(self, partitions: list[str] | None = None) -> SlurmEnv:
        """Accounts, partitions (arch, GPUs, gres), pmix and version; failures in ``errors``."""
        return slurm_discovery.discover(self.shell, partitions, timeout=self.timeout)
