"""Host key checking against an OpenSSH known_hosts file (StrictHostKeyChecking semantics).

An unknown key is refused unless ``accept_new_host_key = true`` (``accept-new``); a changed
or revoked key always is; paramiko's auto-add policy is never used. A host certificate is
accepted when an ``@cert-authority`` line names its CA (``hostcerts``)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.transport.ssh.hostcerts import certificate_blob, check_host_certificate
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

log = logging.getLogger(__name__)


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -lf`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class KnownHosts:
    """What a known_hosts file says about one host name."""

    keys: list[paramiko.PKey] = field(default_factory=list)  # its recorded keys
    revoked: list[paramiko.PKey] = field(default_factory=list)  # @revoked (any host)
    authorities: list[paramiko.PKey] = field(default_factory=list)  # @cert-authority for it


def known_hosts_for(path: str, name: str) -> KnownHosts:
    """Keys, revoked keys and certificate authorities for ``name`` in the file."""
    known = KnownHosts()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return known
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            if marker not in ("@revoked", "@cert-authority"):
                continue  # not a marker OpenSSH knows: OpenSSH skips the line too
            line = line.strip()
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.SSHException, ValueError):
            continue
        if entry is None or entry.key is None:
            continue
        if marker == "@revoked":
            known.revoked.append(entry.key)
        elif not _matches(name, entry.hostnames):
            continue
        elif marker == "@cert-authority":
            known.authorities.append(entry.key)
        else:
            known.keys.append(entry.key)
    return known


def _matches(name: str, patterns: list[str]) -> bool:
    """OpenSSH host pattern list: hashed names, ``*``/``?`` wildcards, ``!`` negation."""
    hit = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if pat.startswith("|1|"):
            ok = paramiko.HostKeys.hash_host(name, pat) == pat
        else:
            ok = _glob(pat).fullmatch(name.lower()) is not None
        if ok and negate:
            return False
        hit = hit or ok
    return hit


def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH wildcards are only ``*`` and ``?`` (``[`` is literal: ``[host]:port``)."""
    return re.compile(re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", "."))


def verify_host_key(target: SSHTarget, key: paramiko.PKey) -> None:
    """Accept ``key`` for ``target`` or raise ConfigError saying why and what to do."""
    name = target.known_hosts_name
    known = known_hosts_for(target.known_hosts, name)
    recorded, revoked = known.keys, known.revoked
    fp = fingerprint(key)
    where = f"{target.hostname} port {target.port}"
    cert = certificate_blob(key)
    if cert is not None and known.authorities and not any(k == key for k in revoked):
        check_host_certificate(cert, hostname=target.hostname, where=where,
                               authorities=known.authorities, revoked=revoked,
                               known_hosts=target.known_hosts)
        return
    if any(k == key for k in revoked):
        raise ConfigError(
            f"the SSH host key of {where} ({key.get_name()} {fp}) is marked @revoked in "
            f"{target.known_hosts}; refusing to connect")
    if any(k == key for k in recorded):
        return
    same_type = [k for k in recorded if k.get_name() == key.get_name()]
    if same_type:
        raise ConfigError(
            f"the SSH host key of {where} has CHANGED: the server presented {key.get_name()} "
            f"{fp}, but {target.known_hosts} records {fingerprint(same_type[0])} for {name}. "
            "Someone may be intercepting the connection, or the host was reinstalled. "
            "Refusing to connect (accept_new_host_key never overrides a changed key). If the "
            f"change is expected, remove the old entry: ssh-keygen -R '{name}' -f "
            f"{target.known_hosts}")
    if not target.accept_new_host_key:
        others = (
            f" (it records only {', '.join(sorted({k.get_name() for k in recorded}))} keys "
            "for this host)" if recorded else "")
        raise ConfigError(
            f"the SSH host key of {where} is not known: {key.get_name()} {fp} is not in "
            f"{target.known_hosts}{others}. Check the fingerprint with the cluster's "
            f"administrators, then either record it (run `ssh -p {target.port} "
            f"{target.user}@{target.hostname}` once and answer yes), or set "
            f"accept_new_host_key = true in {target.where} to accept and record a new key "
            "on first use")
    add_known_host(target.known_hosts, name, key)
    log.warning("added the SSH host key of %s (%s %s) to %s", where, key.get_name(), fp,
                target.known_hosts)


def add_known_host(path: str, name: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line (O_APPEND, 0600, directory 0700 if created)."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)
