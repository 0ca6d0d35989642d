"""Open one authenticated paramiko Transport (direct, ProxyCommand or ProxyJump chain).

paramiko has no ControlMaster (paramiko #852), so a run keeps ONE Transport and opens
many channels on it; keepalive is set because paramiko otherwise never notices a dead
connection (paramiko #503)."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from typing import Any

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.transport.ssh.auth import OtpProvider, authenticate
from pytest_trtllm_slurm.transport.ssh.hostcerts import CERT_SUFFIX
from pytest_trtllm_slurm.transport.ssh.hostkeys import known_hosts_for, verify_host_key
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

log = logging.getLogger(__name__)


class SSHConnectError(ExecutionError):
    """The host could not be reached or the SSH handshake broke (worth retrying)."""


class SSHConnectionLost(ExecutionError):
    """The connection dropped under a command that must not be repeated: it may have taken
    effect (a job submitted); the caller finds out (e.g. by job name) instead of re-running."""


@dataclass
class Connection:
    """An authenticated transport plus the jump transports it rides on."""

    target: SSHTarget
    transport: paramiko.Transport
    jumps: list[paramiko.Transport] = field(default_factory=list)
    sftp: paramiko.SFTPClient | None = None

    @property
    def active(self) -> bool:
        return self.transport.is_active() and all(j.is_active() for j in self.jumps)

    def local_port(self) -> int | None:
        """The client-side TCP port of the first hop (tests find the serving sshd by it)."""
        first = self.jumps[0] if self.jumps else self.transport
        try:
            return int(first.sock.getsockname()[1])
        except (OSError, AttributeError, TypeError, IndexError):
            return None

    def close(self) -> None:
        for closable in [self.sftp, self.transport, *reversed(self.jumps)]:
            try:
                if closable is not None:
                    closable.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                pass


def connect(target: SSHTarget, otp_provider: OtpProvider) -> Connection:
    """Connect, check the host key, authenticate. ConfigError: the user must fix something;
    SSHConnectError: the network or the server (retry later)."""
    jumps: list[paramiko.Transport] = []
    try:
        sock: Any = None
        for hop in target.jump_hosts():
            sock = _open_socket(hop, sock, jumps)
            jumps.append(_login(hop, sock, otp_provider))
        sock = _open_socket(target, sock, jumps)
        transport = _login(target, sock, otp_provider)
    except BaseException:
        for j in reversed(jumps):
            j.close()
        raise
    return Connection(target, transport, jumps)


def _open_socket(target: SSHTarget, via: Any, jumps: list[paramiko.Transport]) -> Any:
    where = f"{target.hostname} port {target.port}"
    if jumps:
        try:
            return jumps[-1].open_channel("direct-tcpip", (target.hostname, target.port),
                                          ("127.0.0.1", 0), timeout=target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHConnectError(
                f"the jump host {jumps[-1].getpeername()[0]} could not open a connection to "
                f"{where}: {exc or type(exc).__name__}") from None
    if target.proxy_command:
        try:
            return paramiko.ProxyCommand(target.proxy_command)
        except (paramiko.SSHException, OSError) as exc:
            raise SSHConnectError(
                f"ProxyCommand for {target.alias} ({target.proxy_command}) failed: {exc}"
            ) from None
    try:
        sock = socket.create_connection((target.hostname, target.port),
                                        timeout=target.connect_timeout)
    except OSError as exc:
        raise SSHConnectError(
            f"cannot reach {where} for SSH ({exc.strerror or exc}). Check ssh_host/ssh_port in "
            f"{target.where} (or HostName/Port in ~/.ssh/config) and that the host is up"
        ) from None
    _tcp_options(sock)
    return sock


def _tcp_options(sock: socket.socket) -> None:
    """No Nagle delay; notice a silently dead peer in about a minute (paramiko's keepalive
    never waits for an answer, so only TCP can tell)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small requests, no 40 ms stalls
    for opt, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4),
                       ("TCP_USER_TIMEOUT", 60_000)):
        if hasattr(socket, opt):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass


def _login(target: SSHTarget, sock: Any, otp_provider: OtpProvider) -> paramiko.Transport:
    transport = paramiko.Transport(sock)
    try:
        _prefer_known_key_types(transport, target)
        try:
            transport.start_client(timeout=target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHConnectError(
                f"SSH handshake with {target.hostname} port {target.port} failed: "
                f"{exc or type(exc).__name__}") from None
        verify_host_key(target, transport.get_remote_server_key())
        authenticate(transport, target, otp_provider)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport.close()
        raise SSHConnectError(
            f"SSH connection to {target.display} broke during login: {exc or type(exc).__name__}"
        ) from None
    except BaseException:
        transport.close()
        raise
    transport.set_keepalive(target.keepalive)
    log.debug("ssh: connected to %s", target.display)
    return transport


def _prefer_known_key_types(transport: paramiko.Transport, target: SSHTarget) -> None:
    """Ask first for a host key type known_hosts already has (as OpenSSH does): host
    certificates when an @cert-authority line covers the host."""
    known = known_hosts_for(target.known_hosts, target.known_hosts_name)
    if not known.keys and not known.authorities:
        return
    opts = transport.get_security_options()
    names = {k.get_name() for k in known.keys}
    if "ssh-rsa" in names:
        names |= {"rsa-sha2-512", "rsa-sha2-256"}
    first = [t for t in opts.key_types if t in names]
    if known.authorities:  # paramiko offers certificates last unless asked
        first = [f"{t}{CERT_SUFFIX}" for t in opts.key_types
                 if f"{t}{CERT_SUFFIX}" in paramiko.Transport._key_info] + first
    if first:
        opts.key_types = first + [t for t in opts.key_types if t not in first]
