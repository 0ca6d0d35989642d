"""The persistent allocation's state file (atomic, 0600) and its ``shell_lock``, over the
Shell: a checkout's ``work_dirs`` here, or a remote cluster's private state folder."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from uuid import uuid4

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock, shell_where
from pytest_trtllm_slurm.node.paths import join, lock_of, name_of
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

SAY_EVERY = 30.0  # seconds between repeated "still waiting" lines (here and for salloc)


class StateStore:
    """The state file of one allocation on ``shell``'s host, and its lock (``private``:
    the folder must be ours and closed to others; a checkout's ``work_dirs`` is left as is)."""

    def __init__(self, shell: Shell, folder: str | Path, name: str, *,
                 private: bool = True) -> None:
        self.shell = shell
        self.folder = str(folder).rstrip("/")
        self.path = join(self.folder, name)
        self.private = private
        self._made = False

    @property
    def where(self) -> str:
        """The state file as messages name it."""
        return shell_where(self.shell, self.path)

    @property
    def identity(self) -> str:
        """What the allocation's owner tag is made of: the same on every machine that
        shares this store (a remote path is; the host alias may differ)."""
        return str(Path(self.path).resolve()) if isinstance(self.shell, LocalShell) \
            else self.path

    def _make_folder(self) -> None:
        if not self._made:
            self.shell.mkdir(self.folder, private=self.private)
            self._made = True

    def read(self) -> str | None:
        """The file's text; None when absent; OSError when it cannot be read."""
        res = self.shell.run(["sh", "-c", '[ -e "$1" ] || exit 3; cat -- "$1"', "sh",
                              self.path], timeout=60)
        if res.returncode == 3:
            return None
        if not res.ok:
            raise OSError(f"cannot read {self.where}: {res.describe()}")
        return res.stdout

    def write(self, text: str) -> None:
        self._make_folder()
        self.shell.write_file(self.path, text)  # a temp file renamed over it, 0600

    def delete(self) -> None:
        self.shell.run(["rm", "-f", "--", self.path], timeout=60)

    def exists(self) -> bool:
        return self.shell.exists(self.path)

    def move_aside(self, why: str) -> str | None:
        """Keep a bad file (``<name>.<why>-<time>``): where it went, or None (then deleted)."""
        stamp = f"{datetime.now().strftime('%Y%m%d_%H%M%S')}-{uuid4().hex[:4]}"
        aside = join(self.folder, f"{name_of(self.path)}.{why}-{stamp}")
        if self.shell.run(["mv", "-f", "--", self.path, aside], timeout=60).ok:
            return shell_where(self.shell, aside)
        self.delete()
        return None

    @contextlib.contextmanager
    def locked(self, timeout: float, holder: dict[str, object],
               warn: Callable[[str], None]) -> Iterator[None]:
        """Hold the lock (waiting at most ``timeout`` seconds, a line every SAY_EVERY
        seconds naming its holder; ExecutionError naming the lock and its holder after)."""
        self._make_folder()
        # a holder that lost its connection without closing it lets go after max_hold
        lock = ShellLock(self.shell, lock_of(self.path), max_hold=timeout + 60)
        since, say_at = str(holder.get("since", "")), [5.0]

        def waiting(seconds: float) -> None:
            if seconds >= say_at[0]:
                say_at[0] = seconds + SAY_EVERY
                warn(f"Waiting since {since} for {lock.where} ({lock.describe()}).")

        if not lock.acquire(timeout, holder, waiting=waiting):
            raise ExecutionError(
                f"another run held {lock.where} for more than {timeout:.0f} s "
                f"({lock.describe()}); it is let go when that run ends or its "
                "connection drops")
        try:
            yield
        finally:
            lock.release()
