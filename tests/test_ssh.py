"""SSHShell / OpenSSHShell against the dev cluster's REAL sshd (no mocks).

Port 2222 takes a public key only; port 2223 takes a public key plus a keyboard-interactive
one-time code (the static 424242 or the TOTP of the cluster's secret). Connections are cut
by killing the sshd process that serves exactly this test's TCP connection.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devcluster import child_pids, wait_for_job

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import LocalShell
from pytest_trtllm_slurm.transport.ssh.auth import OneTimeCode
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import (
    SSHConnectError,
    SSHConnectionLost,
    SSHShell,
    SSHTarget,
    remote_command,
)
from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

pytestmark = pytest.mark.devcluster

WRONG_CODE = "917305"


def cc(**kw: Any) -> ClusterConfig:
    """A validated ClusterConfig (model_validate: mypy sees no pydantic field defaults)."""
    return ClusterConfig.model_validate(kw)


# -- helpers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ssh(devcluster: dict[str, Any]) -> dict[str, Any]:
    return {**devcluster["ssh"], "state_dir": devcluster["state_dir"]}


@pytest.fixture(autouse=True)
def _no_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never fall back to a terminal prompt, even when pytest runs in a terminal."""
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("TRTLLM_SLURM_OTP", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def cluster(ssh: dict[str, Any], port: int, **kw: Any) -> ClusterConfig:
    base = {"name": "dev", "ssh_host": ssh["host"], "ssh_port": port, "user": ssh["user"],
            "identity_file": ssh["identity_file"], "known_hosts": ssh["known_hosts"]}
    return ClusterConfig(**{**base, **kw})


def shell(ssh: dict[str, Any], port: int, **kw: Any) -> SSHShell:
    target = SSHTarget.from_cluster(cluster(ssh, port, **kw), ssh_config_path=os.devnull)
    return SSHShell(target)


@pytest.fixture
def key_shell(ssh: dict[str, Any]) -> Iterator[SSHShell]:
    sh = shell(ssh, ssh["port_key"])
    yield sh
    sh.close()


def totp_script(tmp_path: Path, secret: str, counter: Path | None = None) -> str:
    """An otp_command printing the current TOTP (and counting its calls)."""
    script = tmp_path / "totp.py"
    count = f"open({str(counter)!r}, 'a').write('x\\n')\n" if counter else ""
    script.write_text(f"import pyotp\n{count}print(pyotp.TOTP({secret!r}).now())\n")
    return shlex.join([sys.executable, str(script)])


def kill_connection(state_dir: str, client_port: int) -> list[int]:
    """SIGKILL the sshd process(es) serving the TCP connection from ``client_port`` (and what
    they started): the client sees the connection drop, other connections are untouched."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[2].rsplit(":", 1)[1], 16) == client_port and \
                    int(f[1].rsplit(":", 1)[1], 16) in (2222, 2223):
                inodes.add(f"socket:[{f[9]}]")
    listener = int(Path(state_dir, "ssh", "sshd.pid").read_text())
    serving = []
    for pid in child_pids(listener):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if links & inodes:
            serving.append(pid)
    assert serving, f"no sshd process serves client port {client_port}"
    victims, todo = [], list(serving)
    while todo:
        pid = todo.pop()
        victims.append(pid)
        todo += child_pids(pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def wait_dropped(sh: SSHShell, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while sh._conn is not None and sh._conn.active:
        assert time.monotonic() < end, "the client never noticed the dropped connection"
        time.sleep(0.05)


# -- key only (port 2222) --------------------------------------------------------------------
def test_key_login_sbatch_failed_job(key_shell: SSHShell) -> None:
    # either partition will do: other tests may hold whole nodes of one of them
    res = key_shell.run(["sbatch", "--parsable", "-J", "ssh-exit3", "-p", "batch,gb200",
                         "-t", "1", "--wrap", "exit 3"], retry_on_drop=False)
    assert res.ok, res.describe()
    job_id = res.stdout.strip().split(";")[0]
    assert wait_for_job(job_id) == ("FAILED", "3:0")
    out = key_shell.run(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=State,ExitCode"])
    assert out.stdout.split() == ["FAILED|3:0"]


def test_run_quotes_argv_env_cwd_input(key_shell: SSHShell, tmp_path: Path) -> None:
    odd = ["a b", "it's", '"dq"', "$HOME", "`id`", "x[1]", "semi;colon", "new\nline", "*"]
    res = key_shell.run(["printf", "%s|", *odd])
    assert res.stdout == "".join(f"{a}|" for a in odd)
    cwd = tmp_path / "dir with 'quote' $x"
    cwd.mkdir()
    res = key_shell.run(["sh", "-c", 'pwd; printf "%s" "$V"; cat; exit 7'], cwd=str(cwd),
                        env={"V": "v a l'ue $x"}, input="from stdin\n")
    assert (res.returncode, res.stdout) == (7, f"{cwd}\nv a l'ue $xfrom stdin\n")
    assert key_shell.run(["sh", "-c", "echo err >&2"]).stderr == "err\n"
    assert remote_command(["a b"], env={"K": "1 2"}, cwd="/x y") == "cd '/x y' && env 'K=1 2' 'a b'"
    with pytest.raises(ValueError):
        remote_command(["true"], env={"BAD NAME": "1"})


def test_run_timeout(key_shell: SSHShell) -> None:
    start = time.monotonic()
    res = key_shell.run(["sleep", "30"], timeout=0.5)
    assert res.timed_out and res.returncode == 124 and not res.ok
    assert time.monotonic() - start < 5
    assert key_shell.run(["echo", "still fine"]).stdout == "still fine\n"


def test_many_channels_one_transport(key_shell: SSHShell) -> None:
    key_shell.connect()
    transport = key_shell._conn.transport  # type: ignore[union-attr]
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        key_shell.run(["echo", str(i)]).stdout.strip())) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results, key=int) == [str(i) for i in range(8)]
    assert key_shell._conn.transport is transport  # type: ignore[union-attr]
    assert key_shell.reconnects == 0


# -- files --------------------------------------------------------------------------------
def test_read_from_growing_file(key_shell: SSHShell, tmp_path: Path) -> None:
    path = str(tmp_path / "growing.log")
    assert key_shell.read_from(path, 0) == b"" and key_shell.size(path) == 0
    assert not key_shell.exists(path)
    offset, seen = 0, b""
    for i in range(5):
        key_shell.run(["sh", "-c", f'printf "line {i}\\n" >> "$1"', "sh", path])
        chunk = key_shell.read_from(path, offset)
        offset += len(chunk)
        seen += chunk
        assert chunk == f"line {i}\n".encode()
    assert seen == Path(path).read_bytes() and key_shell.size(path) == offset
    assert key_shell.read_from(path, offset) == b""
    assert key_shell.read_from(path, 2, limit=4) == b"ne 0"
    big = os.urandom(3 << 20)
    Path(path).write_bytes(big)
    assert key_shell.read_from(path, 1000, limit=2 << 20) == big[1000:1000 + (2 << 20)]


@pytest.fixture(params=["local", "paramiko", "openssh"])
def any_shell(request: pytest.FixtureRequest, ssh: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """Each Shell that writes state: this machine's, paramiko's and OpenSSH's (over a
    ControlMaster started here)."""
    if request.param == "local":
        yield LocalShell()
        return
    if request.param == "paramiko":
        sh = shell(ssh, ssh["port_key"])
        yield sh
        sh.close()
        return
    control = request.getfixturevalue("control_dir")
    sock = control / "m.sock"
    start_master(ssh, ssh["port_key"], sock, tmp_path)
    target = SSHTarget.from_cluster(cluster(ssh, ssh["port_key"], transport="openssh"),
                                    ssh_config_path=os.devnull)
    yield OpenSSHShell(target, control_path=str(sock))


def test_write_file_atomic_and_private(any_shell: Any, tmp_path: Path) -> None:
    """State written through any Shell: a reader sees no file or all of it, 0600 whatever
    the umask (a ``mode`` when asked), and no temporary file is left."""
    key_shell = any_shell
    directory = tmp_path / "out"
    key_shell.mkdir(str(directory / "deeper" / "still"))
    key_shell.mkdir(str(directory / "deeper"))  # -p semantics: existing is fine
    assert (directory / "deeper" / "still").is_dir()
    path = directory / "state.json"
    size = 1 << 20
    contents = {b"a" * size, b"b" * size}
    stop, torn = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            if data not in contents:
                torn.append(len(data))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(12):
            key_shell.write_file(str(path), ("a" if i % 2 else "b") * size)
    finally:
        stop.set()
        thread.join()
    assert not torn, f"a reader saw a partly written file ({torn[:3]})"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in directory.iterdir()) == ["deeper", "state.json"]  # no temps
    path.chmod(0o644)  # an older, more open file: written again, it is 0600 again
    key_shell.write_file(str(path), "c")
    assert path.read_text() == "c" and stat.S_IMODE(path.stat().st_mode) == 0o600
    key_shell.write_file(str(directory / "script.sh"), "#!/bin/sh\n", mode=0o755)
    assert stat.S_IMODE((directory / "script.sh").stat().st_mode) == 0o755


# -- host keys ------------------------------------------------------------------------------
def test_unknown_host_key_refused(ssh: dict[str, Any], tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    sh = shell(ssh, ssh["port_key"], known_hosts=str(empty))
    with pytest.raises(ConfigError) as err:
        sh.run(["true"])
    msg = str(err.value)
    assert "127.0.0.1 port 2222" in msg and "is not known" in msg and "SHA256:" in msg
    assert "accept_new_host_key = true" in msg and "[clusters.dev]" in msg
    assert empty.read_text() == ""


def test_accept_new_host_key_records_it(ssh: dict[str, Any], tmp_path: Path) -> None:
    known = tmp_path / "new" / "known_hosts"
    sh = shell(ssh, ssh["port_key"], known_hosts=str(known), accept_new_host_key=True)
    assert sh.run(["echo", "ok"]).stdout == "ok\n"
    sh.close()
    lines = known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[127.0.0.1]:2222 ssh-ed25519 AAAA")
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    again = shell(ssh, ssh["port_key"], known_hosts=str(known))  # now known, no opt-in needed
    assert again.run(["true"]).ok
    again.close()
    assert len(known.read_text().splitlines()) == 1
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    hashed = shell(ssh, ssh["port_key"], known_hosts=str(known))
    assert hashed.run(["true"]).ok
    hashed.close()


def test_changed_host_key_always_refused(ssh: dict[str, Any], tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
                   check=True)
    other = (tmp_path / "other.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:2222 {other[0]} {other[1]}\n")
    before = known.read_bytes()
    sh = shell(ssh, ssh["port_key"], known_hosts=str(known), accept_new_host_key=True)
    with pytest.raises(ConfigError) as err:
        sh.run(["true"])
    assert "CHANGED" in str(err.value) and "ssh-keygen -R" in str(err.value)
    assert known.read_bytes() == before


# -- authentication -----------------------------------------------------------------------
def test_mfa_static_code_from_env(ssh: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_SLURM_OTP", ssh["otp_static"])
    for mfa in (True, None):  # declared, and discovered (the server asks for it)
        sh = shell(ssh, ssh["port_otp"], mfa=mfa)
        assert sh.run(["echo", "in"]).stdout == "in\n"
        sh.close()


def test_mfa_totp_from_otp_command(ssh: dict[str, Any], tmp_path: Path) -> None:
    cmd = totp_script(tmp_path, ssh["totp_secret"])
    sh = shell(ssh, ssh["port_otp"], mfa=True, otp_command=cmd)
    assert sh.run(["hostname"]).ok
    sh.close()


def test_mfa_true_on_key_only_host_needs_no_code(ssh: dict[str, Any]) -> None:
    sh = shell(ssh, ssh["port_key"], mfa=True)  # no code source at all: never asked
    assert sh.run(["true"]).ok
    sh.close()


def test_wrong_code_clear_error(ssh: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_SLURM_OTP", WRONG_CODE)
    sh = shell(ssh, ssh["port_otp"], mfa=True)
    with pytest.raises(ConfigError) as err:
        sh.run(["true"])
    msg = str(err.value)
    assert "root@127.0.0.1:2223" in msg and "refused the one-time code" in msg
    assert "TRTLLM_SLURM_OTP" in msg and WRONG_CODE not in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no chained trace


def test_no_code_source_says_how(ssh: dict[str, Any]) -> None:
    sh = shell(ssh, ssh["port_otp"])  # mfa unset: key first, then the server asks for a code
    with pytest.raises(ConfigError) as err:
        sh.run(["true"])
    msg = str(err.value)
    assert "127.0.0.1:2223" in msg and "TRTLLM_SLURM_OTP" in msg and "otp_command" in msg


def test_failing_otp_command(ssh: dict[str, Any]) -> None:
    sh = shell(ssh, ssh["port_otp"], mfa=True, otp_command="sh -c 'exit 2'")
    with pytest.raises(ConfigError, match="otp_command of .*failed .exit code 2"):
        sh.run(["true"])


def test_mfa_false_against_otp_port_is_configuration_problem(
        ssh: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_SLURM_OTP", ssh["otp_static"])  # available, but must not be used
    sh = shell(ssh, ssh["port_otp"], mfa=False)
    with pytest.raises(ConfigError) as err:
        sh.run(["true"])
    assert "configuration problem" in str(err.value) and "mfa = false" in str(err.value)


def test_wrong_key_is_configuration_problem(ssh: dict[str, Any], tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    sh = shell(ssh, ssh["port_key"], mfa=False, identity_file=str(tmp_path / "k"))
    with pytest.raises(ConfigError, match="configuration problem: SSH key authentication"):
        sh.run(["true"])
    missing = shell(ssh, ssh["port_key"], identity_file=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="identity_file .*absent.* does not exist"):
        missing.run(["true"])


def test_secrets_never_logged_or_shown(ssh: dict[str, Any], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TRTLLM_SLURM_OTP", ssh["otp_static"])
    sh = shell(ssh, ssh["port_otp"], mfa=True)
    assert sh.run(["true"]).ok
    import pyotp

    cmd = totp_script(tmp_path, ssh["totp_secret"])
    monkeypatch.delenv("TRTLLM_SLURM_OTP")
    sh2 = shell(ssh, ssh["port_otp"], mfa=True, otp_command=cmd)
    assert sh2.run(["true"]).ok
    codes = {ssh["otp_static"], pyotp.TOTP(ssh["totp_secret"]).now()}
    shown = caplog.text + repr(sh) + repr(sh2) + repr(sh.target) + str(sh2.target.model_dump())
    shown += repr(OneTimeCode(ssh["otp_static"], "x")) + str(OneTimeCode(ssh["otp_static"], "x"))
    assert "paramiko" in caplog.text or "ssh:" in caplog.text  # debug logging did happen
    for code in codes:
        assert code not in shown
    sh.close()
    sh2.close()


# -- reconnect ------------------------------------------------------------------------------
def test_dropped_connection_reconnects_on_next_call(key_shell: SSHShell,
                                                     ssh: dict[str, Any]) -> None:
    assert key_shell.run(["echo", "1"]).stdout == "1\n"
    port = key_shell.local_port
    assert port is not None
    kill_connection(ssh["state_dir"], port)
    wait_dropped(key_shell)
    assert key_shell.run(["echo", "2"]).stdout == "2\n"
    assert key_shell.reconnects == 1 and key_shell.local_port != port
    kill_connection(ssh["state_dir"], key_shell.local_port)  # type: ignore[arg-type]
    wait_dropped(key_shell)
    assert key_shell.size("/etc/hostname") > 0  # SFTP reconnects too
    assert key_shell.reconnects == 2


def test_reconnect_gives_up_after_bounded_backoff(ssh: dict[str, Any]) -> None:
    target = SSHTarget.from_cluster(cluster(ssh, ssh["port_key"]), ssh_config_path=os.devnull)
    sh = SSHShell(target, backoff=(0.05, 0.1))
    assert sh.run(["true"]).ok
    sh.target = target.model_copy(update={"port": 1})  # nothing listens there any more
    kill_connection(ssh["state_dir"], sh.local_port)  # type: ignore[arg-type]
    wait_dropped(sh)
    start = time.monotonic()
    with pytest.raises(SSHConnectError, match="could not be re-established after 3 attempts"):
        sh.run(["true"])
    assert time.monotonic() - start < 5


def _run_and_cut(sh: SSHShell, ssh: dict[str, Any], argv: list[str], marker: Path,
                 **kw: Any) -> Any:
    """Start argv in a thread; once ``marker`` exists, cut the connection; return the result."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = sh.run(argv, timeout=60, **kw)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    sh.connect()
    port = sh.local_port
    thread = threading.Thread(target=target)
    thread.start()
    end = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < end, "the command never started"
        time.sleep(0.02)
    kill_connection(ssh["state_dir"], port)  # type: ignore[arg-type]
    thread.join(60)
    assert not thread.is_alive()
    return box.get("error") or box["result"]


def test_cut_mid_command_not_retried_when_not_idempotent(key_shell: SSHShell,
                                                          ssh: dict[str, Any],
                                                          tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = 'echo x >> "$1"; sleep 20; echo done'
    got = _run_and_cut(key_shell, ssh, ["sh", "-c", script, "sh", str(marker)], marker,
                       retry_on_drop=False)
    assert isinstance(got, SSHConnectionLost)
    assert "was not run again" in str(got) and "127.0.0.1:2222" in str(got)
    assert marker.read_text() == "x\n"  # ran exactly once
    assert key_shell.run(["echo", "after"]).stdout == "after\n"


def test_cut_mid_command_retried_when_idempotent(key_shell: SSHShell, ssh: dict[str, Any],
                                                 tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = 'echo x >> "$1"; [ "$(wc -l < "$1")" -ge 2 ] || sleep 20; echo done'
    got = _run_and_cut(key_shell, ssh, ["sh", "-c", script, "sh", str(marker)], marker)
    assert got.ok and got.stdout == "done\n"
    assert marker.read_text() == "x\nx\n" and key_shell.reconnects == 1


def test_mfa_reconnect_asks_for_a_fresh_code(ssh: dict[str, Any], tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    sh = shell(ssh, ssh["port_otp"], mfa=True,
               otp_command=totp_script(tmp_path, ssh["totp_secret"], counter=calls))
    assert sh.run(["true"]).ok
    kill_connection(ssh["state_dir"], sh.local_port)  # type: ignore[arg-type]
    wait_dropped(sh)
    assert sh.run(["echo", "back"]).stdout == "back\n"
    assert calls.read_text() == "x\nx\n" and sh.reconnects == 1
    sh.close()


# -- ssh config: aliases, ProxyJump, ProxyCommand --------------------------------------------
def write_ssh_config(tmp_path: Path, ssh: dict[str, Any], body: str) -> str:
    path = tmp_path / "ssh_config"
    path.write_text(body.format(key=ssh["identity_file"], kh=ssh["known_hosts"],
                                port=ssh["port_key"]))
    return str(path)


def test_ssh_config_resolution_cluster_values_win(ssh: dict[str, Any], tmp_path: Path) -> None:
    cfg = write_ssh_config(tmp_path, ssh, """
Host devalias
    HostName 127.0.0.1
    Port {port}
    User root
    IdentityFile {key}
    UserKnownHostsFile {kh}
""")
    target = SSHTarget.from_cluster(cc(name="c", ssh_host="devalias"),
                                    ssh_config_path=cfg)
    assert (target.hostname, target.port, target.user) == ("127.0.0.1", 2222, "root")
    assert target.identity_files == (ssh["identity_file"],)
    assert target.known_hosts == ssh["known_hosts"]
    sh = SSHShell(target)
    assert sh.run(["echo", "alias"]).stdout == "alias\n"
    sh.close()
    explicit = SSHTarget.from_cluster(
        cc(name="c", ssh_host="devalias", ssh_port=2223, user="someone"),
        ssh_config_path=cfg)
    assert (explicit.port, explicit.user, explicit.hostname) == (2223, "someone", "127.0.0.1")
    with pytest.raises(ConfigError, match="no ssh_host"):
        SSHTarget.from_cluster(cc(name="c"))


def test_proxy_jump(ssh: dict[str, Any], tmp_path: Path) -> None:
    cfg = write_ssh_config(tmp_path, ssh, """
Host jumpbox
    HostName 127.0.0.1
    Port {port}
    User root
Host behind
    HostName 127.0.0.1
    Port {port}
    User root
    ProxyJump jumpbox
""")
    target = SSHTarget.from_cluster(
        cc(name="j", ssh_host="behind", identity_file=ssh["identity_file"],
           known_hosts=ssh["known_hosts"]), ssh_config_path=cfg)
    assert target.proxy_jump == "jumpbox" and target.jump_hosts()[0].port == 2222
    sh = SSHShell(target)
    assert sh.run(["echo", "via jump"]).stdout == "via jump\n"
    assert sh._conn is not None and len(sh._conn.jumps) == 1
    sh.close()


def test_proxy_command(ssh: dict[str, Any], tmp_path: Path) -> None:
    cfg = write_ssh_config(tmp_path, ssh, """
Host proxied
    HostName 127.0.0.1
    Port {port}
    User root
    ProxyCommand ssh -o BatchMode=yes -i {key} -o UserKnownHostsFile={kh} -p {port} """
                           """-W %h:%p root@127.0.0.1
""")
    target = SSHTarget.from_cluster(
        cc(name="p", ssh_host="proxied", identity_file=ssh["identity_file"],
           known_hosts=ssh["known_hosts"]), ssh_config_path=cfg)
    assert target.proxy_command and "-W 127.0.0.1:2222" in target.proxy_command
    sh = SSHShell(target)
    assert sh.run(["echo", "via proxy"]).stdout == "via proxy\n"
    sh.close()


# -- OpenSSH + ControlMaster ----------------------------------------------------------------
@pytest.fixture
def control_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))  # socket paths must stay short
    yield path
    for sock in path.glob("*.sock"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                       capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(path)], check=False)


def start_master(ssh: dict[str, Any], port: int, sock: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    if port == ssh["port_otp"]:  # the one interactive login, answered by an askpass helper
        askpass = tmp_path / "askpass.sh"
        askpass.write_text(f"#!/bin/sh\necho {ssh['otp_static']}\n")
        askpass.chmod(0o700)
        env.update(SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0")
    subprocess.run(["ssh", "-fNM", "-o", f"ControlPath={sock}", "-i", ssh["identity_file"],
                    "-o", f"UserKnownHostsFile={ssh['known_hosts']}", "-p", str(port),
                    f"{ssh['user']}@{ssh['host']}"], env=env, check=True, timeout=30,
                   stdin=subprocess.DEVNULL, capture_output=True)


def test_openssh_without_master_explains(ssh: dict[str, Any], control_dir: Path) -> None:
    target = SSHTarget.from_cluster(cluster(ssh, ssh["port_key"], transport="openssh"),
                                    ssh_config_path=os.devnull)
    with pytest.raises(ConfigError) as err:
        OpenSSHShell(target, control_path=str(control_dir / "none.sock"))
    assert "ssh -fNM" in str(err.value) and "ControlMaster" in str(err.value)


@pytest.mark.parametrize("port_key", ["port_key", "port_otp"])
def test_openssh_over_control_master(ssh: dict[str, Any], control_dir: Path, tmp_path: Path,
                                     port_key: str) -> None:
    sock = control_dir / "m.sock"
    start_master(ssh, ssh[port_key], sock, tmp_path)
    target = SSHTarget.from_cluster(cluster(ssh, ssh[port_key], transport="openssh"),
                                    ssh_config_path=os.devnull)
    sh = OpenSSHShell(target, control_path=str(sock))
    res = sh.run(["sh", "-c", 'printf "%s|" "$@"; cat', "sh", "a b", "$x"], input="in",
                 env={"K": "v"}, cwd=str(tmp_path))
    assert res.stdout == "a b|$x|in"
    path = tmp_path / "sub" / "f.txt"
    sh.mkdir(str(path.parent))
    sh.write_file(str(path), "0123456789")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sh.read_from(str(path), 3, 4) == b"3456" and sh.size(str(path)) == 10
    assert sh.read_from(str(tmp_path / "absent"), 0) == b"" and sh.size(str(tmp_path / "x")) == 0
    assert sh.exists(str(path)) and not sh.exists(str(tmp_path / "absent"))
    res = sh.run_stdin_stream(["sh", "-c", "wc -c"], lambda fh: fh.write(b"x" * 100000))
    assert res.stdout.strip() == "100000"

    def slow_chunks(fh: Any) -> None:  # a producer still writing after the command started
        for _ in range(20):
            fh.write(b"y" * 5000)
            fh.flush()
            time.sleep(0.01)

    res = sh.run_stdin_stream(["sh", "-c", "wc -c"], slow_chunks)
    assert res.stdout.strip() == "100000"
    # a lock on the cluster held through this transport is held (shell_lock)
    lock, other = ShellLock(sh, str(tmp_path / "l.lock")), ShellLock(LocalShell(),
                                                                     str(tmp_path / "l.lock"))
    assert lock.acquire(30)
    try:
        assert not other.acquire(1)
    finally:
        lock.release()
    assert other.acquire(30)
    other.release()


def test_shell_for_cluster_picks_transport(ssh: dict[str, Any], control_dir: Path,
                                           tmp_path: Path) -> None:
    sh = shell_for_cluster(cluster(ssh, ssh["port_key"]), ssh_config_path=os.devnull)
    assert isinstance(sh, SSHShell)
    with pytest.raises(ConfigError, match="ControlMaster"):
        shell_for_cluster(cluster(ssh, ssh["port_key"], transport="openssh", ssh_port=2299),
                          ssh_config_path=os.devnull)
