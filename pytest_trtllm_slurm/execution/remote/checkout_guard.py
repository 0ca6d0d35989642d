"""One remote checkout, several runs at once: they may share it only while they test the
same code.

Why: the code sync rewrites the remote checkout in place, so a second run (another
terminal, another machine, another CI job of the same user) syncing other code would change
the files under the tests the first run is still running. What a user expects: two runs
of the same code simply share the checkout (nothing is re-sent, nothing is stashed under
the other run), and a run of other code stops before it touches anything, with an error
that names the checkout, the run using it and how to proceed. A per-run copy of the
checkout was not chosen: a TensorRT-LLM checkout is gigabytes and its build
(``build_project``) lives in it, so a silent copy would cost a clone and a rebuild per run.

Each run's record in the cluster's run registry (``shared_runs``) names the checkout and
a key of the code it synced there (the snapshot's tree and the untracked files' content);
a run is live while it holds its lock there, so a crashed run never blocks the checkout.
The check and the sync happen under one lock on the cluster, so two runs starting at the
same moment cannot both pass the check and then both sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.remote.sync import PreparedSync
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord
from pytest_trtllm_slurm.execution.slurm.shared_runs import ShellRunRegistry
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock

SYNC_LOCK_WAIT = 1800.0  # a first sync clones the repository: it may take a while


@contextlib.contextmanager
def checkout_claimed(runs: ShellRunRegistry, checkout: str,
                     prepared: PreparedSync) -> Iterator[list[RunRecord]]:
    """Hold the checkout's lock while the caller syncs ``prepared`` into ``checkout``;
    yields the live runs that test the same code there (the sync must not disturb them).
    ExecutionError when a live run tests other code there; this run's record names the
    checkout and its code once the sync is done."""
    runs.shell.mkdir(runs.remote, private=True)
    lock = ShellLock(runs.shell, f"{runs.remote}/.checkout.lock", max_hold=SYNC_LOCK_WAIT + 60)
    me = runs.me
    if not lock.acquire(SYNC_LOCK_WAIT, {"pid": me.pid, "host": me.host, "run_id": me.run_id,
                                         "since": me.began}):
        raise ExecutionError(f"another run has been syncing into {runs.shell.name}:{checkout} "
                             f"for more than {SYNC_LOCK_WAIT:.0f} s ({lock.describe()})")
    try:
        users = [r for r, alive, _ in runs.others() if alive and r.checkout == checkout]
        other = [r for r in users if r.code != prepared.key]
        if other:
            raise ExecutionError(conflict_message(runs.shell.name, checkout, other[0],
                                                  prepared))
        yield users
        me.checkout, me.code, me.code_note = checkout, prepared.key, prepared.describe()
        runs.save()
    finally:
        lock.release()


def conflict_message(host: str, checkout: str, other: RunRecord, prepared: PreparedSync) -> str:
    """The error a run gets when another live run tests other code in its checkout."""
    return (
        f"the remote checkout {host}:{checkout} is in use by another run that tests other "
        f"code: run {other.run_id} (pid {other.pid} on {other.host}, since {other.began or '?'}"
        f"; {other.code_note or 'its code'}). This run has {prepared.describe()}; syncing it "
        "now would change the files under that run's tests, so nothing was synced. Wait for "
        "that run to finish, or give this run its own checkout: point user_root_dir of the "
        "cluster's table at another folder (for example one per CI job)"
    )
