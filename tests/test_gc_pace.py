"""The garbage collector's pace (controller/gc_pace.py): the controller replays with fewer
collections of the old generation; the tests, dispatched or run in the controller, see
Python's own pace."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from dispatch_helpers import run_suite

from pytest_trtllm_slurm.controller.gc_pace import REPLAY_THRESHOLDS, own_pace, replay_pace

CONFTEST = '''
import gc
import json
import os


def pytest_runtest_logreport(report):
    if report.when == "call":
        where = "worker" if os.environ.get("TRTLLM_SLURM_WORKER") else "controller"
        with open(os.environ["PACES"], "a") as out:
            out.write(json.dumps([where, "logreport", gc.get_threshold()]) + "\\n")
'''
TESTS = '''
import gc
import json
import os


def test_records_its_pace():
    with open(os.environ["PACES"], "a") as out:
        out.write(json.dumps(["test", "body", gc.get_threshold()]) + "\\n")
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


def test_a_test_run_in_the_controller_gets_pythons_pace_back() -> None:
    before = gc.get_threshold()
    with replay_pace() as replaced:
        assert gc.get_threshold() == REPLAY_THRESHOLDS
        with own_pace(replaced):
            assert gc.get_threshold() == before
        assert gc.get_threshold() == REPLAY_THRESHOLDS
    assert gc.get_threshold() == before
