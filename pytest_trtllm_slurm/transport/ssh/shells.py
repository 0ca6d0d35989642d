"""Which Shell a remote cluster's ``transport`` setting asks for."""
from __future__ import annotations

import os
from typing import Any

from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.auth import OtpProvider, default_otp_provider
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget


def shell_for_cluster(cluster: ClusterConfig, *, ssh_config_path: str | None = None,
                      otp_provider: OtpProvider | None = None) -> Any:
    """The Shell a remote cluster's ``transport`` asks for (SSHShell or OpenSSHShell).
    ``TRTLLM_SLURM_SSH_RELAY=0``: no relay on the login node (a channel per command, SFTP
    for reads), for login nodes that end long-lived processes, and as a baseline."""
    target = SSHTarget.from_cluster(cluster, ssh_config_path=ssh_config_path)
    if cluster.transport == "openssh":
        return OpenSSHShell(target)
    relay = os.environ.get("TRTLLM_SLURM_SSH_RELAY", "1").strip().lower() not in (
        "0", "false", "no", "off")
    return SSHShell(target, otp_provider=otp_provider or default_otp_provider, relay=relay,
                    relay_python=cluster.python)
