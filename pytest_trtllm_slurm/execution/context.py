"""What a run finds once -- settings, this machine, its Slurm, the clusters file, the remote
clusters -- read by planning (``routing.Targets``), the executor factory and cases alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_trtllm_slurm.node.paths import work_root
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.models import LocalEnv
from pytest_trtllm_slurm.planning.perf_sanity import PerfSources
from pytest_trtllm_slurm.planning.settings import ClustersFile, Settings

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.local.session import LocalSession
    from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters
    from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions


@dataclass
class RunContext:
    """Found once per run (the plugin's ``planning_context``, ``cases.run.discover_context``)."""

    settings: Settings
    local: LocalEnv
    clusters: ClustersFile
    slurm_env: SlurmEnv | None = None
    perf: PerfSources | None = None
    rootdir: Path = Path(".")
    # one SSH connection per remote cluster and its discovery (None: the clusters file alone)
    remote_env: RemoteClusters | None = None
    # sessions the run started before it collected (the plugin's early start)
    early_sessions: EarlySessions | None = None
    local_session: LocalSession | None = None  # local_direct's, started with them


def discover_local(rootdir: Path, *, engines: bool = True, cached: bool = False,
                   slurm: bool = True) -> tuple[LocalEnv, SlurmEnv | None]:
    """This machine's probe and its Slurm's discovery (``cached``: from ``.cache``;
    ``slurm=False``: neither probed nor discovered)."""
    from pytest_trtllm_slurm.execution.probe import probe_local_env

    local = probe_local_env(engines=engines, slurm=slurm)
    if not local.slurm_available:
        return local, None
    from pytest_trtllm_slurm.execution.slurm.client import SlurmClient, cache_key, cached_discovery
    from pytest_trtllm_slurm.transport.shell import LocalShell

    discover = SlurmClient(LocalShell()).discover
    if not cached:
        return local, discover()
    return local, cached_discovery(work_root(None, rootdir).cache.slurm_env,
                                   cache_key(local.cluster_name), discover)
