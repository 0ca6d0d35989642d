"""SSHShell: the Shell protocol over one paramiko connection, commands and file operations
on one relay channel (``node/relay.py``), else a channel per command and SFTP. A dropped
connection is re-established with backoff; a cut command is re-run only with
``retry_on_drop`` (sbatch must not be)."""

from __future__ import annotations

import base64
import errno
import logging
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.transport.command_log import timed_command
from pytest_trtllm_slurm.transport.file_ops import wire
from pytest_trtllm_slurm.transport.shell import CommandResult, FileOp
from pytest_trtllm_slurm.transport.ssh.auth import OtpProvider, default_otp_provider
from pytest_trtllm_slurm.transport.ssh.commands import (
    OneOpFiles,
    file_op_error,
    piped_env_command,
    remote_command,
)
from pytest_trtllm_slurm.transport.ssh.connect import (
    Connection,
    SSHConnectError,
    SSHConnectionLost,
    connect,
)
from pytest_trtllm_slurm.transport.ssh.paramiko_lib import paramiko
from pytest_trtllm_slurm.transport.ssh.relay_client import RelayChannel, RelayLost
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

log = logging.getLogger(__name__)

T = TypeVar("T")
DROP_ERRORS = (EOFError, OSError, paramiko.SSHException)
BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)
RELAY_STARTS = 5  # relays one run starts at most (a login node that keeps killing them)

__all__ = ["SSHShell", "SSHTarget", "SSHConnectionLost", "SSHConnectError", "remote_command"]


class _Dropped(Exception):
    """Internal: the transport died under an operation."""


class SSHShell(OneOpFiles):
    """Run commands and read/write files on an SSH host (see the module docstring)."""

    def __init__(self, target: SSHTarget, *, otp_provider: OtpProvider = default_otp_provider,
                 backoff: Sequence[float] = BACKOFF, relay: bool = True,
                 relay_python: str = "python3") -> None:
        self.target = target
        self.name = target.alias
        self.reconnects = 0
        self._otp_provider = otp_provider
        self._backoff = tuple(backoff)
        self._lock = threading.RLock()  # guards the connection
        self._sftp_lock = threading.Lock()  # one SFTP request at a time
        self._conn: Connection | None = None
        self._ever_connected = False
        # the relay: commands and pushed file growth on one channel (see relay_client)
        self.use_relay = relay
        self.relay_python = relay_python
        self.relay_starts = 0
        self._relay: RelayChannel | None = None
        self._relay_conn: Connection | None = None  # the connection the relay was tried on
        self._relay_lock = threading.Lock()
        self._later_watches: dict[str, tuple[int, bool]] = {}  # for the next relay
        self._watch_lock = threading.Lock()  # guards _later_watches
        # told while a dropped connection is re-established (a frozen run is worse than a line)
        self.notify: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        state = "connected" if self._conn and self._conn.active else "not connected"
        return f"SSHShell({self.target.display}, {state})"

    def __enter__(self) -> SSHShell:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Connect now (first call) so configuration problems surface before any work."""
        self._connection()

    def close(self) -> None:
        with self._relay_lock:
            if self._relay is not None:
                log.debug("ssh: relay on %s: %s", self.target.display, self._relay.summary())
                self._relay.close()
            self._relay = self._relay_conn = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def local_port(self) -> int | None:
        """Client-side TCP port of the live connection (None when not connected)."""
        return self._conn.local_port() if self._conn else None

    def _connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and self._conn.active:
                return self._conn
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if not self._ever_connected:  # the first login fails fast: it is usually config
                self._conn = connect(self.target, self._otp_provider)
                self._ever_connected = True
            else:
                self._conn = self._reconnect()
            self._start_relay_soon(self._conn)
            return self._conn

    def _reconnect(self) -> Connection:
        last: Exception | None = None
        since, started, said = time.strftime("%H:%M:%S"), time.monotonic(), -1e9
        for attempt, delay in enumerate((0.0, *self._backoff), 1):
            if delay:
                if self.notify is not None and time.monotonic() - said >= 30.0:
                    said = time.monotonic()
                    self.notify(f"The SSH connection to {self.target.display} dropped at "
                                f"{since}; reconnecting (attempt {attempt} of "
                                f"{len(self._backoff) + 1}; last error: {last}).")
                time.sleep(delay)
            try:
                conn = connect(self.target, self._otp_provider)
            except SSHConnectError as exc:  # network: try again; ConfigError propagates
                last = exc
                log.debug("ssh: reconnect to %s failed: %s", self.target.display, exc)
                continue
            self.reconnects += 1
            log.warning("ssh: connection to %s re-established", self.target.display)
            if self.notify is not None and attempt > 1:
                self.notify(f"The SSH connection to {self.target.display} is back (dropped at "
                            f"{since}, {time.monotonic() - started:.0f} s ago).")
            return conn
        raise SSHConnectError(
            f"the SSH connection to {self.target.display} dropped and could not be "
            f"re-established after {len(self._backoff) + 1} attempts: {last}")

    def _dropped(self, conn: Connection) -> None:
        """``conn`` ended under a command: said once, and only when it was the live connection
        (not when ``close`` ended it, nor when another thread already noticed)."""
        with self._lock:
            live = self._conn is conn
            if live:
                conn.close()
                self._conn = None
        if live:
            log.warning("ssh: connection to %s dropped", self.target.display)
        else:
            log.debug("ssh: a command on an ended connection to %s stopped",
                      self.target.display)

    def _start_relay_soon(self, conn: Connection) -> None:
        """Start the relay now, while the caller gets on with what needs no command."""
        if self.use_relay:
            threading.Thread(target=self._relay_on, args=(conn,), name="ssh-relay-start",
                             daemon=True).start()

    def _relay_on(self, conn: Connection) -> RelayChannel | None:
        """The live relay of ``conn``, started on first use (up to RELAY_STARTS a run); None:
        a channel each. A command waits for a start under way (it costs as much as one)."""
        with self._relay_lock:
            old = self._relay
            if old is not None and self._relay_conn is conn and old.alive:
                return old
            if not self.use_relay or self.relay_starts >= RELAY_STARTS:
                return None
            if old is None and self._relay_conn is conn:
                return None  # it did not come up on this connection
            self.relay_starts += 1
            since = time.monotonic()
            relay = RelayChannel.start(conn.transport, self.relay_python)
            log.debug("ssh: relay on %s " + ("started in %.3f s" if relay else
                      "not available (%.3f s)"), self.target.display, time.monotonic() - since)
            with self._watch_lock:
                watches = [(path, offset, wake) for path, (offset, wake)
                           in self._later_watches.items()]
                if relay is not None:
                    self._later_watches.clear()
            if old is not None:
                log.debug("ssh: relay on %s: %s", self.target.display, old.summary())
                old.close()
                watches += old.watches()  # the files the old one watched, from what is unread
            if relay is None:  # kept for a relay started later (another connection)
                with self._watch_lock:
                    for path, offset, wake in watches:
                        self._later_watches.setdefault(path, (offset, wake))
            else:
                try:
                    for path, offset, wake in watches:
                        relay.watch(path, offset, wake=wake)
                except RelayLost:
                    pass  # dead too: its pushed() says None, the reader reads files
            self._relay, self._relay_conn = relay, conn
            return relay

    @property
    def parallel_safe(self) -> bool:
        """Whether several commands may run at once: only over a live relay (a channel each
        would soon reach sshd's MaxSessions, 10 by default)."""
        relay = self._relay
        return relay is not None and relay.alive

    def relay_up(self) -> bool:
        """Whether commands ride the relay (waiting for a start under way)."""
        return self._relay_on(self._connection()) is not None

    def watch(self, path: str, offset: int, *, wake: bool = True) -> None:
        """Have the relay push what ``path`` gets past ``offset`` (``pushed``); ``wake``: a push
        ends ``wait_news``. Never connects (bookkeeping must not wait on the network): with no
        live relay the next one watches it, and until then the reader reads the file."""
        relay = self._relay
        if relay is not None and relay.alive:
            try:
                relay.watch(path, offset, wake=wake)
                return
            except RelayLost:
                pass
        with self._watch_lock:
            self._later_watches[path] = (offset, wake)

    def unwatch(self, path: str) -> None:
        with self._watch_lock:
            self._later_watches.pop(path, None)
        relay = self._relay
        if relay is not None:
            try:
                relay.unwatch(path)
            except RelayLost:
                pass

    def pushed(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None:
        relay = self._relay
        return relay.pushed(path, offset, limit) if relay is not None else None

    def wait_news(self, timeout: float) -> None:
        relay = self._relay
        if relay is not None and relay.alive:
            relay.wait_news(timeout)
        else:
            time.sleep(timeout)

    def run(self, argv: list[str], *, timeout: float | None = 60, input: str | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            retry_on_drop: bool = True) -> CommandResult:
        command = remote_command(argv, env=env, cwd=cwd)  # also checks the env names
        result = self._run_relayed(argv, retry_on_drop, lambda relay: relay.run(
            argv, timeout=timeout, input=input, env=env, cwd=cwd))
        if result is not None:
            return result
        data = input.encode() if input is not None else None
        if env:  # without the relay: the values through the channel, not its command
            command, ahead = piped_env_command(argv, env, cwd=cwd)
            data = ahead + (data or b"")
        return self._exec(argv, command, timeout, retry_on_drop,
                          (lambda fh: fh.write(data)) if data is not None else None)

    def run_stdin_stream(self, argv: list[str], producer: Callable[[IO[bytes]], object], *,
                         timeout: float | None = 600, cwd: str | None = None) -> CommandResult:
        """Run argv with ``producer(stdin)`` streaming into it; never retried (nor is producer)."""
        result = self._run_relayed(argv, False, lambda relay: self._fed(*relay.run_stream(
            argv, producer, timeout=timeout, cwd=cwd)))
        if result is not None:
            return result
        return self._exec(argv, remote_command(argv, cwd=cwd), timeout, False, producer)

    def _run_relayed(self, argv: list[str], retry_on_drop: bool,
                     call: Callable[[RelayChannel], CommandResult]) -> CommandResult | None:
        """``call`` on the relay; None: no relay. A relay that ends under a command that may
        run again is replaced and the command re-run once through the new one."""
        for _attempt in range(2 if self.use_relay else 0):
            conn = self._connection()
            relay = self._relay_on(conn)
            if relay is None:
                return None
            with timed_command(f"ssh {self.name}", argv) as outcome:
                try:
                    outcome.append(call(relay))
                except RelayLost:
                    if not conn.active:
                        self._dropped(conn)
                    if not retry_on_drop:
                        raise self._lost(argv, "it was not run again (it may have taken "
                                         "effect). The connection is re-established on the "
                                         "next call") from None
                    log.warning("ssh: re-running `%s` after the relay's channel ended",
                                shlex.join(argv))
                    continue
            return outcome[0]
        return None

    def _exec(self, argv: Sequence[str], command: str, timeout: float | None,
              retry_on_drop: bool, producer: Callable[[IO[bytes]], Any] | None) -> CommandResult:
        with timed_command(f"ssh {self.name}", argv) as outcome:
            for attempt in range(3):
                conn = self._connection()
                try:
                    chan = conn.transport.open_session(timeout=30)
                except DROP_ERRORS as exc:  # nothing was sent: always safe to try again
                    if conn.active:  # refused (e.g. sshd MaxSessions), not dropped
                        raise SSHConnectError(f"{self.target.display} refused a new SSH "
                                              f"channel: {exc or type(exc).__name__}") from None
                    self._dropped(conn)
                    continue
                try:
                    outcome.append(self._run_channel(conn, chan, argv, command, timeout,
                                                     producer))
                    return outcome[0]
                except _Dropped:
                    self._dropped(conn)
                    if not retry_on_drop or attempt == 2:
                        again = ("it was not run again" if not retry_on_drop
                                 else "gave up after 3 tries")
                        raise self._lost(argv, f"{again} (it may have taken effect). The "
                                         "connection is re-established on the next call"
                                         ) from None
                    log.warning("ssh: re-running `%s` after the connection dropped",
                                shlex.join(argv))
                finally:
                    chan.close()
        raise SSHConnectError(f"could not open a channel to {self.target.display}")

    def _run_channel(self, conn: Connection, chan: paramiko.Channel, argv: Sequence[str],
                     command: str, timeout: float | None,
                     producer: Callable[[IO[bytes]], Any] | None) -> CommandResult:
        try:
            chan.exec_command(command)
        except DROP_ERRORS:
            raise _Dropped() from None
        feeder = _Feeder(chan, producer)
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                busy = _drain(chan, out, err)
            except DROP_ERRORS:
                raise _Dropped() from None
            if chan.exit_status_ready():
                _drain(chan, out, err)
                break
            if not conn.transport.is_active():
                raise _Dropped()
            if deadline is not None and time.monotonic() > deadline:
                return CommandResult(tuple(argv), 124, out.decode(errors="replace"),
                                     err.decode(errors="replace"), timed_out=True)
            if not busy:
                chan.status_event.wait(0.02)
        status = chan.recv_exit_status()
        if status == -1 and not conn.transport.is_active():
            raise _Dropped()
        feeder.join()
        return self._fed(CommandResult(tuple(argv), status, out.decode(errors="replace"),
                                       err.decode(errors="replace")), feeder.error)

    def _lost(self, argv: Sequence[str], again: str) -> SSHConnectionLost:
        return SSHConnectionLost(f"the SSH connection to {self.target.display} dropped while "
                                 f"`{shlex.join(argv)}` was running; {again}")

    def _fed(self, result: CommandResult, error: BaseException | None) -> CommandResult:
        """``result``, or the error of feeding its input when the command still succeeded."""
        if error is not None and result.returncode == 0:
            raise ExecutionError(f"sending input to `{shlex.join(result.argv)}` on "
                                 f"{self.target.display} failed: {error}")
        return result

    def _relayed_file_op(self, op: str, **fields: Any) -> dict[str, Any] | None:
        """``op`` through the relay in one round trip; None: no relay or it ended (file
        operations are idempotent: the caller does it over SFTP)."""
        relay = self._relay_on(self._connection()) if self.use_relay else None
        if relay is None:
            return None
        try:
            return relay.file_op(op, **fields)
        except RelayLost:
            return None
        except OSError as exc:
            if op not in ("mkdir", "write"):
                raise
            raise file_op_error(op, fields["path"], self.target.display,
                                exc.strerror or str(exc)) from None

    def _sftp(self, op: Callable[[paramiko.SFTPClient], T]) -> T:
        """Run an idempotent SFTP operation, reconnecting (and repeating it) on a drop."""
        for attempt in range(3):
            conn = self._connection()
            try:
                with self._sftp_lock:
                    if conn.sftp is None:
                        conn.sftp = conn.transport.open_sftp_client()
                    return op(conn.sftp)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if conn.active:
                    if isinstance(exc, OSError):
                        raise  # a file error (ENOENT, EACCES, failure) on a live connection
                    conn.sftp = None  # the SFTP channel broke; the transport is fine
                else:
                    self._dropped(conn)
                if attempt == 2:
                    raise SSHConnectError(f"SFTP to {self.target.display} keeps failing: "
                                          f"{exc}") from None
        raise AssertionError("unreachable")

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        answer = self._relayed_file_op("read", path=path, offset=offset, limit=limit)
        if answer is not None:
            return base64.b64decode(answer["data"])

        def op(sftp: paramiko.SFTPClient) -> bytes:
            try:
                with sftp.open(path, "rb") as fh:
                    n = min(limit, fh.stat().st_size - offset)
                    return b"".join(fh.readv([(offset, n)])) if n > 0 else b""
            except FileNotFoundError:
                return b""

        return self._sftp(op)

    def read_when(self, path: str, needle: str, timeout: float) -> bytes | None:
        """``path``'s first 16 KiB once they hold ``needle``, waited for on the login
        node (one round trip, at most ``timeout`` s; what it holds then, found or not).
        None without a relay: the caller looks itself, as often as it likes."""
        answer = self._relayed_file_op("await", path=path, needle=needle, timeout=timeout)
        return None if answer is None else base64.b64decode(answer["data"])

    def _stat_size(self, path: str) -> int | None:
        """Size of ``path``; None when it is absent."""
        answer = self._relayed_file_op("size", path=path)
        if answer is not None:
            return None if answer.get("absent") else int(answer["size"])

        def op(sftp: paramiko.SFTPClient) -> int | None:
            try:
                return int(sftp.stat(path).st_size or 0)
            except FileNotFoundError:
                return None

        return self._sftp(op)

    def size(self, path: str) -> int:
        return self._stat_size(path) or 0

    def exists(self, path: str) -> bool:
        return self._stat_size(path) is not None

    def file_batch(self, ops: Sequence[FileOp]) -> list[bytes] | None:
        """``ops`` in one relay round trip (``Shell.file_batch``); None without a relay."""
        relay = self._relay_on(self._connection()) if self.use_relay else None
        if relay is None:
            return None
        try:
            # (relay.BATCHED: one answer per op done, the last with "errno" when one failed)
            answers = relay.file_op("batch", ops=[wire(op) for op in ops]).get("answers") or []
        except RelayLost:
            return None
        results: list[bytes] = []
        for op, answer in zip(ops, answers, strict=False):  # fewer: one failed
            if "errno" in answer:
                why = str(answer.get("error", ""))
                if op.op in ("mkdir", "write"):
                    raise file_op_error(op.op, op.path, self.target.display, why)
                raise OSError(int(answer["errno"]), f"{op.op} {op.path} on "
                              f"{self.target.display}: {why}")
            results.append(base64.b64decode(answer.get("data") or ""))
        if len(results) != len(ops):  # a relay that did not do them all: say so
            raise OSError(errno.EIO, f"the relay on {self.target.display} did "
                          f"{len(results)} of {len(ops)} file operations")
        return results

    def _exec_input(self, argv: list[str], data: bytes, shown: list[str]
                    ) -> tuple[int, str, str, bool]:
        res = self._exec(shown, remote_command(argv), 120, True, lambda fh: fh.write(data))
        return res.returncode, res.stdout, res.stderr, res.timed_out


class _Feeder:
    """Writes stdin from a thread, so remote output is drained meanwhile (no deadlock); the
    producer writes to it as to a binary file (``write``, ``flush``: all tarfile needs)."""

    def __init__(self, chan: paramiko.Channel,
                 producer: Callable[[IO[bytes]], Any] | None) -> None:
        self.error: BaseException | None = None
        self._chan = chan
        self._thread: threading.Thread | None = None
        if producer is None:
            chan.shutdown_write()
            return
        self._thread = threading.Thread(target=self._feed, args=(producer,), daemon=True)
        self._thread.start()

    def _feed(self, producer: Callable[[IO[bytes]], Any]) -> None:
        try:
            producer(self)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc
        finally:
            try:
                self._chan.shutdown_write()
            except DROP_ERRORS:
                pass

    def write(self, data: bytes) -> int:
        self._chan.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=30)


def _drain(chan: paramiko.Channel, out: bytearray, err: bytearray) -> bool:
    busy = False
    while chan.recv_ready():
        out += chan.recv(1 << 16)
        busy = True
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(1 << 16)
        busy = True
    return busy
