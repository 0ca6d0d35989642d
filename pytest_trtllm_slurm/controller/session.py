"""What a run finds once (settings, this machine's probe, Slurm discovery, clusters file),
only when dispatch or a plan was asked for; cached on the config."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import pytest_trtllm_slurm.controller.options as options
from pytest_trtllm_slurm.controller.warm_start import early_start
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.context import RunContext, discover_local
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.node.paths import work_root
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.models import Scenario, Target
from pytest_trtllm_slurm.planning.perf_sanity import PerfSources
from pytest_trtllm_slurm.planning.safe_values import line_problem
from pytest_trtllm_slurm.planning.settings import ClustersFile, load_clusters_file

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

_CONTEXT_KEY = pytest.StashKey[RunContext]()


def check_rootdir(rootdir: Path) -> None:
    """The rootdir is every job's working directory: a line break in it cannot be rendered."""
    problem = line_problem(str(rootdir))
    if problem:
        raise ConfigError(f"the pytest rootdir {str(rootdir)!r} {problem}; dispatched jobs "
                          "run there and their scripts cannot name it: run from a checkout "
                          "whose path has no line breaks or control characters")


def planning_context(config: pytest.Config) -> RunContext:
    """Probe this machine and the local Slurm, load the clusters file: once per run."""
    cached = config.stash.get(_CONTEXT_KEY, None)
    if cached is not None:
        return cached
    try:
        settings = options.resolve_settings(config)
        if settings.collect == "target":  # placeholders cannot run here: all are dispatched
            settings = settings.model_copy(update={"dispatch": "all"})
        check_rootdir(Path(config.rootpath))
        clusters = options.clusters_file(config)
        if not clusters.clusters and not settings.config_path:
            clusters = load_clusters_file(None, config.rootpath)  # the default locations
        engines = bool(settings.container_image) or settings.scenario == Scenario.LOCAL_DOCKER
        slurm = settings.uses_local_slurm()
        early = early_start(config)
        found = early.discovered() if early is not None else None  # beside the import
        if found is not None and not engines and (found.slurm_probed or not slurm):
            local, slurm_env = found.local, found.slurm_env if slurm else None
        else:
            local, slurm_env = discover_local(Path(config.rootpath), cached=True,
                                              engines=engines, slurm=slurm)
        _check_named_cluster(settings.slurm_cluster, clusters, local.cluster_name)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    ctx = RunContext(
        settings=settings, local=local, clusters=clusters, slurm_env=slurm_env,
        perf=PerfSources.from_settings(settings, Path(config.rootpath)),
        rootdir=Path(config.rootpath),
        remote_env=remote_clusters(config) if clusters.clusters else None,
        early_sessions=early.sessions if (early := early_start(config)) else None,
        local_session=early.local_session if early else None,
    )
    config.stash[_CONTEXT_KEY] = ctx
    return ctx


def _check_named_cluster(name: str | None, clusters: ClustersFile, here: str | None) -> None:
    """--slurm-cluster NAME is the local Slurm cluster or in the clusters file (checked first)."""
    if not name or clusters.find(name) is not None:
        return
    if here and name.lower() == here.lower():
        return
    where = f"this machine's Slurm cluster is {here!r}" if here else "this machine has no Slurm"
    raise ConfigError(f"{clusters.unknown_message(name)} ({where})")


def remote_clusters(config: pytest.Config) -> RemoteClusters:
    """The run's connections to remote clusters and their discoveries; closed at the end."""
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

    early = early_start(config)  # the connections it opened before collection
    remotes = RemoteClusters(work_root(None, config.rootpath).cache.dir,
                             early=early.connections if early else None,
                             held=options.held_code(config))
    config.add_cleanup(remotes.close)
    return remotes


def make_executors(
    ctx: RunContext, config: pytest.Config, keys: Sequence[BatchKey]
) -> dict[Target, Executor]:
    """One executor per target the batches' keys use (execution.factory), warning here."""
    from pytest_trtllm_slurm.execution.factory import build_executors

    return build_executors(ctx, keys, warn=terminal_warning(config))


def terminal_warning(config: pytest.Config) -> Callable[[str], None]:
    """Warnings of the execution layer, shown on the terminal as they happen."""

    def warn(message: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"trtllm-slurm: {message}", yellow=True)
        else:
            print(f"trtllm-slurm: {message}", file=sys.stderr)

    return warn
