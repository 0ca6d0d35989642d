"""One loop that watches every active job: state, new report lines, hang, timeout.

Per poll: one state query per executor for all its jobs, then an incremental
read (by offset) of each job's reports.jsonl and log. Nothing is read whole.
Over a shell that pushes (SSH with its relay), those reads take the pushed bytes
instead of a round trip each, and the wait between polls ends when a report line
lands; a job's last read, once it has ended, always reads the file itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.node.protocol import LOG_MARK
from pytest_trtllm_slurm.transport.shell import PushingShell

LOG_OVERLAP = 256  # bytes kept from the previous log chunk so a pattern split across reads is seen
_MARK = LOG_MARK.encode()


class OwnOutput:
    """What the test itself wrote to its job log, read chunk by chunk: lines that start
    with ``LOG_MARK`` are the plugin's (START lines, pytest's own terminal output on the
    target, which show node ids) and are left out, so a test whose id contains a hang
    pattern is not taken for a hang."""

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
    partial: bytes = b""
    log_offset: int = 0
    own_output: OwnOutput = field(default_factory=lambda: OwnOutput())
    started: float | None = None
    forced_status: JobStatus | None = None
    forced_reason: str | None = None
    state: JobState = field(default_factory=lambda: JobState(status=JobStatus.PENDING))
    held: list[dict[str, Any]] = field(default_factory=list)  # reports newer than alive_at
    # the executor's shell when it pushes, found once (a check against a runtime Protocol
    # costs more than the stat it guards: measured, most of a 32-node run's monitor CPU)
    pushing: PushingShell | None = None
    next_log_look: float = 0.0  # monotonic: the job log's next look for hang patterns


@dataclass
class JobEvent:
    job: WatchedJob
    records: list[dict[str, Any]] = field(default_factory=list)
    final: JobState | None = None  # set once, when the job has ended


class UnreadableLine(dict):  # type: ignore[type-arg]
    """A line of reports.jsonl that is no JSON object, kept in its place among the
    records (empty as a dict: a reader that does not look for it skips it)."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


def report_stop(record: dict[str, Any]) -> float:
    """When a test report's phase stopped (0 for other records and for a ``stop`` that is
    no number: what a target wrote is checked later, it must not break the read)."""
    data = record.get("data") if record.get("type") == "report" else None
    try:
        return float(data.get("stop") or 0) if isinstance(data, dict) else 0.0
    except (TypeError, ValueError):
        return 0.0


class Monitor:
    """Watches jobs until each has ended; yields records and final states."""

    def __init__(
        self,
        hang_patterns: list[str],
        poll_interval: float = CADENCE.monitor,
        on_change: Callable[[WatchedJob], None] | None = None,
    ) -> None:
        self.hang_patterns = [p.lower().encode() for p in hang_patterns if p]
        self.poll_interval = poll_interval
        self.on_change = on_change  # told when a job's status or pending reason changes
        self.jobs: dict[str, WatchedJob] = {}

    def add(self, handle: JobHandle, executor: Executor) -> WatchedJob:
        shell = executor.shell
        pushing = shell if isinstance(shell, PushingShell) else None
        job = WatchedJob(handle=handle, executor=executor, pushing=pushing)
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
        else:
            time.sleep(timeout)

    @property
    def active(self) -> bool:
        return bool(self.jobs)

    def poll(self) -> Iterator[JobEvent]:
        """One round over all active jobs."""
        by_executor: dict[int, list[WatchedJob]] = {}
        for job in self.jobs.values():
            by_executor.setdefault(id(job.executor), []).append(job)
        for jobs in by_executor.values():
            states = jobs[0].executor.poll([j.handle for j in jobs])
            for job in jobs:
                before = (job.state.status, job.state.reason)
                job.state = states.get(job.handle.job_id, job.state)
                if self.on_change and (job.state.status, job.state.reason) != before:
                    self.on_change(job)
                if job.state.nodelist:
                    job.handle.nodelist = job.state.nodelist
                yield from self._check(job)

    def _check(self, job: WatchedJob) -> Iterator[JobEvent]:
        now = time.monotonic()
        if job.state.status is JobStatus.RUNNING and job.started is None:
            job.started = now
        records = self._hold(job, self._read_records(job))
        if not job.state.status.finished and job.forced_status is None:
            if self._hang_seen(job):
                self._stop(job, JobStatus.HANG_DETECTED, "hang pattern found in the job log")
            elif (
                job.started is not None
                and now - job.started > job.handle.spec.monitor_timeout_seconds
            ):
                limit = job.handle.spec.monitor_timeout_seconds
                self._stop(
                    job, JobStatus.TIMEOUT, f"ran longer than the monitor timeout ({limit} s)"
                )
        if job.state.status.finished:
            # the reports held back for the scheduler's word, then the rest of the file
            # (the run loop drops those stamped after an end the scheduler saw)
            records += job.held
            job.held = []
            while True:  # everything that landed, to the end of the file (itself)
                offset = job.reports_offset
                records += self._read_records(job, final=True)
                if job.reports_offset == offset:
                    break
            del self.jobs[job.handle.job_id]
            self._unwatch(job)
            final = job.state
            if job.forced_status is not None:
                final = JobState(  # it ended because we stopped it: its code says nothing
                    status=job.forced_status,
                    nodelist=job.state.nodelist,
                    reason=job.forced_reason,
                )
            yield JobEvent(job, records, final)
        elif records:
            yield JobEvent(job, records)

    def stop(self, job_id: str, status: JobStatus, reason: str) -> None:
        """Cancel a job the caller gave up on; its final state will say ``status``."""
        job = self.jobs.get(job_id)
        if job is not None and not job.state.status.finished and job.forced_status is None:
            self._stop(job, status, reason)

    @staticmethod
    def _hold(job: WatchedJob, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records that may be shown now: while the job's state carries ``alive_at``
        (the scheduler's last word that its allocation runs), a test report that stopped
        later waits, with everything after it, until the scheduler has said so again."""
        pending = job.held + records
        limit = job.state.alive_at
        cut = len(pending)
        if limit is not None and not job.state.status.finished:
            for index, record in enumerate(pending):
                if report_stop(record) > limit:
                    cut = index
                    break
        job.held = pending[cut:]
        return pending[:cut]

    def _stop(self, job: WatchedJob, status: JobStatus, reason: str) -> None:
        job.forced_status, job.forced_reason = status, reason
        job.executor.cancel(job.handle)
        job.state = job.executor.poll([job.handle]).get(job.handle.job_id, job.state)

    @staticmethod
    def _chunk(job: WatchedJob, path: str, offset: int, *, final: bool = False) -> bytes:
        """Bytes of ``path`` from ``offset``: the pushed ones when the shell has them, else
        (and always for a job's ``final`` read) the file's own."""
        if not final and job.pushing is not None:
            data = job.pushing.pushed(path, offset)
            if data is not None:
                return data
        return job.executor.shell.read_from(path, offset)

    @staticmethod
    def _unwatch(job: WatchedJob) -> None:
        if job.pushing is not None:
            job.pushing.unwatch(job.handle.spec.reports_path)
            job.pushing.unwatch(job.handle.spec.log_path)

    def _read_records(self, job: WatchedJob, *, final: bool = False) -> list[dict[str, Any]]:
        chunk = self._chunk(job, job.handle.spec.reports_path, job.reports_offset, final=final)
        if not chunk:
            return []
        job.reports_offset += len(chunk)
        complete, _, job.partial = (job.partial + chunk).rpartition(b"\n")
        # an unterminated last line waits for the next read
        try:  # the lines as one text: one decode, not one per line
            lines: list[str] | list[bytes] = complete.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            lines = complete.split(b"\n")  # a line that is no UTF-8 is no record
        records = []
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            # the reader decides what a line that is no record means
            records.append(record if isinstance(record, dict) else UnreadableLine(
                line if isinstance(line, str) else line.decode("utf-8", "replace")))
        return records

    def _hang_seen(self, job: WatchedJob) -> bool:
        """Hang patterns in what the job's log gained, looked at every
        ``CADENCE.hang_look`` seconds (not at every round: a hang is no hurry)."""
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
