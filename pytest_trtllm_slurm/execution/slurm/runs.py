"""Which controller runs are alive, and what each submitted: the run registry.

Each dispatching run (each pytest process, xdist workers included) keeps one small
file ``<folder>/<run id>.json`` (0600, replaced atomically) naming its process (pid,
host, the process' start time, so a reused pid is not taken for it), the persistent
allocation it uses, and the one-shot jobs and allocation steps it submitted. The file
is removed when the run ends, Ctrl-C, SIGTERM and SIGHUP included.

Two uses:

* a lease: a run replacing the persistent allocation never cancels one that a live
  run uses (``users_of``), and registration and that check share a short lock, so a
  run cannot start using an allocation that another is about to cancel;
* after a SIGKILL (no cleanup runs), the next run finds the dead run's file, cancels
  what it left in the queue and says so (``dead``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.paths import Runs

FOREIGN_HOST_TTL = 24 * 3600.0  # a run on another host (shared file system) counts as
# alive this long after its file last changed: its pids cannot be checked from here


class StepRecord(BaseModel):
    """A batch started as a step of an allocation: its id is in ``work_dir/stepid``."""

    allocation: str
    work_dir: str


class WarmRecord(BaseModel):
    """A batch sent to a warm worker's session (``<session>/inbox/<request>.cancel``
    cancels it)."""

    session: str
    request: str


class RunRecord(BaseModel):
    run_id: str
    pid: int
    host: str
    started: str = ""  # the process' start time (/proc/<pid>/stat field 22)
    allocation: str | None = None  # the persistent allocation this run uses
    request: str | None = None  # its allocation request while it waits (not granted yet)
    jobs: dict[str, str] = Field(default_factory=dict)  # one-shot job id -> job name
    steps: list[StepRecord] = Field(default_factory=list)
    warm: list[WarmRecord] = Field(default_factory=list)
    began: str = ""  # when the run registered (ISO time, for messages)
    checkout: str | None = None  # the remote checkout this run synced and tests from
    code: str | None = None  # what it synced there: snapshot tree + untracked files' digest
    code_note: str | None = None  # the same for people: "commit abc123 + 2 untracked file(s)"


def process_start(pid: int) -> str:
    """The process' start time in clock ticks since boot ("" when unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def pid_alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's: then not the same process, unless the start matches
    return not started or process_start(pid) in ("", started)


class RunRegistry:
    """The registry folder of one target (the local cluster, or one remote cluster)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        pid = os.getpid()
        self.me = RunRecord(run_id=f"{socket.gethostname()}-{pid}-{uuid.uuid4().hex[:6]}",
                            pid=pid, host=socket.gethostname(), started=process_start(pid),
                            began=time.strftime("%Y-%m-%d %H:%M:%S"))
        self._saved = False

    def _make_folder(self) -> None:
        ensure_work_root(self.folder.parent)  # (work_dirs: created git-ignored)
        self.folder.mkdir(exist_ok=True, mode=0o700)

    @property
    def path(self) -> Path:
        return Runs(self.folder).record(self.me.run_id)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The registry's short lock: held while a run registers as an allocation's user,
        and while a run checks for users before it cancels an allocation."""
        self._make_folder()
        fd = os.open(Runs(self.folder).lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def save(self) -> None:
        """Write this run's file (atomically, 0600)."""
        self._make_folder()
        write_atomic(self.path, self.me.model_dump_json())
        self._saved = True

    def use_allocation(self, job_id: str | None) -> None:
        if self.me.allocation != job_id or not self._saved:
            self.me.allocation = job_id
            self.save()

    def waiting_for(self, request: str | None) -> None:
        """Note (or clear) the allocation request this run waits for."""
        if self.me.request != request:
            self.me.request = request
            self.save()

    def add_job(self, job_id: str, name: str) -> None:
        self.me.jobs[job_id] = name
        self.save()

    def add_step(self, allocation: str, work_dir: str) -> None:
        self.me.steps.append(StepRecord(allocation=allocation, work_dir=work_dir))
        self.save()

    def add_warm(self, session: str, request: str) -> None:
        self.me.warm.append(WarmRecord(session=session, request=request))
        self.save()

    def finish(self) -> None:
        """The run ended (normally or interrupted): its file goes."""
        if self._saved:
            self.path.unlink(missing_ok=True)
            self._saved = False

    def others(self) -> list[tuple[RunRecord, bool, Path | str]]:
        """(record, alive, path) of every other run's file; unreadable ones are skipped."""
        found: list[tuple[RunRecord, bool, Path | str]] = []
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            if path == self.path:
                continue
            try:
                record = RunRecord.model_validate(json.loads(path.read_text("utf-8")))
                mtime = path.stat().st_mtime
            except (OSError, ValueError, ValidationError):
                continue
            found.append((record, self.alive(record, mtime), path))
        return found

    def alive(self, record: RunRecord, mtime: float) -> bool:
        if record.host != self.me.host:
            return time.time() - mtime < FOREIGN_HOST_TTL
        return pid_alive(record.pid, record.started)

    def drop(self, path: Path | str) -> None:
        """Forget a dead run's file (the reaper cancelled what it left)."""
        Path(path).unlink(missing_ok=True)

    def users_of(self, allocation: str) -> list[RunRecord]:
        """Live runs other than this one that use ``allocation``."""
        return [r for r, alive, _ in self.others() if alive and r.allocation == allocation]

    def dead(self) -> list[tuple[RunRecord, Path | str]]:
        return [(r, p) for r, alive, p in self.others() if not alive]
