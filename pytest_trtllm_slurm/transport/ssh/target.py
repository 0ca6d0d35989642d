"""Where an SSH connection goes: one ``[clusters.NAME]`` table merged with ``~/.ssh/config``
(HostName, User, Port, IdentityFile, ProxyCommand, ProxyJump); values in the clusters file
win, as ``ssh -p``/``-l``/``-i`` win over the config file."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.safe_values import host_problem, user_problem
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko, with_match_exec

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


class SSHTarget(BaseModel):
    """A resolved SSH destination (no secrets in here: it is logged and repr()'d freely)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str = ""  # [clusters.NAME], for messages that say where to fix things
    alias: str  # what the user wrote (ssh_host); what `ssh` is given
    hostname: str  # after ssh config HostName
    port: int = 22
    user: str
    identity_files: tuple[str, ...] = ()
    identity_file_explicit: bool = False  # from the clusters file: a missing file is an error
    identities_only: bool = False
    known_hosts: str
    accept_new_host_key: bool = False
    mfa: bool | None = None
    otp_command: str | None = None
    proxy_command: str | None = None
    proxy_jump: str | None = None
    connect_timeout: float = 15.0
    keepalive: int = 15
    ssh_config_path: str | None = None  # where jump hosts are looked up too

    @property
    def display(self) -> str:
        """``user@host:port`` as used in every message."""
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The host's name in known_hosts (OpenSSH writes ``[host]:port`` off port 22)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def where(self) -> str:
        """Where the user fixes a setting: the clusters file table, or ssh config."""
        return f"[clusters.{self.cluster}] in the clusters file" if self.cluster else "ssh config"

    @classmethod
    def from_cluster(cls, cluster: ClusterConfig, *,
                     ssh_config_path: str | Path | None = None) -> SSHTarget:
        """Resolve ``cluster`` (needs ``ssh_host``) against ssh config (default ~/.ssh/config)."""
        if not cluster.ssh_host:
            raise ConfigError(
                f"[clusters.{cluster.name}] has no ssh_host: set ssh_host = \"login.example\" "
                "(a host name or an alias from ~/.ssh/config) to run on it over SSH")
        found = lookup_ssh_config(cluster.ssh_host, ssh_config_path)
        ids = [cluster.identity_file] if cluster.identity_file else found.get("identityfile", [])
        known = (cluster.known_hosts or _first(found.get("userknownhostsfile"))
                 or DEFAULT_KNOWN_HOSTS)
        hostname = found.get("hostname", cluster.ssh_host)
        user = cluster.user or found.get("user") or getpass.getuser()
        where = f"[clusters.{cluster.name}] in the clusters file"
        _check(cluster.ssh_host, host_problem, f"ssh_host of {where}")
        _check(hostname, host_problem, f"HostName of {cluster.ssh_host} in ssh config")
        _check(user, user_problem, f"the SSH user of {where} (user, ssh config User or "
               "your login name)", fix=f"set user = \"NAME\" in {where}")
        return cls(cluster=cluster.name, alias=cluster.ssh_host, hostname=hostname,
                   port=cluster.ssh_port or int(found.get("port", 22)), user=user,
                   identity_files=tuple(os.path.expanduser(p) for p in ids),
                   identity_file_explicit=cluster.identity_file is not None,
                   identities_only=found.get("identitiesonly", "no").lower() == "yes",
                   known_hosts=os.path.expanduser(known),
                   accept_new_host_key=cluster.accept_new_host_key, mfa=cluster.mfa,
                   otp_command=cluster.otp_command,
                   proxy_command=_unless_none(found.get("proxycommand")),
                   proxy_jump=_unless_none(found.get("proxyjump")),
                   connect_timeout=float(found.get("connecttimeout", 15)),
                   ssh_config_path=str(ssh_config_path) if ssh_config_path else None)

    def jump_hosts(self) -> list[SSHTarget]:
        """The ProxyJump chain, first hop first; each hop resolved through ssh config too."""
        if not self.proxy_jump:
            return []
        hops = []
        for spec in self.proxy_jump.split(","):
            user, host, port = parse_jump_spec(spec.strip())
            found = lookup_ssh_config(host, self.ssh_config_path)
            _check(found.get("hostname", host), host_problem,
                   f"ProxyJump host {host!r} of {self.alias} in ssh config")
            _check(user or found.get("user") or self.user, user_problem,
                   f"the user of ProxyJump host {host!r} of {self.alias} in ssh config",
                   fix="give the hop a user name (user@host) in ssh config")
            ids = found.get("identityfile") or list(self.identity_files)
            hops.append(
                self.model_copy(
                    update={
                        "alias": host,
                        "hostname": found.get("hostname", host),
                        "port": port or int(found.get("port", 22)),
                        "user": user or found.get("user") or self.user,
                        "identity_files": tuple(os.path.expanduser(p) for p in ids),
                        "identity_file_explicit": False,
                        "proxy_command": None,
                        "proxy_jump": None,
                        "mfa": None,
                    }))
        return hops


def lookup_ssh_config(host: str, path: str | Path | None = None) -> dict:
    """``paramiko.SSHConfig.lookup(host)``; ``{"hostname": host}`` when there is no config."""
    cfg_path = Path(os.path.expanduser(str(path or DEFAULT_SSH_CONFIG)))
    if not cfg_path.exists():
        if path is not None:
            raise ConfigError(f"ssh config file {cfg_path} does not exist")
        return {"hostname": host}
    try:
        text = cfg_path.read_text()
        with_match_exec(text)
        return dict(paramiko.SSHConfig.from_text(text).lookup(host))
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise ConfigError(f"ssh config file {cfg_path} could not be read: {exc}") from None


def parse_jump_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (also ``[v6addr]:port``) -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, _, p = rest.partition(":")
        port = int(p)
    if not host:
        raise ConfigError(f"ProxyJump entry {spec!r} in ssh config names no host")
    return (user or None), host, port


def _check(value: str, check: Callable[[str], str | None], what: str,
           fix: str = "use a host name, an IP address or an alias from ~/.ssh/config") -> None:
    """ConfigError naming ``what`` when ``check`` refuses ``value`` (e.g. a leading '-')."""
    problem = check(value)
    if problem:
        raise ConfigError(f"{what}: found {value!r}, which {problem}; {fix}")


def _first(value: str | list[str] | None) -> str | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value.split()[0] if value else None


def _unless_none(value: str | None) -> str | None:
    return None if value is None or value.strip().lower() == "none" else value
