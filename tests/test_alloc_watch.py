"""The allocation watch on the dev cluster: a warm batch's end is shown only once the
scheduler, asked after it ended, still had the allocation running (a DOWN node's
processes may live on and write files), and the run's last result waits for nothing
more than that one look."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from devcluster import example_suite

pytestmark = pytest.mark.devcluster

REPO = Path(__file__).resolve().parent.parent

ONE_GPU = '''import pytest


@pytest.mark.skip_less_device(1)
def test_one_gpu():
    pass
'''

# The controller's polls of the Slurm executor and its looks at the allocation, recorded
# from inside the run. The watch's regular look and its gap are set far beyond the run
# (20 s; 2.0 s and 0.5 s by default), so the only looks are the first one and those the
# ended batch asks for.
RECORD = '''

import json as _json
import time as _time
from dataclasses import replace as _replace


def pytest_configure(config):
    if config.getoption("trtllm_worker_reports", default=None):
        return
    from pytest_trtllm_slurm.execution.slurm import alloc_watch
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor
    from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs

    alloc_watch.CADENCE = _replace(alloc_watch.CADENCE, alloc_watch=20.0, alloc_watch_gap=20.0)
    seen = {"looks": [], "ends": {}, "waiting_polls": 0, "shown": {}}
    poll, look = SlurmExecutor.poll, SlurmJobs.scontrol_job

    def recorded_poll(self, handles):
        states = poll(self, handles)
        for handle in handles:
            job = self._jobs.get(handle.job_id)
            if job is None or job.alloc is None or not job.state.status.finished:
                continue
            seen["ends"][handle.job_id] = job.ended_wall
            if states[handle.job_id].status.finished:
                seen["shown"].setdefault(handle.job_id, _time.time())
            else:
                seen["waiting_polls"] += 1
        return states

    def recorded_look(self, job_id):
        asked = _time.time()
        row = look(self, job_id)
        seen["looks"].append([asked, row.state if row is not None else None])
        return row

    SlurmExecutor.poll, SlurmJobs.scontrol_job = recorded_poll, recorded_look
    config.add_cleanup(lambda: (config.rootpath / "watch.json").write_text(_json.dumps(seen)))
'''


@pytest.fixture
def warm_suite(devcluster: dict, tmp_path: Path):
    with example_suite(tmp_path / "warm", ONE_GPU, RECORD) as suite:
        yield suite


def test_the_last_result_is_shown_in_the_round_that_sees_its_end_after_one_look(
        warm_suite: Path) -> None:
    """One warm 1-GPU test: its batch's end is shown in the executor's poll that sees it
    (at most one more poll for its reports), after exactly one ``scontrol show job``
    asked after that end which found the allocation running; no wait for the watch's
    gap since the look before (20 s here: the run would wait that long)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--slurm-partition=gb200"],
        cwd=warm_suite, capture_output=True, text=True, timeout=300, env=base, check=False)
    out = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, out
    assert "PASSED test_warm.py::test_one_gpu" in proc.stdout, out
    seen = json.loads((warm_suite / "watch.json").read_text())
    [(job_id, ended)] = seen["ends"].items()
    assert ended is not None and job_id in seen["shown"], seen
    after = [state for asked, state in seen["looks"] if ended <= asked <= seen["shown"][job_id]]
    assert after == ["RUNNING"], seen  # the guarantee: the scheduler, asked after the end
    assert seen["waiting_polls"] <= 1, seen  # main: every round for the 20 s gap
