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
    # the run loop's wait after a round that found nothing: the monitor's interval,
    # ``idle_growth`` times longer per quiet round up to ``idle_max`` (never below the
    # interval); back to the interval after a round that found something: on a big
    # cluster, quiet rounds at the shortest interval are most of the controller's CPU time
    idle_growth: float = 1.5
    idle_max: float = 0.2
    # a round reads every active batch's files: beyond this many batches the least wait
    # between rounds grows with them (up to idle_max), so the controller's CPU per second
    # stays bounded (with many warm batches, rounds back to back after every report are
    # most of its CPU time)
    batches_per_round: int = 8
    # one look at a persistent allocation whose warm workers serve this run's batches
    # (nothing else asks the scheduler then): a failed node ends it. Ended batches'
    # results wait for it while others run (shown up to this late; their GPUs are
    # given back at once, from the files)
    alloc_watch: float = 2.0
    # once the run's last batches there ended, the first look after their end is made at
    # once (only it vouches for them); one that did not (the scheduler failing) is made
    # again at most this often
    alloc_watch_gap: float = 0.5
    # AgentPool: heartbeats of the agents (their sessions' exit codes: a quarter of it)
    agent_health: float = 2.0
    # Monitor: a running job's log is searched for hang patterns at most this often (a
    # stat per job per round otherwise)
    hang_look: float = 1.0
    # AgentPool: a served batch's pid and exit code are read when its work dir changed,
    # and at least this often (a change within the folder mtime's granularity)
    warm_read: float = 0.5
    # Monitor: a batch whose node side announces its changes (``execution.news``) is read
    # when a notice names it, and at least every ``news_net`` s: doubled after each such
    # read that found nothing new, up to ``news_net_max``, and back to ``news_net`` when
    # one found what no notice announced (a lost notice costs at most this much, once)
    news_net: float = 0.5
    news_net_max: float = 4.0
    # run_build: a build job's wait
    build: float = 0.5

    def warm_hint(self, *, local: bool) -> float:
        """The monitor interval a warm-worker executor asks for."""
        return self.warm_local if local else self.warm_remote

    def round_wait(self, base: float, active: int) -> float:
        """The least wait between two rounds over ``active`` batches (``base``: the
        monitor's interval; never below it, at most ``idle_max`` unless base is more)."""
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
