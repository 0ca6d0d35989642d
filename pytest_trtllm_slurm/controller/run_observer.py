"""What a dispatched run did: one record the status line, timeline and efficiency summary
all read. Times are epoch seconds, as the workers stamp their reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.planning.batching import Batch, BatchKey
from pytest_trtllm_slurm.planning.packing import Pool

PLUGIN_NAME = "trtllm-slurm-run-record"


@dataclass(slots=True)
class TestSpan:
    """One dispatched test as its batch ran it (worker clock)."""

    nodeid: str
    job_id: str
    start: float | None = None  # setup began
    stop: float | None = None  # teardown ended (or the last phase seen)
    outcome: str | None = None  # passed | failed | skipped
    finished: bool = False


@dataclass
class BatchSpan:
    """One submitted job (a retry is a batch of its own)."""

    job_id: str
    label: str
    key: BatchKey
    pool: Pool
    nodeids: list[str]
    attempt: int
    submitted: float
    expected_seconds: float | None = None
    running: float | None = None  # when the scheduler was first seen running it
    ended: float | None = None
    status: str = JobStatus.PENDING.value
    reason: str | None = None  # the scheduler's pending reason now
    reasons: list[tuple[float, str]] = field(default_factory=list)  # every reason seen
    nodelist: str | None = None

    @property
    def width(self) -> int:
        """GPUs the batch holds (0: a CPU-only batch)."""
        return max(0, self.key.devices_per_node) * max(1, self.key.node_count)

    @property
    def finished(self) -> bool:
        return self.ended is not None

    @property
    def cluster(self) -> str:
        """The Slurm cluster it ran on (clusters-file or ClusterName), else ``here``."""
        return self.key.cluster or "here"

    @property
    def persistent(self) -> bool:
        """It runs in a persistent allocation, whose pool holds its GPUs all run long."""
        return "/allocation" in self.pool.name


class RunObserver:
    """Observations of one dispatched run. Registered as a plugin while the run lasts."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started = clock()
        self.batches: dict[str, BatchSpan] = {}  # job id -> span, in submission order
        self.tests: dict[str, TestSpan] = {}  # nodeid -> its latest attempt
        self.job_of: dict[str, str] = {}  # nodeid -> job id of its latest batch
        self.pools: Callable[[BatchKey], Pool] | None = None
        self.expected_makespan: float | None = None
        self.lower_bound: float | None = None
        self.guessed: str | None = None  # why the plan's figures are guesses
        self.events: list[tuple[float, str]] = []  # state changes that matter (CI lines)
        self.finished_at: float | None = None

    # -- what the run loop tells it ------------------------------------------------
    def plan(self, batches: Sequence[Batch], pools: Callable[[BatchKey], Pool],
             lower_bound: float | None, guessed: str | None = None) -> None:
        """The packer's plan; ``guessed``: why its figures are guesses (None: measured)."""
        self.pools = pools
        ends = [(b.expected_start or 0.0) + b.expected_seconds for b in batches
                if b.expected_seconds is not None]
        self.expected_makespan = max(ends) if ends else None
        self.lower_bound = lower_bound
        self.guessed = guessed

    def submitted(self, job_id: str, batch: Batch, attempt: int) -> None:
        pool = self.pools(batch.key) if self.pools else Pool(batch.key.scenario.value)
        self.batches[job_id] = BatchSpan(
            job_id=job_id, label=batch.label, key=batch.key, pool=pool,
            nodeids=list(batch.nodeids), attempt=attempt, submitted=self.clock(),
            expected_seconds=batch.expected_seconds)
        for nodeid in batch.nodeids:
            self.job_of[nodeid] = job_id
        if attempt:
            self._event(f"batch {batch.label} resubmitted as job {job_id} (retry {attempt}, "
                        f"{len(batch.nodeids)} test(s))")

    def changed(self, job_id: str, state: JobState) -> None:
        """A job's status or pending reason changed (the monitor's on_change)."""
        span = self.batches.get(job_id)
        if span is None:
            return
        now = self.clock()
        span.status = state.status.value
        span.nodelist = state.nodelist or span.nodelist
        if state.status is JobStatus.PENDING:
            if state.reason and state.reason != span.reason:
                span.reasons.append((now, state.reason))
                self._event(f"job {job_id} [{span.label}] pending ({state.reason})")
            span.reason = state.reason
        elif state.status is JobStatus.RUNNING and span.running is None:
            span.running, span.reason = now, None

    def ended(self, job_id: str, state: JobState) -> None:
        span = self.batches.get(job_id)
        if span is None:
            return
        now = self.clock()
        span.ended, span.status, span.reason = now, state.status.value, None
        span.nodelist = state.nodelist or span.nodelist
        if span.running is None:  # never seen running (it ran between two polls)
            first = [t.start for t in self.tests_of(span) if t.start is not None]
            span.running = min([*first, now])
        if state.status not in (JobStatus.COMPLETED, JobStatus.FAILED):
            why = f" ({state.reason})" if state.reason else ""
            self._event(f"job {job_id} [{span.label}] ended {state.status.value}{why}")

    def finish(self) -> None:
        self.finished_at = self.clock()

    # -- replayed reports (plugin hooks) --------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        job_id = self.job_of.get(report.nodeid)
        if job_id is None:
            return
        span = self.tests.get(report.nodeid)
        if span is None or span.job_id != job_id:
            span = self.tests[report.nodeid] = TestSpan(report.nodeid, job_id)
        start = getattr(report, "start", None)
        stop = getattr(report, "stop", None)
        if isinstance(start, (int, float)) and start > 0 and span.start is None:
            span.start = float(start)
        if isinstance(stop, (int, float)) and stop > 0:
            span.stop = max(float(stop), span.stop or 0.0)
        outcome = report.outcome  # read once (``failed`` and the like are properties of it)
        if outcome == "failed":
            if span.outcome != "failed":
                self._event(f"FAILED {report.nodeid} ({report.when})")
            span.outcome = "failed"
        elif span.outcome is None and (
                outcome == "skipped" or outcome == "passed" and report.when == "call"):
            span.outcome = outcome

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        span = self.tests.get(nodeid)
        if span is not None and nodeid in self.job_of:
            span.finished = True

    # -- views -----------------------------------------------------------------------
    def tests_of(self, span: BatchSpan) -> list[TestSpan]:
        """The tests this batch ran (a retried test belongs to its last batch)."""
        return [t for n in span.nodeids if (t := self.tests.get(n)) and t.job_id == span.job_id]

    @property
    def clusters(self) -> list[str]:
        """The clusters the run's batches went to, in submission order."""
        return list(dict.fromkeys(span.cluster for span in self.batches.values()))

    def measured_bound(self) -> float | None:
        """No packing of this run's tests at their measured durations ends sooner: the
        longest test, and per pool the tests' GPU-seconds over its GPUs (no start-up)."""
        longest = 0.0
        area: dict[str, float] = {}
        seen = False
        for span in self.batches.values():
            for test in self.tests_of(span):
                if test.start is None or test.stop is None:
                    continue
                seen = True
                took = max(0.0, test.stop - test.start)
                longest = max(longest, took)
                if span.width and span.pool.gpus:
                    area[span.pool.name] = (area.get(span.pool.name, 0.0)
                                            + span.width * took / span.pool.gpus)
        return max([longest, *area.values()]) if seen else None

    def learnt_eta(self, now: float) -> tuple[float, int] | None:
        """Seconds left at the pace of finished tests, and how many; None before the first."""
        finished = [t for t in self.tests.values() if t.finished and t.start is not None]
        if not finished:
            return None
        since = min(t.start for t in self.tests.values() if t.start is not None)
        left = self.counts()["left"]
        return left * max(0.0, now - since) / len(finished), len(finished)

    def counts(self, cluster: str | None = None) -> dict[str, int]:
        """passed / failed / skipped / left of the dispatched tests (``cluster``'s only)."""
        mine = [n for n, job in self.job_of.items()
                if cluster is None or self.batches[job].cluster == cluster]
        done = [t for n in mine if (t := self.tests.get(n)) is not None and t.finished]
        out = {"passed": 0, "failed": 0, "skipped": 0}
        for test in done:
            out[test.outcome or "passed"] = out.get(test.outcome or "passed", 0) + 1
        out["left"] = max(0, len(mine) - len(done))
        return out

    def _event(self, text: str) -> None:
        self.events.append((self.clock(), text))
