"""Where the persistent allocation's state file lives, and the lock that guards it.

Why two kinds: the local Slurm cluster's allocation belongs to one checkout on this machine
(``<rootdir>/work_dirs/.slurm_alloc.json``, a filelock next to it), while a remote
cluster's allocation is shared by every machine and CI runner of the user, so its state
lives on the cluster (a private folder under ``user_root_dir``), guarded by a lock there
(``shell_lock``). The AllocationManager reads and writes through this one interface.
Both write atomically (a temporary file renamed over the name), 0600.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock, describe_holder
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.paths import holder_of, join, lock_of, name_of
from pytest_trtllm_slurm.transport.shell import Shell

if TYPE_CHECKING:
    from filelock import FileLock

SAY_EVERY = 30.0  # seconds between repeated "still waiting for the lock" lines
Warn = Callable[[str], None]


class StateStore(Protocol):
    """The state file of one allocation and its lock."""

    @property
    def where(self) -> str:
        """The state file as messages name it."""
        ...

    @property
    def identity(self) -> str:
        """What the allocation's owner tag is made of: the same on every machine that
        shares this store."""
        ...

    def read(self) -> str | None:
        """The file's text; None when absent; OSError when it cannot be read."""
        ...

    def write(self, text: str) -> None: ...

    def delete(self) -> None: ...

    def exists(self) -> bool: ...

    def move_aside(self, why: str) -> str | None:
        """Keep a bad file for a look (``<name>.<why>-<time>``); where it went, or None
        (then it is deleted)."""
        ...

    def locked(self, timeout: float, holder: dict[str, object],
               warn: Warn) -> contextlib.AbstractContextManager[None]:
        """Hold the lock (waiting at most ``timeout`` seconds, a line every SAY_EVERY
        seconds naming its holder; ExecutionError naming the lock and its holder after)."""
        ...


def _aside_name(name: str, why: str) -> str:
    return f"{name}.{why}-{datetime.now().strftime('%Y%m%d_%H%M%S')}-{uuid.uuid4().hex[:4]}"


class LocalStateStore:
    """The state file on this machine (``work_dirs/.slurm_alloc.json`` + filelock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock: FileLock | None = None
        self._lock_timeout = 0.0

    @property
    def where(self) -> str:
        return str(self.path)

    @property
    def identity(self) -> str:
        return str(self.path.resolve())

    def read(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        write_atomic(self.path, text, parents=True)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def exists(self) -> bool:
        return self.path.exists()

    def move_aside(self, why: str) -> str | None:
        aside = self.path.with_name(_aside_name(self.path.name, why))
        try:
            self.path.rename(aside)
            return str(aside)
        except OSError:
            with contextlib.suppress(OSError):
                self.delete()
            return None

    def file_lock(self, timeout: float) -> FileLock:
        """The filelock (and the asyncio it imports) loads only when a run must change
        the allocation, not when it reuses a valid one."""
        if self._lock is None or self._lock_timeout != timeout:
            from filelock import FileLock

            self._lock = FileLock(str(lock_of(self.path)), timeout=timeout)
            self._lock_timeout = timeout
        return self._lock

    @contextlib.contextmanager
    def locked(self, timeout: float, holder: dict[str, object], warn: Warn) -> Iterator[None]:
        from filelock import Timeout

        lock = self.file_lock(timeout)
        started, since = time.monotonic(), str(holder.get("since", ""))
        say_at = started + 5.0
        while True:
            left = started + timeout - time.monotonic()
            try:
                lock.acquire(timeout=max(0.01, min(5.0, left)))
                break
            except Timeout:
                now = time.monotonic()
                if now - started >= timeout:
                    raise ExecutionError(
                        f"another run held {lock.lock_file} for more than {timeout:.0f} s "
                        f"({self.holder()}); if that run is gone, delete the lock file"
                    ) from None
                if now >= say_at:
                    say_at = now + SAY_EVERY
                    warn(f"Waiting since {since} for {lock.lock_file} ({self.holder()}).")
        record = holder_of(Path(lock.lock_file))
        try:
            write_atomic(record, json.dumps(holder), parents=True)
            yield
        finally:
            record.unlink(missing_ok=True)
            lock.release()

    def holder(self) -> str:
        try:
            info = json.loads(holder_of(lock_of(self.path)).read_text("utf-8"))
        except (OSError, ValueError):
            return "its holder is not recorded"
        return describe_holder(info if isinstance(info, dict) else None)


class ShellStateStore:
    """The state file on the cluster, in a private folder (0700) the user's machines share,
    guarded by a ``flock`` there (``shell_lock``)."""

    def __init__(self, shell: Shell, folder: str, name: str) -> None:
        self.shell = shell
        self.folder = folder.rstrip("/")
        self.path = join(self.folder, name)
        self._made = False

    @property
    def where(self) -> str:
        return f"{self.shell.name}:{self.path}"

    @property
    def identity(self) -> str:
        return self.path  # the same from every machine (the host alias may differ)

    def _make_folder(self) -> None:
        if not self._made:
            self.shell.mkdir(self.folder, private=True)
            self._made = True

    def read(self) -> str | None:
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
        aside = join(self.folder, _aside_name(name_of(self.path), why))
        if self.shell.run(["mv", "-f", "--", self.path, aside], timeout=60).ok:
            return f"{self.shell.name}:{aside}"
        self.delete()
        return None

    def lock_file(self) -> ShellLock:
        return ShellLock(self.shell, lock_of(self.path))

    @contextlib.contextmanager
    def locked(self, timeout: float, holder: dict[str, object], warn: Warn) -> Iterator[None]:
        self._make_folder()
        lock = self.lock_file()
        # a holder that lost its connection without closing it lets go after this long
        lock.max_hold = timeout + 60
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
