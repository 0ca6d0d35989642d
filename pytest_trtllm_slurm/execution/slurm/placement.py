"""Which nodes and how many GPUs a batch gets in a persistent allocation: a pure policy
(nodes and a request in, nodes or None out); the warm pool books with ``take``/``give_back``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Slots(Protocol):
    """What the placer sees of a node: its name, its GPUs and how many are in use."""

    name: str
    gpus: int
    used: int


N = TypeVar("N", bound=Slots)


@dataclass(frozen=True)
class Request:
    """``nodes`` nodes with ``gpus`` free GPUs each; ``whole``: idle nodes only (a step
    may land on any GPU of its nodes, so it gets them to itself)."""

    nodes: int
    gpus: int
    whole: bool = False


@dataclass
class Placement(Generic[N]):
    """Nodes given to a batch and the GPUs it holds on each (0 once given back)."""

    nodes: list[N]
    gpus: int

    @property
    def names(self) -> str:
        return ",".join(n.name for n in self.nodes)


class BestFit:
    """First come, best fit: the nodes with the fewest free GPUs that still fit, so big
    holes stay for big batches; ties go to the allocation's node order."""

    def place(self, nodes: Sequence[N], request: Request, *,
              held: Iterable[N] = ()) -> Placement[N] | None:
        """``held``: nodes drained for a gated step whose ranks are ready (nothing new there)."""
        skip = {id(n) for n in held}
        fits = [n for n in nodes if n.gpus - n.used >= request.gpus and id(n) not in skip
                and (not request.whole or n.used == 0)]
        if len(fits) < max(1, request.nodes):
            return None
        fits.sort(key=lambda n: n.gpus - n.used)  # (stable: ties keep the nodes' order)
        return Placement(nodes=fits[:max(1, request.nodes)], gpus=request.gpus)

    def reserve(self, nodes: Sequence[N], count: int, *,
                taken: Iterable[N] = ()) -> list[N] | None:
        """Nodes to set aside for a gated step launched early: the least busy of those no
        other early step has (one early launch per node: its ranks hold memory there)."""
        skip = {id(n) for n in taken}
        free = [n for n in nodes if id(n) not in skip]
        if len(free) < max(1, count):
            return None
        free.sort(key=lambda n: n.used)  # (stable: ties keep the nodes' order)
        return free[:max(1, count)]


def take(placement: Placement[N]) -> None:
    """Book the placement's GPUs on its nodes."""
    for node in placement.nodes:
        node.used += placement.gpus


def give_back(placement: Placement[N]) -> None:
    """Free the placement's GPUs (once: a given-back placement holds 0)."""
    for node in placement.nodes:
        node.used = max(0, node.used - placement.gpus)
    placement.gpus = 0
