"""A lock on a file of the target (a remote allocation is shared by every machine of the
user), held by ``flock`` then ``cat`` there, whose stdin is our end of the connection: when
we release, die or drop it, ``cat`` ends and the lock goes (else after ``max_hold``). Its
files are made by ``mktemp``; a lock file that is a link is refused."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.records import load_json
from pytest_trtllm_slurm.node.paths import holder_of
from pytest_trtllm_slurm.transport.shell import CommandResult, LocalShell, Shell

log = logging.getLogger(__name__)

# $1 lock file, $2 seconds to wait for it, $3 seconds to hold it at most, $4 holder record,
# then a command to run once held (its output and status in <lock>.out, written before the
# holder record that tells the waiting side it holds the lock; the record is in <lock>.taken
# before that command starts, for work that needs only the lock); all through mktemp's
# temporary files (unpredictable names, O_EXCL), renamed over their names
_HOLD = r"""
lock=$1 wait=$2 hold=$3 info=$4; shift 4
command -v flock >/dev/null 2>&1 || { echo "flock (util-linux) is not installed" >&2; exit 127; }
[ -L "$lock" ] && { echo "$lock is a symbolic link: not followed" >&2; exit 71; }
exec 9>>"$lock" || exit 71
flock -x -w "$wait" 9 || exit 75
umask 077
if [ $# -gt 0 ]; then
  t=$(mktemp "$lock.taken.XXXXXXXX") && printf '%s\n' "$info" >"$t" && mv -f "$t" "$lock.taken"
  t=$(mktemp "$lock.out.XXXXXXXX") || exit 73
  { "$@" </dev/null 2>/dev/null; printf '\036%s\n' "$?"; } >"$t"
  mv -f "$t" "$lock.out"
fi
t=$(mktemp "$lock.holder.XXXXXXXX") && printf '%s\n' "$info" >"$t" && mv -f "$t" "$lock.holder"
timeout "$hold" cat >/dev/null
rm -f "$lock.holder" "$lock.taken"
"""
KEEPALIVE = 1.0  # seconds between the bytes that tell a dead holder channel from a live one
LOCK_WAIT_EXIT = 75
AWAIT = 0.5  # seconds one wait for the holder record may last on a shell that waits there


@dataclass
class _Hold:
    """One acquisition: its holder thread, its token, how it ended."""

    token: str
    release: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    result: CommandResult | None = None
    was_held: bool = False
    taken: Callable[[], None] | None = None  # the caller's, called once (``_taken``)
    taken_lock: threading.Lock = field(default_factory=threading.Lock)

    def _taken(self) -> None:
        """``taken()`` once: from the watch on the target, else when the acquire sees it."""
        with self.taken_lock:
            taken, self.taken = self.taken, None
        if taken is not None:
            taken()


WAIT_RETRIES = 3  # a lock wait cut by a dropped connection starts again this often


class ShellLock:
    """An exclusive lock on ``path`` of ``shell``'s host (see the module docstring)."""

    def __init__(self, shell: Shell, path: str, *, max_hold: float = 7 * 24 * 3600.0,
                 keep: bool = False) -> None:
        """``keep``: a holder that ends while held (the connection dropped) is started
        again, for a lock that proves a run alive (nobody else contends for it)."""
        self.shell = shell
        self.path = path
        self.max_hold = max_hold
        self.keep = keep
        self._hold: _Hold | None = None

    @property
    def where(self) -> str:
        """The lock file as messages name it."""
        return shell_where(self.shell, self.path)

    @property
    def held(self) -> bool:
        """Held now (the holder process still runs)."""
        hold = self._hold
        return (hold is not None and hold.thread is not None and hold.thread.is_alive()
                and hold.result is None and not hold.release.is_set())

    def acquire(self, timeout: float, info: dict[str, object] | None = None, *,
                waiting: Callable[[float], None] | None = None,
                then: list[str] | None = None,
                taken: Callable[[], None] | None = None) -> bool:
        """Take the lock within ``timeout`` s (False: another held it); ``waiting`` is called
        about once a second; ``then``: a command run once held (``output()``); ``taken``:
        called (in another thread) as soon as it is held, while ``then`` may still run."""
        if self.held:
            raise RuntimeError(f"{self.where} is already held by this process")
        hold = self._hold = _Hold(token=secrets.token_hex(8))

        def holder_argv(token: str) -> list[str]:
            record = json.dumps({**(info or {}), "token": token})
            return ["sh", "-c", _HOLD, "sh", self.path, str(max(1, int(timeout + 0.999))),
                    str(int(self.max_hold)), record, *(then or [])]

        hold.thread = threading.Thread(target=self._run_holder, args=(hold, holder_argv),
                                       daemon=True, name=f"lock {self.path}")
        hold.thread.start()
        hold.taken = taken
        if taken is not None and then:
            threading.Thread(target=self._watch_taken, args=(hold,), daemon=True,
                             name=f"lock taken {self.path}").start()
        started, pause, said = time.monotonic(), 0.002, time.monotonic()
        while True:
            if hold.result is not None:  # the holder ended before it held the lock
                if hold.result.returncode == LOCK_WAIT_EXIT:
                    return False
                raise ExecutionError(f"could not take the lock {self.where}: "
                                     f"{hold.result.describe()}")
            found, waited = self._look(hold.token)
            if found and found.get("token") == hold.token:
                hold.was_held = True
                hold._taken()
                return True
            now = time.monotonic()
            if now - started > timeout + 30:  # the remote side's own wait ended long ago
                self.release()
                return False
            if waiting is not None and now - said >= 1.0:
                said = now
                waiting(now - started)
            if not waited:
                time.sleep(pause)
                # the relay's ``look_pause`` schedule (not imported: the relay's module,
                # shipped alone to login nodes, costs 5 ms to import on every run's start)
                pause = min(0.005 if now - started < 0.25 else 0.25, pause * 1.5)

    def release(self, *, wait: bool = False) -> None:
        """Let go (the holder's stdin closes: it ends a moment later; ``wait``: until then)."""
        hold, self._hold = self._hold, None
        if hold is None:
            return
        hold.release.set()
        if wait and hold.thread is not None:
            hold.thread.join(timeout=30)

    def output(self) -> tuple[int, str]:
        """The exit status and output of the ``then`` command of the last acquire."""
        text = self.shell.read_from(f"{self.path}.out", 0, 1 << 26).decode("utf-8", "replace")
        body, sep, status = text.rstrip("\n").rpartition("\036")
        return (int(status), body) if sep and status.isdigit() else (-1, text)

    def _watch_taken(self, hold: _Hold) -> None:
        """Wait on the target for ``<lock>.taken`` to name this acquisition, then call ``taken``
        (failing that, the acquire calls it once it sees the lock held)."""
        path = f"{self.path}.taken"
        try:
            while hold.result is None and not hold.release.is_set() and hold.taken:
                raw = self.shell.read_when(path, hold.token, AWAIT)
                if raw is None:  # no relay (a local or OpenSSH shell, or it is gone)
                    return
                found = _record(raw)
                if found and found.get("token") == hold.token:
                    hold._taken()
                    return
        except Exception as exc:  # noqa: BLE001 - only an early start is lost
            log.debug("lock %s: could not wait for it to be taken: %s", self.path, exc)

    def _look(self, token: str) -> tuple[dict[str, object] | None, bool]:
        """The holder's record, and whether the look waited (``AWAIT`` s on the SSH relay) for
        it to name ``token``."""
        raw = self.shell.read_when(holder_of(self.path), token, AWAIT)
        if raw is None:
            return self.holder(), False
        return _record(raw), True

    def holder(self) -> dict[str, object] | None:
        """The current holder's record (None when none is recorded)."""
        return _record(self.shell.read_from(holder_of(self.path), 0, 1 << 14))

    def describe(self) -> str:
        """``held by pid P on H since T, run R`` (for messages)."""
        info = self.holder()
        try:
            return (f"held by pid {info['pid']} on {info['host']} since {info['since']}, "
                    f"run {info['run_id']}") if info else "its holder is not recorded"
        except KeyError:
            return "its holder is not recorded"

    def _run_holder(self, hold: _Hold, holder_argv: Callable[[str], list[str]]) -> None:
        def produce(stdin: IO[bytes]) -> None:
            try:
                while not hold.release.wait(KEEPALIVE):
                    stdin.write(b"\n")  # fails once the holder is gone: then stop feeding
                    stdin.flush()
            except (OSError, ValueError):
                return
            except Exception as exc:  # noqa: BLE001 - a dropped channel, whatever its type
                log.debug("lock %s: holder channel ended: %s", self.path, exc)

        drops = 0
        while True:
            cut = False
            argv = holder_argv(hold.token)
            try:
                result = hold_stdin(self.shell, argv, produce)
            except Exception as exc:  # noqa: BLE001 - reported to the waiting caller
                result, cut = CommandResult(tuple(argv), 255, "", str(exc)), True
            if hold.release.is_set():
                break
            if cut and not hold.was_held and drops < WAIT_RETRIES:
                # dropped while waiting (never held): wait again on the next connection
                drops += 1
                # the cut connection's wait may still take the lock on the host; with its
                # channel gone it lets go at once, so its record must not read as ours
                hold.token = secrets.token_hex(8)
                log.warning("lock %s: the connection dropped while waiting for it (%s); "
                            "waiting again", self.where, result.stderr)
                if hold.release.wait(1.0):
                    break
                continue
            log.warning("lock %s: its holder ended while held (%s)", self.where,
                        result.describe())
            if not (self.keep and hold.was_held) or hold.release.wait(1.0):
                break  # (the next try reconnects)
        hold.result = result


def shell_where(shell: Shell, path: str) -> str:
    """A path of ``shell``'s host as messages name it (``host:path``; a local path as is)."""
    return path if isinstance(shell, LocalShell) else f"{shell.name}:{path}"


def _record(raw: bytes) -> dict[str, object] | None:
    """A holder record from the bytes of its file (None: none, or not one)."""
    try:
        found = load_json(raw.decode("utf-8", "replace") or "null", "the lock's holder")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def hold_stdin(shell: Shell, argv: list[str],
               produce: Callable[[IO[bytes]], None]) -> CommandResult:
    """Run argv with ``produce`` feeding its stdin until it returns (no time limit)."""
    runner = getattr(shell, "run_stdin_stream", None)
    if runner is not None:
        result: CommandResult = runner(argv, produce, timeout=None)
        return result
    with tempfile.TemporaryFile() as err:  # (communicate() would close stdin at once)
        # LocalShell: a child process here, in its own session (a Ctrl-C at the terminal
        # is this run's to handle: its lock is let go when the run lets go, or dies)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        assert proc.stdin is not None
        feeder = threading.Thread(target=_feed_and_close, args=(proc.stdin, produce),
                                  daemon=True)
        feeder.start()
        code = proc.wait()
        feeder.join(timeout=30)
        err.seek(0)
        return CommandResult(tuple(argv), code, "", err.read().decode(errors="replace"))


def _feed_and_close(stdin: IO[bytes], produce: Callable[[IO[bytes]], None]) -> None:
    try:
        produce(stdin)
    finally:
        with contextlib.suppress(OSError):
            stdin.close()
