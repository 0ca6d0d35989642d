"""Cancel what a controller killed with SIGKILL left in the queue (the next run does it):
for each registry file (``runs``) whose run is gone, its still-queued jobs and steps
(checked to be the user's, with the recorded name) and its warm batches; then the file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from pytest_trtllm_slurm.execution.slurm.jobs import NAME_SUFFIX, SchedulerError, SlurmJobs, chunks
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, RunRegistry
from pytest_trtllm_slurm.node.paths import Batch, Session
from pytest_trtllm_slurm.transport.shell import Shell


def reap_dead_runs(runs: RunRegistry, jobs: SlurmJobs, shell: Shell, user: str | None,
                   say: Callable[[str], None]) -> list[str]:
    """Cancel the queued jobs and steps of dead runs; the ids cancelled."""
    cancelled: list[str] = []
    for record, path in runs.dead():
        try:
            ids = _queued_jobs(jobs, record, user) + _running_steps(jobs, shell, record)
        except SchedulerError as exc:
            say(f"Could not look for jobs left by run {record.run_id}: {exc}")
            continue
        if ids:
            jobs.scancel(ids)
            cancelled += ids
            say(f"Cancelled {', '.join(ids)}, left in the queue by an earlier run that was "
                f"killed (pid {record.pid} on {record.host}, run {record.run_id}).")
        warm = _cancel_warm(shell, record)
        if warm:
            cancelled += warm
            say(f"Cancelled {len(warm)} warm-worker batch(es) of an earlier run that was "
                f"killed (pid {record.pid} on {record.host}, run {record.run_id}).")
        runs.drop(path)
    return cancelled


def _queued_jobs(jobs: SlurmJobs, record: RunRecord, user: str | None) -> list[str]:
    """The record's one-shot jobs still queued, owned by ``user`` and named as recorded,
    and its allocation request if it still waits (named as any persistent allocation)."""
    found = []
    wanted = dict(record.jobs)
    for part in chunks(list(wanted) + ([record.request] if record.request else [])):
        res = jobs.run(["squeue", "-h", "-j", ",".join(part), "-o", "%i|%u|%j|%T"])
        if not res.ok:
            if "invalid job id" in (res.stderr + res.stdout).lower():
                continue
            raise SchedulerError(res)
        for line in res.stdout.splitlines():
            cols = line.strip().split("|", 3)
            if len(cols) < 4 or (user is not None and cols[1] != user):
                continue
            if wanted.get(cols[0]) == cols[2] or (
                    cols[0] == record.request and cols[2].endswith(NAME_SUFFIX)
                    and cols[3] == "PENDING"):
                found.append(cols[0])
    return found


def _cancel_warm(shell: Shell, record: RunRecord) -> list[str]:
    """Cancel the dead run's warm batches and end its sessions (files in their inboxes;
    a session that already ended ignores them)."""
    done = []
    for item in record.warm:
        if shell.exists(Session(item.session).inbox):
            with contextlib.suppress(OSError):
                shell.write_file(Session(item.session).cancel(item.request), "")
                done.append(item.request)
    for session in dict.fromkeys(item.session for item in record.warm):
        if shell.exists(Session(session).inbox):
            with contextlib.suppress(OSError):
                shell.write_file(Session(session).stop, "")
    return done


def _running_steps(jobs: SlurmJobs, shell: Shell, record: RunRecord) -> list[str]:
    """The record's allocation steps still running (their ids from ``work_dir/stepid``)."""
    found = []
    by_alloc: dict[str, list[str]] = {}
    for step in record.steps:
        text = shell.read_from(Batch(step.work_dir).stepid, 0, 64)
        number = text.decode("utf-8", "replace").strip()
        if number.isdigit():
            by_alloc.setdefault(step.allocation, []).append(f"{step.allocation}.{number}")
    for alloc, ids in by_alloc.items():
        live = jobs.squeue_steps(alloc) or {}
        found += [i for i in ids if i in live]
    return found
