"""How often a run looks at its jobs: every polling interval in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    """Seconds between looks; each field says who reads it."""

    # Monitor: one round over all active jobs (the run loop's and a case run's default)
    monitor: float = 0.2
    # SlurmExecutor.poll: squeue/sacct, from min after a change growing to max
    scheduler_min: float = 0.5
    scheduler_max: float = 5.0
    scheduler_growth: float = 1.5
    # monitor rounds when warm workers serve the batches (over SSH a look is a round trip)
    warm_local: float = 0.02
    warm_remote: float = 0.2
    # the run loop's wait after a quiet round grows to ``idle_max``, back to the monitor's
    # interval after a busy one (quiet rounds at the shortest interval cost the most CPU)
    idle_growth: float = 1.5
    idle_max: float = 0.2
    # beyond this many active batches the least wait between rounds grows with them (up to
    # idle_max): the controller's CPU per second stays bounded
    batches_per_round: int = 8
    # one look at a persistent allocation whose warm workers serve this run's batches (a
    # failed node ends it); ended batches' results wait for it, shown up to this late
    alloc_watch: float = 2.0
    # a look made at once after the last batches there ended is retried at most this often
    alloc_watch_gap: float = 0.5
    # AgentPool: heartbeats of the agents (their sessions' exit codes: a quarter of it)
    agent_health: float = 2.0
    # Monitor: a running job's log is searched for hang patterns at most this often
    hang_look: float = 1.0
    # AgentPool: a served batch's pid and exit code are read when its work dir changed,
    # and at least this often (a change within the folder mtime's granularity)
    warm_read: float = 0.5
    # Monitor: a batch that announces its changes (``execution.news``) is also read every
    # ``news_net`` s, doubled per such read that found nothing up to ``news_net_max``
    news_net: float = 0.5
    news_net_max: float = 4.0
    # run_build: a build job's wait
    build: float = 0.5

    def warm_hint(self, *, local: bool) -> float:
        """The monitor interval a warm-worker executor asks for."""
        return self.warm_local if local else self.warm_remote

    def round_wait(self, base: float, active: int) -> float:
        """The least wait between two rounds over ``active`` batches (at least ``base``)."""
        stretch = max(1, -(-active // self.batches_per_round))  # ceil
        return min(max(base, self.idle_max), base * stretch)

    def next_idle_wait(self, current: float, *, base: float) -> float:
        """The run loop's next wait after a quiet round (``base``: the monitor's interval)."""
        return min(current * self.idle_growth, max(base, self.idle_max))

    def next_scheduler_interval(self, current: float, *, changed: bool,
                                low: float, high: float) -> float:
        """Adaptive: back to ``low`` after a change, else ``growth`` times longer up to ``high``."""
        return low if changed else min(current * self.scheduler_growth, high)


CADENCE = Cadence()
