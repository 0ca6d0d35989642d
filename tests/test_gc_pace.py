"""The garbage collector's pace (controller/gc_pace.py): the controller replays with fewer
collections of the old generation and none inside a pump (the one put off runs after it);
the tests, dispatched or run in the controller, see Python's own pace."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
from dispatch_helpers import run_suite

from pytest_trtllm_slurm.controller.gc_pace import (
    REPLAY_THRESHOLDS,
    held_for_a_pump,
    own_pace,
    replay_pace,
)

CONFTEST = '''
import gc
import json
import os


def pytest_runtest_logreport(report):
    if report.when == "call":
        where = "worker" if os.environ.get("TRTLLM_SLURM_WORKER") else "controller"
        with open(os.environ["PACES"], "a") as out:
            out.write(json.dumps([where, "logreport", gc.get_threshold()]) + "\\n")
            out.write(json.dumps([where, "collecting", gc.isenabled()]) + "\\n")
'''
TESTS = '''
import gc
import json
import os


def test_records_its_pace():
    with open(os.environ["PACES"], "a") as out:
        out.write(json.dumps(["test", "body", gc.get_threshold()]) + "\\n")
        out.write(json.dumps(["test", "collecting", gc.isenabled()]) + "\\n")
'''


def test_the_controller_replays_at_its_pace_and_the_test_runs_at_pythons(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_pace.py").write_text(TESTS)
    paces = tmp_path / "paces.jsonl"
    run = run_suite(tmp_path, "--trtllm-remote", "--trtllm-dispatch=all",
                    "--trtllm-scenario=local_direct", env={"PACES": str(paces)})
    assert run.returncode == 0, run.stdout
    seen = [json.loads(line) for line in paces.read_text().splitlines()]
    python_default = list(gc.get_threshold())
    assert ["test", "body", python_default] in seen, seen
    assert ["controller", "logreport", list(REPLAY_THRESHOLDS)] in seen, seen
    assert ["worker", "logreport", python_default] in seen, seen
    # the replay's hooks run inside a pump, where nothing is collected; the test, not
    assert ["controller", "collecting", False] in seen, seen
    assert ["test", "collecting", True] in seen, seen
    assert ["worker", "collecting", True] in seen, seen


def test_a_test_run_in_the_controller_gets_pythons_pace_back() -> None:
    before = gc.get_threshold()
    with replay_pace() as replaced:
        assert gc.get_threshold() == REPLAY_THRESHOLDS
        with own_pace(replaced):
            assert gc.get_threshold() == before
        assert gc.get_threshold() == REPLAY_THRESHOLDS
    assert gc.get_threshold() == before


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def _cycles(count: int) -> list[weakref.finalize]:
    """``count`` cycles made garbage at once; their finalizers say when they were freed."""
    made = [_Cycle() for _ in range(count)]
    freed = [weakref.finalize(cycle, lambda: None) for cycle in made]
    del made
    return freed


@pytest.fixture
def collector_on():
    """The collector on at the replay's thresholds, as in a replay, put back after."""
    was = gc.isenabled()
    gc.enable()
    with replay_pace():
        gc.collect()
        yield
    if not was:
        gc.disable()


def test_a_pump_collects_nothing_inside_and_what_came_due_after(collector_on) -> None:
    with held_for_a_pump():
        assert not gc.isenabled()
        freed = _cycles(3 * REPLAY_THRESHOLDS[0])  # a collection is due when the pump ends
        assert all(f.alive for f in freed)  # not collected inside the pump
    assert gc.isenabled()
    assert not any(f.alive for f in freed)  # collected as the pump ended
    assert gc.get_count()[0] < REPLAY_THRESHOLDS[0]


def test_a_pump_that_made_little_leaves_it_to_the_collector(collector_on) -> None:
    with held_for_a_pump():
        freed = _cycles(10)
    assert gc.isenabled()
    assert all(f.alive for f in freed)  # nothing was due: no collection of its own
    gc.collect()
    assert not any(f.alive for f in freed)


def test_a_collector_the_suite_turned_off_stays_off(collector_on) -> None:
    gc.disable()
    try:
        with held_for_a_pump():
            freed = _cycles(3 * REPLAY_THRESHOLDS[0])
        assert not gc.isenabled()
        assert all(f.alive for f in freed)
    finally:
        gc.enable()
    gc.collect()
