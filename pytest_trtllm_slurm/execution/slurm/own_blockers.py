"""Is a job waiting behind the user's own persistent allocation? Then say which, and how
to release or use it (a wait that only shows "PENDING (Resources)" looks like a busy
cluster, while the user could end it)."""

from __future__ import annotations

from pytest_trtllm_slurm.execution.slurm.jobs import SchedulerError, SlurmJobs

NAME_SUFFIX = "-trtllm.persistent"  # (allocation.NAME_SUFFIX: that module imports this one)
WAITING_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required")


def own_allocations(jobs: SlurmJobs, user: str, partition: str | None,
                    exclude: str | None = None) -> list[tuple[str, str, str]]:
    """(job id, name, nodelist) of the user's running persistent allocations (of this
    plugin, any checkout) on ``partition`` (any, when None)."""
    argv = ["squeue", "-h", "-u", user, "-t", "RUNNING", "-o", "%i|%j|%N|%P"]
    if partition:
        argv += ["-p", partition]
    res = jobs.run(argv)
    if not res.ok:
        raise SchedulerError(res)
    rows = [line.strip().split("|") for line in res.stdout.splitlines()]
    return [(cols[0], cols[1], cols[2]) for cols in rows
            if len(cols) >= 3 and cols[1].endswith(NAME_SUFFIX) and cols[0] != exclude]


def blocker_note(jobs: SlurmJobs, user: str, partition: str | None, *, one_shot: bool,
                 exclude: str | None = None) -> str | None:
    """A sentence naming the user's own allocations that hold nodes of ``partition``, and
    what to do about them; None when there are none (or the scheduler did not answer)."""
    try:
        found = own_allocations(jobs, user, partition, exclude)
    except SchedulerError:
        return None
    if not found:
        return None
    held = ", ".join(f"{job_id} ({name}) on {nodes}" for job_id, name, nodes in found)
    where = f"partition {partition}" if partition else "the default partition"
    use = ("; or use it: run without --trtllm-one-shot" if one_shot else
           "; it may be another checkout's (one persistent allocation per rootdir)")
    return (f"your own persistent allocation {held} holds nodes of {where}. Release it with "
            "`trtllm-slurm alloc release` (in that checkout, or --rootdir DIR), "
            f"--trtllm-release-allocation, or `scancel {found[0][0]}`{use}")
