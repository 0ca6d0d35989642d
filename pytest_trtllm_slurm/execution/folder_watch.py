"""A wake-up for the run loop when a batch ends here: Linux's inotify on the folder of a local
news folder's end notice (``execution/news.py``, ``node.paths.end_notice``), which a node
renames in after every exit code (``node/forkloop.write_exit``). The loop's idle wait (up to
``CADENCE.idle_max``) otherwise sits between a batch's end and the next batch on its GPUs.
Only the end wakes it: the report lines' notices land in the news folder itself, outside
the watch (watched, each of them woke the wait, which found no end and waited again: 15% of
W3's dispatch loop). Elsewhere (not Linux, a file system whose other clients'
renames inotify does not see, as NFS's) there is no watch or no event, and the wait sleeps
its time as before: a hint, never the only way an end is seen."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import sys
import time

from pytest_trtllm_slurm.node.paths import ENDED

_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80
_IN_Q_OVERFLOW = 0x4000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000  # a link planted as the folder is not watched
_EVENT = "iIII"  # wd, mask, cookie, len (then the name, NUL-padded)
_EVENT_SIZE = struct.calcsize(_EVENT)


class _Inotify:
    """libc's inotify calls, found once (None off Linux or without them)."""

    _libc: ctypes.CDLL | None = None
    _looked = False

    @classmethod
    def libc(cls) -> ctypes.CDLL | None:
        if not cls._looked:
            cls._looked = True
            if sys.platform.startswith("linux"):
                with contextlib.suppress(OSError, AttributeError):
                    libc = ctypes.CDLL(None, use_errno=True)
                    libc.inotify_init1.argtypes = [ctypes.c_int]
                    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                                       ctypes.c_uint32]
                    cls._libc = libc
        return cls._libc


class FolderWatch:
    """Readable (``fileno``) once something lands in the folder; ``ended`` says whether a
    batch's end was among it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, folder: str) -> FolderWatch | None:
        """A watch on ``folder``; None when there is none to have (yet: no folder)."""
        libc = _Inotify.libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        mask = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR | _IN_DONT_FOLLOW
        if libc.inotify_add_watch(fd, os.fsencode(folder), mask) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def fileno(self) -> int:
        return self._fd

    def ended(self) -> bool:
        """Whether a batch's end landed since the last call (what else landed is dropped)."""
        found = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return found
            except OSError:  # a broken watch: the loop looks now (the wait then sleeps)
                return True
            if not data:
                return found
            at = 0
            while at + _EVENT_SIZE <= len(data):
                _, mask, _, size = struct.unpack_from(_EVENT, data, at)
                name = data[at + _EVENT_SIZE:at + _EVENT_SIZE + size].rstrip(b"\0")
                at += _EVENT_SIZE + size
                found = found or bool(mask & _IN_Q_OVERFLOW) or name == ENDED.encode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def wait_for_end(watches: list[FolderWatch], timeout: float) -> bool:
    """Sleep up to ``timeout`` s, less when a batch ends in a watched folder (True then)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            ready, _, _ = select.select(watches, [], [], left)
        except (OSError, ValueError):  # a watch closed meanwhile: sleep as before
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        if [watch for watch in ready if watch.ended()]:  # (each one drained)
            return True
