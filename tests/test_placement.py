"""The placer alone (execution/slurm/placement.py): which nodes and GPUs a batch gets,
from the nodes' GPUs in use and the request. No Slurm, no files."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_trtllm_slurm.execution.slurm.placement import (
    BestFit,
    Placement,
    Request,
    give_back,
    take,
)


@dataclass(eq=False)
class Box:
    name: str
    gpus: int = 4
    used: int = 0


def names(placement: Placement[Box] | None) -> list[str] | None:
    return None if placement is None else [n.name for n in placement.nodes]


def test_best_fit_packs_small_batches_and_keeps_the_big_holes() -> None:
    nodes = [Box("a1"), Box("a2", used=2), Box("a3", used=3)]
    placer = BestFit()
    assert names(placer.place(nodes, Request(1, 1))) == ["a3"]  # the tightest that fits
    assert names(placer.place(nodes, Request(1, 2))) == ["a2"]
    assert names(placer.place(nodes, Request(1, 4))) == ["a1"]
    assert placer.place(nodes, Request(2, 4)) is None  # only one idle node
    assert names(placer.place(nodes, Request(2, 1))) == ["a3", "a2"]


def test_a_whole_node_request_gets_idle_nodes_only_and_held_nodes_take_nothing_new() -> None:
    nodes = [Box("a1", used=0), Box("a2", used=0), Box("a3", used=1)]
    placer = BestFit()
    assert names(placer.place(nodes, Request(2, 4, whole=True))) == ["a1", "a2"]
    assert names(placer.place(nodes, Request(1, 1, whole=True), held=[nodes[0]])) == ["a2"]
    assert placer.place(nodes, Request(1, 1, whole=True), held=nodes[:2]) is None
    assert names(placer.place(nodes, Request(1, 1), held=[nodes[2]])) == ["a1"]


def test_take_and_give_back_book_the_gpus_once() -> None:
    nodes = [Box("a1"), Box("a2")]
    placement = BestFit().place(nodes, Request(2, 3))
    assert placement is not None and placement.names == "a1,a2"
    take(placement)
    assert [n.used for n in nodes] == [3, 3]
    assert BestFit().place(nodes, Request(1, 2)) is None  # 1 free each
    give_back(placement)
    give_back(placement)  # twice: still only once
    assert [n.used for n in nodes] == [0, 0] and placement.gpus == 0


def test_reserve_sets_aside_the_least_busy_nodes_not_taken_by_another_early_step() -> None:
    nodes = [Box("a1", used=3), Box("a2", used=1), Box("a3", used=1)]
    placer = BestFit()
    assert [n.name for n in placer.reserve(nodes, 2) or []] == ["a2", "a3"]
    assert [n.name for n in placer.reserve(nodes, 2, taken=[nodes[1]]) or []] == ["a3", "a1"]
    assert placer.reserve(nodes, 2, taken=nodes[:2]) is None
