"""From collected items to ItemPlans: ``size_item``, ``route_item``, then the batch key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import pytest_trtllm_slurm.planning.requirements as requirements
from pytest_trtllm_slurm.errors import TestSpecError
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.models import DeviceRequirement, Launch, RouteDecision
from pytest_trtllm_slurm.planning.resolve import resolve_container_image
from pytest_trtllm_slurm.planning.routing import Route, route_item
from pytest_trtllm_slurm.planning.settings import with_mounts


@dataclass(slots=True)
class ItemPlan:
    """Where one item goes (planning's answer, read by the loop)."""

    item: pytest.Item
    key: BatchKey | None  # None: runs here
    skip_reason: str | None = None  # set when nothing can serve it
    error: str | None = None  # set when its markers or perf-sanity id cannot be read


@dataclass(slots=True)
class PlannedItem:
    item: pytest.Item
    requirement: DeviceRequirement
    decision: RouteDecision
    plan: ItemPlan


def errored_item(item: pytest.Item, message: str) -> PlannedItem:
    """An item that cannot be planned: it errors at setup with ``message``."""
    decision = RouteDecision(scenario=None, reason=message)
    return PlannedItem(item, DeviceRequirement(source="error"), decision,
                       ItemPlan(item, None, error=message))


def plan_item(item: pytest.Item, ctx: RunContext) -> PlannedItem:
    """Where one item goes; its own markers or perf-sanity id unreadable: the item errors
    (any other ConfigError is the run's usage error)."""
    try:
        sized = requirements.size_item(item, ctx.settings, ctx.perf)
    except TestSpecError as exc:
        return errored_item(item, str(exc))
    route = route_item(sized.requirement, sized.config, ctx)
    decision, req = route.decision, route.requirement
    key = batch_key(route, sized.config, ctx) if decision.dispatched else None
    skip = decision.reason if decision.scenario is None else None
    return PlannedItem(item, req, decision, ItemPlan(item, key, skip_reason=skip))


def batch_image(route: Route, explicit: str | None, rootdir: Path) -> str | None:
    """The image a batch runs in. On a Slurm cluster whose table has a container_runtime
    other than "none": option/marker > clusters file > jenkins/current_image_tags.properties
    (by the partition's arch); elsewhere only an explicit image counts."""
    table = route.table
    if table is None or table.container_runtime == "none":
        return explicit
    return resolve_container_image(explicit, table, rootdir, device_type=route.device_type,
                                   arch=route.arch)


def batch_key(route: Route, test_cfg: requirements.TestConfig,
              ctx: RunContext) -> BatchKey | None:
    """The key of the batch a dispatched test joins (None: nothing serves it)."""
    decision, req, table = route.decision, route.requirement, route.table
    if decision.scenario is None:
        return None
    settings = ctx.settings
    nodes = req.nodes(decision.target_gpus_per_node)
    launcher = requirements.launcher_for(test_cfg, table.launcher if table else (), nodes)
    image = batch_image(route, test_cfg.container_image or settings.container_image,
                        ctx.rootdir)
    own_mounts = tuple(test_cfg.mounts or ())
    return BatchKey(
        scenario=decision.scenario, cluster=decision.cluster, partition=decision.partition,
        account=test_cfg.account or decision.account, total_devices=req.total,
        devices_per_node=req.resolve_per_node(decision.target_gpus_per_node),
        node_count=nodes, device_type=route.device_type if req.total else None,
        container_image=image,
        # the clusters file's mounts, models root, env and time_limit are the cluster's
        # defaults: the marker's win (its mounts first), and the run's --slurm-time-limit
        # (settings) beats the file's; mounts only mean something in a container
        mounts=with_mounts(own_mounts, table.container_mounts) if table and image
        else own_mounts,
        env=tuple(sorted({**(table.job_env if table else {}), **(test_cfg.env or {})}.items())),
        # a launcher runs on every rank: one task per GPU (launch=mpi), pytest on rank 0
        launch=Launch.MPI if launcher else Launch(test_cfg.launch or "single"), launcher=launcher,
        time_limit=test_cfg.time_limit or (
            table.time_limit if table and not settings.time_limit else None),
        mem_mb=req.host_memory_mib or None,
    )


def plan_items(items: list[pytest.Item], ctx: RunContext) -> list[PlannedItem]:
    """Every item's plan; the items of one batch key share one key object (a run of
    100,000 tests holds a handful of keys, not 100,000 equal copies)."""
    keys: dict[BatchKey, BatchKey] = {}
    planned = []
    for item in items:
        one = plan_item(item, ctx)
        if one.plan.key is not None:
            one.plan.key = keys.setdefault(one.plan.key, one.plan.key)
        planned.append(one)
    return planned
