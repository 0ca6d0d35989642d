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
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devcluster import wait_for_job

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.remote.sync import verify_checkout
from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
from pytest_trtllm_slurm.node.files import UntrustedPath
from pytest_trtllm_slurm.node.report_file import ReportFile
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import LocalShell
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell
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


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder of ours others may enter but not write (a home directory: 0755)."""
    path = Path(tempfile.mkdtemp(prefix="home-", dir="/tmp"))
    path.chmod(0o755)
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


# -- 2. the tree the run makes on a cluster -------------------------------------------------
@pytest.fixture(params=["local", "relay", "sftp", "openssh"])
def any_shell(request: pytest.FixtureRequest, ssh: dict[str, Any]) -> Iterator[Any]:
    """Each Shell that makes folders and writes files: this machine's, paramiko's over its
    relay and over plain SFTP, and OpenSSH's (over a master in a private folder)."""
    if request.param == "local":
        yield LocalShell()
        return
    if request.param in ("relay", "sftp"):
        target = SSHTarget.from_cluster(ClusterConfig.model_validate(
            {"name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
             "user": ssh["user"], "identity_file": ssh["identity_file"],
             "known_hosts": ssh["known_hosts"]}), ssh_config_path=os.devnull)
        sh = SSHShell(target, relay=request.param == "relay")
        yield sh
        sh.close()
        return
    folder = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    sock = folder / "m.sock"
    start_master(ssh, sock)
    try:
        yield OpenSSHShell(openssh_target(ssh), control_path=str(sock))
    finally:
        stop_master(sock)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_a_folder_the_neighbour_made_first_is_refused(any_shell: Any, neighbour: Neighbour,
                                                      shared_dir: Path) -> None:
    """The neighbour creates the batch folder (0777) before the run: refused, named."""
    planted = neighbour.mkdir(shared_dir / "work_dirs" / "batch_1")
    with pytest.raises(ExecutionError) as err:
        any_shell.mkdir(str(planted), private=True)
    assert str(planted) in str(err.value) and f"uid {neighbour.uid}" in str(err.value)


def test_a_link_the_neighbour_planted_is_refused(any_shell: Any, neighbour: Neighbour,
                                                 shared_dir: Path) -> None:
    """A link at the folder's name, to the neighbour's own folder: refused, not followed
    (nothing is made in the neighbour's folder)."""
    theirs = neighbour.mkdir(neighbour.home / f"theirs-{secrets.token_hex(3)}")
    link = neighbour.link(theirs, shared_dir / "batch_2")
    with pytest.raises(ExecutionError) as err:
        any_shell.mkdir(str(link / "inner"))
    assert str(link) in str(err.value) and "symbolic link" in str(err.value)
    assert list(theirs.iterdir()) == []
    with pytest.raises(ExecutionError, match="symbolic link"):
        any_shell.mkdir(str(link), private=True)


def test_a_folder_of_ours_others_may_write_is_refused(any_shell: Any, tmp_path: Path) -> None:
    """Our own folder, made under umask 002 (the group may write it): refused, named."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o775)
    with pytest.raises(ExecutionError) as err:
        any_shell.mkdir(str(loose), private=True)
    assert str(loose) in str(err.value) and "0775" in str(err.value)


def test_folders_made_are_private_whatever_the_umask(any_shell: Any, tmp_path: Path) -> None:
    """Every folder a run makes is 0700, also where the login shell's umask is 002; a
    file it writes is 0600 and no temporary file is left."""
    old = os.umask(0o002)  # this machine's shell and, through it, the dev sshd's children
    try:
        deep = tmp_path / "a" / "b" / "c"
        any_shell.mkdir(str(deep))
        any_shell.write_file(str(deep / "job.sbatch"), "#!/bin/sh\n")
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", deep):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((deep / "job.sbatch").stat().st_mode) == 0o600
    assert [p.name for p in deep.iterdir()] == ["job.sbatch"]


def test_a_planted_reports_file_is_refused(neighbour: Neighbour, shared_dir: Path) -> None:
    """The neighbour plants reports.jsonl (its own, 0666) or a link there to a file of
    its own: the worker refuses both, naming them; nothing is appended to either."""
    planted = neighbour.file(shared_dir / "reports.jsonl", "")
    with pytest.raises(UntrustedPath) as err:
        ReportFile(planted)
    assert str(planted) in str(err.value) and f"uid {neighbour.uid}" in str(err.value)
    victim = neighbour.file(neighbour.home / "victim.txt", "theirs\n", mode=0o666)
    link = neighbour.link(victim, shared_dir / "linked.jsonl")
    with pytest.raises(UntrustedPath, match="symbolic link"):
        ReportFile(link)
    assert planted.read_text() == "" and victim.read_text() == "theirs\n"


def test_the_remote_checkout_git_folder_others_may_write_is_refused(
        neighbour: Neighbour, ssh: dict[str, Any], home: Path) -> None:
    """A remote checkout whose .git/hooks the group may write (made under umask 002): the
    neighbour drops a post-checkout hook; code sync refuses before git runs it."""
    repo = home / "checkout"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git" / "hooks").chmod(0o775)
    neighbour.file(repo / ".git" / "hooks" / "post-checkout", "#!/bin/sh\ntouch PWNED\n",
                   mode=0o755)
    target = SSHTarget.from_cluster(ClusterConfig.model_validate(
        {"name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
         "user": ssh["user"], "identity_file": ssh["identity_file"],
         "known_hosts": ssh["known_hosts"]}), ssh_config_path=os.devnull)
    with SSHShell(target) as sh, pytest.raises(ExecutionError) as err:
        verify_checkout(sh, str(repo))
    assert str(repo / ".git" / "hooks") in str(err.value)
    # the user's own, private checkout is fine
    (repo / ".git" / "hooks" / "post-checkout").unlink()
    (repo / ".git" / "hooks").chmod(0o755)
    verify_checkout(LocalShell(), str(repo))


def test_sbatch_runs_the_script_as_rendered(devcluster: dict[str, Any], tmp_path: Path) -> None:
    """What runs is the script the run rendered, even when job.sbatch is replaced between
    its write and sbatch (someone who could write the batch folder)."""
    script = tmp_path / "job.sbatch"
    rendered = f"#!/bin/sh\n#SBATCH -o {tmp_path}/out.log\necho rendered\n"
    script.write_text(rendered)
    script.write_text(f"#!/bin/sh\n#SBATCH -o {tmp_path}/out.log\necho swapped\n")
    job_id = SlurmJobs(LocalShell()).sbatch(str(script), cwd=str(tmp_path), script=rendered)
    wait_for_job(job_id)
    assert (tmp_path / "out.log").read_text().strip() == "rendered"


ONE_SHOT_SUITE = '''import os
import pytest


@pytest.mark.trtllm_slurm(devices=1, env={"MARKER_VALUE": "mk-value-4821"})
def test_sees_the_marker_value():
    print("printed to the job log")
    assert os.environ["MARKER_VALUE"] == "mk-value-4821"
'''


def test_a_one_shot_batch_is_private_under_a_group_umask(
        devcluster: dict[str, Any], neighbour: Neighbour, home: Path) -> None:
    """A one-shot batch on the local cluster, run under umask 002 (a shared-group setup):
    the neighbour can list nothing in the work dirs nor read the job's log, and
    job.sbatch holds no value of the marker's env (the test still sees it)."""
    suite = home / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    trtllm_slurm: resources\n")
    (suite / "test_env.py").write_text(ONE_SHOT_SUITE)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    proc = subprocess.run(
        ["sh", "-c", 'umask 002 && exec "$@"', "sh", sys.executable, "-m", "pytest",
         "-p", "no:cacheprovider", "-rA", "--trtllm-remote", "--trtllm-one-shot",
         "--slurm-partition=batch"],
        cwd=suite, capture_output=True, text=True, timeout=600, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED test_env.py::test_sees_the_marker_value" in out, out
    scripts = list((suite / "work_dirs").rglob("job.sbatch"))
    assert scripts, out
    for script in scripts:
        work = script.parent
        assert "mk-value-4821" not in script.read_text()
        assert "MARKER_VALUE" in script.read_text()  # named, for the reader
        assert stat.S_IMODE(work.stat().st_mode) == 0o700, work
        logs = [p for p in work.iterdir() if p.name.endswith(".log")]
        for path in [script, *logs]:
            seen = neighbour.run("cat", str(path), check=False)
            assert seen.returncode != 0 and "printed" not in seen.stdout, path
        assert neighbour.run("ls", str(work), check=False).returncode != 0


def test_the_launchers_exit_code_goes_through_no_predictable_temp_name(tmp_path: Path) -> None:
    """A link planted at the temporary name a step's (or warm worker's) launcher used
    for its exit code (``exit_code.tmp``) is never written through: the temporary file
    is mktemp's, of an unpredictable name."""
    from pytest_trtllm_slurm.execution.render.scripts import render_step_launcher

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("the neighbour's file\n")
    (work / "exit_code.tmp").symlink_to(victim)
    script = render_step_launcher(["sh", "-c", "exit 3"], log_path=str(work / "log"),
                                  pid_path=str(work / "pid"), exit_path=str(work / "exit_code"),
                                  cwd=str(tmp_path))
    (work / "step.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run(["bash", str(work / "step.sh")], check=True, timeout=60, env=env)
    assert (work / "exit_code").read_text() == "3\n"
    assert victim.read_text() == "the neighbour's file\n"
    assert sorted(p.name for p in work.iterdir()) == ["exit_code", "exit_code.tmp", "log",
                                                      "pid", "step.sh"]
