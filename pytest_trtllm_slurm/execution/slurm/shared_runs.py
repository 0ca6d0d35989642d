"""The run registry of a remote cluster, kept on the cluster: shared by every machine.

Why: the registry is the lease on the persistent allocation (no run cancels an allocation
that a live run uses) and the record a killed run leaves for the next one. Once the
allocation is shared by the user's machines and CI runners, so must the registry be: a
run on a laptop must see that a CI runner uses the allocation. A pid cannot be checked
from another machine, so each run proves it is alive by holding a ``flock`` on its own
``<run id>.lock`` there for as long as it runs (``shell_lock``): whoever can take that lock
knows the run is gone (ended, killed, or its connection dropped).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, RunRegistry
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock
from pytest_trtllm_slurm.node.paths import Runs, name_of
from pytest_trtllm_slurm.transport.shell import Shell

log = logging.getLogger(__name__)

# every record with whether its run still holds its lock ("live") or not ("dead")
_LIST = r"""
command -v flock >/dev/null 2>&1 || { echo "flock (util-linux) is not installed" >&2; exit 127; }
cd "$1" 2>/dev/null || exit 0
for f in *.json; do
  [ -f "$f" ] || continue
  id=${f%.json}
  if flock -n "$id.lock" true 2>/dev/null; then a=dead; else a=live; fi
  printf '%s\t%s\t%s\n' "$f" "$a" "$(tr -d '\n' <"$f")"
done
"""
SHORT_LOCK_WAIT = 120.0  # the registry's lock is held for a check and a write only


class ShellRunRegistry(RunRegistry):
    """RunRegistry whose folder is on the shell's host (see the module docstring)."""

    def __init__(self, shell: Shell, folder: str) -> None:
        super().__init__(folder)
        self.shell = shell
        self.remote = folder.rstrip("/")
        self._made = False
        self._lease: ShellLock | None = None
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    @property
    def where(self) -> str:
        return f"{self.shell.name}:{self.remote}"

    def _make_folder(self) -> None:
        if not self._made:
            self.shell.mkdir(self.remote, private=True)
            self._made = True

    def _remote_path(self, run_id: str) -> str:
        return Runs(self.remote).record(run_id)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self._make_folder()
        lock = ShellLock(self.shell, Runs(self.remote).lock, max_hold=SHORT_LOCK_WAIT + 60)
        me = self.me
        if not lock.acquire(SHORT_LOCK_WAIT, {"pid": me.pid, "host": me.host,
                                              "run_id": me.run_id, "since": me.began}):
            raise ExecutionError(f"another run held {lock.where} for more than "
                                 f"{SHORT_LOCK_WAIT:.0f} s ({lock.describe()})")
        try:
            yield
        finally:
            lock.release()

    def _hold_lease(self) -> None:
        """This run's own lock, held while it runs: its proof of life to other machines
        (taken again if the holder ended, e.g. after the connection dropped)."""
        if self._lease is not None and self._lease.held:
            return
        self._make_folder()
        lease = self._lease or ShellLock(self.shell, Runs(self.remote).lease(self.me.run_id),
                                         keep=True)
        if not lease.acquire(60, {"pid": self.me.pid, "host": self.me.host,
                                  "run_id": self.me.run_id, "since": self.me.began}):
            raise ExecutionError(f"could not take this run's own lock {lease.where}")
        self._lease = lease

    def start_lease(self) -> None:
        """Begin taking this run's lock in the background (it costs a round trip); the
        first save() waits for it."""
        if self._starting is None and (self._lease is None or not self._lease.held):
            self._starting = threading.Thread(target=self._start, daemon=True,
                                              name="run lease")
            self._starting.start()

    def _start(self) -> None:
        try:
            self._hold_lease()
        except BaseException as exc:  # noqa: BLE001 - raised again by save()
            self._start_error = exc

    def save(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
            if self._start_error is not None:
                error, self._start_error = self._start_error, None
                raise error
        self._hold_lease()  # first: a record is never seen without its live lock
        self.shell.write_file(self._remote_path(self.me.run_id), self.me.model_dump_json())
        self._saved = True

    def finish(self) -> None:
        if self._saved:
            self.shell.run(["rm", "-f", "--", self._remote_path(self.me.run_id)], timeout=60)
            self._saved = False
        if self._lease is not None:
            self._lease.release()
            self.shell.run(["rm", "-f", "--", Runs(self.remote).lease(self.me.run_id)],
                           timeout=60)
            self._lease = None

    def others(self) -> list[tuple[RunRecord, bool, Path | str]]:
        """Every other run's record, live or not (none when they cannot be told apart:
        a live run must never be taken for a dead one)."""
        res = self.shell.run(self.list_argv(), timeout=60)
        if not res.ok:
            log.warning("run registry %s could not be listed: %s", self.where, res.describe())
            return []
        return self.parse_listing(res.stdout)

    def list_argv(self) -> list[str]:
        """The listing's command (to run alone, or with another look in one round trip)."""
        return ["sh", "-c", _LIST, "sh", self.remote]

    def parse_listing(self, stdout: str) -> list[tuple[RunRecord, bool, Path | str]]:
        """(record, alive, path) of every other run, from the listing's output."""
        found: list[tuple[RunRecord, bool, Path | str]] = []
        for line in stdout.splitlines():
            name, _, rest = line.partition("\t")
            state, _, text = rest.partition("\t")
            if name == name_of(self._remote_path(self.me.run_id)):
                continue
            try:
                record = RunRecord.model_validate(json.loads(text))
            except (ValueError, ValidationError):
                continue
            found.append((record, state == "live", Runs(self.remote).at(name)))
        return found

    def drop(self, path: Path | str) -> None:
        self.shell.run(["rm", "-f", "--", str(path), Runs.lease_of(str(path))], timeout=60)
