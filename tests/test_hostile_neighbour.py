"""A hostile neighbour: a second uid on this machine, in this user's group, that plants
sockets, links, folders and files at the paths a run uses, locally and over the dev sshd.

The neighbour is a REAL Unix user made here with ``useradd`` (gid 0: the group of the
user the suite runs as, root here and in CI) and removed after; what it plants it plants
as itself (``setpriv``), so owners, modes and the kernel's checks are the real ones. The
dev sshd runs on this machine, so what it plants locally is what the "cluster" sees.
The checks are what a user would check: the run refuses with an error naming the path,
and the neighbour's files are untouched and got nothing of ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

pytestmark = pytest.mark.devcluster

SYSTEM_PYTHON = "/usr/bin/python3"  # the neighbour cannot read this user's venv


class Neighbour:
    """Runs code as the second uid."""

    def __init__(self, name: str, uid: int, gid: int, home: Path) -> None:
        self.name, self.uid, self.gid, self.home = name, uid, gid, home

    def argv(self, *argv: str) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--", *argv]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*argv), capture_output=True, text=True, check=check,
                              timeout=60, cwd="/")

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(SYSTEM_PYTHON, "-c", code)

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(SYSTEM_PYTHON, "-c", code, *args),
                                stdout=subprocess.PIPE, text=True, cwd="/")

    def mkdir(self, path: Path, mode: int = 0o777) -> Path:
        self.run("mkdir", "-p", str(path))
        self.run("chmod", f"{mode:o}", str(path))
        return path

    def link(self, target: Path | str, at: Path) -> Path:
        self.run("ln", "-s", str(target), str(at))
        return at

    def file(self, path: Path, text: str = "", mode: int = 0o666) -> Path:
        self.python(f"import os; open({str(path)!r}, 'w').write({text!r}); "
                    f"os.chmod({str(path)!r}, {mode})")
        return path


@pytest.fixture(scope="module")
def neighbour() -> Iterator[Neighbour]:
    """A fresh user in this user's group (removed after, with what it owns in /tmp)."""
    name = f"nb{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--no-create-home", "--no-user-group", "-g",
                    str(os.getegid()), "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True,
                                 check=True).stdout)
        home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))
        os.chown(home, uid, os.getegid())
        yield Neighbour(name, uid, os.getegid(), home)
    finally:
        subprocess.run(["pkill", "-u", name], capture_output=True, check=False)
        subprocess.run(["userdel", name], capture_output=True, check=False)
        for each in Path("/tmp").iterdir():
            with contextlib.suppress(OSError):
                if each.lstat().st_uid == uid:
                    subprocess.run(["rm", "-rf", str(each)], check=False)


@pytest.fixture
def shared_dir(neighbour: Neighbour) -> Iterator[Path]:
    """A folder both may write (a group scratch folder: 0777, no sticky bit)."""
    path = Path(tempfile.mkdtemp(prefix="shared-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module")
def ssh(devcluster: dict[str, Any]) -> dict[str, Any]:
    return dict(devcluster["ssh"])


def openssh_target(ssh: dict[str, Any]) -> SSHTarget:
    config = ClusterConfig.model_validate(
        {"name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
         "user": ssh["user"], "identity_file": ssh["identity_file"],
         "known_hosts": ssh["known_hosts"], "transport": "openssh"})
    return SSHTarget.from_cluster(config, ssh_config_path=os.devnull)


def start_master(ssh: dict[str, Any], sock: Path) -> None:
    subprocess.run(["ssh", "-fNM", "-o", f"ControlPath={sock}", "-i", ssh["identity_file"],
                    "-o", f"UserKnownHostsFile={ssh['known_hosts']}", "-p",
                    str(ssh["port_key"]), f"{ssh['user']}@{ssh['host']}"], check=True,
                   timeout=30, stdin=subprocess.DEVNULL, capture_output=True)


def stop_master(sock: Path) -> None:
    subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                   capture_output=True, check=False)


#: a ControlMaster impostor: answers OpenSSH's mux hello and "alive?" as a live master
#: would, and writes down every connection (what a neighbour would then read and forge)
FAKE_MASTER = r'''
import os, socket, struct, sys
path, log = sys.argv[1], sys.argv[2]
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
os.chmod(path, 0o777)
srv.listen(8)
print("ready", flush=True)
def recv(c):
    n = struct.unpack(">I", c.recv(4, socket.MSG_WAITALL))[0]
    return c.recv(n, socket.MSG_WAITALL)
while True:
    c, _ = srv.accept()
    with open(log, "a") as fh:
        fh.write("connected\n")
    try:
        c.sendall(struct.pack(">III", 8, 1, 4))
        recv(c)
        typ, rid = struct.unpack(">II", recv(c)[:8])
        if typ == 0x10000004:
            c.sendall(struct.pack(">IIII", 12, 0x80000005, rid, 4242))
    except Exception:
        pass
    c.close()
'''


def legacy_socket(target: SSHTarget) -> Path:
    out = subprocess.run(["ssh", "-G", "-o", "ControlPath=/tmp/ssh-trtllm-%r@%h:%p", "-p",
                          str(target.port), "-l", target.user, "--", target.alias],
                         capture_output=True, text=True, check=True).stdout
    value = next(line.split(" ", 1)[1] for line in out.splitlines()
                 if line.startswith("controlpath "))
    return Path(value)


# -- 1. ControlMaster sockets ----------------------------------------------------------------
def test_a_planted_master_socket_in_tmp_is_never_connected_to(
        neighbour: Neighbour, ssh: dict[str, Any]) -> None:
    """The neighbour listens at the legacy /tmp ControlPath first and answers like a live
    master: the run refuses it (naming it and its owner) without connecting, and its
    advice starts the master in a private folder."""
    target = openssh_target(ssh)
    sock = legacy_socket(target)
    log = neighbour.home / "seen.log"
    if sock.exists() or sock.is_symlink():
        pytest.fail(f"{sock} exists before the test: remove it")
    fake = neighbour.popen(FAKE_MASTER, str(sock), str(log))
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        with pytest.raises(ConfigError) as err:
            OpenSSHShell(target)
        text = str(err.value)
        assert str(sock) in text and f"owned by uid {neighbour.uid}" in text
        assert not log.exists(), "the run connected to the neighbour's socket"
        advice = next(line for line in text.splitlines() if "ssh -fNM" in line)
        assert "/tmp/" not in advice and "mkdir -p -m 700" in advice
    finally:
        fake.kill()
        fake.wait()
        with contextlib.suppress(OSError):
            os.unlink(sock)


def test_our_master_in_a_folder_others_may_write_is_refused(
        neighbour: Neighbour, ssh: dict[str, Any], shared_dir: Path) -> None:
    """A master of ours whose folder the neighbour can write (it could swap the socket
    between the check and the use): refused, naming the folder."""
    sock = shared_dir / "m.sock"
    start_master(ssh, sock)
    try:
        with pytest.raises(ConfigError) as err:
            OpenSSHShell(openssh_target(ssh), control_path=str(sock))
        assert str(shared_dir) in str(err.value) and "may write" in str(err.value)
    finally:
        stop_master(sock)


def test_our_master_in_a_private_folder_is_used(ssh: dict[str, Any]) -> None:
    """The control: a master of ours in a 0700 folder is found and used."""
    folder = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    sock = folder / "m.sock"
    start_master(ssh, sock)
    try:
        sh = OpenSSHShell(openssh_target(ssh), control_path=str(sock))
        assert sh.run(["echo", "ok"]).stdout == "ok\n"
    finally:
        stop_master(sock)
        subprocess.run(["rm", "-rf", str(folder)], check=False)
