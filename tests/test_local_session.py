"""local_direct's warm session (execution/local/session.py): the suite is imported and
collected once beside the controller, and each batch is a fork of that session; a batch the
session cannot run (it ended, or did not collect the tests) runs in a fresh worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dispatch_helpers import run_suite

LOCAL = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]

# each pytest process that collects this suite appends "<pid> <how>" to COLLECTIONS
CONFTEST = '''
import os
import sys


def _serving(config):
    return bool(getattr(config.option, "trtllm_worker_serve", None))


def pytest_collection_finish(session):
    how = "session" if _serving(session.config) else "other"
    with open(os.environ["COLLECTIONS"], "a") as out:
        out.write(f"{os.getpid()} {how}\\n")


def pytest_configure(config):
    if _serving(config) and os.environ.get("SESSION_DIES"):
        os._exit(3)  # the session ends before it serves anything


def pytest_ignore_collect(collection_path, config):
    if _serving(config) and os.environ.get("SESSION_SKIPS") == collection_path.name:
        return True
    return None
'''
TESTS = '''
import os

import pytest


{mark}
@pytest.mark.parametrize("i", range(3))
def test_{name}(i):
    with open(os.environ["RAN"], "a") as out:
        out.write(f"{{os.getpid()}} {{os.getppid()}} {name}{{i}} {{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}}\\n")
    if os.environ.get("HANGS") == f"{name}{{i}}":
        import time
        time.sleep(120)
    assert i != 2 or "{name}" != "b", "a failure, replayed as usual"
'''


# A fake: this machine has no GPU. It lists four, so that test_a (two GPUs each) and test_b
# (none) make batches of two shapes that run side by side.
FAKE_NVIDIA_SMI = "#!/bin/sh\nfor i in 0 1 2 3; do echo 'NVIDIA H200, 143771'; done\n"


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu2: two GPUs\n")
    (suite / "conftest.py").write_text(CONFTEST)
    for name, mark in (("a", "@pytest.mark.gpu2"), ("b", "")):
        (suite / f"test_{name}.py").write_text(TESTS.format(name=name, mark=mark))
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    return suite


def _run(suite: Path, tmp_path: Path, *args: str, **env: str):
    collections, ran = tmp_path / "collections.txt", tmp_path / "ran.txt"
    for path in (collections, ran):
        path.unlink(missing_ok=True)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    result = run_suite(suite, *LOCAL, *args, env={"COLLECTIONS": str(collections), "RAN": str(ran),
                                           "PATH": path, **env})
    lines = [line.split() for line in collections.read_text().splitlines()]
    return result, lines, [line.split() for line in ran.read_text().splitlines()]


def _outcomes(result) -> dict[str, str]:
    return {r["nodeid"]: r["outcome"] for r in result.reports if r["when"] == "call"}


EXPECTED = {f"test_{n}.py::test_{n}[{i}]": ("failed" if (n, i) == ("b", 2) else "passed")
            for n in "ab" for i in range(3)}


def test_batches_are_forks_of_one_session_that_collected_beside_the_controller(tmp_path):
    suite = _suite(tmp_path)
    result, collections, ran = _run(suite, tmp_path)
    assert _outcomes(result) == EXPECTED, result.stdout
    assert result.returncode == 1, result.stdout
    # the controller and the session collected; no batch collected again
    assert sorted(how for _, how in collections) == ["other", "session"], collections
    session_pid = next(pid for pid, how in collections if how == "session")
    assert {parent for _, parent, _, _ in ran} == {session_pid}, (ran, collections)
    assert len({pid for pid, _, _, _ in ran}) == 2, ran  # two batches, one fork each
    devices = {test: gpus for _, _, test, gpus in ran}
    assert sorted(devices) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    # each batch sees the devices a fresh worker would: its own two, or the machine's
    assert len(devices["a0"].split(",")) == 2 and devices["b0"] == "-", devices


def test_a_session_that_ends_early_leaves_its_batches_to_fresh_workers(tmp_path):
    suite = _suite(tmp_path)
    result, collections, ran = _run(suite, tmp_path, SESSION_DIES="1")
    assert _outcomes(result) == EXPECTED, result.stdout
    # every batch collected in its own worker
    assert [how for _, how in collections].count("other") == 3, collections
    assert "session" not in [how for _, how in collections]


def test_tests_the_session_did_not_collect_run_in_a_fresh_worker(tmp_path):
    suite = _suite(tmp_path)
    result, collections, ran = _run(suite, tmp_path, SESSION_SKIPS="test_b.py")
    assert _outcomes(result) == EXPECTED, result.stdout
    session_pid = next(pid for pid, how in collections if how == "session")
    by_test = {test: parent for _, parent, test, _ in ran}
    assert {by_test[f"a{i}"] for i in range(3)} == {session_pid}, ran
    assert session_pid not in {by_test[f"b{i}"] for i in range(3)}, ran


def test_the_session_leaves_with_the_run(tmp_path):
    suite = _suite(tmp_path)
    result, collections, _ = _run(suite, tmp_path)
    assert _outcomes(result) == EXPECTED, result.stdout
    session_pid = int(next(pid for pid, how in collections if how == "session"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(session_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(session_pid, signal.SIGKILL)
        raise AssertionError("the local session outlived its run")
    # its mailbox went with it
    assert list((suite / "work_dirs" / ".agents" / "local").iterdir()) == []


def test_a_hung_batch_is_killed_at_its_timeout(tmp_path):
    suite = _suite(tmp_path)
    begin = time.monotonic()
    result, collections, ran = _run(suite, tmp_path, "--trtllm-monitor-timeout=3s",
                                    "--trtllm-max-retries=0", HANGS="b1")
    assert time.monotonic() - begin < 60, result.stdout
    outcomes = _outcomes(result)
    assert outcomes["test_b.py::test_b[1]"] == "failed", result.stdout
    assert all(outcomes[f"test_a.py::test_a[{i}]"] == "passed" for i in range(3)), outcomes
    session_pid = next(pid for pid, how in collections if how == "session")
    hung = next(pid for pid, parent, test, _ in ran if test == "b1")
    assert next(parent for _, parent, test, _ in ran if test == "b1") == session_pid
    try:
        os.kill(int(hung), 0)
    except ProcessLookupError:
        pass
    else:
        os.kill(int(hung), signal.SIGKILL)
        raise AssertionError(f"the hung batch's process {hung} outlived its timeout")
