"""The persistent allocation's state under damage and concurrency, on the real dev cluster:
damaged and foreign state files, a live run's lease, the state lock, two cold runs in one
rootdir, and ``trtllm-slurm alloc`` for a remote cluster."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from devcluster import run as sh
from devcluster import squeue_state

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, process_start
from pytest_trtllm_slurm.transport.shell import LocalShell

STATE = ".slurm_alloc.json"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}


def manager(root: Path, warnings: list[str], **request: object) -> AllocationManager:
    req = AllocationRequest(partition="batch", account="acct_a", nodes=1, time_limit="15",
                            **request)  # type: ignore[arg-type]
    return AllocationManager(LocalShell(), rootdir=root, request=req, user="root",
                             warn=warnings.append, wait_seconds=120)


def alloc_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from pytest_trtllm_slurm.cli.main import main; "
                           "import sys; sys.exit(main(sys.argv[1:]))", "alloc", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env(),
                          check=False)


# -- damaged state files (no scheduler needed to read them) ----------------------------
@pytest.mark.parametrize("content", [
    b"\x00\xff\xfe\x80 binary garbage \xc3\x28",
    b'{"job_id": "12',  # truncated
    b'{"job_id": [1, 2], "nodes": "many"}',  # wrong types
    b"[1, 2]",
    None,  # a folder where the file should be
], ids=["garbage", "truncated", "wrong-types", "a-list", "a-folder"])
def test_an_unreadable_state_file_is_moved_aside_and_said(tmp_path: Path,
                                                          content: bytes | None) -> None:
    state = tmp_path / "work_dirs" / STATE
    state.parent.mkdir(parents=True)
    if content is None:
        state.mkdir()
    else:
        state.write_bytes(content)
    warnings: list[str] = []
    assert manager(tmp_path, warnings).read_state() is None
    assert not state.exists()
    (aside,) = state.parent.glob(f"{STATE}.bad-*")
    assert warnings and f"State file {state} is unreadable" in warnings[0]
    assert f"moved to {aside}" in warnings[0]


def test_alloc_status_says_an_unreadable_state_file_and_does_not_crash(tmp_path: Path) -> None:
    state = tmp_path / "work_dirs" / STATE
    state.parent.mkdir(parents=True)
    state.write_bytes(b"\xff\xfe\x00garbage")
    res = alloc_cli("status", "--rootdir", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert f"{state} is unreadable" in res.stdout
    assert state.exists()  # status only looks


# -- runs against the real cluster ------------------------------------------------------
@pytest.fixture
def own(devcluster: dict, tmp_path: Path) -> Iterator[tuple[AllocationManager, list[str]]]:
    """A manager of a fresh rootdir; whatever it allocated is released at the end."""
    warnings: list[str] = []
    mgr = manager(tmp_path / "root", warnings)
    yield mgr, warnings
    made = re.findall(r"Allocation (\d+) granted", " ".join(mgr.messages))
    if made:  # never leave our allocations behind on the shared dev cluster
        sh(["scancel", *made], check=False)


def test_a_state_file_naming_another_users_job_is_not_used(own, devcluster: dict) -> None:
    mgr, warnings = own
    theirs = sh(["sbatch", "--parsable", "--uid=testuser", "-A", "acct_b", "-p", "gb200",
                 "-n1", "--mem=50", "-t", "5", "-J", "acct_b-trtllm.persistent", "--chdir=/tmp",
                 "-o", "/dev/null", "--wrap", "sleep 300"]).stdout.strip().split(";")[0]
    try:  # (running or pending: either way it is in the queue, and not ours)
        Path(mgr.store.folder).mkdir(parents=True)
        (Path(mgr.store.folder) / STATE).write_text(json.dumps({
            "job_id": theirs, "job_name": "acct_b-trtllm.persistent", "partition": "batch",
            "account": "acct_a", "nodes": 1, "gpus_per_node": 4, "nodelist": "g1"}))
        state = mgr.ensure()
        assert state is not None and state.job_id != theirs, state
        text = "\n".join(warnings)
        assert (f"names job {theirs}, which is not this checkout's allocation (it belongs to "
                "user testuser): not used, not cancelled") in text, text
        assert squeue_state(theirs) is not None  # theirs still runs
        assert list(Path(mgr.store.folder).glob(f"{STATE}.foreign-*"))
        # nor does a release cancel it (ours, now without its state file, goes)
        (Path(mgr.store.folder) / STATE).write_text(json.dumps({"job_id": theirs, "nodes": 1}))
        said = mgr.release()
        assert f"State file named job {theirs}, which is not this checkout's allocation" in said
        assert f"Orphaned allocation {state.job_id} released." in said
        assert squeue_state(theirs) is not None
    finally:
        sh(["scancel", theirs], check=False)


def test_replacing_never_cancels_an_allocation_a_live_run_uses(own, tmp_path: Path) -> None:
    """Run A uses the allocation (its lease: a live process); run B needs a bigger one. B
    leaves A's allocation alone and runs one-shot, whatever the agents' heartbeats say."""
    mgr, warnings = own
    state = mgr.ensure()
    assert state is not None
    run_a = subprocess.Popen(["sleep", "120"])
    try:
        record = RunRecord(run_id="run-a", pid=run_a.pid, host=socket.gethostname(),
                           started=process_start(run_a.pid), allocation=state.job_id)
        getattr(mgr, "close", lambda: None)()  # (this process no longer uses it: only A)
        (Path(mgr.store.folder) / ".runs").mkdir(parents=True, exist_ok=True)
        (Path(mgr.store.folder) / ".runs" / "run-a.json").write_text(record.model_dump_json())
        bigger: list[str] = []
        b = AllocationManager(LocalShell(), rootdir=Path(mgr.store.folder).parent,
                              request=AllocationRequest(partition="batch", account="acct_a",
                                                        nodes=2, time_limit="15"),
                              user="root", warn=bigger.append, wait_seconds=20)
        assert b.ensure() is None
        assert f"Allocation {state.job_id} does not fit (1 node(s), wanted 2), but live run" in (
            "\n".join(bigger)), bigger
        assert squeue_state(state.job_id)[0] == "RUNNING"
    finally:
        run_a.kill()
        run_a.wait()


def test_a_held_lock_is_a_clear_error_and_alloc_status_does_not_wait(
        devcluster: dict, tmp_path: Path) -> None:
    holder = manager(tmp_path, [])
    waiting: list[str] = []
    other = manager(tmp_path, waiting)
    other._lock_timeout = 6
    with holder.holding_lock():
        start = time.monotonic()
        res = alloc_cli("status", "--rootdir", str(tmp_path), timeout=30)
        assert res.returncode == 0 and "No persistent allocation" in res.stdout, res.stderr
        with pytest.raises(ExecutionError) as err:
            other.ensure()
        assert time.monotonic() - start < 60
    message = str(err.value)
    assert f"{tmp_path}/work_dirs/{STATE}.lock" in message
    assert f"held by pid {os.getpid()}" in message
    assert any("Waiting since" in w and f"pid {os.getpid()}" in w for w in waiting), waiting


def test_two_cold_runs_in_one_rootdir_start_one_agent_per_node(devcluster: dict,
                                                               tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    trtllm_slurm: resources\n")
    (suite / "test_gpu.py").write_text(
        "import pytest\n\n\n@pytest.mark.trtllm_slurm(devices=1)\n"
        "@pytest.mark.parametrize('i', range(3))\ndef test_gpu(i):\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "--slurm-partition=batch"]
    procs = [subprocess.Popen(argv, cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env()) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    state = json.loads((suite / "work_dirs" / STATE).read_text())
    try:
        for proc, out in zip(procs, outs, strict=True):
            assert proc.returncode == 0, out
        steps = sh(["squeue", "-h", "-s", "-j", state["job_id"], "-o", "%j|%N"]).stdout
        agents = Counter(line.split("|")[1] for line in steps.splitlines()
                         if line.split("|")[0].endswith(".agent"))
        assert agents and set(agents.values()) == {1}, steps
        assert "being started by another run; this run uses it too" in "".join(outs), outs
    finally:
        sh(["scancel", state["job_id"]], check=False)


def test_alloc_status_and_release_reach_a_remote_clusters_allocation(
        devcluster: dict, tmp_path: Path) -> None:
    from pytest_trtllm_slurm.execution.remote.workspace import remote_paths, shared_state_dir
    from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
    from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
    from pytest_trtllm_slurm.planning.settings import load_clusters_file
    from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

    ssh = devcluster["ssh"]
    (tmp_path / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "none"\npartition = "batch"\n')
    cluster = load_clusters_file(None, tmp_path).get("devssh")
    shell = shell_for_cluster(cluster)
    shell.connect()
    # as the plugin builds it: the state on the cluster (execution.factory)
    state_dir = shared_state_dir(cluster, remote_paths(cluster, tmp_path))
    remote = AllocationManager(shell, rootdir=tmp_path / "work_dirs" / ".remote-devssh",
                               request=AllocationRequest(partition="batch", account="acct_a",
                                                         time_limit="15"),
                               store=StateStore(shell, state_dir, STATE),
                               runs=RunRegistry(shell, f"{state_dir}/runs"),
                               agents_dir=str(tmp_path / "remote_work" / ".agents"))
    state = remote.ensure()
    assert state is not None
    try:
        status = alloc_cli("status", "--rootdir", str(tmp_path), timeout=120)
        assert status.returncode == 0, status.stderr
        assert f"[devssh] Allocation {state.job_id} (acct_a-trtllm.persistent): RUNNING" in (
            status.stdout), status.stdout
        assert "[local] No persistent allocation" in status.stdout
        release = alloc_cli("release", "--rootdir", str(tmp_path), "--cluster", "devssh",
                            timeout=120)
        assert release.returncode == 0, release.stderr
        assert f"[devssh] Allocation {state.job_id} released." in release.stdout
        end = time.monotonic() + 30
        while (squeue_state(state.job_id) or ("GONE",))[0] == "RUNNING":
            assert time.monotonic() < end, squeue_state(state.job_id)
            time.sleep(0.5)
    finally:
        remote.close()  # this run's record and lease on the cluster go
        sh(["scancel", state.job_id], check=False)
