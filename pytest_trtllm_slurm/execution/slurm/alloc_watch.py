"""Is the persistent allocation still there? Its batches end with it (NODE_FAIL, its time
limit, a scancel), which their own files would not say (a DOWN node's processes live on)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, map_slurm_state
from pytest_trtllm_slurm.execution.slurm.jobs import SchedulerError
from pytest_trtllm_slurm.execution.slurm.tracking import Backends, TrackedJob


class AllocationWatch:
    """When each allocation of this run was last seen running, and which ones ended."""

    def __init__(self, shared: Backends, *, fail_grace: float,
                 warn_once: Callable[[str, str], None],
                 on_end: Callable[[str], None]) -> None:
        self.shared = shared
        self.fail_grace = fail_grace
        self.warn_once = warn_once
        self.on_end = on_end  # the executor's: stop this run's sessions there, forget it
        self.alive: dict[str, float] = {}  # allocation -> when squeue last said it runs (epoch)
        self.vouched = 0  # how many times ``alive`` moved (held reports may be shown then)
        self.ended: set[str] = set()  # allocations the scheduler ended during this run
        self._watch_at: dict[str, float] = {}  # allocation -> when to look at it next
        self._watched_at: dict[str, float] = {}  # allocation -> when it was last looked at
        self._asked: dict[str, float] = {}  # allocation -> when (epoch) that look was asked
        self._failing: dict[str, float] = {}  # allocation -> since when squeue fails

    def confirmed(self, job: TrackedJob) -> bool:
        """A batch in an allocation shows its end once the scheduler, asked after it ended,
        still had the allocation running (a DOWN node's processes may live on)."""
        if job.alloc is None:
            return True
        return self.alive.get(job.alloc.job_id, 0.0) >= (job.ended_wall or 0.0)

    def watch(self, jobs: list[TrackedJob], now: float) -> None:
        """One ``scontrol show job`` (two slurmctld RPCs; squeue takes three) per allocation
        every ``CADENCE.alloc_watch`` s; at once (then every ``alloc_watch_gap`` s) when only
        ended batches there wait for a look asked after their end to be shown."""
        watched = {j.alloc.job_id for j in jobs if j.alloc is not None
                   and not j.state.status.finished}
        ending: dict[str, float] = {}  # allocation -> its waiting batches' last end (epoch)
        for j in jobs:
            if j.alloc is not None and j.state.status.finished and not j.life.settled \
                    and not self.confirmed(j):
                ending[j.alloc.job_id] = max(ending.get(j.alloc.job_id, 0.0),
                                             j.ended_wall or 0.0)
        for alloc_id in watched | ending.keys():
            due = self._watch_at.get(alloc_id, 0.0)
            if alloc_id in ending and alloc_id not in watched:
                asked = self._asked.get(alloc_id, 0.0)
                due = min(due, now if ending[alloc_id] > asked else
                          self._watched_at.get(alloc_id, 0.0) + CADENCE.alloc_watch_gap)
            if now < due or alloc_id in self.ended:
                continue
            self._watched_at[alloc_id] = now
            self._watch_at[alloc_id] = now + CADENCE.alloc_watch
            asked = self._asked[alloc_id] = time.time()
            try:
                row = self.shared.jobs.scontrol_job(alloc_id)
                self._failing.pop(alloc_id, None)
                if row is not None and row.state in ("RUNNING", "SUSPENDED"):
                    self.alive[alloc_id] = asked
                    self.vouched += 1
                    continue
                self.check(alloc_id)
            except SchedulerError as exc:
                # a slurmctld restart is ridden out (results wait); a longer outage must
                # not hold them forever: after fail_grace the agents' files are trusted
                since = self._failing.setdefault(alloc_id, now)
                if now - since >= self.fail_grace:
                    self.alive[alloc_id] = asked
                    self.vouched += 1
                    self.warn_once(f"watch:{alloc_id}", (
                        f"The scheduler has not answered for {now - since:.0f} s ({exc}); "
                        f"results of allocation {alloc_id} are shown from the warm workers' "
                        "files without its confirmation."))

    def check(self, alloc_id: str) -> bool:
        """True when the scheduler ended the allocation: its unsettled batches end with it."""
        if alloc_id in self.ended:
            return True
        ended = self.shared.jobs.ended(alloc_id)
        if ended is None:
            return False
        row, end = ended
        # Slurm's end time is in whole seconds: our own last look that found it running,
        # when later, is the closer bound (what ended before it surely counts)
        end = max(end or 0.0, self.alive.get(alloc_id, 0.0)) or None
        self.ended.add(alloc_id)
        status = map_slurm_state(row.state)
        if status is JobStatus.COMPLETED:
            status = JobStatus.ERROR
        why = f"allocation {alloc_id} ended: {row.state}" + (
            f" on {row.nodelist}" if row.nodelist else "") + (
            f" ({row.reason})" if row.reason and row.reason != "None" else "")
        for job in self.shared.batches.values():  # and those whose end was not vouched for
            if job.alloc is None or job.alloc.job_id != alloc_id or job.life.settled:
                continue
            job.state = JobState(status=status, nodelist=job.state.nodelist, reason=why,
                                 ended_at=end)
            job.life.settle()
            if job.warm is not None:
                job.warm.state = job.state
                job.warm.cancelled = True
        self.on_end(alloc_id)
        self.shared.warn(f"{why[0].upper()}{why[1:]}; the tests that had not started run "
                         "again in a new allocation.")
        self.shared.wake()
        return True
