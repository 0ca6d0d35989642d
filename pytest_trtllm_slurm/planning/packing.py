"""Packing (pure): per pool, a key is split only while the simulated makespan (chunks start as
GPUs free up, as Slurm starts steps) gets shorter; tests go longest first to the least-loaded
chunk (LPT), in collection order inside it (docs/plan.md)."""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, cast

from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.models import target_of

DEFAULT_DURATION = 30.0  # seconds, a test without history
DEFAULT_STARTUP = 15.0  # seconds, a pool without history (imports of torch/tensorrt_llm ...)
MAX_ROUNDS = 512  # bound on the local moves (each improves the plan)
MAX_WORK = 100_000  # chunks simulated per pool's local moves at most (~2.5 s of CPU)
MAX_TARGETS = 48  # target chunk lengths tried (big pools have hundreds)
WARM_STARTUP = 0.2  # seconds, a chunk served by a warm worker without history
TIE = 0.01  # plans whose simulated makespans differ by less than 1% count as equally fast


class GpuShape(Protocol):
    """What packing needs from a batch key (BatchKey has it)."""

    @property
    def devices_per_node(self) -> int: ...
    @property
    def node_count(self) -> int: ...


K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Pool:
    """Resources a run's batches share: ``nodes`` x ``gpus_per_node`` GPUs, ``cpu_slots``."""

    name: str
    nodes: int = 1
    gpus_per_node: int = 0
    cpu_slots: int = 1
    # a chunk's start-up known by construction (warm workers: a fork; the session's
    # one-time imports overlap other work), used instead of the measured one
    fixed_startup: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def ways(self, shape: GpuShape) -> int:
        """How many batches of ``shape`` run side by side here (>= 1)."""
        if shape.devices_per_node <= 0:
            return max(1, self.cpu_slots)
        if shape.devices_per_node > self.gpus_per_node or shape.node_count > self.nodes:
            return 1
        return max(1, (self.gpus_per_node // shape.devices_per_node)
                   * (self.nodes // max(1, shape.node_count)))

    def fits(self, shape: GpuShape) -> bool:
        if shape.devices_per_node <= 0:
            return True
        return shape.devices_per_node <= self.gpus_per_node and shape.node_count <= self.nodes


@dataclass(frozen=True)
class Estimates:
    """Expected seconds: per test (nodeid) and per pool start-up (pool name)."""

    durations: Mapping[str, float] = field(default_factory=dict)
    startup: Mapping[str, float] = field(default_factory=dict)
    default_duration: float = DEFAULT_DURATION
    default_startup: float = DEFAULT_STARTUP

    def for_tests(self, nodeids: Sequence[str]) -> list[float]:
        known = [self.durations[n] for n in nodeids if n in self.durations]
        fallback = statistics.median(known) if known else self.default_duration
        return [max(0.0, float(self.durations.get(n, fallback))) for n in nodeids]

    def startup_of(self, pool: Pool) -> float:
        if pool.fixed_startup is not None:
            return pool.fixed_startup
        return max(0.0, float(self.startup.get(pool.name, self.default_startup)))

    def guessed(self, planned: Sequence[tuple[str, Any]],
                pool_of: Callable[[Any], Pool]) -> str | None:
        """Why figures from these estimates are guesses (None: all measured or known)."""
        tests = sum(1 for nodeid, _ in planned if nodeid not in self.durations)
        pools = sorted({pool.name for _, key in planned
                        if (pool := pool_of(key)).fixed_startup is None
                        and pool.name not in self.startup})
        why = [f"no earlier duration for {tests} of {len(planned)} test(s)"] if tests else []
        why += [f"no earlier start-up time of {', '.join(pools)}"] if pools else []
        return "; ".join(why) or None


@dataclass
class Chunk:
    """One planned batch: a key, its tests (collection order) and its expected seconds."""

    key: Hashable
    index: int
    nodeids: list[str]
    expected: float  # start-up + the tests
    devices_per_node: int = 0
    node_count: int = 1
    start: float = 0.0  # when the simulation started it

    @property
    def width(self) -> int:
        """GPUs it holds while it runs (1 slot for a CPU-only chunk)."""
        return self.devices_per_node * self.node_count if self.devices_per_node > 0 else 1


@dataclass
class _Group:
    key: Hashable
    nodeids: list[str]
    durations: list[float]
    devices_per_node: int
    node_count: int
    limit: int  # most chunks worth having


def lpt(durations: Sequence[float], chunks: int,
        order: Sequence[int] | None = None) -> list[list[int]]:
    """Indices split into ``chunks`` lists, longest first onto the least loaded; each list in
    collection order, empty ones dropped."""
    chunks = max(1, min(chunks, len(durations)))
    if order is None:  # longest first (callers splitting one list often pass it in)
        order = longest_first(durations)
    heap = [(0.0, 0, c) for c in range(chunks)]  # (load, tests, chunk)
    bins: list[list[int]] = [[] for _ in range(chunks)]
    for i in order:
        load, count, c = heapq.heappop(heap)
        bins[c].append(i)
        heapq.heappush(heap, (load + durations[i], count + 1, c))
    return [sorted(b) for b in bins if b]


def longest_first(durations: Sequence[float]) -> list[int]:
    return sorted(range(len(durations)), key=lambda i: (-durations[i], i))


def simulate(chunks: Sequence[Chunk], pool: Pool) -> float:
    """Makespan of ``chunks`` started in list order as resources free up (no reservations;
    one that never fits runs elsewhere from 0). Sets ``Chunk.start``."""
    free = [pool.gpus_per_node] * max(1, pool.nodes)
    cpu_free = max(1, pool.cpu_slots)
    pending: list[Chunk] = []
    end = 0.0
    for chunk in chunks:
        if pool.fits(chunk):
            pending.append(chunk)
        else:
            chunk.start = 0.0
            end = max(end, chunk.expected)
    running: list[tuple[float, int, list[int], int]] = []  # (end, seq, nodes, dpn)
    now, seq = 0.0, 0
    while pending or running:
        left = []
        most = max(free)  # the most free GPUs on one node: a cheap "cannot fit" test
        for pos, chunk in enumerate(pending):
            if most <= 0 and cpu_free <= 0:
                left += pending[pos:]
                break
            dpn = chunk.devices_per_node
            placed: list[int] | None = None
            if dpn <= 0:
                if cpu_free > 0:
                    placed, cpu_free = [], cpu_free - 1
            elif dpn <= most:
                placed = _place(free, dpn, chunk.node_count)
                for n in placed or []:
                    free[n] -= dpn
                most = max(free)
            if placed is None:
                left.append(chunk)
                continue
            chunk.start = now
            heapq.heappush(running, (now + chunk.expected, seq, placed, dpn))
            seq += 1
        pending = left
        if not running:  # cannot happen: every pending chunk fits the empty pool
            raise AssertionError("simulation stuck")
        now = running[0][0]
        end = max(end, now)
        while running and running[0][0] <= now:  # everything ending at this moment
            _, _, placed, dpn = heapq.heappop(running)
            if dpn <= 0:
                cpu_free += 1
            for n in placed:
                free[n] += dpn
    return end


def _place(free: list[int], dpn: int, nodes: int) -> list[int] | None:
    """Best fit: the ``nodes`` nodes with the fewest free GPUs that still have ``dpn``."""
    fit = sorted((f, n) for n, f in enumerate(free) if f >= dpn)
    if len(fit) < nodes:
        return None
    return [n for _, n in fit[:nodes]]


ORDERS: dict[str, Callable[[Chunk], tuple[float, ...]]] = {
    "wide-first": lambda c: (-c.width, -c.expected),
    "long-first": lambda c: (-c.expected, -c.width),
    "area-first": lambda c: (-c.width * c.expected, -c.width),
}


@dataclass
class PoolPlan:
    pool: Pool
    counts: dict[Hashable, int]
    chunks: list[Chunk]  # submission order
    makespan: float


def plan_pool(groups: Sequence[_Group], pool: Pool, startup: float,
              fixed: Mapping[Hashable, int] | None = None) -> PoolPlan:
    """Chunk counts for the keys sharing ``pool``, chosen on the simulated makespan (within
    1%: the fewest start-ups): first one target chunk length for all, then +-1 moves."""
    fixed = fixed or {}
    splits: dict[tuple[int, int], list[tuple[list[int], float]]] = {}
    scores: dict[tuple[int, ...], tuple[float, float, list[Chunk]]] = {}
    work = [0]  # chunks simulated so far
    floor = [math.inf]  # the shortest makespan simulated so far

    orders = [longest_first(g.durations) for g in groups]

    def split(g: int, count: int) -> list[tuple[list[int], float]]:
        if (g, count) not in splits:
            durations = groups[g].durations
            splits[(g, count)] = [(idx, startup + sum(durations[i] for i in idx))
                                  for idx in lpt(durations, count, orders[g])]
        return splits[(g, count)]

    def longest(g: int, count: int) -> float:
        return max(expected for _, expected in split(g, count))

    def build(counts: tuple[int, ...]) -> tuple[float, float, list[Chunk]]:
        if counts in scores:
            return scores[counts]
        chunks: list[Chunk] = []
        for g, count in enumerate(counts):
            group = groups[g]
            for index, (idx, expected) in enumerate(split(g, count)):
                chunks.append(Chunk(group.key, index, [group.nodeids[i] for i in idx], expected,
                                    group.devices_per_node, group.node_count))
        area = sum(c.width * c.expected for c in chunks)
        work[0] += len(ORDERS) * len(chunks)
        best: tuple[float, float, list[Chunk]] | None = None
        for order in ORDERS.values():
            ordered = [replace(c) for c in sorted(chunks, key=order)]
            makespan = simulate(ordered, pool)
            if best is None or makespan < best[0] - 1e-9:
                best = (makespan, area, ordered)
        assert best is not None
        scores[counts] = best
        floor[0] = min(floor[0], best[0])
        return best

    def better(a: tuple[float, float, list[Chunk]], b: tuple[float, float, list[Chunk]]) -> bool:
        """Shorter by more than TIE (expected durations are estimates), else as long and
        fewer GPU-seconds (fewer start-ups paid), within TIE of the shortest plan seen: a
        chain of ties never drifts 1% a step away from it."""
        eps = TIE * max(1.0, b[0])
        return a[0] < b[0] - eps or (abs(a[0] - b[0]) <= eps and a[1] < b[1] - 1e-9
                                     and a[0] <= floor[0] + TIE * max(1.0, floor[0]))

    free = [g.key not in fixed for g in groups]
    lo = [1 if free[g] else max(1, min(len(grp.nodeids), fixed[grp.key]))
          for g, grp in enumerate(groups)]
    hi = [grp.limit if free[g] else lo[g] for g, grp in enumerate(groups)]

    # 1. one target chunk length for every key
    targets = sorted({longest(g, c) for g in range(len(groups)) for c in range(lo[g], hi[g] + 1)},
                     reverse=True)
    if len(targets) > MAX_TARGETS:  # big pools: an even sample of them
        step = (len(targets) - 1) / (MAX_TARGETS - 1)
        targets = [targets[round(i * step)] for i in range(MAX_TARGETS)]
    counts = tuple(lo)
    best = build(counts)
    tried = [(counts, best)]
    for target in targets:
        trial = tuple(next((c for c in range(lo[g], hi[g] + 1) if longest(g, c) <= target + 1e-9),
                           hi[g]) for g in range(len(groups)))
        result = build(trial)
        tried.append((trial, result))
        if better(result, best):
            counts, best = trial, result

    def moved(counts: tuple[int, ...], best: tuple[float, float, list[Chunk]]
              ) -> tuple[tuple[int, ...], tuple[float, float, list[Chunk]]]:
        """Local moves: one key +-1, or every key +1 (until MAX_WORK chunks were simulated)."""
        for _ in range(MAX_ROUNDS):
            if work[0] >= MAX_WORK:
                break
            moves = []
            for g in range(len(groups)):
                for step in (1, -1):
                    if lo[g] <= counts[g] + step <= hi[g]:
                        moves.append(tuple(c + step if i == g else c
                                           for i, c in enumerate(counts)))
            moves.append(tuple(min(hi[i], c + 1) for i, c in enumerate(counts)))
            found = None
            for trial in moves:
                result = build(trial)
                if better(result, best) and (found is None or better(result, found[1])):
                    found = (trial, result)
            if found is None:
                break
            counts, best = found
        return counts, best

    # 2. the moves start from the first phase's plan and, first, from its plan with the
    # fewest chunks within 2 TIE of it: a plan of 4x the chunks that simulated 1% shorter
    # must not hide one that the moves make as short with a quarter of the batches (each
    # batch costs dispatch the simulation does not see; and from hundreds of chunks the
    # moves' MAX_WORK runs out within a few rounds)
    few = min((t for t in tried if t[1][0] <= best[0] + 2 * TIE * max(1.0, best[0])),
              key=lambda t: len(t[1][2]))
    fewer = moved(*few) if len(few[1][2]) < len(best[2]) else None  # first: MAX_WORK left
    counts, best = moved(counts, best)
    if fewer is not None and not better(best, fewer[1]):
        counts, best = fewer
    return PoolPlan(pool, {g.key: c for g, c in zip(groups, counts, strict=True)}, best[2], best[0])


def pack(
    planned: Sequence[tuple[str, K]],
    pool_of: Callable[[K], Pool],
    estimates: Estimates | None = None,
    fixed: Mapping[K, int] | None = None,
) -> list[Chunk]:
    """All chunks of a run, packed per pool, each pool in its simulated submission order;
    ``fixed`` forces a key's chunk count."""
    estimates = estimates or Estimates()
    pools: dict[Pool, list[_Group]] = {}
    for key, nodeids in by_key(planned).items():
        pool, shape = pool_of(key), cast(GpuShape, key)
        limit = min(len(nodeids), pool.ways(shape) if pool.fits(shape) else 1)
        pools.setdefault(pool, []).append(_Group(
            key, nodeids, estimates.for_tests(nodeids), shape.devices_per_node,
            max(1, shape.node_count), limit))
    return [chunk for pool, groups in pools.items()
            for chunk in plan_pool(groups, pool, estimates.startup_of(pool), fixed=fixed).chunks]


def lower_bound(
    planned: Sequence[tuple[str, K]],
    pool_of: Callable[[K], Pool],
    estimates: Estimates | None = None,
) -> float:
    """No packing ends sooner: per pool, start-up + max(longest test, GPU-seconds / GPUs);
    the largest over the pools (they run side by side)."""
    estimates = estimates or Estimates()
    area: dict[tuple[Pool, bool], float] = {}  # (pool, CPU-only) -> seconds of full use
    bound = 0.0
    for key, nodeids in by_key(planned).items():
        pool, shape = pool_of(key), cast(GpuShape, key)
        startup = estimates.startup_of(pool)
        durations = estimates.for_tests(nodeids)
        if not pool.fits(shape):  # one chunk, elsewhere
            bound = max(bound, startup + sum(durations))
            continue
        width = (shape.devices_per_node * max(1, shape.node_count)
                 if shape.devices_per_node > 0 else 1)
        capacity = pool.gpus if shape.devices_per_node > 0 else max(1, pool.cpu_slots)
        slot = (pool, shape.devices_per_node <= 0)
        area[slot] = area.get(slot, 0.0) + width * sum(durations) / max(1, capacity)
        bound = max(bound, startup + max(durations, default=0.0))
    for (pool, _), seconds in area.items():
        bound = max(bound, estimates.startup_of(pool) + seconds)
    return bound


def by_key(planned: Sequence[tuple[str, K]]) -> dict[K, list[str]]:
    """The node ids of each key, in order."""
    groups: dict[K, list[str]] = {}
    for nodeid, key in planned:
        groups.setdefault(key, []).append(nodeid)
    return groups


# -- where a run's batches go: what each target's executor says it offers ------------------
@dataclass(frozen=True)
class AllocationShape:
    """A persistent allocation as requested: ``nodes`` x ``gpus_per_node``, whole nodes."""

    nodes: int
    gpus_per_node: int
    partition: str | None = None
    image: str | None = None


@dataclass(frozen=True)
class Capacity:
    """What a target offers the packer (``Executor.capacity``); warm: a batch is a fork."""

    local_gpus: int = 0
    allocation: AllocationShape | None = None
    warm: bool = False
    slurm_env: SlurmEnv | None = None


class BatchShape(GpuShape, Protocol):
    """What the packer and an allocation's sizing read of a batch (BatchKey, JobSpec)."""

    @property
    def scenario(self) -> Any: ...
    @property
    def partition(self) -> str | None: ...
    @property
    def account(self) -> str | None: ...
    @property
    def container_image(self) -> str | None: ...


def pools_from_capacities(capacities: Mapping[Any, Capacity]) -> Callable[[BatchShape], Pool]:
    """``key -> Pool`` from what each target offers (two clusters never share a pool): the
    allocation when it serves the key, else the partition, or this machine's GPUs."""

    def pool_of(key: BatchShape) -> Pool:
        scenario = str(getattr(key.scenario, "value", key.scenario))
        target = target_of(key)
        offer = capacities.get(target) or Capacity()
        if isinstance(target, tuple):  # a remote cluster's pools are its own
            scenario = f"{scenario}/{target[1]}"
        if scenario in ("local_direct", "local_docker"):
            return Pool(scenario, nodes=1, gpus_per_node=offer.local_gpus, cpu_slots=1)
        shape = offer.allocation
        if shape is not None and _served(key, shape):
            gpus = int(shape.gpus_per_node or 0)
            # warm workers: a chunk costs a fork (its node's session imported the suite)
            return Pool(f"{scenario}/{shape.partition or '-'}/allocation"
                        + ("/warm" if offer.warm else ""),
                        nodes=max(1, int(shape.nodes)), gpus_per_node=gpus,
                        cpu_slots=max(1, int(shape.nodes)) * max(1, gpus),
                        fixed_startup=WARM_STARTUP if offer.warm else None)
        env = offer.slurm_env
        partition = key.partition or (env.default_partition if env is not None else None)
        info = env.partition_named(partition) if env is not None else None
        nodes = len(info.nodes) if info is not None and info.nodes else key.node_count
        gpus = (info.gpus_per_node if info is not None and info.gpus_per_node
                else key.devices_per_node)
        return Pool(f"{scenario}/{partition or '-'}/one-shot", nodes=max(1, nodes),
                    gpus_per_node=gpus, cpu_slots=max(1, nodes) * max(1, gpus))

    return pool_of


def _served(key: BatchShape, shape: AllocationShape) -> bool:
    """The allocation requested as ``shape`` runs ``key`` (as ``AllocationState.serves``)."""
    if key.partition and shape.partition and key.partition != shape.partition:
        return False
    if key.node_count > shape.nodes or key.devices_per_node > shape.gpus_per_node:
        return False
    return (key.container_image or None) == (shape.image or None)
