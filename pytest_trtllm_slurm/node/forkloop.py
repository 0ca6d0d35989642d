"""The engine of the warm workers (target side, stdlib only): JSON requests renamed into
``<root>/inbox`` (``<name>.cancel``, ``stop``), each run in a forked process group whose exit
status goes to ``exit_path``. Files, not sockets: both sides of SSH share a file system."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.node.files import (
    UntrustedPath,
    announce,
    close_own_dirs,
    make_dirs,
    open_trusted,
    tree_up_to,
    write_atomic,
)
from pytest_trtllm_slurm.node.paths import AGENTS, STOP, Mailbox, end_notice, root_of
from pytest_trtllm_slurm.node.protocol import LOG_MARK  # noqa: F401

KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of a cancelled request
HEARTBEAT_EVERY = 1.0
FAST, SLOW = 0.005, 0.05  # poll interval while busy / when idle for a while


def _refuse(path: Path, why: str) -> None:
    """A request someone else could have written: said in the log, and removed unread."""
    print(f"[trtllm-slurm] refused {why}; removed it without running it", file=sys.stderr,
          flush=True)
    with contextlib.suppress(OSError):
        path.unlink()


def redirect_output(log_path: str) -> None:
    """fd 1 and 2 (and so every child process) append to ``log_path``."""
    _flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def spawn(run: Callable[[], int]) -> int:
    """Fork a process-group leader that runs ``run`` and ``os._exit``s with its code."""
    _flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler is not ours
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must always exit here
        traceback.print_exc()  # and exits 1
    finally:
        _flush()
        os._exit(int(code) & 0xFF)


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()


def kill_group(pid: int, sig: int) -> None:
    """Signal ``pid``'s process group; one already gone is fine."""
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


@dataclass
class Running:
    name: str
    pid: int
    request: dict[str, Any]  # its exit code goes where it says (``write_exit``)
    kill_at: float | None = None


def write_exit(request: dict[str, Any], code: int) -> None:
    """A request's exit code, then its notice: the controller reads its end at once; then
    the folder's end notice, which wakes a waiting controller here (``folder_watch``)."""
    write_atomic(request["exit_path"], f"{code}\n")
    notice = request.get("notice_path")
    announce(notice)
    if notice:
        announce(end_notice(root_of(notice)))


# start(request) -> pid of the forked child, or None when it cannot start yet (asked again)
Starter = Callable[[dict[str, Any]], "int | None"]


@dataclass
class ForkLoop:
    root: Path
    start: Starter
    heartbeat: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)
    idle_exit: float | None = None  # leave after this long with nothing to do
    watch_parent: bool = False  # leave (killing what runs) when the parent process dies
    before_request: Callable[[dict[str, Any]], None] | None = None
    pending: list[dict[str, Any]] = field(default_factory=list)
    running: dict[int, Running] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.inbox = Mailbox(self.root).inbox
        make_dirs(self.inbox)
        # UntrustedPath when a folder of the tree is someone else's (or a link): never served
        close_own_dirs([self.inbox, *tree_up_to(self.root, AGENTS)])
        self._parent = os.getppid()
        self._stopping = False
        self._inbox_refused = False

    def run(self) -> None:
        """Serve until ``stop`` (and nothing runs), idleness, or the parent's death."""
        last_beat = 0.0
        last_work = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                busy = self._reap() | self._read_inbox() | self._start_pending()
                self._escalate(now)
                if busy or self.running or self.pending:
                    last_work = now
                if self.heartbeat is not None and now - last_beat >= HEARTBEAT_EVERY:
                    last_beat = now
                    self._beat()
                if self.watch_parent and os.getppid() != self._parent:
                    break
                if not self.running and not self.pending:
                    if self._stopping:
                        break
                    if self.idle_exit is not None and now - last_work > self.idle_exit:
                        break
                time.sleep(FAST if now - last_work < 2.0 else SLOW)
        finally:
            self._kill_all()

    def _read_inbox(self) -> bool:
        try:
            names = sorted(os.listdir(self.inbox))
        except FileNotFoundError:
            return False
        found = False
        if names and not self._inbox_trusted():
            return False
        for name in names:
            path = self.inbox / name
            if not (name == STOP or name.endswith((".cancel", ".json"))):
                continue  # a writer's temporary name
            try:
                text = open_trusted(path).decode("utf-8")
            except UntrustedPath as exc:
                _refuse(path, str(exc))
                continue
            except (OSError, UnicodeDecodeError) as exc:
                if getattr(exc, "errno", None) == errno.ELOOP:  # O_NOFOLLOW met a link
                    _refuse(path, f"{path}: it is a symbolic link")
                continue  # gone, or not complete yet: next round
            if name == STOP:
                self._stopping = found = True
                continue
            if name.endswith(".cancel"):
                self._cancel(name[: -len(".cancel")])
                path.unlink(missing_ok=True)
                found = True
            elif name.endswith(".json"):
                try:
                    request = json.loads(text)
                except ValueError:
                    continue  # not complete yet (a writer that does not rename): next round
                path.unlink(missing_ok=True)
                request.setdefault("name", name[: -len(".json")])
                if self.before_request is not None:
                    self.before_request(request)
                self.pending.append(request)
                found = True
        return found

    def _inbox_trusted(self) -> bool:
        """Whether the inbox is our own folder (made 0700 again if opened up; logged once)."""
        try:
            close_own_dirs([self.inbox])
        except (UntrustedPath, OSError) as exc:
            if not self._inbox_refused:
                self._inbox_refused = True
                print(f"[trtllm-slurm] not reading the mailbox: {exc}", file=sys.stderr,
                      flush=True)
            return False
        return True

    def _start_pending(self) -> bool:
        started = False
        for request in list(self.pending):
            try:
                if "exit_path" not in request:
                    raise ValueError("no exit_path")
                pid = self.start(request)
            except Exception as exc:  # noqa: BLE001 - a bad request must not end the loop
                print(f"[trtllm-slurm] request {request.get('name')} refused: {exc!r}",
                      file=sys.stderr, flush=True)
                self.pending.remove(request)
                if "exit_path" in request:
                    with contextlib.suppress(OSError):
                        write_exit(request, 2)
                continue
            if pid is None:
                continue  # waits; later requests may still fit (backfill)
            self.pending.remove(request)
            self.running[pid] = Running(request["name"], pid, request)
            started = True
        return started

    def _reap(self) -> bool:
        reaped = False
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            child = self.running.pop(pid, None)
            if child is not None:
                kill_group(pid, signal.SIGKILL)  # the test may have left children behind
                code = os.waitstatus_to_exitcode(status)  # the shell's: 128 + a signal
                write_exit(child.request, 128 - code if code < 0 else code)
                reaped = True
        return reaped

    def _cancel(self, name: str) -> None:
        for request in list(self.pending):
            if request["name"] == name:
                self.pending.remove(request)
                write_exit(request, 128 + signal.SIGTERM)
        for child in self.running.values():
            if child.name == name and child.kill_at is None:
                kill_group(child.pid, signal.SIGTERM)
                child.kill_at = time.monotonic() + KILL_GRACE

    def _escalate(self, now: float) -> None:
        for child in self.running.values():
            if child.kill_at is not None and now >= child.kill_at:
                kill_group(child.pid, signal.SIGKILL)

    def _beat(self) -> None:
        assert self.heartbeat is not None
        with contextlib.suppress(OSError):
            write_atomic(self.heartbeat, json.dumps(
                {"time": time.time(), "pid": os.getpid(), "running": len(self.running),
                 "pending": len(self.pending), **self.info}))

    def _kill_all(self) -> None:
        for child in list(self.running.values()):
            kill_group(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_GRACE
        while self.running and time.monotonic() < deadline:
            if not self._reap():
                time.sleep(0.01)
        for request in self.pending:
            with contextlib.suppress(OSError):
                write_exit(request, 128 + signal.SIGKILL)
