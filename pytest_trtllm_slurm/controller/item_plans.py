"""From collected items to ItemPlans: requirement, route, batch key per item.

Runs once per session, after collection, only when dispatch or a plan was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import pytest_trtllm_slurm.planning.requirements as requirements
import pytest_trtllm_slurm.planning.routing as routing
from pytest_trtllm_slurm.errors import ConfigError, TestSpecError
from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.models import (
    DeviceRequirement,
    Launch,
    LocalEnv,
    RouteDecision,
    Scenario,
)
from pytest_trtllm_slurm.planning.resolve import normalize_device_type, resolve_container_image
from pytest_trtllm_slurm.planning.settings import (
    ClusterConfig,
    ClustersFile,
    Settings,
    with_mounts,
)


@dataclass(slots=True)
class ItemPlan:
    """Where one item goes (planning's answer, read by the loop)."""

    item: pytest.Item
    key: BatchKey | None  # None: runs here
    skip_reason: str | None = None  # set when nothing can serve it
    error: str | None = None  # set when its markers or perf-sanity id cannot be read


@dataclass
class PlanningContext:
    """What planning needs besides the items: found once per run."""

    settings: Settings
    local: LocalEnv
    clusters: ClustersFile
    slurm_env: SlurmEnv | None = None
    perf: requirements.PerfSources | None = None
    rootdir: Path = Path(".")
    # what discovery over SSH finds on a remote cluster (None: the clusters file alone)
    remote_env: routing.RemoteEnv | None = None
    # sessions the run started before it collected (the plugin's early start)
    early_sessions: EarlySessions | None = None

    def slurm_env_of(self, decision: RouteDecision) -> SlurmEnv | None:
        """The discovery of the Slurm cluster a test was routed to (local or remote)."""
        if decision.scenario is Scenario.LOCAL_SLURM:
            return self.slurm_env
        if decision.scenario is Scenario.REMOTE_SLURM and decision.cluster and self.remote_env:
            cluster = self.clusters.get(decision.cluster)
            if cluster.partition and cluster.gpus_per_node:
                return None  # the clusters file says enough: used as given, no connection
            return self.remote_env(cluster)
        return None


@dataclass(slots=True)
class PlannedItem:
    item: pytest.Item
    requirement: DeviceRequirement
    decision: RouteDecision
    plan: ItemPlan


def available_device_types(ctx: PlanningContext, *, discover: bool = False) -> list[str]:
    """Device types some target offers: the remote cluster --slurm-cluster names (what
    discovery found there, unless its table names a device_type), this machine, the local
    Slurm (its table's partition only, when it names one), configured clusters; with
    ``discover``, also what discovery finds on every remote cluster whose table names no
    device_type (a run of several clusters: one of them may be the only one with it)."""
    found = _named_remote_types(ctx)
    found += [ctx.local.device_type] if ctx.local.gpu_count and ctx.local.device_type else []
    if ctx.slurm_env is not None:
        local = ctx.clusters.find(ctx.local.cluster_name) if ctx.local.cluster_name else None
        found += [p.gpu_type for p in ctx.slurm_env.partitions if p.gpu_type
                  and not (local is not None and local.partition and p.name != local.partition)]
    found += [c.device_type for c in ctx.clusters.clusters.values() if c.device_type]
    if discover:
        found += _discovered_remote_types(ctx)
    types = [normalize_device_type(t) for t in found]
    return list(dict.fromkeys(t for t in types if t))


def _discovered_remote_types(ctx: PlanningContext) -> list[str]:
    """GPU types discovery finds on the remote clusters whose table names none (their
    table's partition only, when it names one); one that cannot be reached offers none."""
    if ctx.remote_env is None or ctx.settings.slurm_cluster:
        return []  # --slurm-cluster: only that one counts (_named_remote_types)
    here = (ctx.local.cluster_name or "").lower()
    found: list[str] = []
    for key, cluster in ctx.clusters.clusters.items():
        if key.lower() == here or cluster.device_type or not cluster.is_remote:
            continue
        try:
            env = ctx.remote_env(cluster)
        except ConfigError:
            continue
        found += [p.gpu_type for p in (env.partitions if env else []) if p.gpu_type
                  and not (cluster.partition and p.name != cluster.partition)]
    return found


def _named_remote_types(ctx: PlanningContext) -> list[str]:
    named = ctx.settings.slurm_cluster
    if not named or ctx.remote_env is None or (
            ctx.local.cluster_name and named.lower() == ctx.local.cluster_name.lower()):
        return []
    cluster = ctx.clusters.find(named)
    if cluster is None or cluster.device_type or not cluster.is_remote:
        return []
    env = ctx.remote_env(cluster)
    return [p.gpu_type for p in env.partitions if p.gpu_type] if env else []


def with_keyword_type(req: DeviceRequirement, ctx: PlanningContext) -> DeviceRequirement | str:
    """skip_device_not_contain([...]) without a device type: the first available type that
    contains a keyword; a reason string when none does."""
    if req.device_type or not req.device_keywords:
        return req
    available = available_device_types(ctx)
    if not any(k.lower() in t.lower() for t in available for k in req.device_keywords):
        available = available_device_types(ctx, discover=True)  # connects: only if needed
    for device_type in available:
        if any(k.lower() in device_type.lower() for k in req.device_keywords):
            return req.model_copy(update={"device_type": device_type})
    return (
        f"needs a device whose name contains one of {list(req.device_keywords)}; "
        f"device types available: {', '.join(available) or 'none'}; "
        "configure a cluster with such GPUs (--slurm-cluster NAME) or pass --device-type"
    )


def target_device_type(decision: RouteDecision, ctx: PlanningContext) -> str | None:
    """The GPU type of where a test was routed (for job names and the build arch)."""
    if decision.scenario is Scenario.REMOTE_SLURM and decision.cluster:
        configured = ctx.clusters.get(decision.cluster).device_type
        if configured:  # the clusters file overrides discovery
            return normalize_device_type(configured)
    env = ctx.slurm_env_of(decision)
    if env and decision.partition:
        part = env.partition(decision.partition)
        return normalize_device_type(part.gpu_type) if part else None
    if decision.scenario is Scenario.REMOTE_SLURM:
        return None
    return ctx.local.device_type


def batch_image(
    explicit: str | None, decision: RouteDecision, req: DeviceRequirement, ctx: PlanningContext,
    cluster: ClusterConfig | None,
) -> str | None:
    """The image a batch runs in. On a Slurm cluster whose table (``cluster``) has a
    container_runtime other than "none": option/marker > clusters file >
    jenkins/current_image_tags.properties (by the partition's arch); elsewhere only an
    explicit image counts."""
    if cluster is None or cluster.container_runtime == "none":
        return explicit
    arch = None
    env = ctx.slurm_env_of(decision)
    if env and decision.partition:
        part = env.partition(decision.partition)
        arch = part.arch if part else None
    device_type = req.device_type or target_device_type(decision, ctx)
    return resolve_container_image(explicit, cluster, ctx.rootdir,
                                   device_type=device_type, arch=arch)


def errored_item(item: pytest.Item, message: str) -> PlannedItem:
    """An item that cannot be planned: it errors at setup with ``message``."""
    decision = RouteDecision(scenario=None, reason=message)
    return PlannedItem(item, DeviceRequirement(source="error"), decision,
                       ItemPlan(item, None, error=message))


def plan_item(item: pytest.Item, ctx: PlanningContext) -> PlannedItem:
    """Where one item goes. Its own markers or perf-sanity id unreadable (TestSpecError):
    the item errors with the message and nothing else stops; any other ConfigError (an
    option, the clusters file, a trtllm_slurm marker value) propagates as a usage error."""
    settings = ctx.settings
    try:
        req = requirements.requirement_for_item(item, settings, ctx.perf)
    except TestSpecError as exc:
        return errored_item(item, str(exc))
    test_cfg = requirements.test_config_for_item(item)
    typed = with_keyword_type(req, ctx)
    if isinstance(typed, str):
        decision = RouteDecision(scenario=None, reason=typed)
        return PlannedItem(item, req, decision, ItemPlan(item, None, skip_reason=typed))
    req = typed
    decision, key = route_and_key(req, test_cfg, ctx)
    if key is None:
        skip = decision.reason if decision.scenario is None else None
        return PlannedItem(item, req, decision, ItemPlan(item, None, skip_reason=skip))
    return PlannedItem(item, req, decision, ItemPlan(item, key))


def route_and_key(
    req: DeviceRequirement, test_cfg: requirements.TestConfig, ctx: PlanningContext
) -> tuple[RouteDecision, BatchKey | None]:
    """Where a requirement goes and, when dispatched, the key of the batch it joins (None:
    it runs here, or nothing serves it: ``decision.reason``)."""
    settings = ctx.settings
    if test_cfg.container_image:
        settings = settings.model_copy(update={"container_image": test_cfg.container_image})
    decision = routing.route(
        req,
        settings=settings,
        local=ctx.local,
        clusters=ctx.clusters,
        slurm_env=ctx.slurm_env,
        pinned_local=bool(test_cfg.local),
        partition=test_cfg.partition,
        remote_env=ctx.remote_env,
        cluster=test_cfg.cluster,
    )
    if decision.scenario is None or not decision.dispatched:
        return decision, None
    per_node = req.resolve_per_node(decision.target_gpus_per_node)
    nodes = req.nodes(decision.target_gpus_per_node)
    table = ctx.clusters.table_of(decision.scenario, decision.cluster, ctx.local.cluster_name)
    launcher = requirements.launcher_for(test_cfg, table.launcher if table else (), nodes)
    image = batch_image(test_cfg.container_image or settings.container_image, decision, req,
                        ctx, table)
    own_mounts = tuple(test_cfg.mounts or ())
    key = BatchKey(
        scenario=decision.scenario,
        cluster=decision.cluster,
        partition=decision.partition,
        account=test_cfg.account or decision.account,
        total_devices=req.total,
        devices_per_node=per_node,
        node_count=nodes,
        device_type=req.device_type or target_device_type(decision, ctx) if req.total else None,
        container_image=image,
        # the clusters file's mounts, models root, env and time_limit are the cluster's
        # defaults: the marker's win (its mounts first), and the run's --slurm-time-limit
        # (settings) beats the file's; mounts only mean something in a container
        mounts=with_mounts(own_mounts, table.container_mounts) if table and image
        else own_mounts,
        env=tuple(sorted({**(table.job_env if table else {}), **(test_cfg.env or {})}.items())),
        # a launcher runs on every rank: one task per GPU (launch=mpi), pytest on rank 0
        launch=Launch.MPI if launcher else Launch(test_cfg.launch or "single"),
        launcher=launcher,
        time_limit=test_cfg.time_limit or (
            table.time_limit if table and not settings.time_limit else None),
        mem_mb=req.host_memory_mib or None,
    )
    return decision, key


def plan_items(items: list[pytest.Item], ctx: PlanningContext) -> list[PlannedItem]:
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
