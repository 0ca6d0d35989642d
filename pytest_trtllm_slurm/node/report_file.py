"""reports.jsonl as the node appends to it: each line one ``write`` on an O_APPEND
descriptor (a killed worker loses nothing it wrote), fsynced in batches (half a millisecond
a line) so the lines survive the node and reach a shared file system's server."""

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
        """``path`` opened to append, refused (UntrustedPath) unless our own regular file."""
        make_dirs(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedPath(f"{path}: it is a symbolic link; refusing to write "
                                    "reports through it") from None
            raise
        if (why := why_untrusted(os.fstat(fd), directory=False)) is not None:
            os.close(fd)
            raise UntrustedPath(f"{path}: {why}; refusing to write reports to it")
        return fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, line: bytes, *, sync: bool = False) -> None:
        """``line`` in one write; fsynced if ``sync`` or the last fsync is ``SYNC_EVERY`` old."""
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
        """Write to another file from now on, each line announced at ``notice``."""
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
