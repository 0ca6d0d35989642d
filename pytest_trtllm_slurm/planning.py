"""From collected items to ItemPlans: requirement, route, batch key per item.

Runs once per session, after collection, only when dispatch or a plan was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from . import requirements, routing
from .batching import BatchKey
from .config import ClustersFile, Settings
from .dispatch import ItemPlan
from .jobspec import SlurmEnv
from .models import DeviceRequirement, Launch, LocalEnv, RouteDecision


@dataclass
class PlanningContext:
    """What planning needs besides the items: found once per run."""

    settings: Settings
    local: LocalEnv
    clusters: ClustersFile
    slurm_env: SlurmEnv | None = None


@dataclass
class PlannedItem:
    item: pytest.Item
    requirement: DeviceRequirement
    decision: RouteDecision
    plan: ItemPlan


def plan_item(item: pytest.Item, ctx: PlanningContext) -> PlannedItem:
    settings = ctx.settings
    req = requirements.requirement_for_item(item, settings)
    test_cfg = requirements.test_config_for_item(item)
    decision = routing.route(
        req,
        settings=settings,
        local=ctx.local,
        clusters=ctx.clusters,
        slurm_env=ctx.slurm_env,
        pinned_local=bool(test_cfg.local),
        partition=test_cfg.partition,
    )
    if decision.scenario is None:
        return PlannedItem(item, req, decision, ItemPlan(item, None, skip_reason=decision.reason))
    if not decision.dispatched:
        return PlannedItem(item, req, decision, ItemPlan(item, None))
    per_node = req.resolve_per_node(decision.target_gpus_per_node)
    key = BatchKey(
        scenario=decision.scenario,
        cluster=decision.cluster,
        partition=decision.partition,
        account=test_cfg.account or decision.account,
        total_devices=req.total,
        devices_per_node=per_node,
        node_count=req.nodes(decision.target_gpus_per_node),
        device_type=req.device_type,
        container_image=test_cfg.container_image or settings.container_image,
        mounts=tuple(test_cfg.mounts or ()),
        env=tuple(sorted((test_cfg.env or {}).items())),
        launch=Launch(test_cfg.launch or "single"),
        time_limit=test_cfg.time_limit,
    )
    return PlannedItem(item, req, decision, ItemPlan(item, key))


def plan_items(items: list[pytest.Item], ctx: PlanningContext) -> list[PlannedItem]:
    return [plan_item(item, ctx) for item in items]
