"""Early warm-worker sessions over SSH: a warm run on a remote cluster syncs the code and
starts its sessions on the allocation's agents while the controller still imports the
suite, as a local run does; a file changed after those sessions started is never served
from them (they imported the older code). The dev cluster's sshd is the login node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from devcluster import cancel_allocation, publish_ssh_suite

pytestmark = pytest.mark.devcluster

TESTS = '''import pytest

VALUE = "old"


@pytest.mark.trtllm_slurm(devices=1)
def test_one():
    pass


@pytest.mark.trtllm_slurm(devices=1)
def test_value():
    assert VALUE == "new"


@pytest.mark.trtllm_slurm(devices=64)
def test_too_big():
    pass
'''

# the controller (not a worker in the job), told to by the file MODE: wait until this run's
# early session has been asked for on the cluster and its sync ended (the run's record
# names its code), then change the test file
CONFTEST = '''import os
import pathlib
import time

HERE = pathlib.Path(__file__).parent
MODE = pathlib.Path({mode!r})
HOME = pathlib.Path({home!r})

if not os.environ.get("SLURM_JOB_ID") and MODE.exists() and MODE.read_text() == "change":
    mine = ["**/.agents/*/*/sessions/early-%d-*" % os.getpid(),
            ".trtllm-state/**/runs/*-%d-*.json" % os.getpid()]
    deadline = time.monotonic() + 120
    while (not all(any(HOME.glob(m)) for m in mine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    test = HERE / "test_early.py"
    test.write_text(test.read_text().replace('VALUE = "old"', 'VALUE = "new"'))
'''


def make_suite(base: Path, ssh: dict[str, Any]) -> Path:
    suite = base / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    trtllm_slurm: resources (pytest-trtllm-slurm)\n")
    (suite / "test_early.py").write_text(TESTS)
    (suite / "conftest.py").write_text(CONFTEST.format(mode=str(base / "mode"),
                                                       home=str(base / "cluster_home")))
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    return publish_ssh_suite(suite, base, ssh)


def run(suite: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           "--slurm-cluster=devssh", *args], cwd=suite, capture_output=True,
                          text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def sessions(home: Path) -> set[Path]:
    return set(home.glob("**/work_dirs/.agents/*/*/sessions/*"))


def test_early_sessions_over_ssh_serve_the_run_and_never_stale_code(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    home = tmp_path / "cluster_home"
    suite = make_suite(tmp_path, devcluster["ssh"])
    try:
        run(suite, "-k", "test_one")  # the allocation and its agents
        before = sessions(home)
        out = run(suite, "-k", "test_one")
        assert "PASSED test_early.py::test_one" in out
        new = sessions(home) - before
        # the run asked for no session of its own: the early one served the batch
        assert new and all(p.name.startswith("early-") for p in new), (new, out)

        (tmp_path / "mode").write_text("change")
        before = sessions(home)
        out = run(suite, "-k", "test_value")
        assert "PASSED test_early.py::test_value" in out, out  # the changed file ran
        new = sessions(home) - before
        early = [p for p in new if p.name.startswith("early-")]
        later = [p for p in new if not p.name.startswith("early-")]
        assert early and later, (new, out)
        assert all((p / "inbox" / "stop").exists() for p in early), out  # told to stop

        # planning connects (discovery, its cache gone) but no test is served there: the
        # sessions started while the suite was imported are stopped at the end all the same
        (tmp_path / "mode").write_text("")
        for cached in suite.glob("work_dirs/.cache/slurm_env-remote-*.json"):
            cached.unlink()
        before = sessions(home)
        out = run(suite, "-k", "test_too_big")
        assert "SKIPPED" in out and "64" in out, out
        early = [p for p in sessions(home) - before if p.name.startswith("early-")]
        assert early, out
        assert all((p / "inbox" / "stop").exists() for p in early), out
    finally:
        cancel_allocation(home)


# git runs this before each `git status` in the cluster's checkout (its fsmonitor hook):
# the claim's look at the checkout (the one git status run with GIT_OPTIONAL_LOCKS=0)
# takes about 3 s (git asks it twice), as a large checkout on a shared file system may;
# exit 1 says "no answer", so git scans the files itself
SLOW_LOOK = '#!/bin/sh\n[ "$GIT_OPTIONAL_LOCKS" = 0 ] && sleep 3\nexit 1\n'


def test_the_early_session_is_asked_for_while_the_claim_looks_at_the_checkout(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    """The warm worker's session is requested once the run holds the checkout's lock, not
    after the claim's look at the checkout (its `git status`) ends, and serves the batch
    when that look proves the checkout holds the run's code; when the sync then changes
    the checkout, that session is stopped and a new one serves the changed code."""
    home = tmp_path / "cluster_home"
    suite = make_suite(tmp_path, devcluster["ssh"])
    try:
        run(suite, "-k", "test_one")  # the allocation, its agents and the checkout
        checkout = next(p.parent for p in home.glob("*/.git"))
        hook = checkout / ".git" / "slow-look"
        hook.write_text(SLOW_LOOK)
        hook.chmod(0o700)
        subprocess.run(["git", "-C", str(checkout), "config", "core.fsmonitor", str(hook)],
                       check=True)
        claim_out = next(home.glob(".trtllm-state/**/runs/.checkout.lock.out"))

        before = sessions(home)
        out = run(suite, "-k", "test_one")
        assert "PASSED test_early.py::test_one" in out
        new = sessions(home) - before
        assert new and all(p.name.startswith("early-") for p in new), (new, out)
        ready = min((p / "ready").stat().st_mtime for p in new)  # collected, serving
        looked = claim_out.stat().st_mtime  # the claim's look ended (its output written)
        # the session started while git status still ran there (about 6 s with the hook:
        # a margin for a slow machine; 5.8 s to spare here)
        assert ready < looked, (ready, looked, out)

        # the code changed before the run: the session asked for beside the claim may
        # have read the old files, so it is stopped; the test runs the new code
        test = suite / "test_early.py"
        test.write_text(test.read_text().replace('VALUE = "old"', 'VALUE = "new"'))
        before = sessions(home)
        out = run(suite, "-k", "test_value")
        assert "PASSED test_early.py::test_value" in out, out
        early = sorted(p for p in sessions(home) - before if p.name.startswith("early-"))
        assert len(early) >= 2, (early, out)
        stopped = [p for p in early if (p / "inbox" / "stop").exists()]
        assert stopped, (early, out)
    finally:
        cancel_allocation(home)
