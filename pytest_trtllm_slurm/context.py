"""What a run finds once: settings, this machine's probe, Slurm discovery, clusters file.

Only built when dispatch or a plan was asked for; cached on the pytest config.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import options
from .config import load_clusters_file
from .errors import ConfigError
from .execution.base import Executor
from .models import Scenario
from .planning import PlanningContext
from .requirements import PerfSources

_CONTEXT_KEY = pytest.StashKey[PlanningContext]()


def planning_context(config: pytest.Config) -> PlanningContext:
    """Probe this machine and the local Slurm, load the clusters file: once per run."""
    cached = config.stash.get(_CONTEXT_KEY, None)
    if cached is not None:
        return cached
    from .execution.probe import probe_local_env

    try:
        settings = options.resolve_settings(config)
        clusters = options.clusters_file(config)
        if not clusters.clusters and not settings.config_path:
            clusters = load_clusters_file(None, config.rootpath)  # the default locations
        local = probe_local_env()
        slurm_env = None
        if local.slurm_available:
            from .execution.shell import LocalShell
            from .execution.slurm import SlurmClient

            slurm_env = SlurmClient(LocalShell()).discover()
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    ctx = PlanningContext(
        settings=settings,
        local=local,
        clusters=clusters,
        slurm_env=slurm_env,
        perf=PerfSources.from_settings(settings, Path(config.rootpath)),
    )
    config.stash[_CONTEXT_KEY] = ctx
    return ctx


def make_executors(ctx: PlanningContext, config: pytest.Config) -> dict[Scenario, Executor]:
    """One executor per scenario this run may use."""
    from .execution.direct import DirectExecutor

    executors: dict[Scenario, Executor] = {
        Scenario.LOCAL_DIRECT: DirectExecutor(gpu_ids=list(range(ctx.local.gpu_count)))
    }
    return executors
