"""Hosts with CA-signed host keys (``@cert-authority`` in known_hosts), issue 16 item 14.

A REAL sshd (the dev cluster's binary and login key) is started by this module on its
own port with a host certificate made here with ``ssh-keygen -s``; known_hosts lists only
the CA. Both transports reach it: paramiko (the plugin checks the certificate: CA,
signature, host type, validity, principals) and OpenSSH (it checks it natively). The
refusals are checked on certificates ``ssh-keygen`` makes wrong on purpose.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.hostcerts import check_host_certificate
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell, SSHTarget

pytestmark = pytest.mark.devcluster


def keygen(*args: str) -> None:
    subprocess.run(["ssh-keygen", "-q", *args], check=True, capture_output=True, timeout=30)


def pub_key(path: Path) -> paramiko.PKey:
    kind, data = path.read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(data))


def cert_blob(path: Path) -> bytes:
    return base64.b64decode(path.read_text().split()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, another CA, and a host key signed by the first for 127.0.0.1 (an hour)."""
    d = tmp_path_factory.mktemp("pki")
    for name in ("ca", "other_ca", "host"):
        keygen("-t", "ed25519", "-N", "", "-C", name, "-f", str(d / name))
    keygen("-s", str(d / "ca"), "-I", "devcluster-host", "-h", "-n", "127.0.0.1",
           "-V", "-5m:+1h", str(d / "host.pub"))
    return d


@pytest.fixture(scope="module")
def ca_sshd(devcluster: dict[str, Any], pki: Path) -> Iterator[dict[str, Any]]:
    """sshd on its own port presenting ``host-cert.pub``; logins with the dev cluster's key."""
    ssh = devcluster["ssh"]
    port = free_port()
    authorized = Path(ssh["identity_file"]).parent / "authorized_keys"
    config = pki / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {pki / 'host'}\n"
        f"HostCertificate {pki / 'host-cert.pub'}\nPidFile {pki / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\nStrictModes no\nPermitRootLogin yes\nUsePAM no\n"
        "PubkeyAuthentication yes\nKbdInteractiveAuthentication no\n"
        "PasswordAuthentication no\nUseDNS no\nSubsystem sftp internal-sftp\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                            stdout=open(pki / "sshd.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the test sshd did not start: {(pki / 'sshd.log').read_text()}")
            time.sleep(0.05)
    known = pki / "known_hosts"
    ca_line = " ".join((pki / "ca.pub").read_text().split()[:2])
    known.write_text(f"@cert-authority [127.0.0.1]:{port} {ca_line}\n")
    yield {**ssh, "port": port, "known_hosts": str(known)}
    proc.terminate()
    proc.wait(timeout=30)


def target_for(sshd: dict[str, Any], **kw: Any) -> SSHTarget:
    cluster = ClusterConfig.model_validate({
        "name": "ca", "ssh_host": sshd["host"], "ssh_port": sshd["port"], "user": sshd["user"],
        "identity_file": sshd["identity_file"], "known_hosts": sshd["known_hosts"], **kw})
    return SSHTarget.from_cluster(cluster, ssh_config_path=os.devnull)


def test_paramiko_reaches_a_host_whose_key_only_its_ca_vouches_for(ca_sshd) -> None:
    sh = SSHShell(target_for(ca_sshd))
    try:
        assert sh.run(["echo", "via ca"]).stdout == "via ca\n"
    finally:
        sh.close()
    # nothing was added to known_hosts: the CA line is all it needs
    assert Path(ca_sshd["known_hosts"]).read_text().count("\n") == 1


def test_paramiko_refuses_a_certificate_of_a_ca_known_hosts_does_not_trust(
        ca_sshd, pki: Path, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    other = " ".join((pki / "other_ca.pub").read_text().split()[:2])
    known.write_text(f"@cert-authority [127.0.0.1]:{ca_sshd['port']} {other}\n")
    sh = SSHShell(target_for({**ca_sshd, "known_hosts": str(known)}))
    with pytest.raises(ConfigError, match="its CA is not listed as @cert-authority"):
        sh.run(["true"])
    sh.close()
    known.write_text(known.read_text() + "@revoked * " + " ".join(
        (pki / "ca.pub").read_text().split()[:2]) + "\n" + "@cert-authority * "
        + " ".join((pki / "ca.pub").read_text().split()[:2]) + "\n")
    sh = SSHShell(target_for({**ca_sshd, "known_hosts": str(known)}))
    with pytest.raises(ConfigError, match="@revoked"):
        sh.run(["true"])
    sh.close()


def test_openssh_transport_reaches_it_too(ca_sshd, tmp_path: Path) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="ca", dir="/tmp"))  # socket paths stay short
    sock = sock_dir / "m.sock"
    try:
        subprocess.run(["ssh", "-fNM", "-o", f"ControlPath={sock}", "-i",
                        ca_sshd["identity_file"], "-o", "BatchMode=yes",
                        "-o", f"UserKnownHostsFile={ca_sshd['known_hosts']}",
                        "-o", "StrictHostKeyChecking=yes", "-p", str(ca_sshd["port"]),
                        f"{ca_sshd['user']}@{ca_sshd['host']}"], check=True, timeout=30,
                       stdin=subprocess.DEVNULL, capture_output=True)
        sh = OpenSSHShell(target_for(ca_sshd, transport="openssh"), control_path=str(sock))
        assert sh.run(["echo", "via openssh"]).stdout == "via openssh\n"
    finally:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                       capture_output=True, check=False)
        subprocess.run(["rm", "-rf", str(sock_dir)], check=False)


@pytest.mark.parametrize("case,args,why", [
    ("other principal", ["-h", "-n", "login.other.example"], "it is for login.other.example"),
    ("expired", ["-h", "-n", "127.0.0.1", "-V", "20200101:20200102"], "it expired at 2020"),
    ("not yet valid", ["-h", "-n", "127.0.0.1", "-V", "+1d:+2d"], "not valid yet"),
    ("user certificate", ["-n", "127.0.0.1"], "user certificate, not a host certificate"),
])
def test_wrong_certificates_are_refused_with_the_reason(pki: Path, tmp_path: Path, case: str,
                                                        args: list[str], why: str) -> None:
    key = tmp_path / "host"
    keygen("-t", "ed25519", "-N", "", "-f", str(key))
    keygen("-s", str(pki / "ca"), "-I", case, *args, str(key) + ".pub")
    with pytest.raises(ConfigError, match=why):
        check_host_certificate(cert_blob(tmp_path / "host-cert.pub"), hostname="127.0.0.1",
                               where="127.0.0.1 port 22", authorities=[pub_key(pki / "ca.pub")],
                               revoked=[], known_hosts="kh")


@pytest.mark.parametrize("ca_type,host_type", [("ed25519", "ed25519"), ("rsa", "ecdsa"),
                                               ("ecdsa", "rsa")])
def test_certificates_of_every_key_type_pass(tmp_path: Path, ca_type: str,
                                             host_type: str) -> None:
    keygen("-t", ca_type, "-N", "", "-f", str(tmp_path / "ca"))
    keygen("-t", host_type, "-N", "", "-f", str(tmp_path / "host"))
    keygen("-s", str(tmp_path / "ca"), "-I", "h", "-h", "-n", "login.example,127.0.0.1",
           str(tmp_path / "host.pub"))
    check_host_certificate(cert_blob(tmp_path / "host-cert.pub"), hostname="login.example",
                           where="w", authorities=[pub_key(tmp_path / "ca.pub")], revoked=[],
                           known_hosts="kh")


def test_a_good_certificate_passes_and_any_other_ca_fails(pki: Path) -> None:
    blob = cert_blob(pki / "host-cert.pub")
    check_host_certificate(blob, hostname="127.0.0.1", where="w",
                           authorities=[pub_key(pki / "ca.pub")], revoked=[], known_hosts="kh")
    with pytest.raises(ConfigError, match="its CA is not listed"):
        check_host_certificate(blob, hostname="127.0.0.1", where="w",
                               authorities=[pub_key(pki / "other_ca.pub")], revoked=[],
                               known_hosts="kh")
    kind_len = int.from_bytes(blob[:4], "big")
    nonce_at = 4 + kind_len + 4  # the first byte of the nonce, which the CA signed too
    forged = blob[:nonce_at] + bytes([blob[nonce_at] ^ 1]) + blob[nonce_at + 1:]
    with pytest.raises(ConfigError, match="signature on it does not verify"):
        check_host_certificate(forged, hostname="127.0.0.1", where="w",
                               authorities=[pub_key(pki / "ca.pub")], revoked=[],
                               known_hosts="kh")
