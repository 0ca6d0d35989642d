"""Pure routing: requirement + probes -> where a test runs. ``route_item`` is the one call;
``route``'s rules, first match wins, are in docs/routing.md (rows of tests/test_routing.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.requirements import TestConfig
from pytest_trtllm_slurm.planning.resolve import normalize_device_type
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings

_HOW = "use --slurm-cluster NAME / --slurm-partition NAME to serve it"

RemoteEnv = Callable[[ClusterConfig], "SlurmEnv | None"]


class Targets(Protocol):
    """What routing reads of a run; ``remote_env`` None: the clusters file alone."""

    settings: Settings
    local: LocalEnv
    clusters: ClustersFile
    slurm_env: SlurmEnv | None

    @property
    def remote_env(self) -> RemoteEnv | None: ...  # read-only: a RemoteClusters is one


@dataclass(frozen=True)
class Route:
    """Where one test goes: its requirement (keyword resolved), its clusters-file table, and
    that target's GPU type and CPU arch."""

    requirement: DeviceRequirement
    decision: RouteDecision
    table: ClusterConfig | None = None
    device_type: str | None = None
    arch: str | None = None


def route_item(req: DeviceRequirement, cfg: TestConfig, targets: Targets) -> Route:
    """The one routing call of a test: its marker's fields (``cfg``) on top of the run's."""
    typed = _with_keyword_type(req, targets)
    if isinstance(typed, str):
        return Route(req, RouteDecision(scenario=None, reason=typed))
    settings = targets.settings
    if cfg.container_image:
        settings = settings.model_copy(update={"container_image": cfg.container_image})
    decision = route(typed, settings=settings, local=targets.local, clusters=targets.clusters,
                     slurm_env=targets.slurm_env, pinned_local=cfg.local,
                     partition=cfg.partition, remote_env=targets.remote_env,
                     cluster=cfg.cluster)
    if decision.scenario is None or not decision.dispatched:
        return Route(typed, decision)
    table = targets.clusters.table_of(decision.scenario, decision.cluster,
                                      targets.local.cluster_name)
    containerized = table is not None and table.container_runtime != "none"
    configured = (targets.clusters.get(decision.cluster).device_type
                  if decision.scenario is Scenario.REMOTE_SLURM and decision.cluster else None)
    wants_type = not typed.device_type and bool(typed.total or containerized)
    env = (_discovery_of(decision, targets)
           if containerized or (wants_type and not configured) else None)
    part = env.partition_named(decision.partition) if env else None
    device_type = typed.device_type
    if wants_type:
        if configured:  # the clusters file overrides discovery
            device_type = normalize_device_type(configured)
        elif env and decision.partition:
            device_type = normalize_device_type(part.gpu_type) if part else None
        elif decision.scenario is not Scenario.REMOTE_SLURM:
            device_type = targets.local.device_type
    return Route(typed, decision, table, device_type, part.arch if part else None)


def _discovery_of(decision: RouteDecision, targets: Targets) -> SlurmEnv | None:
    """The discovery of the Slurm cluster a test was routed to (local or remote)."""
    if decision.scenario is Scenario.LOCAL_SLURM:
        return targets.slurm_env
    if decision.scenario is Scenario.REMOTE_SLURM and decision.cluster and targets.remote_env:
        cluster = targets.clusters.get(decision.cluster)
        if cluster.partition and cluster.gpus_per_node:
            return None  # the clusters file says enough: used as given, no connection
        return targets.remote_env(cluster)
    return None


def available_device_types(targets: Targets, *, discover: bool = False) -> list[str]:
    """Device types some target offers; ``discover`` also asks remote clusters naming none."""
    found = _named_remote_types(targets)
    local = targets.local
    found += [local.device_type] if local.gpu_count and local.device_type else []
    if targets.slurm_env is not None:
        table = targets.clusters.find(local.cluster_name) if local.cluster_name else None
        found += [p.gpu_type for p in _own_partitions(targets.slurm_env, table) if p.gpu_type]
    found += [c.device_type for c in targets.clusters.clusters.values() if c.device_type]
    if discover:
        found += _discovered_remote_types(targets)
    types = [normalize_device_type(t) for t in found]
    return list(dict.fromkeys(t for t in types if t))


def _discovered_remote_types(targets: Targets) -> list[str]:
    """GPU types found on remote clusters whose table names none (unreachable: none)."""
    if targets.remote_env is None or targets.settings.slurm_cluster:
        return []  # --slurm-cluster: only that one counts (_named_remote_types)
    here = (targets.local.cluster_name or "").lower()
    found: list[str] = []
    for key, cluster in targets.clusters.clusters.items():
        if key.lower() == here or cluster.device_type or not cluster.is_remote:
            continue
        try:
            env = targets.remote_env(cluster)
        except ConfigError:
            continue
        found += [p.gpu_type for p in _own_partitions(env, cluster) if p.gpu_type]
    return found


def _named_remote_types(targets: Targets) -> list[str]:
    named, here = targets.settings.slurm_cluster, targets.local.cluster_name
    if not named or targets.remote_env is None or (here and named.lower() == here.lower()):
        return []
    cluster = targets.clusters.find(named)
    if cluster is None or cluster.device_type or not cluster.is_remote:
        return []
    env = targets.remote_env(cluster)
    return [p.gpu_type for p in env.partitions if p.gpu_type] if env else []


def _with_keyword_type(req: DeviceRequirement, targets: Targets) -> DeviceRequirement | str:
    """skip_device_not_contain: the first available type with a keyword, else a reason."""
    if req.device_type or not req.device_keywords:
        return req

    def matching(types: list[str]) -> str | None:
        return next((t for t in types for k in req.device_keywords if k.lower() in t.lower()),
                    None)

    available = available_device_types(targets)
    if matching(available) is None:
        available = available_device_types(targets, discover=True)  # connects: only if needed
    found = matching(available)
    if found is not None:
        return req.model_copy(update={"device_type": found})
    return (
        f"needs a device whose name contains one of {list(req.device_keywords)}; "
        f"device types available: {', '.join(available) or 'none'}; "
        "configure a cluster with such GPUs (--slurm-cluster NAME) or pass --device-type"
    )


def route(
    req: DeviceRequirement,
    *,
    settings: Settings,
    local: LocalEnv,
    clusters: ClustersFile,
    slurm_env: SlurmEnv | None,
    pinned_local: bool = False,
    partition: str | None = None,
    remote_env: RemoteEnv | None = None,
    cluster: str | None = None,
) -> RouteDecision:
    """Where ``req``'s test runs (docs/routing.md); a marker's ``cluster`` = --slurm-cluster."""
    router = _Router(req, settings, local, clusters, slurm_env,
                     partition or settings.partition, remote_env)
    if pinned_local:
        return RouteDecision(scenario=Scenario.LOCAL_DIRECT, dispatched=False)
    if settings.scenario != "auto":
        return router.forced(Scenario(settings.scenario))
    if req.total == 0 and settings.dispatch == "needed":
        return router.here()
    if cluster or settings.slurm_cluster:
        return router.named_cluster(cluster or settings.slurm_cluster)  # type: ignore[arg-type]
    if router.satisfied_here():
        return router.here()
    local_miss: RouteDecision | None = None
    if local.slurm_available:
        decision = router.local_slurm()
        if decision.scenario is not None or router.explicit_partition:
            return decision  # an explicit partition means this cluster, served or not
        local_miss = decision
    wanted = router.wanted
    if (wanted and not _same_type(local.device_type, wanted)
            and not router._has_type(slurm_env, router._local_cfg())):
        return router.remote_by_type()
    remote = router.remote_auto()
    return local_miss if remote.scenario is None and local_miss else remote


def _same_type(a: str | None, b: str | None) -> bool:
    return normalize_device_type(a) == normalize_device_type(b)


@dataclass
class _Router:
    """The inputs of one route() call and the rules (one method each) that read them."""

    req: DeviceRequirement
    settings: Settings
    local: LocalEnv
    clusters: ClustersFile
    slurm_env: SlurmEnv | None
    explicit_partition: str | None
    remote_env: RemoteEnv | None = None

    @property
    def wanted(self) -> str | None:
        return self.req.device_type or self.settings.device_type

    def satisfied_here(self) -> bool:
        req, local = self.req, self.local
        if req.total == 0:
            return True
        if local.gpu_count < req.total:
            return False
        if self.wanted and not _same_type(local.device_type, self.wanted):
            return False
        mem = req.device_memory_mib
        return not (mem and local.gpu_memory_mib is not None and local.gpu_memory_mib < mem)

    def here(self) -> RouteDecision:
        if self.settings.container_image and self.local.container_engine:
            return RouteDecision(scenario=Scenario.LOCAL_DOCKER, dispatched=True)
        return RouteDecision(
            scenario=Scenario.LOCAL_DIRECT, dispatched=self.settings.dispatch == "all"
        )

    def forced(self, scenario: Scenario) -> RouteDecision:
        flag = f"--trtllm-scenario={scenario.value}"
        if scenario is Scenario.LOCAL_DIRECT:
            return RouteDecision(scenario=scenario, dispatched=self.settings.dispatch == "all")
        if scenario is Scenario.LOCAL_DOCKER:
            if not self.local.container_engine:
                notes = self._notes("container")
                raise ConfigError(f"{flag}: no container engine answers here ({notes})")
            return RouteDecision(scenario=scenario, dispatched=True)
        if scenario is Scenario.LOCAL_SLURM:
            if not self.local.slurm_available:
                raise ConfigError(f"{flag}: no local Slurm ({self._notes('slurm')})")
            named = self.settings.slurm_cluster
            if named and named.lower() != (self.local.cluster_name or "").lower():
                raise ConfigError(
                    f"{flag} conflicts with --slurm-cluster {named}: the local cluster is "
                    f"{self.local.cluster_name!r}; drop one of them"
                )
            return self.local_slurm()
        if self.settings.slurm_cluster:
            return self.remote(self.settings.slurm_cluster)
        fitting = [c for c in self._remote_clusters() if self._cluster_fits(c)]
        if len(fitting) == 1:
            return self.remote(fitting[0].name)
        raise ConfigError(
            f"{flag} needs a cluster: pass --slurm-cluster NAME; "
            f"configured clusters that fit: {self._list_clusters(fitting)}"
        )

    def _notes(self, prefix: str) -> str:
        return "; ".join(n for n in self.local.notes if n.startswith(prefix)) or "nothing found"

    def named_cluster(self, name: str) -> RouteDecision:
        """This machine's own Slurm cluster name (any case) is local_slurm; others are remote."""
        if self.local.cluster_name and name.lower() == self.local.cluster_name.lower():
            if not self.local.slurm_available:
                raise ConfigError(f"--slurm-cluster {name}: names this machine's Slurm "
                                  f"cluster, but it does not answer ({self._notes('slurm')})")
            return self.local_slurm()
        return self.remote(name)

    def _local_cfg(self) -> ClusterConfig | None:
        return self.clusters.find(self.local.cluster_name or "")

    def _has_type(self, env: SlurmEnv | None, cfg: ClusterConfig | None) -> bool:
        """A partition of ``env`` (its table's, if named) has the wanted type."""
        return any(p.gpu_type and _same_type(p.gpu_type, self.wanted)
                   for p in _own_partitions(env, cfg))

    def local_slurm(self) -> RouteDecision:
        cfg = self._local_cfg()
        name = self._choose(self.slurm_env, cfg)
        part = self.slurm_env.partition_named(name) if self.slurm_env else None
        if self.slurm_env and self.slurm_env.partitions:
            if name is None:
                return self.unsatisfied("no partition of the local Slurm can")
            if part and not self._serves(part):
                return self.unsatisfied(f"partition {name!r} cannot")
        per_node = (part.gpus_per_node or None) if part else (cfg.gpus_per_node if cfg else None)
        return RouteDecision(scenario=Scenario.LOCAL_SLURM, cluster=self.local.cluster_name,
                             partition=name, target_gpus_per_node=per_node,
                             account=resolve_account(self.settings.account, cfg, self.slurm_env))

    def _type_ok(self, gpu_type: str | None) -> bool:
        return not (self.wanted and gpu_type) or _same_type(gpu_type, self.wanted)

    def _serves(self, part: PartitionInfo) -> bool:
        return partition_fits(part, self.req) and self._type_ok(part.gpu_type)

    def _choose(self, env: SlurmEnv | None, cfg: ClusterConfig | None) -> str | None:
        return select_partition(self.req, env, explicit=self.explicit_partition, cluster=cfg,
                                device_type=self.wanted)

    def _remote_clusters(self) -> list[ClusterConfig]:
        """Configured clusters other than the local one (that one is local_slurm)."""
        local = (self.local.cluster_name or "").lower()
        return [c.model_copy(update={"name": c.name or key})
                for key, c in self.clusters.clusters.items() if key.lower() != local]

    def _discovered(self, cfg: ClusterConfig) -> SlurmEnv | None:
        """Discovery of ``cfg``'s cluster with its table on top; None without partitions."""
        if self.remote_env is None:
            return None
        env = self.remote_env(cfg)
        return with_cluster_overrides(env, cfg) if env and env.partitions else None

    def _needs_discovery(self, cfg: ClusterConfig, *, partition: bool = False) -> bool:
        """The clusters file cannot tell alone (GPUs per node, wanted type, partition)."""
        if partition and not (self.explicit_partition or cfg.partition):
            return True
        return self.req.total > 0 and (
            cfg.gpus_per_node is None or bool(self.wanted and not cfg.device_type))

    def _cluster_fits(self, cfg: ClusterConfig) -> bool:
        """Per-node need within the cluster's gpus_per_node (unknown: cannot rule it out)."""
        env = self._discovered(cfg) if self._needs_discovery(cfg) else None
        if env is not None:  # a discovered partition must serve the test
            try:
                part = env.partition_named(self._choose(env, cfg))
            except ConfigError:
                return False
            return part is not None and self._serves(part)
        if not self._type_ok(cfg.device_type):
            return False
        if self.req.per_node is None or cfg.gpus_per_node is None:
            return True
        return self.req.per_node <= cfg.gpus_per_node

    def remote(self, name: str) -> RouteDecision:
        cfg = self.clusters.get(name)  # ConfigError listing the known names
        key = cfg.name or name
        named = cfg.model_copy(update={"name": key})
        env = self._discovered(named) if self._needs_discovery(named, partition=True) else None
        if env is not None:  # routed like the local Slurm, on what discovery found there
            part_name = self._choose(env, cfg)
            part = env.partition_named(part_name)
            if part is None:
                return self.unsatisfied(f"no partition of cluster {key!r} "
                                        f"({_describe_partitions(env)}) can")
            if not self._serves(part):
                return self.unsatisfied(f"partition {part_name!r} of cluster {key!r} "
                                        f"({_describe_partitions(env, part_name)}) cannot")
            return RouteDecision(scenario=Scenario.REMOTE_SLURM, cluster=key, partition=part_name,
                                 account=resolve_account(self.settings.account, cfg, env),
                                 target_gpus_per_node=part.gpus_per_node or None)
        if not self._cluster_fits(cfg):
            return self.unsatisfied(
                f"cluster {key!r} ({cfg.device_type or '?'}, "
                f"{cfg.gpus_per_node or '?'} GPUs per node) cannot"
            )
        return RouteDecision(scenario=Scenario.REMOTE_SLURM, cluster=key,
                             partition=self.explicit_partition or cfg.partition,
                             account=self.settings.account or cfg.account,
                             target_gpus_per_node=cfg.gpus_per_node)

    def _offers_type(self, cfg: ClusterConfig) -> bool:
        """The clusters file's device_type, else (with discovery) a partition's GPU type."""
        if cfg.device_type:
            return _same_type(cfg.device_type, self.wanted)
        return self._has_type(self._discovered(cfg), cfg)

    def remote_by_type(self) -> RouteDecision:
        remote = self._remote_clusters()
        typed = [c for c in remote if self._offers_type(c)]
        if not typed:
            raise ConfigError(
                f"device type {self.wanted} is not on this machine ({self._here()}), "
                f"not in the local Slurm, and no configured cluster has device_type = "
                f"{self.wanted!r}; clusters: {self._list_clusters(remote)}. Set device_type "
                "in the [clusters.NAME] table or choose one with --slurm-cluster NAME"
            )
        fitting = [c for c in typed if self._cluster_fits(c)]
        if len(fitting) == 1:
            return self.remote(fitting[0].name)
        if not fitting:
            return self.unsatisfied(f"no {self.wanted} cluster ({self._list_clusters(typed)}) can")
        raise ConfigError(
            f"several configured clusters can run {describe_requirement(self.req, self.wanted)}: "
            f"{self._list_clusters(fitting)}; choose one with --slurm-cluster NAME"
        )

    def remote_auto(self) -> RouteDecision:
        fitting = [c for c in self._remote_clusters() if self._cluster_fits(c)]
        if len(fitting) == 1:
            return self.remote(fitting[0].name)
        return self.unsatisfied(f"several configured clusters could "
                                f"({self._list_clusters(fitting)}), so none" if fitting
                                else "nothing configured can")

    def unsatisfied(self, why: str) -> RouteDecision:
        need = describe_requirement(self.req, self.wanted)
        reason = f"needs {need}; {why} serve it; available: {self._available()}; {_HOW}"
        return RouteDecision(scenario=None, reason=reason)

    def _here(self) -> str:
        loc = self.local
        kind = f" {loc.device_type}" if loc.device_type else ""
        return f"{loc.gpu_count}{kind} GPU{'s' if loc.gpu_count != 1 else ''} here"

    def _available(self) -> str:
        parts = [self._here()]
        if self.local.slurm_available and self.slurm_env:
            slurm = ", ".join(
                f"{p.name} ({p.gpus_per_node}x {p.gpu_type or 'GPU'} per node, "
                f"{len(p.nodes)} nodes)"
                for p in _own_partitions(self.slurm_env, self._local_cfg())
            )
            parts.append(f"local Slurm {self.local.cluster_name or ''}: {slurm or 'no partitions'}")
        elif not self.local.slurm_available:
            parts.append("no local Slurm")
        parts.append(f"configured clusters: {self._list_clusters(self._remote_clusters())}")
        return "; ".join(parts)

    def _list_clusters(self, cfgs: list[ClusterConfig]) -> str:
        """Each cluster with what it offers: discovered partitions, else its table."""
        return ", ".join(f"{c.name} ({self._offer(c)})" for c in cfgs) or "none"

    def _offer(self, cfg: ClusterConfig) -> str:
        table = f"{cfg.device_type or 'any type'}, {cfg.gpus_per_node or '?'} GPUs per node"
        if self.remote_env is None or (cfg.device_type and cfg.gpus_per_node):
            return table
        try:
            env = self._discovered(cfg)
        except ConfigError:  # unreachable: what its table says is all there is
            return table
        if env is None:
            return table
        own = env.model_copy(update={"partitions": _own_partitions(env, cfg)})
        return _describe_partitions(own)


def resolve_account(
    option: str | None, cluster: ClusterConfig | None, slurm_env: SlurmEnv | None
) -> str | None:
    """Account: option > cluster file > discovered default, validated; None: accounting off."""
    known = slurm_env.accounts if slurm_env else []
    chosen = option or (cluster.account if cluster else None)
    where = "--slurm-account" if option else "the clusters file"
    if chosen:
        if known and chosen not in known:
            raise ConfigError(
                f"Slurm account {chosen!r} (from {where}) is not one of yours on this cluster; "
                f"valid accounts: {', '.join(known)}"
            )
        return chosen
    if slurm_env and slurm_env.default_account:
        return slurm_env.default_account
    if known:
        raise ConfigError(
            f"no default Slurm account found; choose one of {', '.join(known)} with "
            "--slurm-account NAME (or account = ... in the clusters file)"
        )
    return None


def partition_fits(part: PartitionInfo, req: DeviceRequirement) -> bool:
    """Can one job on ``part`` give ``req`` its GPUs (per node, and enough nodes)?"""
    if req.total == 0:
        return True
    if part.gpus_per_node <= 0:
        return False
    per_node = req.resolve_per_node(part.gpus_per_node)
    if per_node > part.gpus_per_node:
        return False
    return not part.nodes or req.nodes(part.gpus_per_node) <= len(part.nodes)


def select_partition(
    req: DeviceRequirement,
    slurm_env: SlurmEnv | None,
    *,
    explicit: str | None = None,
    cluster: ClusterConfig | None = None,
    device_type: str | None = None,
) -> str | None:
    """Partition for ``req``: explicit > cluster file > GPU type match > enough GPUs > default
    (a named one is not checked to fit); None: none fits."""
    named = explicit or (cluster.partition if cluster else None)
    if named:
        if slurm_env and slurm_env.partitions and slurm_env.partition_named(named) is None:
            where = "--slurm-partition" if explicit else "the clusters file"
            raise ConfigError(
                f"Slurm partition {named!r} (from {where}) does not exist on this cluster; "
                f"valid partitions: {', '.join(p.name for p in slurm_env.partitions)}"
            )
        return named
    if slurm_env is None or not slurm_env.partitions:
        return None
    default = slurm_env.partition_named(slurm_env.default_partition)
    if req.total == 0:  # CPU-only: any partition; the site's default first
        return (default or slurm_env.partitions[0]).name
    if not any(p.gpus_per_node for p in slurm_env.partitions) and slurm_env.errors:
        # Discovery was partial and saw no GPU gres: GPUs cannot be ruled out anywhere.
        return default.name if default else None
    fitting = [p for p in slurm_env.partitions if partition_fits(p, req)]
    if device_type:
        typed = [p for p in fitting if p.gpu_type and _same_type(p.gpu_type, device_type)]
        if typed:
            return _prefer_default(typed, slurm_env).name
        # A partition whose gres names no GPU type cannot be ruled out.
        fitting = [p for p in fitting if not p.gpu_type]
    return _prefer_default(fitting, slurm_env).name if fitting else None


def _prefer_default(parts: list[PartitionInfo], slurm_env: SlurmEnv) -> PartitionInfo:
    return next((p for p in parts if p.name == slurm_env.default_partition), parts[0])


def with_cluster_overrides(env: SlurmEnv, cluster: ClusterConfig) -> SlurmEnv:
    """The table's gpus_per_node/device_type over discovery's (a gres it cannot read)."""
    update = {k: v for k, v in (("gpus_per_node", cluster.gpus_per_node),
                                ("gpu_type", cluster.device_type)) if v}
    parts = [p.model_copy(update=update) if not cluster.partition or p.name == cluster.partition
             else p for p in env.partitions]
    return env.model_copy(update={"partitions": parts})


def describe_requirement(req: DeviceRequirement, device_type: str | None = None) -> str:
    """``8 GPUs (4 per node, H200, from skip_less_device)`` for messages."""
    if req.total == 0:
        return "no GPUs"
    bits = [f"{req.per_node} per node" if req.per_node else "any per node"]
    dtype = device_type or req.device_type
    if dtype:
        bits.append(dtype)
    if req.device_memory_mib:
        bits.append(f">= {req.device_memory_mib} MiB each")
    bits.append(f"from {req.source}")
    return f"{req.total} GPU{'s' if req.total != 1 else ''} ({', '.join(bits)})"


def _own_partitions(env: SlurmEnv | None, cfg: ClusterConfig | None) -> list[PartitionInfo]:
    """The partitions a cluster serves: its table's ``partition`` alone when named."""
    parts = env.partitions if env else []
    if cfg is not None and cfg.partition:
        return [p for p in parts if p.name == cfg.partition]
    return list(parts)


def _describe_partitions(env: SlurmEnv, only: str | None = None) -> str:
    return ", ".join(
        f"{p.name}: {p.gpus_per_node}x {p.gpu_type or 'GPU'} per node, {len(p.nodes)} nodes"
        for p in env.partitions if only is None or p.name == only
    ) or "no partitions"
