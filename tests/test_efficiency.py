"""The run record's arithmetic: GPU use, queue and start-up, the status line and its ETA,
for a run told through the record's own calls (a clock the test sets, pytest's own
TestReport objects)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_trtllm_slurm.controller.efficiency import efficiency, summary_lines
from pytest_trtllm_slurm.controller.run_observer import RunObserver
from pytest_trtllm_slurm.controller.status_line import status_text
from pytest_trtllm_slurm.controller.timeline import lay_out, waits
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.planning.batching import Batch, BatchKey
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.packing import Pool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(gpus: int, nodes: int = 1) -> BatchKey:
    return BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", total_devices=gpus * nodes,
                    devices_per_node=gpus, node_count=nodes)


def report(nodeid: str, when: str, outcome: str, start: float, stop: float) -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("t.py", 1, nodeid), {}, outcome, None, when,
                             start=start, stop=stop, duration=stop - start)


def run_test(record: RunObserver, nodeid: str, start: float, stop: float,
             outcome: str = "passed") -> None:
    record.pytest_runtest_logreport(report(nodeid, "setup", "passed", start, start + 0.5))
    record.pytest_runtest_logreport(report(nodeid, "call", outcome, start + 0.5, stop - 0.5))
    record.pytest_runtest_logreport(report(nodeid, "teardown", "passed", stop - 0.5, stop))
    record.pytest_runtest_logfinish(nodeid)


def two_batches(pool: Pool) -> tuple[RunObserver, Clock]:
    """A 4-GPU batch (2 tests) and a 1-GPU batch (1 failing test), both in ``pool``."""
    clock = Clock()
    record = RunObserver(clock=clock)
    wide = Batch(key=key(4), nodeids=["t.py::a", "t.py::b"], expected_seconds=30.0,
                 expected_start=0.0)
    narrow = Batch(key=key(1), nodeids=["t.py::c"], expected_seconds=20.0, expected_start=0.0)
    record.plan([wide, narrow], lambda k: pool, lower_bound=25.0)
    record.submitted("11", wide, 0)
    record.submitted("12", narrow, 0)
    clock.now = 1002.0
    record.changed("11", JobState(status=JobStatus.RUNNING, nodelist="n1"))
    record.changed("12", JobState(status=JobStatus.PENDING, reason="Resources"))
    clock.now = 1005.0
    record.changed("12", JobState(status=JobStatus.RUNNING, nodelist="n2"))
    return record, clock


def test_one_shot_jobs_hold_their_own_gpus_while_they_run() -> None:
    record, clock = two_batches(Pool("local_slurm/batch/one-shot", nodes=2, gpus_per_node=4))
    run_test(record, "t.py::a", 1004.0, 1014.0)  # start-up 2 s, then 10 s + 6 s of tests
    run_test(record, "t.py::b", 1014.0, 1020.0)
    run_test(record, "t.py::c", 1006.0, 1011.0, outcome="failed")  # start-up 1 s
    clock.now = 1021.0
    record.ended("11", JobState(status=JobStatus.COMPLETED))
    clock.now = 1012.0
    record.ended("12", JobState(status=JobStatus.COMPLETED))
    record.finish()
    eff = efficiency(record)
    assert eff.gpu_seconds_allocated == 4 * (1021 - 1002) + 1 * (1012 - 1005)  # 83
    assert eff.gpu_seconds_busy == 4 * 16 + 1 * 5  # 69
    assert eff.ratio == round(69 / 83, 3)
    assert (eff.queue_seconds_total, eff.queue_seconds_max) == (7.0, 5.0)
    assert (eff.startup_seconds_total, eff.startup_seconds_max) == (3.0, 2.0)
    assert (eff.makespan_seconds, eff.expected_makespan_seconds, eff.lower_bound_seconds) == (
        21.0, 30.0, 25.0)
    assert summary_lines(eff) == [
        "2 batch(es), 3 dispatched test(s)",
        "GPU-seconds allocated 83, busy in tests 69 (83% used)",
        "in queue 7.0 s (longest 5.0 s), in start-up 3.0 s (longest 2.0 s)",
        "makespan 21.0 s (packer expected 30.0 s, lower bound 25.0 s, 0.84x the lower bound; "
        "this run's test times alone need 10.0 s, 2.10x that)",
    ]


def test_a_persistent_allocation_holds_all_its_gpus_from_its_first_batch() -> None:
    record, clock = two_batches(Pool("local_slurm/batch/allocation", nodes=2, gpus_per_node=4))
    run_test(record, "t.py::a", 1004.0, 1014.0)
    run_test(record, "t.py::b", 1014.0, 1020.0)
    run_test(record, "t.py::c", 1006.0, 1011.0)
    clock.now = 1021.0
    record.ended("11", JobState(status=JobStatus.COMPLETED))
    record.ended("12", JobState(status=JobStatus.COMPLETED))
    record.finish()
    assert efficiency(record).gpu_seconds_allocated == 8 * (1021 - 1002)


def test_status_line_as_the_run_goes() -> None:
    record, clock = two_batches(Pool("local_slurm/batch/one-shot", nodes=2, gpus_per_node=4))
    clock.now = 1003.0
    record.changed("12", JobState(status=JobStatus.PENDING, reason="Resources"))
    record.batches["12"].running = None  # as seen at 1003: still pending
    record.pytest_runtest_logreport(report("t.py::a", "setup", "passed", 1003.0, 1003.5))
    assert status_text(record, clock.now) == (
        "trtllm-slurm: batches 1 pending (Resources), 1 running, 0 done | tests 0 passed, "
        "0 failed, 3 left | GPUs 4 held, 4 busy | ETA ~29s")  # the 30 s batch began at 1002
    record.batches["12"].running = 1005.0
    clock.now = 1011.0
    record.pytest_runtest_logreport(report("t.py::a", "call", "failed", 1003.5, 1010.0))
    record.pytest_runtest_logreport(report("t.py::a", "teardown", "passed", 1010.0, 1010.5))
    record.pytest_runtest_logfinish("t.py::a")
    assert status_text(record, clock.now) == (
        "trtllm-slurm: batches 0 pending, 2 running, 0 done | tests 0 passed, 1 failed, "
        "2 left | GPUs 5 held, 0 busy | ETA ~21s")
    assert any("FAILED t.py::a (call)" in text for _, text in record.events)
    clock.now = 1040.0  # late: the ETA is what the running batches still expect
    assert status_text(record, clock.now).endswith("| ETA ~0s")


def test_a_retry_is_an_event_and_a_batch_of_its_own() -> None:
    record, clock = two_batches(Pool("local_slurm/batch/one-shot", nodes=2, gpus_per_node=4))
    clock.now = 1010.0
    record.ended("12", JobState(status=JobStatus.NODE_FAIL, reason="node n2 failed"))
    retry = Batch(key=key(1), nodeids=["t.py::c"], expected_seconds=20.0)
    record.submitted("13", retry, 1)
    assert [text for _, text in record.events][-2:] == [
        "job 12 [batch-1gpu-1n-0] ended NODE_FAIL (node n2 failed)",
        "batch batch-1gpu-1n-0 resubmitted as job 13 (retry 1, 1 test(s))",
    ]
    assert record.job_of["t.py::c"] == "13" and len(record.batches) == 3


def test_waits_are_cut_where_the_reason_changes() -> None:
    """Queue, then a gated step collecting early and waiting at its gate (the warm pool's
    reasons), as the timeline shows them."""
    clock = Clock()
    record = RunObserver(clock=clock)
    wide = Batch(key=key(4, 2), nodeids=["t.py::a"], expected_seconds=30.0)
    record.plan([wide], lambda k: Pool("p/allocation/warm", nodes=2, gpus_per_node=4), None)
    record.submitted("7", wide, 0)
    for now, reason in ((1001.0, "waiting for GPUs in the allocation"),
                        (1003.0, "launched early: its ranks collect while other batches use n1"),
                        (1004.0, "ranks ready, waiting for the batches on n1 to end")):
        clock.now = now
        record.changed("7", JobState(status=JobStatus.PENDING, reason=reason))
    clock.now = 1006.0
    record.changed("7", JobState(status=JobStatus.RUNNING, nodelist="n[1-2]"))
    span = record.batches["7"]
    assert [(a, b, kind) for a, b, _, kind in waits(span, span.running)] == [
        (1000.0, 1003.0, "queue"), (1003.0, 1004.0, "gate"), (1004.0, 1006.0, "gate")]
    assert waits(span, 1006.0)[1][2] == ("gate wait batch-8gpu-2n-0 (job 7): launched early: "
                                        "its ranks collect while other batches use n1")


def test_a_node_has_as_many_gpu_tracks_as_gpus() -> None:
    """The next batches' tests start before the controller sees the previous batch end
    (it polls): they still share the node's 4 GPU tracks, not a fifth and sixth."""
    clock = Clock()
    record = RunObserver(clock=clock)
    pool = Pool("local_slurm/batch/allocation/warm", nodes=1, gpus_per_node=4)
    wide = Batch(key=key(4), nodeids=["t.py::a"])
    narrow = [Batch(key=key(1), index=i, nodeids=[f"t.py::n{i}"]) for i in range(2)]
    record.plan([wide, *narrow], lambda k: pool, None)
    record.submitted("1~w1", wide, 0)
    record.changed("1~w1", JobState(status=JobStatus.RUNNING, nodelist="n1"))
    run_test(record, "t.py::a", 1000.5, 1002.0)
    for i, batch in enumerate(narrow):
        record.submitted(f"1~w{i + 2}", batch, 0)
        clock.now = 1002.1
        record.changed(f"1~w{i + 2}", JobState(status=JobStatus.RUNNING, nodelist="n1"))
        run_test(record, f"t.py::n{i}", 1002.2, 1003.0)
    clock.now = 1002.6  # the wide batch's end seen after the narrow ones began
    record.ended("1~w1", JobState(status=JobStatus.COMPLETED))
    clock.now = 1003.5
    for i in range(2):
        record.ended(f"1~w{i + 2}", JobState(status=JobStatus.COMPLETED))
    laid, slots, _ = lay_out(record)
    assert slots == {"n1": 4}
    assert sorted(t for x in laid for t in x.tracks if x.span.job_id != "1~w1") == [
        ("n1", 0), ("n1", 1)]


def guessed_run(clock: Clock) -> RunObserver:
    """Three 1-GPU tests in two batches, planned on no earlier durations: the packer's
    30 s default per test, its "bound" 165 s (the examples' figure)."""
    record = RunObserver(clock=clock)
    pool = Pool("local_slurm/batch/one-shot", nodes=1, gpus_per_node=4)
    first = Batch(key=key(1), nodeids=["t.py::a", "t.py::b"], expected_seconds=75.0,
                  expected_start=0.0)
    second = Batch(key=key(1), index=1, nodeids=["t.py::c"], expected_seconds=45.0,
                   expected_start=120.0)
    record.plan([first, second], lambda k: pool, lower_bound=165.0,
                guessed="no earlier duration for 3 of 3 test(s)")
    record.submitted("21", first, 0)
    record.submitted("22", second, 0)
    record.changed("21", JobState(status=JobStatus.RUNNING, nodelist="n1"))
    record.changed("22", JobState(status=JobStatus.RUNNING, nodelist="n1"))
    return record


def test_a_guessed_plan_gives_no_eta_until_tests_finish_then_their_pace() -> None:
    """The status line never shows the packer's default guess as an ETA (a 95 s run
    once showed "ETA ~15m01s"): none before a test finished, then the run's own pace."""
    clock = Clock()
    record = guessed_run(clock)
    clock.now = 1001.0
    record.pytest_runtest_logreport(report("t.py::a", "setup", "passed", 1000.5, 1001.0))
    assert status_text(record, clock.now).endswith("| ETA ? (no durations yet)")
    run_test(record, "t.py::a", 1000.5, 1002.5)  # one test in 2 s, two left: ~4 s
    clock.now = 1002.5
    assert status_text(record, clock.now).endswith("| ETA ~4s (from 1 finished test)")
    run_test(record, "t.py::c", 1001.0, 1003.5)
    clock.now = 1003.5
    assert status_text(record, clock.now).endswith("| ETA ~2s (from 2 finished tests)")


def test_a_guessed_plan_is_no_lower_bound() -> None:
    """The examples printed "makespan 1.4 s, lower bound 165.0 s, 0.01x": a bound made of
    default durations. It is named a guess, and the bound shown is the measured one."""
    clock = Clock()
    record = guessed_run(clock)
    run_test(record, "t.py::a", 1000.5, 1001.5)
    run_test(record, "t.py::b", 1000.5, 1001.0)
    run_test(record, "t.py::c", 1000.5, 1001.3)
    clock.now = 1001.6
    record.ended("21", JobState(status=JobStatus.COMPLETED))
    record.ended("22", JobState(status=JobStatus.COMPLETED))
    record.finish()
    eff = efficiency(record)
    assert eff.lower_bound_seconds is None
    assert eff.estimates_guessed == "no earlier duration for 3 of 3 test(s)"
    assert eff.measured_bound_seconds == 1.0  # the longest test (area 2.3 / 4 GPUs is less)
    line = summary_lines(eff)[-1]
    assert line == ("makespan 1.6 s (the packer's guess 165.0 s (no earlier duration for 3 "
                    "of 3 test(s)); this run's test times alone need 1.0 s, 1.60x that)")
    assert "lower bound" not in line


def test_a_run_of_quick_tests_has_a_bound_above_zero() -> None:
    """Tests of a few milliseconds each need a bound of milliseconds, not "0.0 s" (a fast
    machine's example run rounded it to 0.0 and the summary line dropped it)."""
    clock = Clock()
    record = guessed_run(clock)
    for nodeid, stop in (("t.py::a", 1000.53), ("t.py::b", 1000.51), ("t.py::c", 1000.52)):
        for when, began, ended in (("setup", 1000.5, 1000.5), ("call", 1000.5, stop),
                                   ("teardown", stop, stop)):
            record.pytest_runtest_logreport(report(nodeid, when, "passed", began, ended))
        record.pytest_runtest_logfinish(nodeid)
    clock.now = 1000.6
    record.ended("21", JobState(status=JobStatus.COMPLETED))
    record.ended("22", JobState(status=JobStatus.COMPLETED))
    record.finish()
    eff = efficiency(record)
    assert eff.measured_bound_seconds == 0.03
    assert summary_lines(eff)[-1].endswith("this run's test times alone need 0.030 s, 20.00x that)")


def test_estimates_say_what_they_guessed() -> None:
    from pytest_trtllm_slurm.planning.packing import Estimates

    pools = {"warm": Pool("a/allocation/warm", nodes=1, gpus_per_node=4, fixed_startup=0.2),
             "cold": Pool("a/batch/one-shot", nodes=1, gpus_per_node=4)}
    planned = [("t.py::a", "warm"), ("t.py::b", "warm")]
    known = Estimates(durations={"t.py::a": 1.0, "t.py::b": 2.0})
    assert known.guessed(planned, pools.__getitem__) is None
    assert Estimates(durations={"t.py::a": 1.0}).guessed(planned, pools.__getitem__) == (
        "no earlier duration for 1 of 2 test(s)")
    assert known.guessed([("t.py::a", "cold")], pools.__getitem__) == (
        "no earlier start-up time of a/batch/one-shot")
    assert Estimates(durations={"t.py::a": 1.0}, startup={"a/batch/one-shot": 3.0}).guessed(
        [("t.py::a", "cold")], pools.__getitem__) is None


def test_a_terminal_status_line_is_back_after_each_test_and_recounted_twice_a_second(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, pytest's output for a test hides the status line and the test's
    end brings it back; the line's text (a count over every test of the run) is made
    again only when a redraw is due, not once per test: 2,000 replayed tests in one
    burst are not 2,000 counts of 2,000 tests."""
    import io
    import types

    from _pytest.terminal import TerminalReporter

    from pytest_trtllm_slurm.controller.status_line import StatusLine

    out = io.StringIO()
    reporter = TerminalReporter(request.config, file=out)  # pytest's own, on a StringIO
    config: Any = types.SimpleNamespace(
        pluginmanager=types.SimpleNamespace(get_plugin=lambda name: reporter),
        getoption=lambda name, default=None: 0)
    clock = Clock()
    record = RunObserver(clock=clock)
    nodeids = [f"t.py::t{i}" for i in range(2000)]
    batch = Batch(key=key(1), nodeids=nodeids, expected_seconds=30.0, expected_start=0.0)
    record.plan([batch], lambda k: Pool("local_slurm/batch/one-shot", nodes=1, gpus_per_node=1),
                lower_bound=25.0)
    record.submitted("11", batch, 0)
    record.changed("11", JobState(status=JobStatus.RUNNING, nodelist="n1"))
    status = StatusLine(config, record, tty=True, clock=clock)
    counted = []
    real_counts = record.counts
    monkeypatch.setattr(record, "counts", lambda *a: counted.append(1) or real_counts(*a))
    for index, nodeid in enumerate(nodeids):
        run_test(record, nodeid, 1000.0 + index * 0.001, 1000.0 + index * 0.001 + 0.001)
        reporter.write(".")  # pytest's progress dot: the line goes
        assert not status.shown
        status.pytest_runtest_logfinish()
        assert status.shown, f"no status line after test {index}"
        clock.now += 0.0005  # 2,000 tests in one second
    assert status.text.startswith("trtllm-slurm: ")
    assert len(counted) <= 2 * 3, len(counted)  # twice a second (ETA counts too)
    assert out.getvalue().count(".") >= 2000
