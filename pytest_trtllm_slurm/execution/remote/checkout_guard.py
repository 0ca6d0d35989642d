"""One remote checkout, several runs at once: they may share it only while they test the
same code (the sync rewrites it in place; a per-run copy would cost a clone and a rebuild).

Each run's record in the cluster's run registry names the checkout and its code's key; a
run is live while it holds its lock, so a crashed run never blocks. The check and the sync
happen under one lock on the cluster, so two runs cannot both pass and both sync."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.remote.checkout_probe import (
    RemoteCheckout,
    parse_probe,
    probe_argv,
)
from pytest_trtllm_slurm.execution.remote.sync import PreparedSync
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, RunRegistry
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock
from pytest_trtllm_slurm.node.paths import Runs

SYNC_LOCK_WAIT = 1800.0  # a first sync clones the repository: it may take a while


# two looks in one round trip: the run registry, a separator line, the checkout
_BOTH = 'sh -c "$1" sh "$2"; printf "\\036\\n"; shift 2; exec "$@"'


@contextlib.contextmanager
def checkout_claimed(runs: RunRegistry, checkout: str,
                     prepare: Callable[[], PreparedSync],
                     taken: Callable[[], None] | None = None,
                     ) -> Iterator[tuple[PreparedSync, list[RunRecord], RemoteCheckout]]:
    """Hold the checkout's lock while the caller syncs; yields ``prepare()``'s result, the live
    runs testing the same code there (not to be disturbed) and what the checkout holds now.
    ExecutionError when a live run tests other code there. ``taken``: called as soon as
    the lock is held, before the look at the checkout ends (from then on no other run
    changes the checkout until this one's record names its code)."""
    runs.make_folder()
    runs.start_lease()
    lock = ShellLock(runs.shell, Runs(runs.folder).checkout_lock, max_hold=SYNC_LOCK_WAIT + 60)
    me = runs.me
    info = {"pid": me.pid, "host": me.host, "run_id": me.run_id, "since": me.began}
    # once the lock is held, the registry and the checkout are read in the same round trip
    script, _, folder = runs.list_argv()[2:]
    look = ["sh", "-c", _BOTH, "sh", script, folder, *probe_argv(checkout)]
    with ThreadPoolExecutor(1, thread_name_prefix="checkout-lock") as pool:
        taking = pool.submit(lock.acquire, SYNC_LOCK_WAIT, info, then=look, taken=taken)
        try:
            prepared = prepare()
        except BaseException:
            if taking.result():
                lock.release()
            raise
        held = taking.result()
    if not held:
        raise ExecutionError(f"another run has been syncing into {runs.shell.name}:{checkout} "
                             f"for more than {SYNC_LOCK_WAIT:.0f} s ({lock.describe()})")
    try:
        status, output = lock.output()
        listing, sep, looked = output.partition("\036\n")
        if status != 0 or not sep:
            raise ExecutionError(f"code sync to {runs.shell.name} failed while looking at "
                                 f"{checkout} (exit status {status}): {output[-500:]}")
        found = runs.parse_listing(listing)
        runs.listed(found)  # the reaper's look at the dead runs (no second listing)
        users = [r for r, alive, _ in found if alive and r.checkout == checkout]
        other = next((r for r in users if r.code != prepared.key), None)
        if other is not None:
            raise ExecutionError(
                f"the remote checkout {runs.shell.name}:{checkout} is in use by another run "
                f"that tests other code: run {other.run_id} (pid {other.pid} on "
                f"{other.host}, since {other.began or '?'}; "
                f"{other.code_note or 'its code'}). This run has {prepared.describe()}; "
                "syncing it now would change the files under that run's tests, so nothing was "
                "synced. Wait for that run to finish, or give this run its own checkout: point "
                "user_root_dir of the cluster's table at another folder (for example one per "
                "CI job)")
        yield prepared, users, parse_probe(looked)
        me.checkout, me.code, me.code_note = checkout, prepared.key, prepared.describe()
        runs.save()
    finally:
        lock.release()

