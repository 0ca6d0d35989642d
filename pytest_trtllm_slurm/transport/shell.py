"""Where commands run: this machine (LocalShell) or an SSH host, behind one Shell protocol;
commands are argv lists, never joined into a shell string without shlex.quote."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.node.files import UntrustedPath, make_dirs, write_atomic
from pytest_trtllm_slurm.transport.command_log import timed_command


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        """One line naming the command and why it failed (for error messages)."""
        why = "timed out" if self.timed_out else f"exit code {self.returncode}"
        detail = (self.stderr or self.stdout).strip().splitlines()
        return f"`{shlex.join(self.argv)}` {why}" + (f": {detail[-1]}" if detail else "")


Op = Literal["mkdir", "write", "read", "remove"]
READ_LIMIT = 4096  # bytes of a small file (a heartbeat, an exit code) read at once


@dataclass(frozen=True)
class FileOp:
    """One file operation: ``mkdir`` (``private``), ``write`` (``data``, atomic, ``mode``),
    ``read`` (the first ``limit`` bytes; b"" while absent) or ``remove`` (``rm -f``)."""

    op: Op
    path: str
    data: str = ""
    private: bool = False
    mode: int = 0o600
    limit: int = READ_LIMIT


class Shell(Protocol):
    """Run commands and read/write files on one host."""

    name: str

    def run(self, argv: list[str], *, timeout: float | None = 60, input: str | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            retry_on_drop: bool = True) -> CommandResult:
        """Run argv. ``retry_on_drop=False``: a command that must not run twice (a submission);
        a remote shell raises instead of re-running it after a dropped connection."""
        ...

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Bytes of ``path`` from ``offset`` (at most ``limit``); b"" if absent."""
        ...

    def size(self, path: str) -> int:
        """Size of ``path`` in bytes; 0 if absent."""
        ...

    def write_file(self, path: str, data: str, mode: int = 0o600) -> None:
        """Atomically (a temporary name, then a rename): a reader polling for ``path``
        sees no file or the whole of it (the warm workers' mailboxes rely on it)."""
        ...

    def mkdir(self, path: str, *, private: bool = False) -> None:
        """``mkdir -p`` whose new folders are 0700. A folder it makes or finds made meanwhile
        (and with ``private`` ``path`` itself) must be ours, writable by us only, else
        ExecutionError."""
        ...

    def exists(self, path: str) -> bool: ...

    def read_when(self, path: str, needle: str, timeout: float) -> bytes | None:
        """``path``'s first 16 KiB once they hold ``needle``, waited for on the host (one
        round trip, at most ``timeout`` s; what it holds then, found or not). None: this
        shell cannot wait there (no relay): the caller looks itself, as often as it likes."""
        ...

    def file_batch(self, ops: Sequence[FileOp]) -> list[bytes] | None:
        """Each op's result in order (a read's bytes, b"" for the others) from one round trip;
        the first failure raised as the op alone raises it, none done after it. None: not
        this shell, or not now: ``file_ops.run_ops`` does them one by one (each idempotent)."""
        ...


@runtime_checkable
class PushingShell(Protocol):
    """A Shell whose far end pushes what is appended to watched files (SSHShell's relay).
    ``pushed`` may answer None at any time: the reader then reads the file by offset."""

    def watch(self, path: str, offset: int, *, wake: bool = True) -> None: ...

    def unwatch(self, path: str) -> None: ...

    def pushed(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None: ...

    def wait_news(self, timeout: float) -> None: ...


class WithoutRelay:
    """The Shell members a shell without the SSH relay answers None to: no batched file
    operations, no wait on the host (LocalShell: no round trip to save; OpenSSHShell)."""

    def file_batch(self, ops: Sequence[FileOp]) -> None:
        return None

    def read_when(self, path: str, needle: str, timeout: float) -> None:
        return None


class LocalShell(WithoutRelay):
    """The machine pytest runs on."""

    name = "localhost"
    parallel_safe = True  # run() may be called from several threads at once

    def run(self, argv: list[str], *, timeout: float | None = 60, input: str | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            retry_on_drop: bool = True) -> CommandResult:  # (nothing drops locally)
        with timed_command(self.name, argv) as outcome:
            try:
                proc = subprocess.run(argv, input=input, capture_output=True, text=True,
                                      timeout=timeout, env={**os.environ, **env} if env else None,
                                      cwd=cwd, check=False)
                result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
            except FileNotFoundError as exc:
                result = CommandResult(tuple(argv), 127, "",
                                       f"{argv[0]}: not found ({exc.strerror})")
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
                result = CommandResult(tuple(argv), 124, out, err, timed_out=True)
            outcome.append(result)
        return result

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        try:
            # the monitor asks every few ms whether a file grew: one stat, not open+read
            if os.stat(path).st_size <= offset:
                return b""
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(limit)
        except FileNotFoundError:
            return b""

    def size(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except OSError:
            return 0

    def write_file(self, path: str, data: str, mode: int = 0o600) -> None:
        write_atomic(path, data, mode=mode, parents=True)

    def mkdir(self, path: str, *, private: bool = False) -> None:
        try:
            make_dirs(path, private=private)
        except UntrustedPath as exc:
            raise ExecutionError(f"cannot use the folder {exc}") from None

    def exists(self, path: str) -> bool:
        return Path(path).exists()
