"""The one place executors are built, for the plugin and ``trtllm-slurm run``: one per target."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.concurrent import side_by_side
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.execution.folder_watch import FolderWatch
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.node import paths
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.models import Scenario, Target, target_of
from pytest_trtllm_slurm.planning.packing import Capacity
from pytest_trtllm_slurm.planning.settings import ClusterConfig, Settings
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmSettings

# what the builders read of a batch: a BatchKey (plugin) or a JobSpec (trtllm-slurm run)
BatchLike = BatchKey | JobSpec
Warn = Callable[[str], None]


def build_executors(ctx: RunContext, keys: Sequence[BatchLike], *,
                    warn: Warn) -> dict[Target, Executor]:
    """One executor per target the ``keys`` use, plus the local subprocess one."""
    executors: dict[Target, Executor] = {
        Scenario.LOCAL_DIRECT: build_executor(Scenario.LOCAL_DIRECT, ctx, [], warn=warn)}
    for scenario in (Scenario.LOCAL_DOCKER, Scenario.LOCAL_SLURM):
        mine = [k for k in keys if k.scenario is scenario]
        if mine:
            executors[scenario] = build_executor(scenario, ctx, mine, warn=warn)
    by_cluster: dict[Target, list[BatchLike]] = {}
    for key in keys:
        if key.scenario is Scenario.REMOTE_SLURM:
            by_cluster.setdefault(target_of(key), []).append(key)
    # one cluster that cannot be set up stops the run; of several, only its own tests fail
    several = len(by_cluster) + (Scenario.LOCAL_SLURM in executors) > 1
    build = partial(_one_of_several, warn=warn) if several else lambda target, make: make()
    built = side_by_side({target: partial(build, target, partial(
        remote_slurm_executor, ctx, mine, warn=warn)) for target, mine in by_cluster.items()})
    executors.update(built)
    return with_cluster_ids(executors, ctx)


def _one_of_several(target: Target, make: Callable[[], Executor], *, warn: Warn) -> Executor:
    """The cluster's executor, else one that fails its batches with the reason."""
    name = target[1] if isinstance(target, tuple) else target.value
    try:
        return make()
    except (ConfigError, ExecutionError, OSError) as exc:
        warn(f"cluster {name!r} could not be set up ({exc}); its tests fail, the other "
             "clusters run")
        return UnreachableCluster(name, str(exc))


def with_cluster_ids(executors: dict[Target, Executor],
                     ctx: RunContext) -> dict[Target, Executor]:
    """With several Slurm clusters, each one's job ids prefixed with its name."""
    names = {target: target[1] if isinstance(target, tuple) else ctx.local.cluster_name or "local"
             for target in executors
             if isinstance(target, tuple) or target is Scenario.LOCAL_SLURM}
    if len(names) < 2:
        return executors
    return {target: ClusterJobIds(executor, names[target]) if target in names else executor
            for target, executor in executors.items()}


def build_executor(scenario: Scenario, ctx: RunContext, keys: Sequence[BatchLike], *,
                   warn: Warn) -> Executor:
    """The executor of ``scenario``, sized and checked for the batches ``keys``."""
    if scenario is Scenario.LOCAL_DIRECT:
        from pytest_trtllm_slurm.execution.local.direct import DirectExecutor

        return DirectExecutor(gpu_ids=list(range(ctx.local.gpu_count)), session=ctx.local_session)
    if scenario is Scenario.LOCAL_DOCKER:
        return local_docker_executor(ctx, keys)
    if scenario is Scenario.LOCAL_SLURM:
        return local_slurm_executor(ctx, keys, warn=warn)
    return remote_slurm_executor(ctx, keys, warn=warn)


def local_docker_executor(ctx: RunContext, keys: Sequence[BatchLike]) -> Executor:
    """docker or podman (probed or forced); a missing image is an error before any run."""
    from pytest_trtllm_slurm.execution.local.docker import ContainerExecutor

    forced = ctx.settings.container_engine
    executor = ContainerExecutor.from_local_env(ctx.local,
                                                engine=None if forced == "auto" else forced)
    for image in sorted({k.container_image for k in keys if k.container_image}):
        executor.check_image(image)
    if any(not k.container_image for k in keys):
        raise ConfigError("local_docker needs a container image: pass "
                          "--trtllm-container-image IMAGE or trtllm_slurm(container_image=...)")
    return executor


def remotes_of(ctx: RunContext) -> RemoteClusters:
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

    return ctx.remote_env if ctx.remote_env is not None else RemoteClusters(None)


def remote_slurm_executor(ctx: RunContext, keys: Sequence[BatchLike], *,
                          warn: Warn) -> Executor:
    """Connect, check, sync, then a SlurmExecutor over the SSH shell with paths mapped."""
    from pytest_trtllm_slurm.execution.remote import early_start
    from pytest_trtllm_slurm.execution.remote.executor import RemoteSlurmExecutor
    from pytest_trtllm_slurm.execution.remote.workspace import preflight, sync_cluster
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager
    from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
    from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
    from pytest_trtllm_slurm.execution.work_root import ensure_work_root

    names = sorted({k.cluster or "" for k in keys})
    if len(names) != 1 or not names[0]:  # build_executors groups the keys by cluster
        raise ConfigError(f"one remote executor serves one cluster, found {names}")
    cluster = ctx.clusters.get(names[0])
    settings = ctx.settings
    remotes = remotes_of(ctx)
    shell = remotes.shell(cluster)  # the connection planning's discovery made, if any
    if hasattr(shell, "notify"):
        shell.notify = warn  # a reconnect after a drop is said, not silent
    # what the early connection did already (preflight, sync, sessions); the snapshot that
    # proves the code unchanged since is taken while its last round trips run
    with ThreadPoolExecutor(1, thread_name_prefix="code-key") as pool:
        key = (pool.submit(early_start.code_key, cluster, ctx.rootdir)
               if remotes.early.pending(cluster) and cluster.sync != "none" else None)
        early = remotes.early.done(cluster)
        if not isinstance(early, early_start.EarlyRemote) or early.runs.shell is not shell:
            early = None
        current = (early is not None and early.synced
                   and early_start.still_current(early, cluster, ctx.rootdir, key))
    if early is None or not early.checked:
        preflight(shell, cluster)
    rootdir = ctx.rootdir
    local_work_root = paths.work_root(settings.work_dir, rootdir).dir
    remote, state_dir, path_map = early_start.layout(cluster, rootdir, local_work_root)
    # the allocation's state and the run registry live on the cluster (shared by all runners)
    runs = (early.runs if early is not None
            else RunRegistry(shell, paths.StateDir(state_dir).runs.dir))
    ensure_work_root(paths.work_root(None, rootdir).dir)  # this checkout ran (`alloc status`)
    local_state = paths.work_root(None, rootdir).remote_dir(cluster.name)  # the salloc log
    local_state.mkdir(exist_ok=True)
    if early is not None and current:
        for note in early.notes:  # what that sync had to say
            warn(note)
    else:
        if early is not None:  # the code changed since: its sessions imported older code
            early_start.stop_sessions(shell, early)
        sync_cluster(cluster, rootdir, shell, name=f"pytest_{rootdir.name}", say=warn,
                     runs=runs)
    slurm_env = remotes.env(cluster)
    remote_root = paths.root_of(remote.remote_work_root)
    manager = None
    if settings.persistent:
        manager = AllocationManager(
            shell, rootdir=local_state, store=StateStore(shell, state_dir, paths.STATE_NAME),
            runs=runs, user=slurm_env.user, warn=warn, early=ctx.early_sessions,
            request=with_containers(covering(keys, slurm_env, settings), cluster, remote_root),
            agents_dir=paths.WorkRoot(remote.remote_work_root).agents)
    return RemoteSlurmExecutor(
        shell, slurm_settings(settings, slurm_env, cluster.container_runtime),
        paths=path_map, interpreter=sys.executable, allocation_manager=manager, warn=warn,
        runs=runs,
        before_close=None if early is None else lambda: early_start.stop_sessions(shell, early))


def local_slurm_executor(ctx: RunContext, keys: Sequence[BatchLike], *,
                         warn: Warn) -> Executor:
    """SlurmExecutor over the local shell; persistent unless --trtllm-one-shot."""
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor
    from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
    from pytest_trtllm_slurm.execution.slurm.runs import local_registry

    shell = LocalShell()
    settings = ctx.settings
    manager = (allocation_manager(ctx, covering(keys, ctx.slurm_env, settings), warn=warn)
               if settings.persistent else None)
    local_cfg = local_cluster_config(ctx)
    runtime = local_cfg.container_runtime if local_cfg else "none"
    run_flags: tuple[str, ...] | None = None
    if runtime in ("docker", "podman"):
        from pytest_trtllm_slurm.execution.local.docker import default_run_flags

        # the nodes are this machine's kind: the resource flags it can grant
        run_flags = tuple(default_run_flags("podman" if runtime == "podman" else "docker"))
    return SlurmExecutor(
        shell,
        slurm_settings(settings, ctx.slurm_env, runtime, container_run_flags=run_flags),
        allocation_manager=manager,
        runs=(manager.runs if manager
              else local_registry(shell, paths.work_root(None, ctx.rootdir).dir)),
        jobs=SlurmJobs(shell),
        warn=warn,
    )


def local_cluster_config(ctx: RunContext) -> ClusterConfig | None:
    """The clusters-file table of the local Slurm cluster (same name as its ClusterName)."""
    name = (ctx.local.cluster_name or "").lower()
    return next((c for k, c in ctx.clusters.clusters.items() if k.lower() == name), None)


def allocation_manager(ctx: RunContext, request: AllocationRequest | None = None, *,
                       warn: Warn) -> AllocationManager:
    """The local Slurm's persistent allocation (state under the rootdir's work_dirs)."""
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest

    cluster = local_cluster_config(ctx)
    request = request or AllocationRequest()
    return AllocationManager(
        LocalShell(),
        rootdir=ctx.rootdir,
        request=with_containers(request, cluster, str(ctx.rootdir)) if cluster else request,
        user=ctx.slurm_env.user if ctx.slurm_env else None,
        warn=warn,
        agents_dir=str(paths.work_root(ctx.settings.work_dir, ctx.rootdir).agents),
        early=ctx.early_sessions,
    )


def with_containers(request: AllocationRequest, cluster: ClusterConfig,
                    repo: str) -> AllocationRequest:
    """The request plus the cluster's container settings (pyxis images)."""
    from pytest_trtllm_slurm.execution.slurm.alloc_containers import setup_mounts

    if cluster.container_runtime != "pyxis":
        return request
    try:
        mounts = setup_mounts(repo, cluster.mounts, cluster.models_root)
    except ValueError as exc:
        raise ConfigError(f"cluster {cluster.name}: {exc}") from None
    return replace(request, container_runtime="pyxis", container_mounts=mounts,
                   install_command=cluster.container_install_command, install_workdir=repo)


def build_targets(ctx: RunContext,
                  keys: Sequence[BatchLike]) -> dict[Target, ClusterConfig]:
    """Slurm targets of this run whose cluster table says build_project = true."""
    targets: dict[Target, ClusterConfig] = {}
    for key in keys:
        if key.scenario is Scenario.REMOTE_SLURM and key.cluster:
            cluster: ClusterConfig | None = ctx.clusters.get(key.cluster)
        elif key.scenario is Scenario.LOCAL_SLURM:
            cluster = local_cluster_config(ctx)
        else:
            continue
        if cluster is not None and cluster.build_project:
            targets[target_of(key)] = cluster
    return targets


def covering(keys: Sequence[BatchLike], env: SlurmEnv | None,
             settings: Settings) -> AllocationRequest:
    """The persistent allocation the batches ``keys`` need, as the settings bound it."""
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationRequest

    return AllocationRequest.covering(list(keys), env, time_limit=settings.alloc_time_limit,
                                      nodes=settings.alloc_nodes)


def slurm_settings(settings: Settings, env: SlurmEnv | None, runtime: str,
                   **more: Any) -> SlurmSettings:
    """The run's settings of a Slurm executor."""
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmSettings
    from pytest_trtllm_slurm.execution.slurm.tracking import WalltimePolicy

    return SlurmSettings(slurm_env=env, persistent=settings.persistent,
                         container_runtime=runtime, warm_workers=settings.warm_workers,
                         walltime=WalltimePolicy() if settings.negotiate_walltime else None,
                         **more)


class ClusterJobIds(Executor):
    """An Executor whose handles are ``cluster:ID``; all else is the wrapped one's."""

    def __init__(self, wrapped: Executor, cluster: str) -> None:
        self.wrapped = wrapped
        self.cluster = cluster
        self.shell: Shell = wrapped.shell
        # what the controller and the packer read of it: set once when an executor is made
        self.poll_hint, self.slurm_env = wrapped.poll_hint, wrapped.slurm_env
        self.allocations, self.prepares = wrapped.allocations, wrapped.prepares
        self._own: dict[str, JobHandle] = {}  # qualified id -> the wrapped executor's handle

    def expect(self, tests: Mapping[str, str]) -> None:
        self.wrapped.expect(tests)

    def prepare(self) -> None:
        self.wrapped.prepare()

    def capacity(self) -> Capacity:
        return self.wrapped.capacity()

    def submit(self, spec: JobSpec) -> JobHandle:
        own = self.wrapped.submit(spec)
        handle = own.model_copy(update={"job_id": f"{self.cluster}:{own.job_id}"})
        self._own[handle.job_id] = own
        return handle

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        states = self.wrapped.poll([self._own.get(h.job_id, h) for h in handles])
        return {f"{self.cluster}:{job_id}": state for job_id, state in states.items()}

    @property
    def vouched(self) -> int:
        return self.wrapped.vouched

    def quiet(self, handles: list[JobHandle]) -> set[str]:
        own = [self._own.get(h.job_id, h) for h in handles]
        return {f"{self.cluster}:{job_id}" for job_id in self.wrapped.quiet(own)}

    def end_watches(self) -> list[FolderWatch]:
        return self.wrapped.end_watches()

    def cancel(self, handle: JobHandle) -> None:
        self.wrapped.cancel(self._own.get(handle.job_id, handle))

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        return self.wrapped.rerun_command(spec, nodeid)

    def close(self) -> None:
        self.wrapped.close()


class UnreachableCluster(Executor):
    """Refuses every submission with the set-up error; nothing runs, nothing to poll."""

    def __init__(self, cluster: str, why: str) -> None:
        self.cluster = cluster
        self.why = why
        self.shell: Shell = LocalShell()  # never used: no job of it exists

    def submit(self, spec: JobSpec) -> JobHandle:
        raise ExecutionError(f"cluster {self.cluster!r} could not be set up: {self.why}")

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        return {}

    def cancel(self, handle: JobHandle) -> None:
        return None

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        return f"# cluster {self.cluster} could not be set up: {self.why}"

    def close(self) -> None:
        return None
