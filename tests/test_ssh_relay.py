"""The SSH relay (node/relay.py through transport/ssh/relay_client.py) against the dev
cluster's REAL sshd: commands ride one long-lived channel and say what a channel of their
own says; pushed file growth is read by offset, and killing the relay (the login node's
process, by its pid) mid-command or mid-stream loses nothing and doubles nothing.

The relay runs on this machine (the dev cluster's login node is 127.0.0.1): a test finds
its own relays by the tag they carry (``trtllm-relay:<pid of the controller>``)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_pool import make_spec

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.pushed_files import SmallFiles
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock
from pytest_trtllm_slurm.execution.slurm.warm_pool import AgentPool, send_session
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import (
    SSHConnectionLost,
    SSHShell,
    SSHTarget,
)
from pytest_trtllm_slurm.transport.ssh.relay_client import (
    SYSTEM_PYTHONS,
    quick_candidates,
    relay_tag,
)

pytestmark = pytest.mark.devcluster


def relay_pids(controller_pid: int | None = None) -> list[int]:
    """Relays started by ``controller_pid`` (this process by default). A command the relay
    starts shows the relay's command line between its fork and its exec: a process whose
    parent matches too is such a child, not a second relay."""
    tag = relay_tag(controller_pid).encode()
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if tag in argv and b"-c" in argv and not argv[0].endswith(b"sh"):
                stat = (entry / "stat").read_text()
                found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return [pid for pid, parent in found.items() if parent not in found]


def kill_relays(controller_pid: int | None = None, timeout: float = 30) -> list[int]:
    """SIGKILL this controller's relay(s), waiting for one to exist first."""
    deadline = time.monotonic() + timeout
    while not (pids := relay_pids(controller_pid)):
        assert time.monotonic() < deadline, "no relay came up"
        time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


@pytest.fixture
def ssh_shell(devcluster: dict[str, Any]) -> Iterator[SSHShell]:
    ssh = devcluster["ssh"]
    cluster = ClusterConfig(name="dev", ssh_host=ssh["host"], ssh_port=ssh["port_key"],
                            user=ssh["user"], identity_file=ssh["identity_file"],
                            known_hosts=ssh["known_hosts"])
    sh = SSHShell(SSHTarget.from_cluster(cluster, ssh_config_path=os.devnull))
    yield sh
    sh.close()


def plain(sh: SSHShell) -> SSHShell:
    """The same host without a relay: a channel per command, as before the relay."""
    other = SSHShell(sh.target, relay=False)
    other.connect()
    return other


COMMANDS: list[tuple[list[str], dict[str, Any]]] = [
    (["printf", "%s|", "a b", "it's", "$HOME", "[x] y", "`id`"], {}),
    (["sh", "-c", 'echo "$V"; pwd; cat'], {"env": {"V": "sp ace $X 'q'"}, "cwd": "/tmp",
                                          "input": "line one\nline two\n"}),
    (["sh", "-c", "echo out; echo err >&2; exit 3"], {}),
    (["true"], {"cwd": "/no/such/dir"}),
    (["sleep", "5"], {"timeout": 0.5}),
]


def test_commands_through_the_relay_say_what_a_channel_each_says(ssh_shell: SSHShell) -> None:
    assert ssh_shell.relay_up()
    before = set(relay_pids())  # (this process's other connections may have theirs)
    other = plain(ssh_shell)
    try:
        for argv, kw in COMMANDS:
            relayed, alone = ssh_shell.run(argv, **kw), other.run(argv, **kw)
            assert (relayed.returncode, relayed.timed_out) == (alone.returncode,
                                                               alone.timed_out), argv
            assert relayed.stdout == alone.stdout, argv
            if alone.stderr.strip():
                assert relayed.stderr.strip(), argv
        assert ssh_shell.run(["no-such-command-here"]).returncode == 127
    finally:
        other.close()
    assert set(relay_pids()) == before, "the connection's one relay served every command"
    assert ssh_shell.relay_up() and ssh_shell.relay_starts == 1


def test_a_relay_killed_mid_command(ssh_shell: SSHShell, tmp_path: Path) -> None:
    assert ssh_shell.relay_up()
    marker = tmp_path / "ran"
    argv = ["sh", "-c", f"sleep 1; echo x >> {shlex.quote(str(marker))}; echo done"]
    results: list[Any] = []

    def repeatable() -> None:
        results.append(ssh_shell.run(argv))

    thread = threading.Thread(target=repeatable)
    thread.start()
    time.sleep(0.3)
    first = kill_relays()
    thread.join(30)
    # a command that may run again is run again (on a channel of its own), and says so
    assert results and results[0].ok and results[0].stdout == "done\n"
    # one that must not (a submission) is not: the caller is told it may have run
    assert ssh_shell.relay_up()  # a new relay
    assert relay_pids() and relay_pids() != first
    errors: list[BaseException] = []

    def once() -> None:
        try:
            ssh_shell.run(argv, retry_on_drop=False)
        except SSHConnectionLost as exc:
            errors.append(exc)

    thread = threading.Thread(target=once)
    thread.start()
    time.sleep(0.3)
    kill_relays()
    thread.join(30)
    assert errors and "was not run again" in str(errors[0])
    assert ssh_shell.run(["echo", "still here"]).stdout == "still here\n"


def test_pushed_lines_survive_killed_relays(ssh_shell: SSHShell, tmp_path: Path) -> None:
    """A reader that reads as the monitor does (pushed bytes, else the file by offset)
    gets every line once while the relay is killed twice under it."""
    path = str(tmp_path / "reports.jsonl")
    assert ssh_shell.relay_up()
    ssh_shell.watch(path, 0)
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 50)}"}}\n' for i in range(300)]
    done = threading.Event()

    def writer() -> None:
        with open(path, "a") as fh:
            for i, line in enumerate(lines):
                fh.write(line)
                fh.flush()
                if i % 10 == 0:
                    time.sleep(0.01)
        done.set()

    got, offset, from_push, kills = bytearray(), 0, 0, 0
    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set() or offset < os.path.getsize(path):
        data = ssh_shell.pushed(path, offset)
        if data:
            from_push += 1
        if data is None:
            data = ssh_shell.read_from(path, offset)
        got += data
        offset += len(data)
        if kills < 2 and len(got) > (kills + 1) * len("".join(lines)) // 3:
            kill_relays()
            kills += 1
            ssh_shell.run(["true"])  # the next command starts a relay: it watches again
        ssh_shell.wait_news(0.05)
    thread.join()
    assert got.decode() == "".join(lines)  # every line, in order, once
    assert kills == 2 and ssh_shell.relay_starts == 3
    assert from_push > 0, "the lines came by push, not only by reads"


def test_a_stream_through_the_relay(ssh_shell: SSHShell) -> None:
    """A bundle or tar stream (binary, bigger than one piece) arrives whole; a producer
    that fails is an error, not a silent half file."""
    assert ssh_shell.relay_up()
    blob = bytes(range(256)) * 12_000  # ~3 MB, every byte value
    result = ssh_shell.run_stdin_stream(["md5sum"], lambda fh: fh.write(blob))
    assert result.ok and result.stdout.split()[0] == hashlib.md5(blob).hexdigest()

    def broken(fh: Any) -> None:
        fh.write(b"half")
        raise OSError("the local file went away")

    with pytest.raises(ExecutionError, match="the local file went away"):
        ssh_shell.run_stdin_stream(["sh", "-c", "cat > /dev/null"], broken)
    assert len(relay_pids()) == 1 and ssh_shell.relay_starts == 1


def test_a_streamed_command_that_ends_first_is_answered_while_input_still_comes(
        ssh_shell: SSHShell) -> None:
    """A command that ends before its input (a lock's ``flock -w`` that timed out, fed
    keep-alive bytes until it is released) is answered as it ends: the producer's next
    write fails as one to a closed pipe does, instead of feeding it until it gives up."""
    assert ssh_shell.relay_up()
    stopped: list[BaseException] = []

    def keep_alive(fh: Any) -> None:
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                fh.write(b"\n")
                fh.flush()
                time.sleep(0.2)
        except OSError as exc:
            stopped.append(exc)

    result = ssh_shell.run_stdin_stream(["sh", "-c", "sleep 1; exit 75"], keep_alive)
    assert result.returncode == 75, result.describe()
    assert stopped and isinstance(stopped[0], BrokenPipeError), "fed until its own deadline"
    # the relay still serves: the next command and a stream after it
    assert ssh_shell.run(["echo", "next"], timeout=30).stdout == "next\n"
    assert ssh_shell.run_stdin_stream(["wc", "-c"], lambda fh: fh.write(b"x" * 10)).stdout \
        .strip() == "10"
    assert len(relay_pids()) == 1 and ssh_shell.relay_starts == 1


def test_a_watch_made_before_the_relay_runs(ssh_shell: SSHShell, tmp_path: Path) -> None:
    """A job added before the connection (or while its relay is replaced) is watched by
    the relay that starts next: its lines still come by push, once each."""
    path = str(tmp_path / "early.jsonl")
    ssh_shell.watch(path, 0)  # not connected yet: nothing runs on the login node
    assert ssh_shell.pushed(path, 0) is None  # the reader reads the file meanwhile
    assert ssh_shell.relay_up()
    lines = "".join(f"line {i}\n" for i in range(50))
    Path(path).write_text(lines)
    got, offset, deadline = b"", 0, time.monotonic() + 30
    while offset < len(lines) and time.monotonic() < deadline:
        data = ssh_shell.pushed(path, offset)
        assert data is not None, "the new relay does not watch the file"
        got, offset = got + data, offset + len(data)
        ssh_shell.wait_news(0.1)
    assert got.decode() == lines


def test_a_batch_end_is_pushed_and_wakes_the_waiter(ssh_shell: SSHShell, tmp_path: Path) -> None:
    """A batch's exit-code file (written once, by rename, as the fork and the step
    launcher write it) is pushed by the relay: the monitor's wait ends when it lands, and
    reading it costs no round trip. The pid file, watched without waking, is read the same
    way. Without pushes the end would be seen at the next poll's read, a round trip each."""
    assert ssh_shell.relay_up()
    relay = ssh_shell._relay
    assert relay is not None
    files = SmallFiles(ssh_shell)
    exit_path, pid_path = str(tmp_path / "exit_code"), str(tmp_path / "batch.pid")
    files.watch(exit_path)
    files.watch(pid_path, wake=False)
    asked = dict(relay.requests)
    assert files.read(exit_path) == "" and files.read(pid_path) == ""  # not there yet

    def finish() -> None:
        time.sleep(0.5)
        for path, text in ((pid_path, "4242\n"), (exit_path, "0\n")):
            Path(path + ".tmp").write_text(text)
            os.replace(path + ".tmp", path)

    writer = threading.Thread(target=finish)
    start = time.monotonic()
    writer.start()
    while files.read(exit_path) == "" and time.monotonic() - start < 30:
        ssh_shell.wait_news(30)  # a push ends it; no poll
    waited = time.monotonic() - start
    writer.join()
    assert files.read(exit_path) == "0\n" and waited < 5, waited
    deadline = time.monotonic() + 10
    while files.read(pid_path) == "" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert files.read(pid_path) == "4242\n"
    assert files.round_trips == 0 and relay.requests == asked, "read without a round trip"
    # a path watched again (a retry in the same work dir) is read from the file: the
    # relay may still hold a push of the old one
    os.unlink(exit_path)
    files.watch(exit_path)
    assert files.read(exit_path) == "" and files.round_trips == 1


def _rename_in(path: Path, text: str, after: float) -> threading.Thread:
    """``text`` written to ``path`` by rename after ``after`` seconds, as a rank writes it."""
    def write() -> None:
        time.sleep(after)
        Path(f"{path}.tmp").write_text(text)
        os.replace(f"{path}.tmp", path)

    writer = threading.Thread(target=write)
    writer.start()
    return writer


def test_a_gated_steps_ranks_are_pushed(ssh_shell: SSHShell, tmp_path: Path) -> None:
    """A multi-node step's ranks say in its gate folder that they are ready and, as they
    exit, done (node/gate.py). Over SSH the relay pushes those files: the loop's wait ends
    when they land, and counting the exited ranks costs no round trip (before, each round
    asked whether ``done.<rank>`` existed, and a step's end was seen only at a round)."""
    assert ssh_shell.relay_up()
    relay = ssh_shell._relay
    assert relay is not None
    alloc = AllocationState(job_id="7", nodelist="a[1-2]", nodes=2, gpus_per_node=4)
    pool = AgentPool(ssh_shell, alloc)
    gated = pool.add("mpi", make_spec(tmp_path, "mpi", 2), warm=False, gated=True)
    assert not pool.place_waiting(lambda job_id, job: None)  # launched early, not let in
    gate = Path(gated.gate_dir)
    gate.mkdir()

    start = time.monotonic()
    writer = _rename_in(gate / "ready", "2\n", 0.5)
    while not pool.place_waiting(lambda job_id, job: None) and time.monotonic() - start < 30:
        ssh_shell.wait_news(30)  # only a push ends it
    waited = time.monotonic() - start
    writer.join()
    assert (gate / "open").exists() and gated.placement is not None and waited < 5, waited

    asked = dict(relay.requests)
    writers = [_rename_in(gate / "done.0", "4242\n", 0.3),
               _rename_in(gate / "done.1", "4243\n", 0.6)]
    start = time.monotonic()
    while not pool.ranks_exited(gated) and time.monotonic() - start < 30:
        ssh_shell.wait_news(30)
    waited = time.monotonic() - start
    for writer in writers:
        writer.join()
    assert pool.ranks_exited(gated) and waited < 5, waited
    assert relay.requests == asked, "the ranks were counted by round trips"
    pool.release(gated)  # no more pushes of its gate
    assert not any(path.startswith(str(gate)) for path, _, _ in relay.watches())


def test_the_relay_starts_without_a_path_shim(ssh_shell: SSHShell, tmp_path: Path) -> None:
    """The quick start runs an absolute interpreter isolated (-I -S), not the python3 the
    login shell's PATH names (a pyenv shim on this machine: a shell script and a second
    process); a cluster python that does not exist falls back to the PATH start."""
    assert ssh_shell.relay_up()
    pids = relay_pids()
    assert pids
    argv = (Path("/proc") / str(pids[0]) / "cmdline").read_bytes().split(b"\0")
    assert argv[0] in {p.encode() for p in SYSTEM_PYTHONS} and b"-I" in argv and b"-S" in argv
    assert quick_candidates("/no/such/python") == ["/no/such/python"]
    assert quick_candidates("python3.11") == []  # a bare name that is not python3: PATH
    other = SSHShell(ssh_shell.target, relay_python="/no/such/python")
    try:
        assert other.relay_up(), "the plain start after a failed quick one"
        assert other.run(["echo", "ok"]).stdout == "ok\n"
    finally:
        other.close()


def test_a_lock_is_seen_held_without_polling_its_holder_file(ssh_shell: SSHShell,
                                                             tmp_path: Path) -> None:
    """A lock on the cluster (``shell_lock``: the checkout's, the run registry's) whose
    holder first runs a slow command (the code sync's look at the checkout; here 0.6 s)
    is waited for on the login node: one relay request per half second, none of the
    looks at the holder file a poll made (one round trip each, backing off to 0.25 s, so
    the lock was seen held up to that late). Released, a second run's wait for it ends."""
    assert ssh_shell.relay_up()
    relay = ssh_shell._relay
    assert relay is not None
    path = str(tmp_path / "t.lock")
    lock = ShellLock(ssh_shell, path)
    before = dict(relay.requests)
    assert lock.acquire(30, {"run_id": "first"}, then=["sleep", "0.6"])
    asked = {op: n - before.get(op, 0) for op, n in relay.requests.items()
             if n != before.get(op, 0)}
    assert lock.output() == (0, "")
    assert "read" not in asked and 1 <= asked.get("await", 0) <= 2, asked
    other = ShellLock(ssh_shell, path)
    waiting = threading.Thread(target=lambda: other.acquire(30, {"run_id": "second"}))
    waiting.start()
    time.sleep(0.3)
    assert (lock.holder() or {}).get("run_id") == "first" and waiting.is_alive()
    lock.release()
    waiting.join(10)
    assert not waiting.is_alive() and other.held
    other.release(wait=True)


def test_a_session_request_lands_private_in_one_round_trip(ssh_shell: SSHShell,
                                                           tmp_path: Path) -> None:
    """A warm worker's session asked for over SSH (``send_session``: its inbox, the agent's
    inbox, its node ids, the request): the folders 0700, the files 0600 and whole, in one
    relay round trip (four on main, one after the other). A link planted where the
    agent's inbox goes is refused as a lone mkdir refuses it, and no request is written
    (not through the link, not anywhere)."""
    assert ssh_shell.relay_up()
    relay = ssh_shell._relay
    assert relay is not None
    agent = tmp_path / "agents" / "7" / "n1-abcd"
    before = dict(relay.requests)
    sdir = send_session(ssh_shell, str(agent), "s1", ["python", "-m", "pytest"],
                        cwd=str(tmp_path), env={"A": "1"}, nodeids='[["t.py::test_a", "k"]]')
    asked = {op: n - before.get(op, 0) for op, n in relay.requests.items()
             if n != before.get(op, 0)}
    assert asked == {"batch": 1}, asked
    folders = [agent / "inbox", Path(sdir), Path(sdir) / "inbox", agent]
    files = [agent / "inbox" / "s1.json", Path(sdir) / "nodeids.json"]
    assert {oct(p.stat().st_mode & 0o777) for p in folders} == {"0o700"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
    assert json.loads(files[0].read_text())["argv"] == ["python", "-m", "pytest"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = tmp_path / "agents" / "7" / "n2-abcd"
    other.mkdir(mode=0o700)
    (other / "inbox").symlink_to(elsewhere)
    with pytest.raises(ExecutionError, match="symbolic link"):
        send_session(ssh_shell, str(other), "s2", ["python"], cwd=str(tmp_path), env={})
    assert list(elsewhere.iterdir()) == []
    assert not list((other / "sessions").rglob("*.json"))
