"""Pure routing: one test's requirement + what the probes found -> where it runs.

Rules, first match wins (each is a row of tests/test_routing.py):

1. ``pinned_local`` (marker ``local=True``): here, in this pytest process.
2. ``--trtllm-scenario`` other than auto forces the scenario, still validated:
   local_direct runs here even if the test needs more GPUs (its own skip markers
   then decide, exactly as without the plugin); local_docker needs a container
   engine; local_slurm needs a local Slurm (and a --slurm-cluster, if given, that
   is the local one); remote_slurm needs a --slurm-cluster or exactly one
   configured cluster that fits.
3. A CPU-only test (0 GPUs) with ``--trtllm-dispatch=needed`` runs here: any
   machine serves it (even with --slurm-cluster / --device-type).
4. ``--slurm-cluster NAME``: the local cluster (ClusterName, case-insensitive) ->
   local_slurm; otherwise remote_slurm to that clusters-file entry.
5. Satisfied here (enough GPUs, right type and memory, one node) -> local_docker
   when an image is set (--trtllm-container-image / cluster file) and an engine
   answers, else local_direct (dispatched only with --trtllm-dispatch=all).
6. Local Slurm present -> local_slurm on the partition chosen by
   resolve.select_partition (explicit > cluster file > GPU type > enough GPUs >
   default), when one can serve the test (always, when a partition is explicit).
7. A wanted device type (marker or --device-type) that neither this machine nor
   the local Slurm offers -> remote_slurm auto-selected among the configured
   clusters by device_type and gpus_per_node; no cluster offering the type, or
   several that fit -> ConfigError naming the candidates and --slurm-cluster.
   Clusters offering the type but too few GPUs per node -> unsatisfied.
8. Otherwise, exactly one configured remote cluster that fits -> remote_slurm;
   else unsatisfied: scenario None with a reason naming what exists and how to
   choose (the plugin skips the test, or fails it with --trtllm-unsatisfied=fail).

Each test is routed on its own, so one run may send tests to the local Slurm and to
several remote clusters (the run then has one executor per cluster, all at work at
once: execution.factory). A clusters-file ``partition`` is what that cluster offers: the
type and size checks and the messages see that partition only, so two tables may stand
for two parts of one Slurm (the dev cluster's batch and gb200 in tests/test_multi_cluster).

A remote cluster is sized like the local one: ``remote_env(cluster)`` (when given) returns
what discovery over SSH found there (partitions, GPUs per node and type), with the
clusters-file keys (partition, gpus_per_node, device_type, account) overriding it; the
partition is then chosen by resolve.select_partition as for the local Slurm. It is asked
only when the clusters file cannot tell alone (no partition, or a GPU test and no
gpus_per_node, or a wanted type and no device_type); otherwise, and without discovery,
the clusters-file keys alone decide.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.resolve import (
    describe_requirement,
    device_type_matches,
    normalize_device_type,
    partition_fits,
    resolve_account,
    select_partition,
    with_cluster_overrides,
)
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings

_HOW = "use --slurm-cluster NAME / --slurm-partition NAME to serve it"

RemoteEnv = Callable[[ClusterConfig], "SlurmEnv | None"]


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
) -> RouteDecision:
    """Where ``req``'s test runs (see the module docstring for the rules, in order)."""
    ctx = _Ctx(req, settings, local, clusters, slurm_env, partition or settings.partition,
               remote_env)
    if pinned_local:
        return RouteDecision(scenario=Scenario.LOCAL_DIRECT, dispatched=False)
    if settings.scenario != "auto":
        return ctx.forced(Scenario(settings.scenario))
    if req.total == 0 and settings.dispatch == "needed":
        return ctx.here()
    if settings.slurm_cluster:
        return ctx.named_cluster(settings.slurm_cluster)
    if ctx.satisfied_here():
        return ctx.here()
    local_miss: RouteDecision | None = None
    if local.slurm_available:
        decision = ctx.local_slurm()
        if decision.scenario is not None or ctx.partition:
            return decision  # an explicit partition means this cluster, served or not
        local_miss = decision
    if ctx.wanted and not _same_type(local.device_type, ctx.wanted) and not ctx.local_offers_type():
        return ctx.remote_by_type()
    remote = ctx.remote_auto()
    return local_miss if remote.scenario is None and local_miss else remote


def _same_type(a: str | None, b: str | None) -> bool:
    return normalize_device_type(a) == normalize_device_type(b)


class _Ctx:
    """The inputs of one route() call and the rule helpers that read them."""

    def __init__(
        self,
        req: DeviceRequirement,
        settings: Settings,
        local: LocalEnv,
        clusters: ClustersFile,
        slurm_env: SlurmEnv | None,
        partition: str | None,
        remote_env: RemoteEnv | None = None,
    ) -> None:
        self.req = req
        self.remote_env = remote_env
        self.settings = settings
        self.local = local
        self.clusters = clusters
        self.slurm_env = slurm_env
        self.partition = partition
        self.wanted = req.device_type or settings.device_type

    # ------------------------------------------------------------------ here

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

    # ------------------------------------------------------------------ forced

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
        notes = [n for n in self.local.notes if n.startswith(prefix)]
        return "; ".join(notes) if notes else "nothing found"

    # ------------------------------------------------------------------ slurm

    def named_cluster(self, name: str) -> RouteDecision:
        """Seed rule: this machine's own Slurm cluster name (any case) is local_slurm, with or
        without a clusters file; any other name is a remote cluster of the clusters file."""
        if self.local.cluster_name and name.lower() == self.local.cluster_name.lower():
            if not self.local.slurm_available:
                raise ConfigError(f"--slurm-cluster {name}: names this machine's Slurm "
                                  f"cluster, but it does not answer ({self._notes('slurm')})")
            return self.local_slurm()
        return self.remote(name)

    def _local_cfg(self) -> ClusterConfig | None:
        name = (self.local.cluster_name or "").lower()
        return next((c for k, c in self.clusters.clusters.items() if k.lower() == name), None)

    def local_offers_type(self) -> bool:
        """A partition of the local Slurm has the wanted type (only the clusters file's
        partition, when the local cluster's table names one)."""
        parts = _own_partitions(self.slurm_env, self._local_cfg()) if self.slurm_env else []
        return any(p.gpu_type and device_type_matches(p, self.wanted) for p in parts)

    def local_slurm(self) -> RouteDecision:
        cfg = self._local_cfg()
        name = select_partition(
            self.req, self.slurm_env, explicit=self.partition, cluster=cfg, device_type=self.wanted
        )
        part = self.slurm_env.partition(name) if (self.slurm_env and name) else None
        if self.slurm_env and self.slurm_env.partitions:
            if name is None:
                return self.unsatisfied("no partition of the local Slurm can")
            if part and not (partition_fits(part, self.req) and self._type_ok(part.gpu_type)):
                return self.unsatisfied(f"partition {name!r} cannot")
        return RouteDecision(
            scenario=Scenario.LOCAL_SLURM,
            cluster=self.local.cluster_name,
            partition=name,
            account=resolve_account(self.settings.account, cfg, self.slurm_env),
            target_gpus_per_node=(part.gpus_per_node or None)
            if part
            else (cfg.gpus_per_node if cfg else None),
        )

    def _type_ok(self, gpu_type: str | None) -> bool:
        return not (self.wanted and gpu_type) or _same_type(gpu_type, self.wanted)

    # ------------------------------------------------------------------ remote

    def _remote_clusters(self) -> list[ClusterConfig]:
        """Configured clusters other than the local one (that one is local_slurm)."""
        local = (self.local.cluster_name or "").lower()
        return [
            c.model_copy(update={"name": c.name or key})
            for key, c in self.clusters.clusters.items()
            if key.lower() != local
        ]

    def _discovered(self, cfg: ClusterConfig) -> SlurmEnv | None:
        """What discovery found on ``cfg``'s cluster, clusters-file keys applied; None when
        there is no discovery (or it found no partitions)."""
        if self.remote_env is None:
            return None
        env = self.remote_env(cfg)
        return with_cluster_overrides(env, cfg) if env and env.partitions else None

    def _needs_discovery(self, cfg: ClusterConfig, *, partition: bool = False) -> bool:
        """Only when the clusters file cannot tell alone: GPUs per node (or the type, when
        one is wanted) for a GPU test, and with ``partition`` the partition to use."""
        if partition and not (self.partition or cfg.partition):
            return True
        return self.req.total > 0 and (
            cfg.gpus_per_node is None or bool(self.wanted and not cfg.device_type))

    def _cluster_fits(self, cfg: ClusterConfig) -> bool:
        """Per-node need within the cluster's gpus_per_node (unknown: cannot rule it out)."""
        env = self._discovered(cfg) if self._needs_discovery(cfg) else None
        if env is not None:
            return self._remote_partition(cfg, env) is not None
        if not self._type_ok(cfg.device_type):
            return False
        if self.req.per_node is None or cfg.gpus_per_node is None:
            return True
        return self.req.per_node <= cfg.gpus_per_node

    def _remote_partition(self, cfg: ClusterConfig, env: SlurmEnv) -> str | None:
        """The discovered partition that serves the test (None: none can)."""
        try:
            name = select_partition(self.req, env, explicit=self.partition, cluster=cfg,
                                    device_type=self.wanted)
        except ConfigError:
            return None
        part = env.partition(name) if name else None
        if part is None or not (partition_fits(part, self.req) and self._type_ok(part.gpu_type)):
            return None
        return name

    def remote(self, name: str) -> RouteDecision:
        cfg = self.clusters.get(name)  # ConfigError listing the known names
        key = cfg.name or name
        named = cfg.model_copy(update={"name": key})
        env = self._discovered(named) if self._needs_discovery(named, partition=True) else None
        if env is not None:
            return self._remote_sized(key, cfg, env)
        if not self._cluster_fits(cfg):
            return self.unsatisfied(
                f"cluster {key!r} ({cfg.device_type or '?'}, "
                f"{cfg.gpus_per_node or '?'} GPUs per node) cannot"
            )
        return RouteDecision(
            scenario=Scenario.REMOTE_SLURM,
            cluster=key,
            partition=self.partition or cfg.partition,
            account=self.settings.account or cfg.account,
            target_gpus_per_node=cfg.gpus_per_node,
        )

    def _remote_sized(self, key: str, cfg: ClusterConfig, env: SlurmEnv) -> RouteDecision:
        """A remote cluster routed like the local Slurm, on what discovery found there."""
        name = select_partition(self.req, env, explicit=self.partition, cluster=cfg,
                                device_type=self.wanted)
        part = env.partition(name) if name else None
        if part is None:
            return self.unsatisfied(f"no partition of cluster {key!r} "
                                    f"({_describe_partitions(env)}) can")
        if not (partition_fits(part, self.req) and self._type_ok(part.gpu_type)):
            return self.unsatisfied(f"partition {name!r} of cluster {key!r} "
                                    f"({_describe_partitions(env, name)}) cannot")
        return RouteDecision(
            scenario=Scenario.REMOTE_SLURM,
            cluster=key,
            partition=name,
            account=resolve_account(self.settings.account, cfg, env),
            target_gpus_per_node=part.gpus_per_node or None,
        )

    def _offers_type(self, cfg: ClusterConfig) -> bool:
        """The clusters file's device_type, else (with discovery) a partition's GPU type."""
        if cfg.device_type:
            return _same_type(cfg.device_type, self.wanted)
        env = self._discovered(cfg)
        return env is not None and any(p.gpu_type and device_type_matches(p, self.wanted)
                                       for p in _own_partitions(env, cfg))

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
        if fitting:
            return self.unsatisfied(
                f"several configured clusters could ({self._list_clusters(fitting)}), so none"
            )
        return self.unsatisfied("nothing configured can")

    # ------------------------------------------------------------------ messages

    def unsatisfied(self, why: str) -> RouteDecision:
        need = describe_requirement(self.req, self.wanted)
        return RouteDecision(
            scenario=None,
            reason=f"needs {need}; {why} serve it; available: {self._available()}; {_HOW}",
        )

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
        """Each cluster with what it offers: its discovered partitions (the clusters
        file's one only, when it names one) when discovery is at hand, else its table."""
        if not cfgs:
            return "none"
        return ", ".join(f"{c.name} ({self._offer(c)})" for c in cfgs)

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


def _own_partitions(env: SlurmEnv | None, cfg: ClusterConfig | None) -> list[PartitionInfo]:
    """The partitions a cluster serves: the clusters file's ``partition`` alone when its
    table names one (two tables may stand for two parts of one cluster), else all."""
    parts = env.partitions if env else []
    if cfg is not None and cfg.partition:
        return [p for p in parts if p.name == cfg.partition]
    return list(parts)


def _describe_partitions(env: SlurmEnv, only: str | None = None) -> str:
    return ", ".join(
        f"{p.name}: {p.gpus_per_node}x {p.gpu_type or 'GPU'} per node, {len(p.nodes)} nodes"
        for p in env.partitions if only is None or p.name == only
    ) or "no partitions"
