"""Which batches' files changed since the last round, from one stat of a news folder a served
batch renames a notice into (``node.files.announce``). Local files only (over SSH the relay
pushes)."""

from __future__ import annotations

import contextlib
import os
import time

from pytest_trtllm_slurm.execution.folder_watch import FolderWatch
from pytest_trtllm_slurm.node import paths
from pytest_trtllm_slurm.node.files import UntrustedPath, make_dirs

RACY_NS = 20_000_000  # a stamp this recent may hide a rename in the same clock tick


class NewsFolder:
    """One work root's news folder, as this run reads it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: int | None = None  # the folder's mtime at the last listing
        self.listings = 0  # (figures for tests and benchmarks)
        self._watch: FolderWatch | None = None

    def watch(self) -> FolderWatch | None:
        """The folder's wake-up on a batch's end: a watch on its end notice's own folder
        (made here, private, if it is not yet), which no report line's notice touches."""
        if self._watch is None:
            ends = paths.join(self.path, paths.ENDS)
            with contextlib.suppress(OSError, UntrustedPath):  # no watch: the wait sleeps
                make_dirs(ends)
            self._watch = FolderWatch.open(ends)
        return self._watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def take(self, mine: set[str]) -> set[str] | None:
        """The names among ``mine`` (work dir names) with a notice since the last call, their
        notices removed (others' stay); None when the folder cannot be read (all changed)."""
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return set()  # nothing announced yet
        except OSError:
            return None
        if stamp == self._stamp:
            return set()
        try:
            names = set(os.listdir(self.path))
        except OSError:
            return None
        self.listings += 1
        news = names & mine
        for name in news:  # removed before the batch is read: a later change renames anew
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, name))
        # the removals move the mtime again (the next round lists once more); a stamp
        # within one clock tick of now is not trusted
        self._stamp = stamp if time.time_ns() - stamp > RACY_NS else None
        return news
