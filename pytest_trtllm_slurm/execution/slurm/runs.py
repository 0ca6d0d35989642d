"""The run registry: each live run's ``<folder>/<run id>.json`` (its allocation, jobs and
steps) on the Shell's host, proven alive by the ``flock`` it holds on ``<run id>.lock``.
Uses: a lease (an allocation a live run uses is never cancelled, ``users_of``), and the
next run cancels what a SIGKILLed one left (``reap_dead_runs``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.jobs import NAME_SUFFIX, SchedulerError, SlurmJobs, chunks
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock, shell_where
from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node.paths import Batch, Runs, Session, WorkRoot, name_of
from pytest_trtllm_slurm.transport import file_ops
from pytest_trtllm_slurm.transport.file_ops import FileOp
from pytest_trtllm_slurm.transport.shell import Shell

log = logging.getLogger(__name__)

# every record with whether its run still holds its lock ("live") or not ("dead")
_LIST = r"""
command -v flock >/dev/null 2>&1 || { echo "flock (util-linux) is not installed" >&2; exit 127; }
cd "$1" 2>/dev/null || exit 0
for f in *.json; do
  [ -f "$f" ] || continue
  id=${f%.json}
  if flock -n "$id.lock" true 2>/dev/null; then a=dead; else a=live; fi
  printf '%s\t%s\t%s\n' "$f" "$a" "$(tr -d '\n' <"$f")"
done
"""
SHORT_LOCK_WAIT = 120.0  # the registry's lock is held for a check and a write only


class StepRecord(BaseModel):
    """A batch started as a step of an allocation: its id is in ``work_dir/stepid``."""

    allocation: str
    work_dir: str


class WarmRecord(BaseModel):
    """A batch sent to a warm worker's session (``<session>/inbox/<request>.cancel`` ends it)."""

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
    """The registry folder of one target on ``shell``'s host (``work_root``: a local folder
    to create git-ignored first)."""

    def __init__(self, shell: Shell, folder: str | Path, *,
                 work_root: Path | None = None) -> None:
        self.shell = shell
        self.folder = str(folder).rstrip("/")
        self.work_root = work_root
        pid = os.getpid()
        self.me = RunRecord(run_id=f"{socket.gethostname()}-{pid}-{uuid.uuid4().hex[:6]}",
                            pid=pid, host=socket.gethostname(), started=process_start(pid),
                            began=time.strftime("%Y-%m-%d %H:%M:%S"))
        self._saved = False
        self._made = False
        self._lease: ShellLock | None = None
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        # the dead runs of a listing just read (the checkout's claim): the reaper's first look
        # saves a round trip; a run that dies after it is reaped by the next run
        self._dead_listed: list[tuple[RunRecord, str]] | None = None

    @property
    def where(self) -> str:
        return shell_where(self.shell, self.folder)

    @property
    def path(self) -> str:
        return Runs(self.folder).record(self.me.run_id)

    def make_folder(self) -> None:
        """The registry's folder: ours, 0700, nobody else may write it."""
        if not self._made:
            if self.work_root is not None:
                ensure_work_root(self.work_root)
            self.shell.mkdir(self.folder, private=True)
            self._made = True

    def holder(self) -> dict[str, object]:
        """This run as a lock's holder record names it."""
        me = self.me
        return {"pid": me.pid, "host": me.host, "run_id": me.run_id, "since": me.began}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The registry's short lock: registering as an allocation's user, or checking for users."""
        self.make_folder()
        lock = ShellLock(self.shell, Runs(self.folder).lock, max_hold=SHORT_LOCK_WAIT + 60)
        if not lock.acquire(SHORT_LOCK_WAIT, self.holder()):
            raise ExecutionError(f"another run held {lock.where} for more than "
                                 f"{SHORT_LOCK_WAIT:.0f} s ({lock.describe()})")
        try:
            yield
        finally:
            lock.release()

    def _hold_lease(self) -> None:
        """This run's own lock, held while it runs: its proof of life to other machines."""
        if self._lease is not None and self._lease.held:
            return
        self.make_folder()
        lease = self._lease or ShellLock(self.shell, Runs(self.folder).lease(self.me.run_id),
                                         keep=True)
        if not lease.acquire(60, self.holder()):
            raise ExecutionError(f"could not take this run's own lock {lease.where}")
        self._lease = lease

    def start_lease(self) -> None:
        """Take this run's lock in the background (a round trip); the first save() waits for it."""
        if self._starting is None and (self._lease is None or not self._lease.held):
            self._starting = threading.Thread(target=self._start, daemon=True,
                                              name="run lease")
            self._starting.start()

    def _start(self) -> None:
        try:
            self._hold_lease()
        except BaseException as exc:  # noqa: BLE001 - raised again by save()
            self._start_error = exc

    def save(self) -> None:
        """Write this run's file (atomically, 0600)."""
        self.shell.write_file(self.path, self._saving())
        self._saved = True

    def _saving(self) -> str:
        """The record to write, once the lease is held (no record is seen without its live lock)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
            if self._start_error is not None:
                error, self._start_error = self._start_error, None
                raise error
        self._hold_lease()
        return self.me.model_dump_json()

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

    def warm_note(self, session: str, request: str) -> FileOp:
        """Note a served batch: the record's write, to do ahead of its request (one round trip)."""
        self.me.warm.append(WarmRecord(session=session, request=request))
        note = file_ops.write(self.path, self._saving())
        self._saved = True  # (``finish`` removes it: rm -f, whether it landed or not)
        return note

    def finish(self) -> None:
        """The run ended (normally or interrupted): its file and its lease go."""
        if self._saved:
            self.shell.run(["rm", "-f", "--", self.path], timeout=60)
            self._saved = False
        if self._lease is not None:
            self._lease.release()
            self.shell.run(["rm", "-f", "--", Runs(self.folder).lease(self.me.run_id)],
                           timeout=60)
            self._lease = None

    def others(self) -> list[tuple[RunRecord, bool, str]]:
        """Every other run's record, live or not (none when they cannot be told apart)."""
        res = self.shell.run(self.list_argv(), timeout=60)
        if not res.ok:
            log.warning("run registry %s could not be listed: %s", self.where, res.describe())
            return []
        return self.parse_listing(res.stdout)

    def list_argv(self) -> list[str]:
        """The listing's command (to run alone, or with another look in one round trip)."""
        return ["sh", "-c", _LIST, "sh", self.folder]

    def parse_listing(self, stdout: str) -> list[tuple[RunRecord, bool, str]]:
        """(record, alive, path) of every other run, from the listing's output."""
        found: list[tuple[RunRecord, bool, str]] = []
        for line in stdout.splitlines():
            name, _, rest = line.partition("\t")
            state, _, text = rest.partition("\t")
            if name == name_of(self.path):
                continue
            try:
                record = RunRecord.model_validate(json.loads(text))
            except (ValueError, ValidationError):
                continue
            alive = state == "live" or (record.host == self.me.host
                                        and pid_alive(record.pid, record.started))
            found.append((record, alive, Runs(self.folder).at(name)))
        return found

    def drop(self, path: str) -> None:
        """Forget a dead run's file and its lock (the reaper cancelled what it left)."""
        self.shell.run(["rm", "-f", "--", str(path), Runs.lease_of(str(path))], timeout=60)

    def users_of(self, allocation: str) -> list[RunRecord]:
        """Live runs other than this one that use ``allocation``."""
        return [r for r, alive, _ in self.others() if alive and r.allocation == allocation]

    def listed(self, found: list[tuple[RunRecord, bool, str]]) -> None:
        """A listing read just now elsewhere: the next ``dead()`` takes it, not a new one."""
        self._dead_listed = [(r, p) for r, alive, p in found if not alive]

    def dead(self) -> list[tuple[RunRecord, str]]:
        """The dead runs' records and files (a ``listed`` one, once: the dead stay dead)."""
        if self._dead_listed is not None:
            found, self._dead_listed = self._dead_listed, None
            return found
        return [(r, p) for r, alive, p in self.others() if not alive]


def local_registry(shell: Shell, work_dirs: Path) -> RunRegistry:
    """The run registry of a checkout's local cluster: ``work_dirs/.runs``."""
    return RunRegistry(shell, WorkRoot(work_dirs).runs.dir, work_root=work_dirs)


def reap_dead_runs(runs: RunRegistry, jobs: SlurmJobs, shell: Shell, user: str | None,
                   say: Callable[[str], None]) -> list[str]:
    """Cancel the dead runs' queued jobs, steps and warm batches; the ids cancelled."""
    cancelled: list[str] = []
    for record, path in runs.dead():
        try:
            ids = _queued_jobs(jobs, record, user) + _running_steps(jobs, shell, record)
        except SchedulerError as exc:
            say(f"Could not look for jobs left by run {record.run_id}: {exc}")
            continue
        if ids:
            jobs.scancel(ids)
            cancelled += ids
            say(f"Cancelled {', '.join(ids)}, left in the queue by an earlier run that was "
                f"killed (pid {record.pid} on {record.host}, run {record.run_id}).")
        warm = _cancel_warm(shell, record)
        if warm:
            cancelled += warm
            say(f"Cancelled {len(warm)} warm-worker batch(es) of an earlier run that was "
                f"killed (pid {record.pid} on {record.host}, run {record.run_id}).")
        runs.drop(path)
    return cancelled


def _queued_jobs(jobs: SlurmJobs, record: RunRecord, user: str | None) -> list[str]:
    """The record's one-shot jobs still queued (``user``'s, named as recorded) and its
    allocation request if it still waits."""
    found = []
    wanted = dict(record.jobs)
    for part in chunks(list(wanted) + ([record.request] if record.request else [])):
        res = jobs.run(["squeue", "-h", "-j", ",".join(part), "-o", "%i|%u|%j|%T"])
        if not res.ok:
            if "invalid job id" in (res.stderr + res.stdout).lower():
                continue
            raise SchedulerError(res)
        for line in res.stdout.splitlines():
            cols = line.strip().split("|", 3)
            if len(cols) < 4 or (user is not None and cols[1] != user):
                continue
            if wanted.get(cols[0]) == cols[2] or (
                    cols[0] == record.request and cols[2].endswith(NAME_SUFFIX)
                    and cols[3] == "PENDING"):
                found.append(cols[0])
    return found


def _cancel_warm(shell: Shell, record: RunRecord) -> list[str]:
    """Cancel the dead run's warm batches and end its sessions (files in their inboxes)."""
    done = []
    for item in record.warm:
        if shell.exists(Session(item.session).inbox):
            with contextlib.suppress(OSError):
                shell.write_file(Session(item.session).cancel(item.request), "")
                done.append(item.request)
    for session in dict.fromkeys(item.session for item in record.warm):
        if shell.exists(Session(session).inbox):
            with contextlib.suppress(OSError):
                shell.write_file(Session(session).stop, "")
    return done


def _running_steps(jobs: SlurmJobs, shell: Shell, record: RunRecord) -> list[str]:
    """The record's allocation steps still running (their ids from ``work_dir/stepid``)."""
    found = []
    by_alloc: dict[str, list[str]] = {}
    for step in record.steps:
        text = shell.read_from(Batch(step.work_dir).stepid, 0, 64)
        number = text.decode("utf-8", "replace").strip()
        if number.isdigit():
            by_alloc.setdefault(step.allocation, []).append(f"{step.allocation}.{number}")
    for alloc, ids in by_alloc.items():
        live = jobs.squeue_steps(alloc) or {}
        found += [i for i in ids if i in live]
    return found
