"""OpenSSH host certificates, checked against ``@cert-authority`` lines of known_hosts.

paramiko verifies the key exchange with the certificate's key but checks nothing about the
certificate, so this does what OpenSSH's ``check_host_cert`` does: a *host* certificate,
signed by a CA known_hosts trusts for this host (not @revoked), valid now, naming this host
among its principals (or none), with no critical option it does not understand."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko

HOST_CERT = 2  # SSH2_CERT_TYPE_HOST
FOREVER = 0xFFFFFFFFFFFFFFFF
CERT_SUFFIX = "-cert-v01@openssh.com"


@dataclass(frozen=True)
class HostCertificate:
    """The fields of an OpenSSH certificate that decide whether to trust it."""

    cert_type: int
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    signature_key: bytes
    signed: bytes  # everything the CA signed
    signature: bytes


def certificate_blob(key: paramiko.PKey) -> bytes | None:
    """The certificate a server presented as its host key, or None for a plain key."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not str(blob.key_type).endswith(CERT_SUFFIX):
        return None
    return bytes(blob.key_blob)


def parse_certificate(blob: bytes) -> HostCertificate:
    """Parse an OpenSSH certificate (PROTOCOL.certkeys); ValueError when malformed."""
    try:
        msg = paramiko.Message(blob)
        cert_kind = msg.get_text()
        msg.get_binary()  # nonce
        base = cert_kind.removesuffix(CERT_SUFFIX)
        if base == "ssh-ed25519":
            msg.get_binary()
        elif base.startswith("ecdsa-sha2-"):
            msg.get_text()
            msg.get_binary()
        elif base in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512"):
            msg.get_mpint()
            msg.get_mpint()
        else:
            raise ValueError(f"certificate of unsupported key type {cert_kind}")
        msg.get_int64()  # serial
        cert_type = msg.get_int()
        msg.get_text()  # key id
        packed = paramiko.Message(msg.get_binary())
        principals = []
        while packed.get_remainder():
            principals.append(packed.get_text())
        valid_after, valid_before = msg.get_int64(), msg.get_int64()
        critical = msg.get_binary()
        msg.get_binary()  # extensions (none defined for host certificates)
        msg.get_binary()  # reserved
        signature_key = msg.get_binary()
        signed = msg.get_so_far()
        signature = msg.get_binary()
    except (paramiko.SSHException, IndexError, UnicodeDecodeError, TypeError) as exc:
        raise ValueError(f"malformed certificate: {exc}") from None
    return HostCertificate(cert_type, tuple(principals), valid_after, valid_before,
                           critical, signature_key, signed, signature)


def check_host_certificate(blob: bytes, *, hostname: str, where: str,
                           authorities: list[paramiko.PKey], revoked: list[paramiko.PKey],
                           known_hosts: str, now: float | None = None) -> None:
    """Accept the host certificate or raise ConfigError saying what is wrong with it."""
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"the SSH host certificate of {where} is not accepted: {why}. "
                           "Refusing to connect")

    try:
        cert = parse_certificate(blob)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    ca = next((k for k in authorities if k.asbytes() == cert.signature_key), None)
    if ca is None:
        raise refuse(f"its CA is not listed as @cert-authority for {hostname} in {known_hosts}")
    if any(k.asbytes() == cert.signature_key for k in revoked):
        raise refuse(f"its CA is marked @revoked in {known_hosts}")
    if not ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)):
        raise refuse("the CA's signature on it does not verify")
    if cert.cert_type != HOST_CERT:
        raise refuse("it is a user certificate, not a host certificate")
    moment = int(time.time() if now is None else now)
    if moment < cert.valid_after:
        raise refuse(f"it is not valid yet (from {_when(cert.valid_after)})")
    if cert.valid_before != FOREVER and moment >= cert.valid_before:
        raise refuse(f"it expired at {_when(cert.valid_before)}")
    if cert.principals and hostname not in cert.principals:
        raise refuse(f"it is for {', '.join(cert.principals)}, not {hostname}")
    if cert.critical_options:
        raise refuse("it carries critical options, which host certificates do not define")


def _when(stamp: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))
