"""Group dispatched tests into batches (same destination, shape, image, env, launch), pure;
each batch pays start-up once, so ``packing`` splits a key only as far as it pays."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from pytest_trtllm_slurm.planning.models import Launch, Scenario
from pytest_trtllm_slurm.planning.packing import Estimates, Pool, by_key, pack


class BatchKey(BaseModel):
    """What must be equal for two tests to share one job."""

    model_config = ConfigDict(frozen=True)

    scenario: Scenario
    cluster: str | None = None
    partition: str | None = None
    account: str | None = None
    total_devices: int = 0
    devices_per_node: int = 0
    node_count: int = 1
    device_type: str | None = None
    container_image: str | None = None
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launch: Launch = Launch.SINGLE
    launcher: tuple[str, ...] = ()  # the prefix each rank runs (launch=mpi)
    time_limit: str | None = None
    mem_mb: int | None = None  # memory per node (skip_less_host_memory)


class Batch(BaseModel):
    key: BatchKey
    index: int = 0  # chunk number within the key
    nodeids: list[str] = Field(default_factory=list)
    expected_seconds: float | None = None  # packing's estimate (start-up + tests), if packed
    expected_start: float | None = None  # when packing's simulation of its pool started it

    @property
    def label(self) -> str:
        k = self.key
        where = k.partition or k.cluster or k.scenario.value
        return f"{where}-{k.total_devices}gpu-{k.node_count}n-{self.index}"


def make_batches(
    planned: list[tuple[str, BatchKey]],
    parallel: dict[BatchKey, int] | None = None,
    *,
    pools: Callable[[BatchKey], Pool] | None = None,
    estimates: Estimates | None = None,
) -> list[Batch]:
    """Group (nodeid, key) pairs by key: round-robin into ``parallel[key]`` chunks, or with
    ``pools`` as ``packing.pack`` plans them (``parallel`` still forces a key's count)."""
    if pools is not None:
        return [
            Batch(key=chunk.key, index=chunk.index, nodeids=chunk.nodeids,  # type: ignore[arg-type]
                  expected_seconds=round(chunk.expected, 3),
                  expected_start=round(chunk.start, 3))
            for chunk in pack(planned, pools, estimates, fixed=parallel)
        ]
    batches: list[Batch] = []
    for key, nodeids in by_key(planned).items():
        chunks = max(1, min(len(nodeids), (parallel or {}).get(key, 1)))
        for index in range(chunks):
            batches.append(Batch(key=key, index=index, nodeids=nodeids[index::chunks]))
    return batches
