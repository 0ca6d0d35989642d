"""What a run finds once: settings, this machine's probe, Slurm discovery, clusters file.

Only built when dispatch or a plan was asked for; cached on the pytest config.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import pytest_trtllm_slurm.controller.options as options
from pytest_trtllm_slurm.controller.item_plans import PlanningContext
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.requirements import PerfSources
from pytest_trtllm_slurm.planning.safe_values import line_problem
from pytest_trtllm_slurm.planning.settings import (
    ClusterConfig,
    ClustersFile,
    Settings,
    load_clusters_file,
)

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
    from pytest_trtllm_slurm.execution.slurm.tracking import WalltimePolicy

# what the executor builders read of a batch: a BatchKey (plugin) or a JobSpec (trtllm-slurm run)
Shape = BatchKey | JobSpec

_CONTEXT_KEY = pytest.StashKey[PlanningContext]()


def check_rootdir(rootdir: Path) -> None:
    """The rootdir is every job's working directory (``#SBATCH --chdir``, ``cd``) and holds
    its work dirs: a line break in it cannot be rendered into a job script."""
    problem = line_problem(str(rootdir))
    if problem:
        raise ConfigError(f"the pytest rootdir {str(rootdir)!r} {problem}; dispatched jobs "
                          "run there and their scripts cannot name it: run from a checkout "
                          "whose path has no line breaks or control characters")


def planning_context(config: pytest.Config) -> PlanningContext:
    """Probe this machine and the local Slurm, load the clusters file: once per run."""
    cached = config.stash.get(_CONTEXT_KEY, None)
    if cached is not None:
        return cached
    from pytest_trtllm_slurm.execution.probe import probe_local_env

    try:
        settings = options.resolve_settings(config)
        check_rootdir(Path(config.rootpath))
        clusters = options.clusters_file(config)
        if not clusters.clusters and not settings.config_path:
            clusters = load_clusters_file(None, config.rootpath)  # the default locations
        local = probe_local_env(engines=bool(settings.container_image)
                                or settings.scenario == Scenario.LOCAL_DOCKER)
        slurm_env = None
        if local.slurm_available:
            from pytest_trtllm_slurm.execution.slurm.client import SlurmClient
            from pytest_trtllm_slurm.execution.slurm.discovery_cache import (
                cache_key,
                cached_discovery,
            )
            from pytest_trtllm_slurm.transport.shell import LocalShell

            slurm_env = cached_discovery(
                Path(config.rootpath) / "work_dirs" / ".cache" / "slurm_env.json",
                cache_key(local.cluster_name), SlurmClient(LocalShell()).discover)
        _check_named_cluster(settings.slurm_cluster, clusters, local.cluster_name)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    ctx = PlanningContext(
        settings=settings,
        local=local,
        clusters=clusters,
        slurm_env=slurm_env,
        perf=PerfSources.from_settings(settings, Path(config.rootpath)),
        rootdir=Path(config.rootpath),
        remote_env=remote_clusters(config) if clusters.clusters else None,
    )
    config.stash[_CONTEXT_KEY] = ctx
    return ctx


def _check_named_cluster(name: str | None, clusters: ClustersFile, here: str | None) -> None:
    """--slurm-cluster NAME is this machine's Slurm cluster (any case; no clusters file
    needed) or a cluster of the clusters file: say so before anything runs, even when no
    test would be routed by it."""
    if not name or clusters.find(name) is not None:
        return
    if here and name.lower() == here.lower():
        return
    where = f"this machine's Slurm cluster is {here!r}" if here else "this machine has no Slurm"
    raise ConfigError(f"{clusters.unknown_message(name)} ({where})")


def remote_clusters(config: pytest.Config) -> RemoteClusters:
    """The run's connections to remote clusters and their discoveries (cached on disk
    under work_dirs/.cache, like the local one); closed when the run ends."""
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

    remotes = RemoteClusters(Path(config.rootpath) / "work_dirs" / ".cache")
    config.add_cleanup(remotes.close)
    return remotes


def _remotes_of(ctx: PlanningContext) -> RemoteClusters:
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

    found = ctx.remote_env
    return found if isinstance(found, RemoteClusters) else RemoteClusters(None)


def make_executors(
    ctx: PlanningContext, config: pytest.Config, keys: Sequence[BatchKey]
) -> dict[Scenario, Executor]:
    """One executor per scenario this run uses, built from the batches' keys."""
    from pytest_trtllm_slurm.execution.local.direct import DirectExecutor

    executors: dict[Scenario, Executor] = {
        Scenario.LOCAL_DIRECT: DirectExecutor(gpu_ids=list(range(ctx.local.gpu_count)))
    }
    warn = terminal_warning(config)
    docker_keys = [k for k in keys if k.scenario is Scenario.LOCAL_DOCKER]
    if docker_keys:
        executors[Scenario.LOCAL_DOCKER] = local_docker_executor(ctx, docker_keys)
    slurm_keys = [k for k in keys if k.scenario is Scenario.LOCAL_SLURM]
    if slurm_keys:
        executors[Scenario.LOCAL_SLURM] = local_slurm_executor(ctx, slurm_keys, warn=warn)
    remote_keys = [k for k in keys if k.scenario is Scenario.REMOTE_SLURM]
    if remote_keys:
        executors[Scenario.REMOTE_SLURM] = remote_slurm_executor(ctx, remote_keys, warn=warn)
    return executors


def local_docker_executor(ctx: PlanningContext, keys: Sequence[Shape]) -> Executor:
    """docker or podman, whichever answered the probe (or the forced one); every image
    must already be in the engine's store: a missing one is an error before anything runs."""
    from pytest_trtllm_slurm.execution.local.docker import ContainerExecutor

    forced = ctx.settings.container_engine
    executor = ContainerExecutor.from_local_env(
        ctx.local, engine=None if forced == "auto" else forced,
        gpu_ids=list(range(ctx.local.gpu_count)),
    )
    for image in sorted({k.container_image for k in keys if k.container_image}):
        executor.check_image(image)
    if any(not k.container_image for k in keys):
        raise ConfigError("local_docker needs a container image: pass "
                          "--trtllm-container-image IMAGE or trtllm_slurm(container_image=...)")
    return executor


def remote_slurm_executor(
    ctx: PlanningContext, keys: Sequence[Shape], *, warn: Callable[[str], None]
) -> Executor:
    """Connect, check, sync the code, discover the cluster's Slurm, then the same
    SlurmExecutor as for a local cluster, over the SSH shell, with paths mapped."""
    from pytest_trtllm_slurm.execution.remote.executor import PathMap, RemoteSlurmExecutor
    from pytest_trtllm_slurm.execution.remote.workspace import preflight, remote_paths, sync_cluster
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor

    names = sorted({k.cluster or "" for k in keys})
    if len(names) != 1 or not names[0]:
        raise ConfigError(
            f"one remote cluster per run, found {names}; pick one with --slurm-cluster NAME"
        )
    cluster = ctx.clusters.get(names[0])
    settings = ctx.settings
    remotes = _remotes_of(ctx)
    shell = remotes.shell(cluster)  # the connection planning's discovery made, if any
    if hasattr(shell, "notify"):
        shell.notify = warn  # a reconnect after a drop is said, not silent
    preflight(shell, cluster)
    rootdir = ctx.rootdir
    sync_cluster(cluster, rootdir, shell, name=f"pytest_{rootdir.name}", say=warn)
    slurm_env = remotes.env(cluster)
    paths = remote_paths(cluster, rootdir)
    local_work_root = Path(settings.work_dir) if settings.work_dir else rootdir / "work_dirs"
    remote_root = paths.remote_work_root.rsplit("/work_dirs", 1)[0]
    path_map = PathMap(
        {str(rootdir): remote_root, str(local_work_root): paths.remote_work_root},
        python=cluster.python,
    )
    manager = None
    if settings.persistent:
        request = AllocationRequest.covering(
            list(keys), slurm_env, time_limit=settings.alloc_time_limit,
            nodes=settings.alloc_nodes,
        )
        manager = AllocationManager(
            shell,
            # the state of a remote allocation is kept here, one file per cluster
            rootdir=remote_state_root(rootdir, cluster.name),
            request=with_containers(request, cluster, remote_root),
            user=slurm_env.user,
            warn=warn,
            agents_dir=f"{paths.remote_work_root}/.agents",
        )
    from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry

    inner = SlurmExecutor(
        shell,
        slurm_env=slurm_env,
        persistent=settings.persistent,
        allocation_manager=manager,
        warn=warn,
        runs=manager.runs if manager else RunRegistry(
            remote_state_root(rootdir, cluster.name) / "work_dirs" / ".runs"),
        container_runtime=cluster.container_runtime,
        walltime=walltime_policy(settings),
        warm_workers=settings.warm_workers,
    )
    return RemoteSlurmExecutor(inner, path_map, interpreter=sys.executable)


def local_slurm_executor(
    ctx: PlanningContext, keys: Sequence[Shape], *, warn: Callable[[str], None]
) -> Executor:
    """SlurmExecutor over the local shell; persistent (an allocation sized for ``keys``)
    unless --trtllm-one-shot."""
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationRequest
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor
    from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
    from pytest_trtllm_slurm.transport.shell import LocalShell

    shell = LocalShell()
    jobs = SlurmJobs(shell)
    settings = ctx.settings
    manager = None
    if settings.persistent:
        request = AllocationRequest.covering(
            list(keys), ctx.slurm_env, time_limit=settings.alloc_time_limit,
            nodes=settings.alloc_nodes,
        )
        manager = allocation_manager(ctx, request, warn=warn)
    local_cfg = local_cluster_config(ctx)
    runtime = local_cfg.container_runtime if local_cfg else "none"
    run_flags = None
    if runtime in ("docker", "podman"):
        from pytest_trtllm_slurm.execution.local.docker import default_run_flags

        # the nodes are this machine's kind: the resource flags it can grant
        run_flags = default_run_flags("podman" if runtime == "podman" else "docker")
    from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry

    return SlurmExecutor(
        shell,
        slurm_env=ctx.slurm_env,
        persistent=settings.persistent,
        allocation_manager=manager,
        runs=manager.runs if manager else RunRegistry(ctx.rootdir / "work_dirs" / ".runs"),
        jobs=jobs,
        warn=warn,
        container_runtime=runtime,
        container_run_flags=run_flags,
        walltime=walltime_policy(settings),
        warm_workers=settings.warm_workers,
    )


def remote_state_root(rootdir: Path, cluster: str) -> Path:
    """Where a remote cluster's allocation state is kept here (one folder per cluster;
    its ``work_dirs/.slurm_alloc.json``)."""
    return rootdir / "work_dirs" / f".remote-{cluster}"


def local_cluster_config(ctx: PlanningContext) -> ClusterConfig | None:
    """The clusters-file table of the local Slurm cluster (same name as its ClusterName)."""
    name = (ctx.local.cluster_name or "").lower()
    return next((c for k, c in ctx.clusters.clusters.items() if k.lower() == name), None)


def allocation_manager(
    ctx: PlanningContext,
    request: AllocationRequest | None = None,
    *,
    warn: Callable[[str], None],
) -> AllocationManager:
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
    from pytest_trtllm_slurm.transport.shell import LocalShell

    cluster = local_cluster_config(ctx)
    request = request or AllocationRequest()
    return AllocationManager(
        LocalShell(),
        rootdir=ctx.rootdir,
        request=with_containers(request, cluster, str(ctx.rootdir)) if cluster else request,
        user=ctx.slurm_env.user if ctx.slurm_env else None,
        warn=warn,
        agents_dir=str(Path(ctx.settings.work_dir or ctx.rootdir / "work_dirs") / ".agents"),
    )


def with_containers(
    request: AllocationRequest, cluster: ClusterConfig, repo: str
) -> AllocationRequest:
    """The request plus the cluster's container settings: with pyxis the allocation sets
    up the run's images (import, mount warm-up, ``container_install_command`` in ``repo``)."""
    from dataclasses import replace

    from pytest_trtllm_slurm.execution.slurm.alloc_containers import setup_mounts

    if cluster.container_runtime != "pyxis":
        return request
    try:
        mounts = setup_mounts(repo, cluster.mounts, cluster.models_root)
    except ValueError as exc:
        raise ConfigError(f"cluster {cluster.name}: {exc}") from None
    return replace(request, container_runtime="pyxis", container_mounts=mounts,
                   install_command=cluster.container_install_command, install_workdir=repo)


def terminal_warning(config: pytest.Config) -> Callable[[str], None]:
    """Warnings of the execution layer, shown on the terminal as they happen."""

    def warn(message: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"trtllm-slurm: {message}", yellow=True)
        else:
            print(f"trtllm-slurm: {message}", file=sys.stderr)

    return warn


def build_targets(ctx: PlanningContext, keys: Sequence[Shape]) -> dict[Scenario, ClusterConfig]:
    """Slurm targets of this run whose cluster table says build_project = true."""
    targets: dict[Scenario, ClusterConfig] = {}
    for key in keys:
        if key.scenario is Scenario.REMOTE_SLURM and key.cluster:
            cluster: ClusterConfig | None = ctx.clusters.get(key.cluster)
        elif key.scenario is Scenario.LOCAL_SLURM:
            cluster = local_cluster_config(ctx)
        else:
            continue
        if cluster is not None and cluster.build_project:
            targets[key.scenario] = cluster
    return targets


def walltime_policy(settings: Settings) -> WalltimePolicy | None:
    """--trtllm-negotiate-walltime: opt-in shortening of long-pending one-shot jobs."""
    from pytest_trtllm_slurm.execution.slurm.tracking import WalltimePolicy

    return WalltimePolicy() if settings.negotiate_walltime else None
