"""The end of a dispatched run costs what the end of a plain one does, or less.

pytest's unraisable-exception cleanup collects garbage five times over every object the
collector tracks. In a plain run those are the tests' own objects; in a dispatched run they
would be the replayed reports and the junit tree, which the controller freezes instead
(the tests ran in workers): at 2,000 tests this was ~1 s of the run's end. The early start
asks the warm agents for their sessions in a thread, so that the suite's import does not
wait for those writes (its behaviour end to end: ``test_warm_workers``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dispatch_helpers import run_suite

from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions

DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
TESTS = 600
SUITE = '''import pytest


@pytest.mark.parametrize("i", range({n}))
def test_item(i):
    assert i >= 0
'''
# records, in the controller only, how many objects pytest's final collections go over
CONFTEST = '''import gc
import json
import os

import _pytest.unraisableexception as unraisable


def pytest_configure(config):
    if config.getoption("trtllm_worker_reports", default=None):
        return  # a worker
    collect = unraisable.gc_collect_harder

    def counted(iterations):
        with open(os.environ["GC_SEEN"], "w") as out:
            json.dump({"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}, out)
        collect(iterations)

    unraisable.gc_collect_harder = counted
'''


def _suite(root: Path) -> Path:
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_many.py").write_text(SUITE.format(n=TESTS))
    return root


def test_pytests_last_collections_skip_a_dispatched_runs_replayed_reports(
        tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    seen = {}
    for tag, args in (("plain", []), ("dispatched", DISPATCH)):
        out = tmp_path / f"{tag}.gc.json"
        run = run_suite(suite, "-p", "no:cacheprovider", *args, tag=tag,
                        env={"GC_SEEN": str(out)})
        assert run.returncode == 0, run.stdout[-3000:]
        assert sum(r["when"] == "call" and r["outcome"] == "passed"
                   for r in run.reports) == TESTS, run.stdout[-3000:]
        seen[tag] = json.loads(out.read_text())
    # plain: every report and item is still tracked when pytest collects at its end
    assert seen["plain"]["tracked"] > 3 * TESTS, seen
    # dispatched: the same run's reports are frozen by then, a small rest tracked
    assert seen["dispatched"]["tracked"] < seen["plain"]["tracked"] / 10, seen
    assert seen["dispatched"]["frozen"] > 3 * TESTS, seen


DRIVER = '''import gc
import sys

import pytest

codes = []
for _ in range(2):
    codes.append(int(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])))
    print("FROZEN", gc.get_freeze_count(), flush=True)
print("CODES", codes)
'''


def test_an_in_process_dispatched_run_leaves_nothing_frozen(tmp_path: Path) -> None:
    """pytest.main() twice in one process: each returns with the collector as it found it."""
    suite = _suite(tmp_path)
    (suite / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["GC_SEEN"] = str(tmp_path / "gc.json")
    proc = subprocess.run([sys.executable, "driver.py", *DISPATCH], cwd=suite, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "CODES [0, 0]" in out, out[-3000:]
    assert [ln for ln in out.splitlines() if ln.startswith("FROZEN")] == ["FROZEN 0"] * 2, out
    assert json.loads((tmp_path / "gc.json").read_text())["frozen"] > 3 * TESTS


def test_the_early_sessions_are_asked_for_beside_and_looked_at_after() -> None:
    sessions = EarlySessions()
    release = threading.Event()

    def fill() -> None:
        release.wait(5)
        sessions.remember("/w/.agents/7/n1-x", "/w/.agents/7/n1-x/sessions/early-1")

    start = time.monotonic()
    sessions.fill_beside(fill)
    assert time.monotonic() - start < 1  # the caller goes on (the suite imports)
    threading.Timer(0.3, release.set).start()
    assert sessions.on_allocation("7")  # waited for the fill, then looked
    assert sessions.take("/w/.agents/7/n1-x") == "/w/.agents/7/n1-x/sessions/early-1"
    assert list(sessions.drain()) == []


def test_what_the_early_fill_raised_is_raised_where_the_sessions_are_looked_at() -> None:
    sessions = EarlySessions()

    def fill() -> None:
        raise RuntimeError("a bug in the early start")

    sessions.fill_beside(fill)
    with pytest.raises(RuntimeError, match="a bug in the early start"):
        sessions.take("/w/.agents/7/n1-x")
    assert sessions.take("/w/.agents/7/n1-x") is None  # raised once, then settled


WORKER_SUITE = '''import os

HOLD = []


class Cycle:
    """Garbage only at the session's end: a finalizer pytest's last collections run."""

    def __init__(self):
        self.me = self

    def __del__(self):
        with open(os.environ["FINALIZED"], "a") as out:
            out.write(f"{os.getpid()}\\n")


def test_holds_a_cycle():
    HOLD.append(Cycle())
'''
# records, in the worker only, what pytest's final collections go over; drops the cycle
WORKER_CONFTEST = '''import gc
import json
import os

import _pytest.unraisableexception as unraisable
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    import test_cycle

    test_cycle.HOLD.clear()  # garbage from here on, in a cycle


def pytest_configure(config):
    if not config.getoption("trtllm_worker_reports", default=None):
        return  # the controller
    collect = unraisable.gc_collect_harder

    def counted(iterations):
        with open(os.environ["GC_SEEN"], "w") as out:
            json.dump({"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(),
                       "finalized": os.path.exists(os.environ["FINALIZED"])}, out)
        collect(iterations)

    unraisable.gc_collect_harder = counted
'''


def test_a_workers_last_collections_go_over_what_its_finalizers_leave(tmp_path: Path) -> None:
    """The batch's GPUs wait for the worker's exit: pytest's five collections there skip
    the suite's imports, and a garbage cycle's finalizer still runs before them."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(WORKER_CONFTEST)
    (tmp_path / "test_cycle.py").write_text(WORKER_SUITE)
    seen, finalized = tmp_path / "gc.json", tmp_path / "finalized.txt"
    # a worker of its own (a warm session's fork ends at its last test's teardown)
    run = run_suite(tmp_path, "-p", "no:cacheprovider", *DISPATCH, "--trtllm-no-warm-workers",
                    tag="worker",
                    env={"GC_SEEN": str(seen), "FINALIZED": str(finalized)})
    assert run.returncode == 0, run.stdout[-3000:]
    worker = json.loads(seen.read_text())
    assert worker["finalized"], worker  # before pytest's own collections
    assert worker["frozen"] > 10_000 and worker["tracked"] < worker["frozen"] / 10, worker
    assert finalized.read_text().split() and str(os.getpid()) not in finalized.read_text()
