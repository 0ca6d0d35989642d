"""One loop that watches every active job: per poll one state query per executor, then an
incremental read of each job's reports.jsonl (pushed bytes where the shell pushes; an ended
job's from the file) and log for hang patterns and timeouts."""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.folder_watch import wait_for_end
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.execution.records import LineReader
from pytest_trtllm_slurm.node.protocol import LOG_MARK
from pytest_trtllm_slurm.transport.shell import PushingShell

LOG_OVERLAP = 256  # bytes kept from the previous log chunk so a pattern split across reads is seen
READ_CHUNK = 1 << 20  # bytes of a reports file read at once, pushed or from the file
_MARK = LOG_MARK.encode()


class OwnOutput:
    """What the test itself wrote to its job log, chunk by chunk: the plugin's ``LOG_MARK``
    lines (which show node ids) left out, so a test id is never taken for a hang pattern."""

    def __init__(self) -> None:
        self._pending = b""  # the start of a line that may still turn out marked
        self._state = "start"  # at a line's start | in the test's own line | in a marked line
        self._overlap = b""  # the end of the test's line so far: a pattern split across reads

    def feed(self, chunk: bytes) -> bytes:
        """The test's own text in ``chunk`` (with a little of the line before it)."""
        out: list[bytes] = []
        pos = 0
        while True:
            end = chunk.find(b"\n", pos)
            piece = chunk[pos:] if end < 0 else chunk[pos:end]
            if self._state == "start":
                line = self._pending + piece
                if line.startswith(_MARK):
                    self._state, self._pending = "marked", b""
                elif end < 0 and _MARK.startswith(line):
                    self._pending = line  # undecided until more of the line arrives
                    break
                else:
                    self._state, self._pending = "own", b""
                    piece = line
            if self._state == "own":
                text = self._overlap + piece
                out.append(text)
                self._overlap = text[-LOG_OVERLAP:]
            if end < 0:
                break
            self._state, self._pending, self._overlap = "start", b"", b""
            pos = end + 1
        return b"\n".join(out)


@dataclass
class WatchedJob:
    handle: JobHandle
    executor: Executor
    reports_offset: int = 0
    lines: LineReader = field(default_factory=lambda: LineReader())
    log_offset: int = 0
    own_output: OwnOutput = field(default_factory=lambda: OwnOutput())
    started: float | None = None
    forced_status: JobStatus | None = None
    forced_reason: str | None = None
    state: JobState = field(default_factory=lambda: JobState(status=JobStatus.PENDING))
    held: list[dict[str, Any]] = field(default_factory=list)  # reports newer than alive_at
    ended: JobState | None = None  # its final state, while the rest of its file is read
    # the executor's shell when it pushes, found once (an isinstance on a Protocol is costly)
    pushing: PushingShell | None = None
    next_log_look: float = 0.0  # monotonic: the job log's next look for hang patterns
    next_visit: float = 0.0  # monotonic: read by then even without a notice (``quiet``)
    vouched: int = -1  # the executor's ``vouched`` at the last read
    by_net: bool = False  # this round reads it only for the safety net (no notice)


@dataclass
class JobEvent:
    job: WatchedJob
    records: list[dict[str, Any]] = field(default_factory=list)
    final: JobState | None = None  # set once, when the job has ended


def report_stop(record: dict[str, Any]) -> float:
    """When a test report's phase stopped; of an ``item`` line (a test's reports in one
    line), its last report's (0 for other records and for a ``stop`` that is no number:
    what a target wrote is checked later, it must not break the read)."""
    kind = record.get("type")
    if kind == "report":
        return _stop_of(record.get("data"))
    reports = record.get("reports") if kind == "item" else None
    if not isinstance(reports, list):
        return 0.0
    return max((_stop_of(data) for data in reports), default=0.0)


def _stop_of(data: Any) -> float:
    try:
        return float(data.get("stop") or 0) if isinstance(data, dict) else 0.0
    except (TypeError, ValueError, OverflowError):
        return 0.0


def records_before(records: list[dict[str, Any]], ended_at: float) -> list[dict[str, Any]]:
    """The records before the first test report that stopped after ``ended_at``."""
    return records[:next((i for i, r in enumerate(records) if report_stop(r) > ended_at),
                         len(records))]


class Monitor:
    """Watches jobs until each has ended; yields records and final states."""

    def __init__(self, hang_patterns: list[str], poll_interval: float = CADENCE.monitor,
                 on_change: Callable[[WatchedJob], None] | None = None) -> None:
        self.hang_patterns = [p.lower().encode() for p in hang_patterns if p]
        self.poll_interval = poll_interval
        self.on_change = on_change  # told when a job's status or pending reason changes
        self.jobs: dict[str, WatchedJob] = {}
        self._net: dict[int, float] = {}  # per executor: the safety net's period now

    def add(self, handle: JobHandle, executor: Executor,
            batch: Container[str] | None = None) -> WatchedJob:
        """Watch ``handle``'s job; its records are checked as records of ``batch`` (the
        node ids they may name: ``records.check_line``)."""
        shell = executor.shell
        pushing = shell if isinstance(shell, PushingShell) else None
        job = WatchedJob(handle=handle, executor=executor, pushing=pushing,
                         lines=LineReader(batch=batch))
        self.jobs[handle.job_id] = job
        if pushing is not None:
            pushing.watch(handle.spec.reports_path, 0)
            if self.hang_patterns:  # read for hangs only; its lines wake nobody
                pushing.watch(handle.spec.log_path, 0, wake=False)
        return job

    def wait(self, timeout: float | None = None) -> None:
        """The pause between two polls (``poll_interval``): shorter when the one shell of
        the active jobs pushes a report line meanwhile."""
        timeout = self.poll_interval if timeout is None else timeout
        shells = {id(j.executor.shell): j.pushing for j in self.jobs.values()}
        only = next(iter(shells.values())) if len(shells) == 1 else None
        if only is not None:
            only.wait_news(timeout)
            return
        executors = {id(j.executor): j.executor for j in self.jobs.values()}.values()
        watches = [w for executor in executors for w in executor.end_watches()]
        if watches:
            wait_for_end(watches, timeout)  # (ends early when a batch ends here)
        else:
            time.sleep(timeout)

    @property
    def active(self) -> bool:
        return bool(self.jobs)

    def poll(self) -> Iterator[JobEvent]:
        """One round over all active jobs."""
        by_executor: dict[int, list[WatchedJob]] = {}
        for job in list(self.jobs.values()):
            if job.ended is not None:  # ended: the rest of its file, a chunk a round
                yield self._drain(job, [])
                continue
            by_executor.setdefault(id(job.executor), []).append(job)
        now = time.monotonic()
        for group in by_executor.values():
            jobs = self._with_news(group, now)
            if not jobs:
                continue
            states = jobs[0].executor.poll([j.handle for j in jobs])
            netted = missed = False
            for job in jobs:
                before = (job.state.status, job.state.reason)
                offset = job.reports_offset
                job.state = states.get(job.handle.job_id, job.state)
                if self.on_change and (job.state.status, job.state.reason) != before:
                    self.on_change(job)
                if job.state.nodelist:
                    job.handle.nodelist = job.state.nodelist
                yield from self._check(job)
                if job.by_net:
                    netted = True
                    missed |= (job.state.status != before[0]
                               or job.reports_offset != offset)
            if netted:  # the safety net's period: back to its least when it found what no
                # notice announced (a shared file system may cache folder times), else doubled
                key = id(jobs[0].executor)
                self._net[key] = (CADENCE.news_net if missed else
                                  min(2 * self._net.get(key, CADENCE.news_net),
                                      CADENCE.news_net_max))

    def _with_news(self, jobs: list[WatchedJob], now: float) -> list[WatchedJob]:
        """The jobs this round reads: all but those ``Executor.quiet`` vouches unchanged, which
        are read when the safety net is due or their held reports' word came (``vouched``)."""
        executor = jobs[0].executor
        quiet, vouched = executor.quiet([j.handle for j in jobs]), executor.vouched
        net = self._net.get(id(executor), CADENCE.news_net)
        read = []
        for job in jobs:
            vouch = bool(job.held) and job.vouched != vouched
            if job.handle.job_id not in quiet or vouch or now >= job.next_visit:
                job.by_net = job.handle.job_id in quiet and not vouch
                job.next_visit, job.vouched = now + net, vouched
                read.append(job)
        return read

    def _check(self, job: WatchedJob) -> Iterator[JobEvent]:
        now = time.monotonic()
        if job.state.status is JobStatus.RUNNING and job.started is None:
            job.started = now
        records = self._hold(job, self._read_records(job))
        if not job.state.status.finished and job.forced_status is None:
            if self._hang_seen(job):
                self._stop(job, JobStatus.HANG_DETECTED, "hang pattern found in the job log")
            elif (job.started is not None
                  and now - job.started > (limit := job.handle.spec.monitor_timeout_seconds)):
                self._stop(job, JobStatus.TIMEOUT,
                           f"ran longer than the monitor timeout ({limit} s)")
        if job.state.status.finished:
            job.ended = job.state
            if job.forced_status is not None:  # we stopped it: its code says nothing
                job.ended = JobState(status=job.forced_status, nodelist=job.state.nodelist,
                                     reason=job.forced_reason)
            # the reports held back for the scheduler's word, then the rest of the file
            records += job.held
            job.held = []
            yield self._drain(job, records)
        elif records:
            yield JobEvent(job, records)

    def _drain(self, job: WatchedJob, records: list[dict[str, Any]]) -> JobEvent:
        """The next chunk of an ended job's file (from the file), final at its end. Records
        stamped after the end the scheduler saw are dropped with all after them: a node set
        DOWN may keep its processes running, and they keep writing (``records_before``)."""
        assert job.ended is not None
        offset = job.reports_offset
        if not records:  # else these are this round's: the file's rest from the next
            records = self._read_records(job, final=True)
        done = job.reports_offset == offset and not records
        if job.ended.ended_at is not None:
            kept = records_before(records, job.ended.ended_at)
            records, done = kept, done or len(kept) < len(records)
        if not done:
            return JobEvent(job, records)
        self.jobs.pop(job.handle.job_id, None)
        self._unwatch(job)
        return JobEvent(job, records, job.ended)

    def stop(self, job_id: str, status: JobStatus, reason: str) -> None:
        """Cancel a job the caller gave up on; its final state will say ``status``."""
        job = self.jobs.get(job_id)
        if job is not None and not job.state.status.finished and job.forced_status is None:
            self._stop(job, status, reason)

    @staticmethod
    def _hold(job: WatchedJob, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records that may be shown now: a report stamped after ``alive_at`` (the
        scheduler's last word that the allocation runs) waits, with all after it, until renewed."""
        pending = job.held + records
        limit = job.state.alive_at
        shown = (pending if limit is None or job.state.status.finished
                 else records_before(pending, limit))
        job.held = pending[len(shown):]
        return shown

    def _stop(self, job: WatchedJob, status: JobStatus, reason: str) -> None:
        job.forced_status, job.forced_reason = status, reason
        job.executor.cancel(job.handle)
        job.state = job.executor.poll([job.handle]).get(job.handle.job_id, job.state)

    @staticmethod
    def _chunk(job: WatchedJob, path: str, offset: int, *, final: bool = False) -> bytes:
        """Bytes of ``path`` from ``offset``: pushed ones if any (not when ``final``), else read."""
        if not final and job.pushing is not None:
            data = job.pushing.pushed(path, offset)
            if data is not None:
                return data[:READ_CHUNK]
        return job.executor.shell.read_from(path, offset, READ_CHUNK)

    @staticmethod
    def _unwatch(job: WatchedJob) -> None:
        if job.pushing is not None:
            job.pushing.unwatch(job.handle.spec.reports_path)
            job.pushing.unwatch(job.handle.spec.log_path)

    def _read_records(self, job: WatchedJob, *, final: bool = False) -> list[dict[str, Any]]:
        """The records whose lines ended since the last read."""
        chunk = self._chunk(job, job.handle.spec.reports_path, job.reports_offset, final=final)
        if not chunk:
            return []
        job.reports_offset += len(chunk)
        return job.lines.feed(chunk)

    def _hang_seen(self, job: WatchedJob) -> bool:
        """Hang patterns in what the job's log gained, every ``CADENCE.hang_look`` seconds."""
        if not self.hang_patterns:
            return False
        now = time.monotonic()
        if now < job.next_log_look:
            return False
        job.next_log_look = now + CADENCE.hang_look
        chunk = self._chunk(job, job.handle.spec.log_path, job.log_offset)
        if not chunk:
            return False
        job.log_offset += len(chunk)
        text = job.own_output.feed(chunk).lower()
        return any(p in text for p in self.hang_patterns)

    def cancel_all(self) -> None:
        for job in list(self.jobs.values()):
            job.executor.cancel(job.handle)
            self._unwatch(job)
        self.jobs.clear()


def log_tail(executor: Executor, path: str, lines: int = 50, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log, reading at most ``max_bytes`` from its end."""
    shell = executor.shell
    start = max(0, shell.size(path) - max_bytes)
    data = shell.read_from(path, start, max_bytes)
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
