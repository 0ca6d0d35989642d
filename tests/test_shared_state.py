"""A remote cluster's allocation state lives on the cluster (issue 20), against the REAL dev
cluster and its REAL sshd.

Two "machines" are two local checkouts of the same repository (each with its own
work_dirs, its own SSH connection and, for the crash test, its own process) that reach the
cluster as the same user with the same user_root_dir. The cluster's file system is this
machine's, so the test can look at what was written there directly.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devcluster import run as sh
from devcluster import squeue_state

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.remote.workspace import (
    remote_paths,
    shared_state_dir,
    sync_cluster,
)
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, RunRegistry, reap_dead_runs
from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
from pytest_trtllm_slurm.node.paths import STATE_NAME
from pytest_trtllm_slurm.planning.settings import ClusterConfig, load_clusters_file
from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

pytestmark = pytest.mark.devcluster


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def clusters_toml(ssh: dict[str, Any], user_root_dir: Path) -> str:
    return ("[clusters.devssh]\n"
            f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
            f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
            f'mfa = false\nsync = "git"\nuser_root_dir = "{user_root_dir}"\n'
            'partition = "batch"\n')


@pytest.fixture
def machines(devcluster: dict, tmp_path: Path) -> dict[str, Any]:
    """Two checkouts of one repository (``a/proj`` and ``b/proj``), one cluster home."""
    home = tmp_path / "cluster_home"
    toml = clusters_toml(devcluster["ssh"], home)
    found: dict[str, Any] = {"home": home, "ssh": devcluster["ssh"]}
    a = tmp_path / "a" / "proj"
    a.mkdir(parents=True)
    git(a, "init", "-q", "-b", "main")
    (a / ".gitignore").write_text("work_dirs/\n")
    (a / "mod.py").write_text("VALUE = 1\n")
    (a / "trtllm-slurm.toml").write_text(toml)
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "base")
    b = tmp_path / "b" / "proj"
    b.parent.mkdir()
    subprocess.run(["git", "clone", "-q", str(a), str(b)], check=True)
    found["a"], found["b"] = a, b
    return found


def cluster_of(repo: Path) -> ClusterConfig:
    return load_clusters_file(None, repo).get("devssh")


def machine_manager(repo: Path, warnings: list[str]) -> AllocationManager:
    """What the plugin builds on one machine for the remote cluster (execution.factory)."""
    cluster = cluster_of(repo)
    shell = shell_for_cluster(cluster)
    shell.connect()
    paths = remote_paths(cluster, repo)
    state_dir = shared_state_dir(cluster, paths)
    return AllocationManager(
        shell, rootdir=repo / "work_dirs" / ".remote-devssh",
        request=AllocationRequest(partition="batch", account="acct_a", nodes=1,
                                  gpus_per_node=1, time_limit="15", exclusive=False),
        store=StateStore(shell, state_dir, STATE_NAME),
        runs=RunRegistry(shell, f"{state_dir}/runs"), user="root",
        warn=warnings.append, wait_seconds=120, agents_dir=f"{paths.remote_work_root}/.agents")


def alloc_cli(rootdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    return subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm", "alloc", *args,
                           "--rootdir", str(rootdir)], capture_output=True, text=True,
                          timeout=120, env=env, check=False, cwd=rootdir)


def test_two_machines_share_one_allocation_kept_on_the_cluster(machines: dict) -> None:
    a_said: list[str] = []
    b_said: list[str] = []
    a = machine_manager(machines["a"], a_said)
    state = a.ensure()
    assert state is not None
    try:
        b = machine_manager(machines["b"], b_said)
        b_state = b.ensure()
        # the second machine found and reused the first one's allocation
        assert b_state is not None and b_state.job_id == state.job_id, (a.messages, b.messages)
        assert f"Reusing allocation {state.job_id}" in " ".join(b.messages)
        assert a.owner == b.owner  # the same owner tag: one allocation per checkout there
        # the state is on the cluster, private, and on neither machine
        folder = machines["home"] / ".trtllm-state" / "proj"
        on_cluster = folder / STATE_NAME
        assert json.loads(on_cluster.read_text())["job_id"] == state.job_id
        assert stat.S_IMODE(on_cluster.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for repo in (machines["a"], machines["b"]):
            assert not list(repo.rglob(STATE_NAME)), repo
        # each machine sees the other as a live user of the allocation (the lease)
        assert [r.run_id for r in b.runs.users_of(state.job_id)] == [a.runs.me.run_id]
        assert [r.run_id for r in a.runs.users_of(state.job_id)] == [b.runs.me.run_id]
        # `trtllm-slurm alloc status` on the second machine sees it, over SSH
        status = alloc_cli(machines["b"], "status", "--cluster", "devssh")
        assert status.returncode == 0, status.stderr
        assert f"[devssh] Allocation {state.job_id} (acct_a-trtllm.persistent): RUNNING" \
            in status.stdout, status.stdout
        assert f"state file: 127.0.0.1:{on_cluster}" in status.stdout, status.stdout
        a.close()
        assert b.runs.users_of(state.job_id) == []  # a's lease went with its run
        b.close()
        release = alloc_cli(machines["b"], "release", "--cluster", "devssh")
        assert release.returncode == 0, release.stderr
        assert f"[devssh] Allocation {state.job_id} released." in release.stdout
        assert not on_cluster.exists()
        end = time.monotonic() + 30
        while (squeue_state(state.job_id) or ("GONE",))[0] == "RUNNING":
            assert time.monotonic() < end, squeue_state(state.job_id)
            time.sleep(0.5)
    finally:
        sh(["scancel", state.job_id], check=False)


# another machine's process: takes the allocation's lock and registers as a run, then waits
HOLDER = r"""
import sys, time
from pathlib import Path
from pytest_trtllm_slurm.execution.slurm.runs import reap_dead_runs
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
from pytest_trtllm_slurm.planning.settings import load_clusters_file
from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

repo, state_dir = Path(sys.argv[1]), sys.argv[2]
shell = shell_for_cluster(load_clusters_file(None, repo).get("devssh"))
shell.connect()
runs = RunRegistry(shell, state_dir + "/runs")
runs.use_allocation("4242")
store = StateStore(shell, state_dir, ".slurm_alloc.json")
with store.locked(30, {"pid": runs.me.pid, "host": runs.me.host, "run_id": runs.me.run_id,
                       "since": "now"}, print):
    print("held", runs.me.run_id, flush=True)
    time.sleep(600)
"""


def test_a_crashed_holders_lock_and_lease_are_recovered(machines: dict) -> None:
    """A run on another machine holds the allocation's lock and is killed (SIGKILL: no
    cleanup runs). Its lock is free again as soon as its connection is gone, and its
    record counts as dead, not as a live user of the allocation."""
    b_said: list[str] = []
    b = machine_manager(machines["b"], b_said)
    b_cluster = cluster_of(machines["b"])
    state_dir = shared_state_dir(b_cluster, remote_paths(b_cluster, machines["b"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(machines["a"]), state_dir],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("held "), line + holder.stderr.read() if holder.stderr else ""
        run_id = line.split()[1]
        # held: another machine waits, and the error names the holder
        b._lock_timeout = 3
        with pytest.raises(ExecutionError) as err, b.holding_lock():
            pass
        assert f"pid {holder.pid}" in str(err.value) and run_id in str(err.value)
        assert f"127.0.0.1:{state_dir}/{STATE_NAME}.lock" in str(err.value)
        assert [r.run_id for r in b.runs.users_of("4242")] == [run_id]
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        # killed: the lock is let go with its connection, no time-out to wait for
        b._lock_timeout = 30
        with b.holding_lock():
            held = json.loads(Path(f"{state_dir}/{STATE_NAME}.lock.holder").read_text())
            assert held["run_id"] == b.runs.me.run_id
        assert b.runs.users_of("4242") == []
        assert [r.run_id for r, _ in b.runs.dead()] == [run_id]
        # the next run's reaper forgets the dead run's record, on the cluster
        said: list[str] = []
        reap_dead_runs(b.runs, b.jobs, b.shell, "root", said.append)
        assert not Path(f"{state_dir}/runs/{run_id}.json").exists()
        assert b.runs.dead() == []
    finally:
        if holder.poll() is None:
            holder.kill()
        b.close()


def test_a_lock_wait_cut_by_a_dropped_connection_waits_again(machines: dict) -> None:
    """Machine b waits for the lock another machine holds, and b's SSH connection is cut
    (its sshd session killed) while it waits: b reconnects and keeps waiting, and takes
    the lock once the holder is gone, instead of failing with the dropped connection."""
    b_cluster = cluster_of(machines["b"])
    port = b_cluster.ssh_port or 22
    others = _client_ports(os.getpid(), port)  # this process's connections before b's
    b = machine_manager(machines["b"], [])
    state_dir = shared_state_dir(b_cluster, remote_paths(b_cluster, machines["b"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(machines["a"]), state_dir],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    outcome: list[object] = []

    def wait_for_the_lock() -> None:
        try:
            with b.holding_lock():
                outcome.append(json.loads(
                    Path(f"{state_dir}/{STATE_NAME}.lock.holder").read_text()))
        except ExecutionError as exc:
            outcome.append(exc)

    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("held "), line + holder.stderr.read() if holder.stderr else ""
        b.shell.run(["true"])  # b's connection is up before it waits
        b._lock_timeout = 60
        waiter = threading.Thread(target=wait_for_the_lock, daemon=True)
        waiter.start()
        time.sleep(2.0)  # b waits on the cluster now
        cut = _kill_sshd_sessions(_client_ports(os.getpid(), port) - others, port=port)
        assert cut, "no sshd session of b's connection was found to cut"
        time.sleep(1.0)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        waiter.join(timeout=90)
        assert outcome, "b still waits for the lock after its holder was killed"
        assert isinstance(outcome[0], dict), outcome[0]
        assert outcome[0]["run_id"] == b.runs.me.run_id
    finally:
        if holder.poll() is None:
            holder.kill()
        b.close()


def _tcp_sockets() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every IPv4 TCP socket of this machine."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        found.append((int(local.split(":")[1], 16), int(remote.split(":")[1], 16), inode))
    return found


def _socket_inodes(pid: int | str) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _client_ports(pid: int, port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to ``port`` on this machine."""
    mine = _socket_inodes(pid)
    return {lp for lp, rp, inode in _tcp_sockets() if rp == port and inode in mine}


def _kill_sshd_sessions(client_ports: set[int], *, port: int) -> list[int]:
    """SIGKILL the sshd processes serving the connections from ``client_ports`` to
    ``port`` here (a cut connection, as its client sees it: its next read fails)."""
    server_inodes = {inode for lp, rp, inode in _tcp_sockets()
                     if lp == port and rp in client_ports}
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if _socket_inodes(proc.name) & server_inodes:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return killed


@pytest.fixture
def registries(machines: dict) -> Iterator[list[RunRegistry]]:
    made: list[RunRegistry] = []
    yield made
    for runs in made:
        runs.finish()
        runs.shell.close()  # (its relay ends with the connection)


def registry(repo: Path, made: list[RunRegistry]) -> RunRegistry:
    cluster = cluster_of(repo)
    shell = shell_for_cluster(cluster)
    shell.connect()
    runs = RunRegistry(shell,
                            f"{shared_state_dir(cluster, remote_paths(cluster, repo))}/runs")
    made.append(runs)
    return runs


def test_two_runs_share_a_remote_checkout_only_with_the_same_code(
        machines: dict, registries: list[RunRegistry]) -> None:
    """Run A synced and tests its code; run B (another machine) with other code stops
    before it sends anything, naming the checkout and run A; with the same code it shares
    the checkout (nothing sent); once A has ended, B syncs its own code."""
    a_repo, b_repo = machines["a"], machines["b"]
    checkout = machines["home"] / "proj"
    run_a = registry(a_repo, registries)
    first = sync_cluster(cluster_of(a_repo), a_repo, run_a.shell, name="t", runs=run_a)
    assert first is not None and (checkout / "mod.py").read_text() == "VALUE = 1\n"
    (b_repo / "mod.py").write_text("VALUE = 2\n")
    run_b = registry(b_repo, registries)
    with pytest.raises(ExecutionError) as err:
        sync_cluster(cluster_of(b_repo), b_repo, run_b.shell, name="t", runs=run_b)
    message = str(err.value)
    assert f"the remote checkout 127.0.0.1:{checkout} is in use by another run" in message
    assert run_a.me.run_id in message and f"pid {run_a.me.pid}" in message
    assert "nothing was synced" in message and "user_root_dir" in message
    assert (checkout / "mod.py").read_text() == "VALUE = 1\n"  # run A's code, untouched
    # the same code: shared, nothing sent, nothing stashed from under run A
    (checkout / "a_session_output.txt").write_text("run A's test wrote this\n")
    (b_repo / "mod.py").write_text("VALUE = 1\n")
    shared = sync_cluster(cluster_of(b_repo), b_repo, run_b.shell, name="t", runs=run_b)
    assert shared is not None and shared.unchanged and shared.sent_bytes == 0
    assert (checkout / "a_session_output.txt").exists()
    # run A ended: run B may sync other code
    run_a.finish()
    (b_repo / "mod.py").write_text("VALUE = 3\n")
    other = sync_cluster(cluster_of(b_repo), b_repo, run_b.shell, name="t", runs=run_b)
    assert other is not None and not other.unchanged
    assert (checkout / "mod.py").read_text() == "VALUE = 3\n"


def test_the_first_clone_keeps_the_shared_state(
        machines: dict, registries: list[RunRegistry]) -> None:
    """The cluster clones origin for the first sync: the registry (the run's record and
    lock) lives beside the checkout, so the clone neither fails on it nor removes it."""
    b_repo = machines["b"]  # a clone: its origin (a's folder) is reachable from the cluster
    run_b = registry(b_repo, registries)
    result = sync_cluster(cluster_of(b_repo), b_repo, run_b.shell, name="t", runs=run_b)
    assert result is not None and result.cloned and not result.warnings, result
    assert Path(f"{run_b.folder}/{run_b.me.run_id}.json").exists()
    seen = registry(machines["a"], registries).others()
    assert [(r.run_id, alive) for r, alive, _ in seen] == [(run_b.me.run_id, True)]


def test_the_reaper_takes_the_dead_runs_from_the_claims_listing(
        machines: dict, registries: list[RunRegistry]) -> None:
    """The checkout's claim reads the run registry under its lock (in the round trip of its
    look at the checkout); the reaper's look for killed runs, next on the way to the first
    batch, takes the dead runs from that listing instead of listing again. A later look
    lists again (a run may have died since)."""
    a_repo = machines["a"]
    run_a = registry(a_repo, registries)
    run_a.make_folder()
    # a run killed on another machine: its record, no live lock
    ghost = RunRecord(run_id="elsewhere-1-dead00", pid=1, host="elsewhere",
                      began="2026-01-01 00:00:00")
    Path(run_a.folder, "elsewhere-1-dead00.json").write_text(ghost.model_dump_json())
    assert sync_cluster(cluster_of(a_repo), a_repo, run_a.shell, name="t", runs=run_a)
    assert run_a.shell.relay_up()
    relay = run_a.shell._relay
    assert relay is not None
    before = sum(relay.requests.values())
    assert [r.run_id for r, _ in run_a.dead()] == ["elsewhere-1-dead00"]
    assert sum(relay.requests.values()) == before  # no round trip
    assert [r.run_id for r, _ in run_a.dead()] == ["elsewhere-1-dead00"]
    assert sum(relay.requests.values()) == before + 1  # listed again
