"""A remote run whose relay (the login node's end of the wire) is killed mid-run, twice:
the run still ends with every test's outcome, each once, as a user reads them (terminal
summary and junit XML). The dispatched tests wait for a file this test writes only after
the kills, so the kills fall while reports are still to come."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from devcluster import publish_ssh_suite
from test_ssh_relay import kill_relays, relay_pids

pytestmark = pytest.mark.devcluster

TESTS = '''import pathlib
import time

import pytest

GO = pathlib.Path({go!r})


@pytest.mark.trtllm_slurm(devices=1)
def test_first():
    pass


@pytest.mark.trtllm_slurm(devices=1)
def test_fails():
    assert 1 == 2, "meant to fail"


@pytest.mark.trtllm_slurm(devices=1)
@pytest.mark.parametrize("n", [0, 1, 2])
def test_waits(n):
    deadline = time.monotonic() + 120
    while not GO.exists():
        assert time.monotonic() < deadline, "never told to go"
        time.sleep(0.1)
'''


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True, text=True)


def make_suite(base: Path, ssh: dict[str, Any]) -> Path:
    suite = base / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    trtllm_slurm: resources (pytest-trtllm-slurm)\n")
    (suite / "test_relay_run.py").write_text(TESTS.format(go=str(base / "go")))
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    return publish_ssh_suite(suite, base, ssh)


def first_report_landed(cluster_home: Path) -> bool:
    return any("test_first" in p.read_text(errors="replace")
               for p in cluster_home.glob("**/work_dirs/*/reports.jsonl"))


def test_killed_relays_lose_and_double_nothing(devcluster: dict[str, Any],
                                               tmp_path: Path) -> None:
    suite = make_suite(tmp_path, devcluster["ssh"])
    junit = tmp_path / "junit.xml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         "--slurm-cluster=devssh", "--trtllm-one-shot", f"--junitxml={junit}"],
        cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 900  # a shared cluster may keep the job pending
        while not first_report_landed(tmp_path / "cluster_home"):
            assert proc.poll() is None and time.monotonic() < deadline, "no report came"
            time.sleep(0.1)
        killed = kill_relays(proc.pid)
        while not (set(relay_pids(proc.pid)) - set(killed)):  # the run starts another
            assert proc.poll() is None and time.monotonic() < deadline, "no second relay"
            time.sleep(0.1)
        time.sleep(0.5)  # up and watching the files again
        kill_relays(proc.pid)
        (tmp_path / "go").touch()
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out
    assert "1 failed, 4 passed" in out, out
    cases = ET.parse(junit).getroot().iter("testcase")
    outcomes = [(case.get("name"), "failed" if case.find("failure") is not None else "passed")
                for case in cases]
    assert sorted(outcomes) == [("test_fails", "failed"), ("test_first", "passed"),
                                ("test_waits[0]", "passed"), ("test_waits[1]", "passed"),
                                ("test_waits[2]", "passed")], out
    assert "meant to fail" in out


CONFTEST = '''import os
import pathlib
import time

SEEN = pathlib.Path({seen!r})


def relay_running():
    tag = ("trtllm-relay:%d" % os.getpid()).encode()
    for entry in pathlib.Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\\0")
        except OSError:
            continue
        if tag in argv and b"-c" in argv and not argv[0].endswith(b"sh"):
            return True
    return False


if not os.environ.get("SLURM_JOB_ID"):  # the controller importing the suite, not a worker
    deadline = time.monotonic() + 60  # an import as slow as torch's, at most
    while not relay_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    SEEN.write_text("relay up while the suite was imported" if relay_running() else "no relay")
'''


def test_the_connection_opens_while_the_suite_imports(devcluster: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """--slurm-cluster with a key login: the run's one connection, relay included, is up
    while the controller still imports the suite's conftest, and it is the one the run
    uses (one relay for the whole run)."""
    suite = make_suite(tmp_path, devcluster["ssh"])
    seen = tmp_path / "seen"
    (suite / "conftest.py").write_text(CONFTEST.format(seen=str(seen)))
    git(suite, "add", "-A")
    git(suite, "commit", "-q", "-m", "conftest")
    (tmp_path / "go").touch()  # test_waits need not wait here
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         "--slurm-cluster=devssh", "--trtllm-one-shot"],
        cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    relays: set[int] = set()
    try:
        while proc.poll() is None:
            relays.update(relay_pids(proc.pid))
            time.sleep(0.05)
        out = proc.communicate(timeout=900)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "1 failed, 4 passed" in out, out
    assert seen.read_text() == "relay up while the suite was imported"
    assert len(relays) == 1, f"the run started {len(relays)} relays: {sorted(relays)}"
