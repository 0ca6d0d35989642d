"""How often a run looks at its jobs: every polling interval in one place.

The monitor loop, the Slurm executor's adaptive scheduler queries, its look at a
persistent allocation, the warm pool's health checks and a build's wait all read
these, so a change of pace is made (and reviewed) here, not in five modules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    """Seconds between looks; each field says who reads it."""

    # Monitor: one round over all active jobs (the run loop's and a case run's default)
    monitor: float = 0.2
    # SlurmExecutor.poll: squeue/sacct at most this often; 0.5 s after a change,
    # growing by ``scheduler_growth`` per quiet round up to 5 s
    scheduler_min: float = 0.5
    scheduler_max: float = 5.0
    scheduler_growth: float = 1.5
    # monitor rounds when warm workers serve the batches (files, cheap to look at
    # locally; over SSH every look is a round trip)
    warm_local: float = 0.02
    warm_remote: float = 0.2
    # one squeue of a persistent allocation whose warm workers serve this run's
    # batches (nothing else asks the scheduler then): a failed node ends it
    alloc_watch: float = 2.0
    alloc_watch_gap: float = 0.5  # at least this long between two looks once a batch ended
    # AgentPool: heartbeats of the agents (their sessions' exit codes: a quarter of it)
    agent_health: float = 2.0
    # run_build: a build job's wait
    build: float = 0.5

    def warm_hint(self, *, local: bool) -> float:
        """The monitor interval a warm-worker executor asks for."""
        return self.warm_local if local else self.warm_remote

    def next_scheduler_interval(self, current: float, *, changed: bool,
                                low: float, high: float) -> float:
        """Adaptive: back to ``low`` after a change, else ``growth`` times longer up to ``high``."""
        return low if changed else min(current * self.scheduler_growth, high)


CADENCE = Cadence()
