"""reports.jsonl as the node appends to it: whole lines, flushed at once, fsynced in batches.

Each line goes to the kernel with one ``write`` on an O_APPEND descriptor as soon as it is
made, so the controller can read the file while it grows, a killed worker process (SIGKILL,
a segfault, the OOM killer) loses nothing it wrote, and a torn last line is the only damage
any crash can do. What ``fsync`` adds is durability against the machine itself going down
and, on a shared file system, that the file server has the lines now rather than when the
client's cache writes them back (seconds to tens of seconds). It costs about half a
millisecond a line, and a test writes six lines: more than a trivial test itself. So:

- a line is fsynced (with all before it) when it comes ``SYNC_EVERY`` seconds or more after
  the last fsync, or when its writer says it must be (``append(..., sync=True)``: the worker
  does so for a test's start when the test before it took ``SYNC_EVERY`` or longer, so a
  slow suite fsyncs once per test, as a slow test's neighbours are then seen at once);
- the file is always fsynced before it is closed (a session's end, a served batch's end).

An OS crash or a node failure may lose what was written since the last fsync (at most
``SYNC_EVERY`` seconds of a fast suite, or a slow test's setup report while it runs); the
controller then treats those tests as never reported, as for any job that died.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from pytest_trtllm_slurm.node.files import UntrustedPath, announce, make_dirs, why_untrusted

SYNC_EVERY = 0.5  # seconds: at most two fsyncs a second while lines keep coming


class ReportFile:
    """One append-only file of lines (private: 0600), reopened per served batch."""

    def __init__(self, path: Path) -> None:
        self._fd = self._open(path)
        self._dirty = False
        self._synced_at = time.monotonic()
        self._notice: str | None = None  # renamed after each line (``files.announce``)

    @staticmethod
    def _open(path: Path) -> int:
        """Appends to ``path`` only when it is a regular file of ours that nobody else may
        write (a link or a file someone planted is refused: UntrustedPath naming it)."""
        make_dirs(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedPath(f"{path}: it is a symbolic link; refusing to write "
                                    "reports through it") from None
            raise
        why = why_untrusted(os.fstat(fd), directory=False)
        if why is not None:
            os.close(fd)
            raise UntrustedPath(f"{path}: {why}; refusing to write reports to it")
        return fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, line: bytes, *, sync: bool = False) -> None:
        """``line`` (ending in a newline) in one write; fsynced if ``sync`` or when the
        last fsync is ``SYNC_EVERY`` old."""
        os.write(self._fd, line)
        self._dirty = True
        if sync or time.monotonic() - self._synced_at >= SYNC_EVERY:
            self.sync()
        announce(self._notice)

    def sync(self) -> None:
        """What was written so far, on disk (and on the file server)."""
        if self._dirty and self._fd >= 0:
            os.fsync(self._fd)
            self._dirty = False
        self._synced_at = time.monotonic()

    def reopen(self, path: Path, notice: str | None = None) -> None:
        """Write to another file from now on (a served batch's own reports.jsonl);
        ``notice``: announce each line there (``files.announce``)."""
        self.close()
        self._fd = self._open(path)
        self._notice = notice

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1
