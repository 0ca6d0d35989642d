"""The early SSH connection starts before the controller's own imports: one thread runs
Python at a time, so what the main thread imports before starting the connection's thread
is on the remote run's critical path (it was ~0.25 s: the run loop's and the early start's
modules), while what it imports after overlaps the handshake's and the relay's waits.

No sshd is needed: the cluster's host refuses the connection (a closed port here), and the
run goes on without the early connection, as it does when one fails."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from pytest_trtllm_slurm.execution.remote.early_connect import EarlyConnections
from pytest_trtllm_slurm.planning.settings import ClusterConfig

# a plugin that records, when the early connection's thread starts, which of the
# controller's heavy modules the process had imported, and what the thread was handed
RECORDER = '''import json, os, sys
import pytest_trtllm_slurm.execution.remote.early_connect as early_connect

_start = early_connect.EarlyConnections.start


def start(self, cluster, then=None):
    seen = {m: m in sys.modules for m in (
        "pytest_trtllm_slurm.controller.run_loop",
        "pytest_trtllm_slurm.execution.remote.early_start",
        "pytest_trtllm_slurm.transport.ssh.shells")}
    started = _start(self, cluster, then)
    seen["shells_after_start"] = "pytest_trtllm_slurm.transport.ssh.shells" in sys.modules
    ask = then.keywords["ask"] if then is not None else None
    seen["ask_done_at_start"] = ask.done() if hasattr(ask, "done") else repr(ask)
    seen["started"] = started
    with open(os.environ["RECORD"], "w") as fh:
        json.dump(seen, fh)
    return started
early_connect.EarlyConnections.start = start
'''

TOML = '''[clusters.far]
ssh_host = "127.0.0.1"
ssh_port = {port}
user = "nobody"
mfa = false
sync = "git"
partition = "gb200"
'''


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again once this returns


def test_the_early_connection_starts_before_the_run_loop_is_imported(tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    (tmp_path / "trtllm-slurm.toml").write_text(TOML.format(port=closed_port()))
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    record = tmp_path / "record.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "recorder", "-p", "trtllm_slurm",
         "-p", "no:cacheprovider", "-q", "-k", "no_such_test", "--slurm-cluster=far",
         f"--trtllm-config={tmp_path / 'trtllm-slurm.toml'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**_env(), "PYTHONPATH": str(tmp_path), "RECORD": str(record)})
    assert record.exists(), proc.stdout + proc.stderr
    seen = json.loads(record.read_text())
    assert seen["started"] is True, seen
    # the connection's own modules first, in the caller (not interleaved in the thread)
    assert seen["shells_after_start"] is True, seen
    # the controller's heavy modules after the thread started, not before
    assert seen["pytest_trtllm_slurm.controller.run_loop"] is False, seen
    assert seen["pytest_trtllm_slurm.execution.remote.early_start"] is False, seen
    # the sessions' ask is made by the caller after the start, and handed over then
    assert seen["ask_done_at_start"] is False, seen
    assert "1 deselected" in proc.stdout, proc.stdout + proc.stderr


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ADDOPTS")}


def test_the_gil_changes_hands_quickly_while_an_early_connection_works() -> None:
    """Its round trips are many and short; the main thread imports the suite meanwhile."""
    before = sys.getswitchinterval()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        cluster = ClusterConfig.model_validate(
            {"name": "far", "ssh_host": "127.0.0.1", "ssh_port": server.getsockname()[1],
             "user": "nobody", "mfa": False})
        connections = EarlyConnections()
        assert connections.start(cluster)
        conn, _ = server.accept()  # the thread waits for our banner, which never comes
        with conn:
            during = sys.getswitchinterval()
    assert connections.take(cluster) is None  # the handshake failed: the run connects again
    for thread in threading.enumerate():
        if thread.name == "ssh-early-far":
            thread.join(10)
    assert during < before and during <= 0.001, (during, before)
    assert sys.getswitchinterval() == before  # as it was, once the thread is done
