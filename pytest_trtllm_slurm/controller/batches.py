"""The batches of a run, found one way for the run and for ``--trtllm-plan`` (the plan is
what runs, yet builds no executor); under pytest-order or pytest-dependency each shape's
tests stay in one batch (batches run side by side, each its own session)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.planning.batching import Batch, BatchKey, make_batches
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.models import Scenario, Target, target_of
from pytest_trtllm_slurm.planning.packing import Capacity, Estimates, Pool, pools_from_capacities
from pytest_trtllm_slurm.planning.plan_table import BatchRow


def run_batches(
    config: pytest.Config, items: Sequence[pytest.Item], dispatched: list[tuple[str, BatchKey]],
    pools: Callable[[BatchKey], Pool], estimates: Estimates,
) -> tuple[list[Batch], list[str]]:
    """The run's batches in submission order, and why each shape is kept in one batch
    (pytest-order, pytest-dependency: the notes the caller says once; [] when not)."""
    notes = kept_together(config, items)
    one_per_shape = {key: 1 for _, key in dispatched} if notes else None
    return make_batches(dispatched, one_per_shape, pools=pools, estimates=estimates), notes


def planned_pools(ctx: RunContext, keys: Sequence[BatchKey]) -> Callable[[BatchKey], Pool]:
    """The pools the run would pack into, as ``session.make_executors`` would set them up."""
    local = Capacity(local_gpus=ctx.local.gpu_count)
    targets: dict[Target, Capacity] = {Scenario.LOCAL_DIRECT: local, Scenario.LOCAL_DOCKER: local}
    slurm_keys = [k for k in keys if k.scenario is Scenario.LOCAL_SLURM]
    if slurm_keys:
        targets[Scenario.LOCAL_SLURM] = _slurm_capacity(slurm_keys, ctx.slurm_env, ctx)
    remote: dict[Target, list[BatchKey]] = {}
    for key in keys:
        if key.scenario is Scenario.REMOTE_SLURM:
            remote.setdefault(target_of(key), []).append(key)
    for target, mine in remote.items():
        # as a local cluster: its persistent allocation (sized for its own keys, against
        # its discovery), else its partition
        targets[target] = _slurm_capacity(mine, _remote_env(ctx, mine[0].cluster), ctx)
    return pools_from_capacities(targets)


def _slurm_capacity(keys: Sequence[BatchKey], slurm_env: SlurmEnv | None,
                    ctx: RunContext) -> Capacity:
    """What ``SlurmExecutor.capacity`` will say once built."""
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationRequest

    settings = ctx.settings
    if not settings.persistent:
        return Capacity(slurm_env=slurm_env)
    request = AllocationRequest.covering(list(keys), slurm_env,
                                         time_limit=settings.alloc_time_limit,
                                         nodes=settings.alloc_nodes)
    return Capacity(allocation=request.shape(), warm=settings.warm_workers, slurm_env=slurm_env)


def _remote_env(ctx: RunContext, cluster: str | None) -> SlurmEnv | None:
    """The remote cluster's discovery (cached on disk; what routing used), or None when
    it cannot be had: the plan then packs against the keys' own shapes."""
    from pytest_trtllm_slurm.execution.factory import remotes_of

    if not cluster:
        return None
    try:
        return remotes_of(ctx).env(ctx.clusters.get(cluster))
    except (ConfigError, ExecutionError, OSError):
        return None


def batch_rows(batches: Sequence[Batch], pools: Callable[[BatchKey], Pool]) -> list[BatchRow]:
    """The plan's table of ``batches`` (submission order)."""
    rows = []
    for batch in batches:
        key = batch.key
        target = "/".join(filter(None, (key.cluster, key.partition))) or key.scenario.value
        rows.append(BatchRow(
            label=batch.label, target=target, scenario=key.scenario.value,
            pool=pools(key).name, gpus_per_node=key.devices_per_node, nodes=key.node_count,
            tests=len(batch.nodeids), nodeids=list(batch.nodeids),
            expected_start=batch.expected_start, expected_seconds=batch.expected_seconds))
    return rows


ORDER_NOTE = (
    "pytest-order: ordered tests keep their order within each target and device shape, "
    "which now runs as one batch (not split to run side by side); batches of different "
    "shapes still run at the same time, and tests that run on this machine do not wait "
    "for dispatched ones (--trtllm-keep-order makes them)"
)
DEPENDENCY_NOTE = (
    "pytest-dependency: a test sees the outcome of the tests it depends on only within "
    "its target and device shape, which now runs as one batch (not split to run side by "
    "side); a dependency on a test of another shape, or on one that runs on this machine, "
    "is not seen, and the test is skipped as if that test had not run"
)


def asks_for_order(config: pytest.Config, items: Iterable[pytest.Item]) -> bool:
    """pytest-order is active and the run sorts something with it."""
    if not config.pluginmanager.has_plugin("pytest_order"):
        return False
    opt = config.option
    if getattr(opt, "order_dependencies", False) or getattr(opt, "order_marker_prefix", None):
        return True
    return any(item.get_closest_marker("order") is not None for item in items)


def asks_for_dependencies(config: pytest.Config, items: Iterable[pytest.Item]) -> bool:
    """pytest-dependency is active and a test depends on another."""
    if not config.pluginmanager.has_plugin("dependency"):
        return False
    return any(mark.kwargs.get("depends") or len(mark.args) > 1
               for item in items for mark in item.iter_markers("dependency"))


def kept_together(config: pytest.Config, items: Sequence[pytest.Item]) -> list[str]:
    """What keeps each shape's tests in one batch, as the notes the run says once
    (none: batches are split freely)."""
    if len(items) < 2:
        return []
    notes = [ORDER_NOTE] if asks_for_order(config, items) else []
    return notes + ([DEPENDENCY_NOTE] if asks_for_dependencies(config, items) else [])
