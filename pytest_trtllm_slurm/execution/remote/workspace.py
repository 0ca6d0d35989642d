"""Remote cluster preparation: preflight (a missing directory or Slurm tool reported once,
naming the host and the fix, not as failed jobs), where things live there, the sync."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, Field

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.concurrent import side_by_side
from pytest_trtllm_slurm.execution.remote.checkout_guard import checkout_claimed
from pytest_trtllm_slurm.execution.remote.sync import (
    PreparedSync,
    SyncResult,
    Via,
    git_top,
    prepare_sync,
    push_sync,
    sync_workspace,
)
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.node.paths import SHARED_STATE, WORK_DIRS, WorkRoot, join, root_of
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import CommandResult, Shell

SLURM_TOOLS = ("sbatch", "squeue", "sacct", "scancel", "srun", "salloc")
SYNC_TOOLS = ("git", "tar")
STATE_TOOLS = ("flock",)  # the shared allocation's locks on the cluster (util-linux)
_MISSING = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'


class PreflightResult(BaseModel):
    """What the remote side looked like when the run started (recorded in the run's note)."""

    host: str
    remote_dir: str | None = None
    created_dir: bool = False
    slurm_version: str
    tools_checked: list[str] = Field(default_factory=list)
    seconds: float = 0.0


def preflight(shell: Shell, cluster: ClusterConfig, *, create_dirs: bool = True) -> PreflightResult:
    """Check the remote working directory (create it when allowed) and the Slurm tools."""
    start = time.monotonic()
    host = shell.name
    directory = _root_dir(cluster)
    tools = [*SLURM_TOOLS, *STATE_TOOLS, *(SYNC_TOOLS if cluster.sync != "none" else ())]
    # three independent looks, side by side where the shell allows (failures said in order)
    steps: dict[str, Callable[[], object]] = {
        "dir": lambda: directory and _ensure_dir(shell, cluster, directory, create_dirs),
        "version": lambda: _slurm_version(shell, cluster),
        "tools": lambda: shell.run(["sh", "-c", _MISSING, "sh", *tools], timeout=60),
    }
    if getattr(shell, "parallel_safe", False):
        done = side_by_side(steps)
    else:
        done = {name: step() for name, step in steps.items()}
    created, version, res = bool(done["dir"]), str(done["version"]), done["tools"]
    assert isinstance(res, CommandResult)
    missing = res.stdout.split()
    if not res.ok or missing:
        raise ExecutionError(
            f"{host}: required commands are missing from the PATH of a non-interactive SSH "
            f"shell: {', '.join(missing) or res.describe()}. Fix: install them or add them to "
            "PATH in the shell start-up file read by non-interactive logins (e.g. ~/.bashrc)")
    return PreflightResult(host=host, remote_dir=directory, created_dir=created,
                           slurm_version=version, tools_checked=tools,
                           seconds=round(time.monotonic() - start, 3))


def _ensure_dir(shell: Shell, cluster: ClusterConfig, directory: str, create: bool) -> bool:
    key = "user_root_dir" if cluster.user_root_dir else "remote_cwd"
    if shell.exists(directory):
        return False
    if not create:
        raise ExecutionError(
            f"{shell.name}: the remote directory {directory} ({key} of [clusters.{cluster.name}]) "
            f"does not exist. Fix: create it (ssh {shell.name} mkdir -p {directory}) or correct "
            f"{key}")
    try:
        shell.mkdir(directory)
    except (ExecutionError, OSError) as exc:
        raise ExecutionError(
            f"{shell.name}: the remote directory {directory} ({key} of [clusters.{cluster.name}]) "
            f"does not exist and cannot be created ({exc}). Fix: correct {key} or create it "
            "with the right permissions") from None
    return True


def _slurm_version(shell: Shell, cluster: ClusterConfig) -> str:
    res = shell.run(["sinfo", "--version"], timeout=60)
    if res.returncode == 127 or "not found" in res.stderr:
        raise ExecutionError(
            f"{shell.name}: Slurm's `sinfo` is not found in a non-interactive SSH shell. Fix: "
            "make the Slurm client tools available there (PATH or `module load slurm` in "
            "~/.bashrc), or point ssh_host of "
            f"[clusters.{cluster.name}] at the cluster's login node")
    if not res.ok:
        raise ExecutionError(f"{shell.name}: Slurm does not answer: {res.describe()}. Fix: check "
                             "that the controller is reachable from the login node (sinfo)")
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", res.stdout)
    return match.group(1) if match else res.stdout.strip()


def _root_dir(cluster: ClusterConfig) -> str | None:
    """user_root_dir (else remote_cwd); ConfigError when a syncing cluster has neither."""
    directory = cluster.user_root_dir or cluster.remote_cwd
    if cluster.sync != "none" and not directory:
        raise ConfigError(
            f"[clusters.{cluster.name}] has sync = \"{cluster.sync}\" but no user_root_dir: set "
            "user_root_dir = \"/path/on/the/cluster\" (the repository is cloned under it)")
    return directory


class RemotePaths(NamedTuple):
    """Where the repository and the run's work dirs live on the remote side."""

    remote_repo: str
    remote_work_root: str


def remote_paths(cluster: ClusterConfig, local_rootdir: Path) -> RemotePaths:
    """``<user_root_dir>/<repo dir name>`` and its ``work_dirs``, mirroring the local layout
    (the pytest rootdir's place inside the repository is kept). ``sync = "none"`` (shared
    file system): the repository is where it is locally, unless remote_cwd says otherwise."""
    try:
        top = (git_top(local_rootdir) or Path(local_rootdir)).resolve()
    except OSError:  # no git here
        top = Path(local_rootdir).resolve()
    rel = Path(local_rootdir).resolve().relative_to(top).as_posix()
    if cluster.sync == "none":
        repo = cluster.remote_cwd or str(top)
    else:
        repo = f"{str(_root_dir(cluster)).rstrip('/')}/{top.name}"
    root = repo if rel in ("", ".") else f"{repo}/{rel}"
    return RemotePaths(repo, join(root, WORK_DIRS))


def shared_state_dir(cluster: ClusterConfig, paths: RemotePaths) -> str:
    """The cluster's private folder for the persistent allocation's state and the run registry:
    ``<user_root_dir>/.trtllm-state/<repo>``, beside the checkout (a clone, stash or clean
    never touch it); with ``sync = "none"`` the repository's ``work_dirs/.trtllm-state``."""
    base = (cluster.user_root_dir or cluster.remote_cwd or "").rstrip("/")
    root = root_of(paths.remote_work_root)
    if cluster.sync != "none" and base and root.startswith(base + "/"):
        return join(base, SHARED_STATE, root[len(base) + 1:])
    return WorkRoot(paths.remote_work_root).shared_state


def prepare_for(cluster: ClusterConfig, local_rootdir: Path, *, user: str,
                name: str) -> PreparedSync:
    """The local half of ``cluster``'s sync of the repository holding ``local_rootdir``."""
    return prepare_sync(local_rootdir, user=user, name=name, via=_via(cluster),
                        ship_secrets=cluster.sync_secrets)


def _via(cluster: ClusterConfig) -> Via:
    return "origin" if cluster.sync == "git-origin" else "ssh"


def sync_cluster(cluster: ClusterConfig, local_rootdir: Path, shell: Shell, *, name: str,
                 user: str | None = None, say: Callable[[str], None] | None = None,
                 runs: RunRegistry | None = None,
                 taken: Callable[[], None] | None = None) -> SyncResult | None:
    """Sync a cluster's checkout (nothing for ``sync = "none"``). With ``runs`` the checkout is
    claimed first (``checkout_guard``): a live run testing other code there stops this one;
    ``taken``: called once its lock is held (``checkout_claimed``)."""
    if cluster.sync == "none":
        return None
    paths = remote_paths(cluster, local_rootdir)
    who = user or cluster.user or getattr(getattr(shell, "target", None), "user", None) or "user"
    if runs is None:
        return sync_workspace(local_rootdir, shell, paths.remote_repo, user=who,
                              name=name, via=_via(cluster), ship_secrets=cluster.sync_secrets,
                              say=say)
    with checkout_claimed(runs, paths.remote_repo, lambda: prepare_for(
            cluster, local_rootdir, user=who, name=name), taken) as (prepared, sharing, probed):
        return push_sync(prepared, shell, paths.remote_repo, say=say, shared=bool(sharing),
                         probed=probed)
