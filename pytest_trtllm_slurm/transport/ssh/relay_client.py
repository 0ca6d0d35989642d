"""The controller's end of the login-node relay (``node/relay.py``): one channel per run.

A command on its own channel is a new sshd session (a fifth of a second or more); here it
is one JSON line each way, and appended bytes of watched files are pushed. Pushes are kept
by absolute offset: an offset they do not cover answers None and the reader reads the file
(nothing lost or read twice). Bounded: ``relay.PUSH_WINDOW`` ahead per file (dropped past
twice that), ``relay.STDIN_WINDOW`` of streamed stdin, ``MAX_MESSAGE`` per line."""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from pytest_trtllm_slurm.node import relay as relay_source
from pytest_trtllm_slurm.planning.masking import mask_text
from pytest_trtllm_slurm.transport.shell import CommandResult
from pytest_trtllm_slurm.transport.ssh.commands import _relay_source, remote_command
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko

log = logging.getLogger(__name__)

READY_TIMEOUT = 20.0  # seconds for the relay to say it is up (a cold python3 on a busy login node)
ANSWER_GRACE = 30.0  # seconds past a command's own timeout before the controller gives up on it
FILE_OP_WAIT = 60.0  # seconds for one file operation's answer
# the longest line the relay may send: a read answer of 64 MiB (a lock's output) in base64
MAX_MESSAGE = 160 << 20


class RelayLost(Exception):
    """The relay's channel ended under a command: it may or may not have run."""


_Int = Annotated[int, Strict()]
_Str = Annotated[str, Strict()]


class FileAnswer(BaseModel):
    """The answer to one file operation (alone, or one of a batch's ``answers``)."""

    model_config = ConfigDict(extra="ignore")

    data: _Str = Field(default="", pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    size: _Int = Field(default=0, ge=0)
    absent: Annotated[bool, Strict()] = False
    errno: _Int | None = None
    error: _Str = ""


class RelayAnswer(FileAnswer):
    """An answer line of the relay, every field typed as the client uses it: an answer
    that is not one ends the channel (commands fall back to channels of their own)."""

    id: _Int
    rc: _Int = 0
    out: _Str = ""
    err: _Str = ""
    timed_out: Annotated[bool, Strict()] = False
    answers: list[FileAnswer] = Field(default_factory=list, max_length=1024)


# the cluster's own interpreter when the login node has it (often an absolute path: no
# shim or module to resolve), else the login node's python3; $2 names the relay in ps
_START = ('command -v "$0" >/dev/null 2>&1 && exec "$0" -u -c "$1" "$2"; '
          'exec python3 -u -c "$1" "$2"')
# the quick start: the first given absolute interpreter, -I -S (the relay is stdlib only),
# not what PATH names (often a shim: a second process); none there: exit 127, ``_START``
_QUICK = ('src=$1; shift; for p in "$@"; do [ -f "$p" ] && [ -x "$p" ] && '
          'exec "$p" -I -S -u -c "$src" "$0"; done; exit 127')
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")


def relay_tag(pid: int | None = None) -> str:
    """The relay's one argument: whose it is (``ps`` on the login node shows it)."""
    return f"trtllm-relay:{os.getpid() if pid is None else pid}"


def quick_candidates(python: str) -> list[str]:
    """The interpreters the quick start tries: the cluster's own if absolute, else python3's."""
    found = [python] if python.startswith("/") else []
    if python in ("python3", "python"):
        found += SYSTEM_PYTHONS
    return found


@dataclass
class _Feed:
    """Bytes of one watched file, from ``start`` on, as pushed and not yet read past."""

    start: int
    data: bytearray = field(default_factory=bytearray)
    broken: bool = False  # a push skipped bytes: the file is read directly from now on
    wake: bool = True  # a push wakes whoever waits in wait_news (reports: yes; logs: no)
    acked: int = 0  # the offset last acknowledged to the relay (its window starts there)

    @property
    def end(self) -> int:
        return self.start + len(self.data)


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] | None = None
    taken: int = 0  # bytes of a streamed stdin the relay wrote to the command ("took")


class RelayChannel:
    """One running relay: commands through it, pushed file growth out of it."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # pending answers and feeds
        self._pending: dict[int, _Pending] = {}
        self._feeds: dict[str, _Feed] = {}
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._alive = True
        self.pushed_bytes = 0  # what the relay sent unasked (figures for benchmarks)
        self.pushes = 0
        self.requests: dict[str, int] = {}  # round trips by operation (run, read, write...)
        self._news = threading.Condition()
        threading.Thread(target=self._read, name="ssh-relay", daemon=True).start()

    @classmethod
    def start(cls, transport: paramiko.Transport, python: str = "python3", *,
              quick: bool = True) -> RelayChannel | None:
        """A relay on a new channel of ``transport``; None when it does not come up (no python3,
        a restricted shell): each command gets its own channel. ``quick``: ``_QUICK`` first."""
        candidates = quick_candidates(python) if quick else []
        starts = [["sh", "-c", _START, python, _relay_source(), relay_tag()]]
        if candidates:
            starts.insert(0, ["sh", "-c", _QUICK, relay_tag(), _relay_source(), *candidates])
        for argv in starts:
            try:
                chan = transport.open_session(timeout=30)
                chan.exec_command(remote_command(argv))
            except (EOFError, OSError, paramiko.SSHException) as exc:
                log.debug("ssh relay: could not start: %s", exc)
                continue
            relay = cls(chan)
            if relay._ready.wait(READY_TIMEOUT) and relay.alive:
                return relay
            err = b""
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
            log.debug("ssh relay: did not come up: %s",
                      mask_text(err.decode(errors="replace")[-300:]))
            relay.close()
        return None

    @property
    def alive(self) -> bool:
        return self._alive and not self._chan.closed

    def summary(self) -> str:
        """What went through it: round trips by operation, pushes (for the debug log)."""
        with self._lock:
            asked = ", ".join(f"{n} {op}" for op, n in sorted(self.requests.items()))
            return (f"{sum(self.requests.values())} round trips ({asked or 'none'}), "
                    f"{self.pushes} pushes ({self.pushed_bytes} bytes)")

    def close(self) -> None:
        """Closing stdin ends the relay; its running commands finish on their own."""
        self._alive = False
        try:
            self._chan.close()
        except (EOFError, OSError, paramiko.SSHException):
            pass
        self._fail_pending()

    def call(self, message: dict[str, Any], wait: float | None = None,
             feed: Callable[[int, _Pending], None] | None = None) -> dict[str, Any] | None:
        """Send one request (``feed`` streams its stdin) and wait ``wait`` s for its answer."""
        ident, pending = next(self._ids), _Pending()
        began = time.monotonic()
        with self._lock:
            self._pending[ident] = pending
            self.requests[message["op"]] = self.requests.get(message["op"], 0) + 1
        try:
            self._send({**message, "id": ident})
            if feed is not None:
                feed(ident, pending)
            if not pending.done.wait(wait):
                return None
        finally:
            with self._lock:
                self._pending.pop(ident, None)
            log.debug("ssh relay: %s %s in %.3f s", message["op"], _paths(message),
                      time.monotonic() - began)
        if pending.answer is None:
            raise RelayLost()
        return pending.answer

    def file_op(self, op: str, **fields: Any) -> dict[str, Any]:
        """A file operation in one round trip; OSError as the login node raised it."""
        answer = self.call({"op": op, **fields}, FILE_OP_WAIT)
        if answer is None:
            raise RelayLost()  # stuck (a hung file system): the caller tries SFTP
        if "errno" in answer:
            raise OSError(int(answer["errno"]), str(answer.get("error", "")))
        return answer

    def run(self, argv: list[str], *, timeout: float | None, input: str | None,
            env: dict[str, str] | None, cwd: str | None) -> CommandResult:
        """Run ``argv`` on the login node; RelayLost when the channel ends first."""
        return _result(argv, self.call(
            {"op": "run", "argv": list(argv), "env": env or None, "cwd": cwd, "input": input,
             "timeout": timeout}, None if timeout is None else timeout + ANSWER_GRACE))

    def run_stream(self, argv: list[str], producer: Callable[[IO[bytes]], object], *,
                   timeout: float | None, cwd: str | None) -> tuple[CommandResult,
                                                                  BaseException | None]:
        """Run ``argv`` with ``producer(stdin)`` streaming into it; also what the producer raised.
        RelayLost when the channel ends first."""
        errors: list[BaseException] = []

        def feed(ident: int, pending: _Pending) -> None:
            try:
                producer(_StdinWriter(self, ident, pending))  # type: ignore[arg-type]
            except RelayLost:
                raise
            except CommandEnded:
                pass  # it stopped reading: the rest is dropped, its exit code says
            except BaseException as exc:  # noqa: BLE001 - told to the caller with the result
                errors.append(exc)
            self._send({"op": "stdin", "id": ident, "eof": True})

        answer = self.call({"op": "run", "argv": list(argv), "env": None, "cwd": cwd,
                            "input": None, "timeout": timeout, "stream": True},
                           None if timeout is None else timeout + ANSWER_GRACE, feed)
        return _result(argv, answer), (errors[0] if errors else None)

    def watch(self, path: str, offset: int, *, wake: bool = True) -> None:
        """Push what ``path`` gets from ``offset`` on; ``wake``: pushes end a wait_news early."""
        with self._lock:
            self._feeds[path] = _Feed(start=offset, wake=wake, acked=offset)
        self._send({"op": "watch", "path": path, "offset": offset})

    def unwatch(self, path: str) -> None:
        with self._lock:
            self._feeds.pop(path, None)
        if self.alive:
            self._send({"op": "unwatch", "path": path})

    def watches(self) -> list[tuple[str, int, bool]]:
        """(path, lowest offset held, wake) of every watched file, for a replacing relay."""
        with self._lock:
            return [(path, feed.start, feed.wake) for path, feed in self._feeds.items()]

    def pushed(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None:
        """Bytes of ``path`` from ``offset`` that were pushed (b"": none since); None when the
        pushes do not cover ``offset`` (the caller reads the file). Bytes before it are dropped
        and acked (the relay's window moves on)."""
        with self._lock:
            feed = self._feeds.get(path)
            if not self.alive or feed is None or feed.broken:
                return None
            if not feed.start <= offset <= feed.end:
                return None
            del feed.data[:offset - feed.start]
            feed.start = offset
            ack = offset - feed.acked >= relay_source.PUSH_WINDOW // 4
            if ack:
                feed.acked = offset
            data = bytes(feed.data[:limit])
        if ack:
            try:
                self._send({"op": "ack", "path": path, "offset": offset})
            except RelayLost:
                return None
        return data

    def wait_news(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, less when a push (or the channel's end) comes."""
        with self._news:
            self._news.wait(timeout)

    def _send(self, message: dict[str, Any]) -> None:
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                self._chan.sendall(line)
        except (EOFError, OSError, paramiko.SSHException):
            self.close()
            raise RelayLost() from None

    def _read(self) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = self._chan.recv(1 << 16)
                if not chunk:
                    break
                scan = len(buffer)  # what came before has no newline: look at the new bytes
                buffer += chunk
                start = 0
                while (end := buffer.find(b"\n", scan)) >= 0:
                    self._handle(bytes(buffer[start:end]))
                    start = scan = end + 1
                del buffer[:start]
                if len(buffer) > MAX_MESSAGE:
                    log.debug("ssh relay: a line longer than %d bytes: channel ended",
                              MAX_MESSAGE)
                    break
        except (EOFError, OSError, paramiko.SSHException) as exc:
            log.debug("ssh relay: channel ended: %s", exc)
        finally:
            self._alive = False
            self._ready.set()
            self._fail_pending()

    def _handle(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except Exception:  # noqa: BLE001 - not JSON, nested too deep, ...: never the reader's end
            # a login shell that prints (a banner in .bashrc): skipped, shown masked
            log.debug("ssh relay: not a message: %s",
                      mask_text(line[:200].decode("utf-8", "replace")))
            return
        if not isinstance(message, dict):
            return
        if "push" in message:
            self._take_push(message)
        elif "took" in message:
            self._took(message)
        elif "id" in message:
            try:
                RelayAnswer.model_validate(message)
            except ValidationError as exc:
                log.debug("ssh relay: not an answer (%s): channel ended",
                          exc.errors()[0]["msg"])
                self.close()
                return
            with self._lock:
                pending = self._pending.get(message["id"])
            if pending is not None:
                pending.answer = message
                pending.done.set()
        elif "ready" in message:
            self._ready.set()

    def _take_push(self, message: dict[str, Any]) -> None:
        try:
            data = base64.b64decode(message["data"])
            offset = int(message["offset"])
        except (KeyError, TypeError, ValueError, binascii.Error):
            return
        with self._lock:
            feed = self._feeds.get(str(message["push"]))
            if feed is None or feed.broken:
                return
            if offset > feed.end or offset + len(data) - feed.start > 2 * relay_source.PUSH_WINDOW:
                # a gap (never guess what it held), or more than the window unread: the
                # file is read itself from here on
                feed.broken = True
                feed.data = bytearray()
            elif offset + len(data) > feed.end:
                feed.data += data[feed.end - offset:]  # only what is new (no doubles)
            self.pushed_bytes += len(data)
            self.pushes += 1
            if not feed.wake:
                return
        with self._news:
            self._news.notify_all()

    def _took(self, message: dict[str, Any]) -> None:
        """The relay wrote a piece of a streamed stdin: that much more may be sent."""
        try:
            ident, taken = int(message["took"]), int(message["bytes"])
        except (KeyError, TypeError, ValueError):
            return
        with self._lock:
            pending = self._pending.get(ident)
            if pending is not None:
                pending.taken += taken
        with self._news:
            self._news.notify_all()

    def _fail_pending(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for item in pending:
            item.done.set()  # answer None: RelayLost
        with self._news:
            self._news.notify_all()


def _result(argv: list[str], answer: dict[str, Any] | None) -> CommandResult:
    if answer is None:
        return CommandResult(tuple(argv), 124, "", "no answer from the relay", timed_out=True)
    return CommandResult(tuple(argv), int(answer["rc"]), str(answer.get("out", "")),
                         str(answer.get("err", "")), timed_out=bool(answer.get("timed_out")))


def _paths(message: dict[str, Any]) -> str:
    """What a request's debug line names: its path, or a batch's ops and paths."""
    if message["op"] == "batch":
        return "[" + ", ".join(f"{op.get('op')} {op.get('path', '')}"
                               for op in message.get("ops") or []) + "]"
    return str(message.get("path", ""))


class CommandEnded(BrokenPipeError):
    """A write to the input of a streamed command that has ended (was answered)."""


class _StdinWriter:
    """The file a producer writes to: pieces as ``stdin`` lines. Once the command is answered a
    write fails as to a closed pipe, so a producer feeding it until then (a keep-alive) stops."""

    PIECE = 1 << 18

    def __init__(self, relay: RelayChannel, ident: int, pending: _Pending) -> None:
        self._relay, self._id, self._pending = relay, ident, pending
        self._sent = 0

    def _check(self) -> None:
        if self._pending.done.is_set():
            if self._pending.answer is None:
                raise RelayLost()
            raise CommandEnded(f"the command ended (exit code {self._pending.answer.get('rc')})")
        if not self._relay.alive:
            raise RelayLost()

    def write(self, data: bytes) -> int:
        self._check()
        view = memoryview(data)
        relay, pending = self._relay, self._pending
        for start in range(0, len(view), self.PIECE):
            # the window: at most STDIN_WINDOW sent and not yet written by the relay
            while (self._sent - pending.taken >= relay_source.STDIN_WINDOW and relay.alive
                   and not pending.done.is_set()):
                with relay._news:
                    relay._news.wait(0.5)
            self._check()
            piece = view[start:start + self.PIECE]
            relay._send({"op": "stdin", "id": self._id,
                               "data": base64.b64encode(piece).decode("ascii")})
            self._sent += len(piece)
        return len(data)

    def flush(self) -> None:
        pass

