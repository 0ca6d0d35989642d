"""The lifecycle of one batch on Slurm; every move goes through ``Lifecycle.to``, which
refuses one ``ALLOWED`` does not list:

    WAITING -> EARLY -> SUBMITTED <-> RUNNING -> ENDED -> SETTLED

WAITING    held back by the warm pool until GPUs of the allocation are free
EARLY      a gated step launched before its nodes are free: only its gate opening or its
           end moves it (a RUNNING seen meanwhile is accounting lag)
SUBMITTED  the scheduler or a warm worker has it; not running (a re-sent batch returns)
ENDED      its final state is known; its reports may lag, the allocation's end not ruled out
SETTLED    its final state may be shown (terminal)"""

from __future__ import annotations

from enum import Enum

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus


class Phase(Enum):
    WAITING = "waiting"
    EARLY = "early"
    SUBMITTED = "submitted"
    RUNNING = "running"
    ENDED = "ended"
    SETTLED = "settled"


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.WAITING: frozenset({Phase.EARLY, Phase.SUBMITTED, Phase.ENDED}),
    Phase.EARLY: frozenset({Phase.SUBMITTED, Phase.ENDED}),
    Phase.SUBMITTED: frozenset({Phase.RUNNING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.SUBMITTED, Phase.ENDED}),
    Phase.ENDED: frozenset({Phase.SETTLED}),
    Phase.SETTLED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the lifecycle does not allow: a bug in the executor, never the cluster's doing."""


class Lifecycle:
    """One batch's phase (shared by the executor's and the warm pool's view of it)."""

    __slots__ = ("phase",)

    def __init__(self, phase: Phase = Phase.SUBMITTED) -> None:
        self.phase = phase

    def to(self, phase: Phase) -> None:
        """Move to ``phase`` (staying is always allowed)."""
        if phase is not self.phase and phase not in ALLOWED[self.phase]:
            raise IllegalTransition(f"a batch cannot go from {self.phase.name} to {phase.name}")
        self.phase = phase

    def saw(self, status: JobStatus) -> None:
        """The batch's status changed: a final one ends it, RUNNING runs it, PENDING is
        pending again (a re-sent batch) unless the pool still holds it back."""
        if status.finished:
            if self.phase is not Phase.SETTLED:  # settled is shown as is: nothing reopens it
                self.to(Phase.ENDED)
            return
        if self.phase in (Phase.ENDED, Phase.SETTLED):
            raise IllegalTransition(f"a batch in {self.phase.name} cannot become {status.name}")
        if self.phase is Phase.EARLY:
            return  # the gate decides (see EARLY above)
        if status is JobStatus.RUNNING:
            self.to(Phase.RUNNING)
        elif self.phase is Phase.RUNNING:
            self.to(Phase.SUBMITTED)

    def settle(self) -> None:
        """Its final state may be shown now."""
        self.to(Phase.SETTLED)

    @property
    def waiting(self) -> bool:
        return self.phase is Phase.WAITING

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.ENDED, Phase.SETTLED)

    @property
    def settled(self) -> bool:
        return self.phase is Phase.SETTLED


class FollowsState:
    """TrackedJob and WarmJob: one ``state`` setter moves the lifecycle, so neither forgets to."""

    _state: JobState
    life: Lifecycle

    @property
    def state(self) -> JobState:
        return self._state

    @state.setter
    def state(self, value: JobState) -> None:
        self._state = value
        self.life.saw(value.status)
