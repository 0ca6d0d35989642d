"""SIGTERM, SIGHUP and SIGKILL of a real controller on the real dev cluster.

A CI system ends a run with SIGTERM (abort, timeout), a closed terminal sends SIGHUP: both
must do what Ctrl-C does (cancel this run's jobs and its allocation request that was never
granted, print the summary, exit 2). After a SIGKILL nothing can run, so the next run
cancels what the killed one left in the queue, and says so. A run waiting behind the
user's own persistent allocation says whose it is and how to release it.

The waits are made real: a "blocker" allocation of the test (named like a persistent
allocation of another checkout) holds a gb200 node, and the batches want both gb200 nodes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from devcluster import run as sh
from devcluster import squeue_state

SUITE = {
    "pytest.ini": "[pytest]\nmarkers =\n    trtllm_slurm: resources\n",
    "test_two_nodes.py": (
        "import pytest\n\n\n@pytest.mark.trtllm_slurm(devices=8, nodes=2)\n"
        "def test_two_nodes():\n    pass\n"),
    "test_one.py": (
        "import pytest\n\n\n@pytest.mark.trtllm_slurm(devices=1)\ndef test_one():\n    pass\n"),
    "test_here.py": "def test_here():\n    pass\n",
}


def make_suite(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in SUITE.items():
        (path / name).write_text(text)
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}


class Controller:
    """A pytest controller process whose output goes to a file (read while it runs)."""

    def __init__(self, suite: Path, *args: str) -> None:
        self.out = suite / f"controller-{uuid.uuid4().hex[:6]}.log"
        self.fh = self.out.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
            cwd=suite, stdout=self.fh, stderr=subprocess.STDOUT, env=_env(),
            stdin=subprocess.DEVNULL)

    @property
    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = re.search(pattern, self.text)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        self.proc.kill()
        pytest.fail(f"never printed {pattern!r}:\n{self.text}")

    def finish(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.fh.close()


def gone_from_queue(job_id: str, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = squeue_state(job_id)
        if state is None or state[0] in ("CANCELLED", "COMPLETED", "COMPLETING"):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture
def blocker(devcluster: dict) -> Iterator[str]:
    """A gb200 node held by an allocation that looks like another checkout's persistent
    one (the user's own name, another comment): the batches of these tests need both
    gb200 nodes, so they wait behind it."""
    res = sh(["salloc", "--no-shell", "--immediate=120", "-p", "gb200", "-N", "1",
              "--exclusive", "--mem=0", "-t", "10", "-A", devcluster["default_account"],
              f"--job-name={devcluster['default_account']}-trtllm.persistent",
              "--comment=trtllm-slurm:another-checkout"], check=False, timeout=150)
    found = re.search(r"Granted job allocation (\d+)", res.stderr + res.stdout)
    if not found:
        pytest.fail(f"could not hold a gb200 node (shared cluster busy?): {res.stderr}")
    yield found.group(1)
    sh(["scancel", found.group(1)], check=False)


def _next_run_cancels(suite: Path, job_id: str, killed_pid: int) -> None:
    """The next run (one-shot, another partition) passes and says it cancelled ``job_id``,
    left in the queue by the run with pid ``killed_pid``."""
    nxt = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--trtllm-one-shot", "--slurm-partition=batch", "-k", "one"],
        cwd=suite, capture_output=True, text=True, timeout=300, env=_env(), check=False)
    out = nxt.stdout + nxt.stderr
    assert nxt.returncode == 0, out
    assert re.search(rf"Cancelled {job_id}, left in the queue by an earlier run that was "
                     rf"killed \(pid {killed_pid} ", out), out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_cancels_the_pending_one_shot_job_and_prints_the_summary(
        blocker: str, tmp_path: Path, signum: int) -> None:
    suite = make_suite(tmp_path / "suite")
    ctl = Controller(suite, "--trtllm-remote", "--trtllm-one-shot", "--slurm-partition=gb200",
                     "-k", "two_nodes or here")
    # the wait names the user's own allocation that holds the nodes, and what to do (17.6)
    found = ctl.wait_for(rf"job (\d+) \[[^\]]+\] on gb200: PENDING \([^)]*your own persistent "
                         rf"allocation [^)]*{blocker}")
    job_id = found.group(1)
    assert "trtllm-slurm alloc release" in ctl.text and "without --trtllm-one-shot" in ctl.text
    assert squeue_state(job_id) is not None
    ctl.proc.send_signal(signum)
    code = ctl.finish()
    out = ctl.text
    assert code == 2, out  # pytest's "interrupted"
    assert f"{signal.Signals(signum).name} received" in out, out
    assert re.search(r"=+ .*1 passed.* in [\d.]+s", out), out  # the summary of what finished
    assert gone_from_queue(job_id), f"job {job_id} is still queued: {squeue_state(job_id)}"
    assert not list((suite / "work_dirs" / ".runs").glob("*.json"))  # its record went too


def test_after_a_sigkill_the_next_run_cancels_what_the_killed_one_left(
        blocker: str, tmp_path: Path) -> None:
    suite = make_suite(tmp_path / "suite")
    ctl = Controller(suite, "--trtllm-remote", "--trtllm-one-shot", "--slurm-partition=gb200",
                     "-k", "two_nodes")
    job_id = ctl.wait_for(r"job (\d+) \[[^\]]+\] on gb200: PENDING").group(1)
    ctl.proc.kill()
    ctl.finish()
    time.sleep(1)
    assert squeue_state(job_id) is not None, "a SIGKILL leaves the job queued"
    _next_run_cancels(suite, job_id, ctl.proc.pid)
    assert gone_from_queue(job_id), squeue_state(job_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_allocation_request_that_was_never_granted_is_cancelled(
        blocker: str, tmp_path: Path, signum: int) -> None:
    """Persistent mode: the allocation request waits behind the user's own allocation of
    another checkout; the wait says so (and since when). SIGTERM cancels the request at
    once; after a SIGKILL the next run does."""
    suite = make_suite(tmp_path / "suite")
    ctl = Controller(suite, "--trtllm-remote", "--slurm-partition=gb200", "-k", "two_nodes")
    found = ctl.wait_for(r"Waiting since \d\d:\d\d:\d\d for the persistent allocation (\d+) "
                         r"\(PENDING [^)]*\) on gb200\. Your own persistent allocation [^\n]*"
                         + blocker, timeout=90)
    request = found.group(1)
    assert f"Allocation {blocker} (RUNNING) has our name but belongs to another checkout" in (
        ctl.text)
    ctl.proc.send_signal(signum)
    code = ctl.finish()
    out = ctl.text
    if signum == signal.SIGTERM:
        assert code == 2, out
        assert f"Cancelled the allocation request {request} that was not granted" in out, out
    else:
        assert squeue_state(request) is not None, "a SIGKILL leaves the request queued"
        _next_run_cancels(suite, request, ctl.proc.pid)
    assert gone_from_queue(request), squeue_state(request)
    assert not (suite / "work_dirs" / ".slurm_alloc.json").exists()
    assert squeue_state(blocker)[0] == "RUNNING"  # the other checkout's allocation stays


def test_after_a_sigkill_the_next_run_cancels_the_killed_runs_warm_batches(
        devcluster: dict, tmp_path: Path) -> None:
    """Warm workers (the default): the killed run's batch keeps its GPU in the allocation
    until the next run cancels it through the session's inbox."""
    suite = make_suite(tmp_path / "suite")
    (suite / "test_sleeps.py").write_text(
        "import os, pathlib, time, pytest\n\n\n@pytest.mark.trtllm_slurm(devices=1)\n"
        "def test_sleeps():\n"
        "    pathlib.Path(__file__).with_name('sleeper.pid').write_text(str(os.getpid()))\n"
        "    time.sleep(300)\n")
    state_file = suite / "work_dirs" / ".slurm_alloc.json"
    try:
        ctl = Controller(suite, "--trtllm-remote", "--slurm-partition=batch", "-k", "sleeps")
        end = time.monotonic() + 180
        while not (suite / "sleeper.pid").exists():
            assert time.monotonic() < end and ctl.proc.poll() is None, ctl.text
            time.sleep(0.3)
        ctl.proc.kill()
        ctl.finish()
        pid = int((suite / "sleeper.pid").read_text())
        assert Path(f"/proc/{pid}").exists(), "a SIGKILL leaves the batch running"
        nxt = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
             "--slurm-partition=batch", "-k", "one"],
            cwd=suite, capture_output=True, text=True, timeout=300, env=_env(), check=False)
        out = nxt.stdout + nxt.stderr
        assert nxt.returncode == 0, out
        assert re.search(rf"Cancelled 1 warm-worker batch\(es\) of an earlier run that was "
                         rf"killed \(pid {ctl.proc.pid} ", out), out
        end = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < end, f"the killed run's test (pid {pid}) still runs"
            time.sleep(0.3)
    finally:
        if state_file.exists():  # never leave our allocation behind on the shared cluster
            import json
            sh(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)
