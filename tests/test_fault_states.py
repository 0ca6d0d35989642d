"""How fault states are read (pure functions; the drills on the dev cluster are in
tests/test_faults.py): a signal is a crash named by its signal, a cancel we asked for stays
a cancel, and reports stamped after a job's end (or after the scheduler's last word that
it runs) do not count."""

from __future__ import annotations

from pathlib import Path

from pytest_trtllm_slurm.execution.monitor import Monitor, WatchedJob, records_before
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, signal_of_exit_code
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.scripts import SlurmOptions
from pytest_trtllm_slurm.execution.slurm.jobs import AcctRow
from pytest_trtllm_slurm.execution.slurm.tracking import TrackedJob, exit_code_state, final_state
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario


def _job(tmp_path: Path, *, cancelled: bool = False) -> TrackedJob:
    spec = JobSpec(scenario=Scenario.LOCAL_SLURM, name="b", job_name="a.b", command=["true"],
                   rootdir=str(tmp_path), work_dir=str(tmp_path), log_path=str(tmp_path / "l"),
                   reports_path=str(tmp_path / "r"))
    job = TrackedJob(JobHandle(job_id="5~1", spec=spec, submitted_at=0.0),
                     SlurmOptions("gres", None, None, (), None), step_id="5.3")
    job.cancelled = cancelled
    return job


def test_a_step_a_segfault_ended_is_a_crash_named_by_its_signal(tmp_path: Path) -> None:
    state = final_state(_job(tmp_path), AcctRow("5.3", "CANCELLED", 0, 11, "n1"), exit_code=139)
    assert state.status is JobStatus.CRASHED and state.signal == 11
    assert state.exit_code is None and "killed by signal 11 (SIGSEGV)" in (state.reason or "")
    cancelled = final_state(_job(tmp_path, cancelled=True), AcctRow("5.3", "CANCELLED", 0, 9, "n1"))
    assert cancelled.status is JobStatus.CANCELLED
    assert exit_code_state(_job(tmp_path), 134).status is JobStatus.CRASHED  # SIGABRT
    assert exit_code_state(_job(tmp_path), 3).status is JobStatus.FAILED
    assert (signal_of_exit_code(139), signal_of_exit_code(-6), signal_of_exit_code(1)) == (
        11, 6, None)


def _report(nodeid: str, stop: float) -> dict:
    return {"type": "report", "data": {"nodeid": nodeid, "stop": stop}}


def test_reports_after_the_end_do_not_count_and_wait_for_the_schedulers_word(
        tmp_path: Path) -> None:
    records = [{"type": "start", "nodeid": "a"}, _report("a", 10.0), {"type": "finish"},
               {"type": "start", "nodeid": "b"}, _report("b", 12.0), {"type": "finish"}]
    assert records_before(records, 11.0) == records[:4]  # b's start counts: b was running
    job = WatchedJob(handle=JobHandle(job_id="5~1", spec=_job(tmp_path).handle.spec,
                                      submitted_at=0.0), executor=None)  # type: ignore[arg-type]
    job.state = JobState(status=JobStatus.RUNNING, alive_at=11.0)
    assert Monitor._hold(job, records) == records[:4] and job.held == records[4:]
    job.state = JobState(status=JobStatus.RUNNING, alive_at=13.0)
    assert Monitor._hold(job, []) == records[4:] and job.held == []


def test_a_test_line_whose_last_report_stopped_after_the_end_does_not_count(
        tmp_path: Path) -> None:
    """A test's reports in one ``item`` line count by the last of them: a line whose
    teardown stopped after the scheduler's end (or after its last word that the allocation
    runs) is dropped, or held, whole, with everything after it."""
    def item(nodeid: str, *stops: float) -> dict:
        return {"type": "item", "nodeid": nodeid, "finish": True, "done": True,
                "reports": [{"nodeid": nodeid, "stop": stop} for stop in stops]}

    records = [{"type": "start", "nodeid": "a"}, item("a", 9.0, 9.5, 10.0),
               {"type": "start", "nodeid": "b"}, item("b", 10.5, 11.5, 12.0),
               {"type": "start", "nodeid": "c"}]
    assert records_before(records, 11.0) == records[:3]
    job = WatchedJob(handle=JobHandle(job_id="5~2", spec=_job(tmp_path).handle.spec,
                                      submitted_at=0.0), executor=None)  # type: ignore[arg-type]
    job.state = JobState(status=JobStatus.RUNNING, alive_at=11.0)
    assert Monitor._hold(job, records) == records[:3] and job.held == records[3:]
    assert records_before([item("x", "late", None), {"type": "item", "reports": "no"}],
                          1.0) == [item("x", "late", None), {"type": "item", "reports": "no"}]
