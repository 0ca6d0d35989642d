"""The small files a batch's launcher writes once by rename (its pid, its exit code), read
from what a pushing shell sent instead of a round trip per look: a remote batch's end is
seen as soon as a local one's. A path watched once is never watched again (a stale push)."""

from __future__ import annotations

from pytest_trtllm_slurm.transport.shell import PushingShell, Shell

SMALL = 4096  # bytes of a small file read at once


class SmallFiles:
    """Reads of small write-once files through ``shell``, pushed where it pushes."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.pushing: PushingShell | None = shell if isinstance(shell, PushingShell) else None
        self._watched: set[str] = set()  # watched now: their pushes answer reads
        self._seen: set[str] = set()  # ever watched: never again (stale pushes)
        self.round_trips = 0  # reads that went to the file (figures for tests, benchmarks)

    def watch(self, path: str, *, wake: bool = True) -> None:
        """Have ``path`` (absent, or written once by rename) pushed; ``wake`` the monitor."""
        if self.pushing is None:
            return
        if path in self._seen:  # re-used (a retry): its pushes may be the old file's
            self.forget(path)
            return
        self._seen.add(path)
        self._watched.add(path)
        self.pushing.watch(path, 0, wake=wake)

    def forget(self, *paths: str) -> None:
        """No more pushes of ``paths`` (their batch ended, or the value was read)."""
        for path in paths:
            if path in self._watched:
                self._watched.discard(path)
                assert self.pushing is not None
                self.pushing.unwatch(path)

    def read(self, path: str) -> str:
        """The text of ``path`` ("" while absent): pushed when it can be, else read."""
        if not path:
            return ""
        if path in self._watched and self.pushing is not None:
            data = self.pushing.pushed(path, 0, SMALL)
            if data is not None:
                return data.decode("utf-8", "replace")
        self.round_trips += 1
        return self.shell.read_from(path, 0, SMALL).decode("utf-8", "replace")
