"""Start this run's warm-worker sessions before pytest imports the suite (controller).

A served batch needs a session on its node that has imported and collected the suite:
seconds for a TensorRT-LLM suite (torch, tensorrt_llm). Started when the first batch is
submitted, that import comes after the controller's own. Started here instead, from
``pytest_load_initial_conftests`` (before the controller imports any conftest), each live
agent of the run's persistent allocation collects what the run's own arguments select
while the controller does the same, and the first batches find it ready.

Locally only where that is known without asking anyone: a local allocation state file and
agents whose heartbeat is fresh. A remote cluster named by ``--slurm-cluster`` does the same
from its early connection's thread, after syncing the code (``connect_early``). Anything
else (no allocation yet, settings that turn warm workers off) does nothing here; the pool
starts sessions itself. A
session whose collection turns out to lack a batch's node id says so before running it,
and the pool collects again by node id (``agents.EARLY_MISS``).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

import pytest_trtllm_slurm.controller.options as options


class EarlyConfig:
    """What ``options`` and ``pytest_base_argv`` read of a pytest.Config, before the
    command line is parsed into ``config.option``: the early parse
    (``known_args_namespace``) already holds every registered option."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self.option = config.known_args_namespace
        self.rootpath = config.rootpath
        self.inipath = config.inipath
        self.invocation_params = config.invocation_params
        self.pluginmanager = config.pluginmanager
        self._parser = config._parser  # forwarding reads the options' flags and nargs
        self.stash = pytest.Stash()

    def getoption(self, name: str, default: Any = None, skip: bool = False) -> Any:
        return getattr(self.option, name, default)

    def getini(self, name: str) -> Any:
        return self._config.getini(name)


def run_targets(config: pytest.Config) -> list[str]:
    """The run's positional arguments as absolute paths (the session runs in the
    rootdir); none: ``testpaths`` from the rootdir, else the invocation dir."""
    args = list(getattr(config.known_args_namespace, "file_or_dir", None) or [])
    here = Path(config.invocation_params.dir)
    if not args:
        testpaths = config.getini("testpaths") if here == config.rootpath else []
        return [str(config.rootpath / p) for p in testpaths] or [str(here)]
    targets = []
    for arg in args:
        path, sep, rest = str(arg).partition("::")
        targets.append(str(here / path) + sep + rest)
    return targets


def start_early_sessions(config: pytest.Config) -> int:
    """One session per live agent of the local persistent allocation; how many. A plain
    run (no dispatch asked for) returns at once: nothing imported, no file read."""
    early = EarlyConfig(config)
    if not options.remote_requested(early):  # type: ignore[arg-type]
        return 0
    import pytest_trtllm_slurm.execution.slurm.early_sessions as early_sessions
    from pytest_trtllm_slurm.execution.slurm.allocation import STATE_NAME
    from pytest_trtllm_slurm.execution.slurm.parse import expand_hostlist
    from pytest_trtllm_slurm.execution.slurm.warm_pool import (
        agent_alive,
        agent_dir,
        env_for_session,
        secrets_key,
        send_session,
        session_argv,
    )
    from pytest_trtllm_slurm.transport.shell import LocalShell

    settings = options.resolve_settings(early)  # type: ignore[arg-type]
    if not (settings.remote and settings.persistent and settings.warm_workers):
        return 0
    try:
        state = json.loads((config.rootpath / "work_dirs" / STATE_NAME).read_text("utf-8"))
        job_id, nodelist = str(state["job_id"]), str(state.get("nodelist") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    from pytest_trtllm_slurm.controller.run_loop import pytest_base_argv, worker_cwd, worker_env

    base = pytest_base_argv(early)  # type: ignore[arg-type]
    cwd = worker_cwd(early)  # type: ignore[arg-type]
    work_root = Path(settings.work_dir) if settings.work_dir else config.rootpath / "work_dirs"
    shell = LocalShell()
    targets = run_targets(config)
    capture_no = getattr(early.option, "capture", "fd") == "no"
    env = env_for_session(worker_env(early), local=True)  # type: ignore[arg-type]  # no secrets
    secrets = secrets_key(local=True)
    started = 0
    for node in expand_hostlist(nodelist):
        adir = agent_dir(str(work_root / ".agents" / job_id), node, base[0], secrets)
        if early_sessions.has(adir) or not agent_alive(shell, adir):
            continue
        name = f"early-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        sdir = f"{adir}/sessions/{name}"
        argv = session_argv(base[0], base, sdir, targets, capture_no=capture_no,
                            nodeids_file=False)
        early_sessions.remember(adir, send_session(shell, adir, name, argv, cwd=str(cwd),
                                                   env=env))
        started += 1
    return started


def connect_early(config: pytest.Config) -> bool:
    """Open the SSH connection of the remote cluster ``--slurm-cluster`` names, in a thread,
    while pytest imports the suite (``execution.remote.early_connect``), then sync the code
    and, in a warm allocation, start the sessions there as ``start_early_sessions`` does
    locally (``execution.remote.early_start``); whether it did."""
    early = EarlyConfig(config)
    if not options.remote_requested(early):  # type: ignore[arg-type]
        return False
    settings = options.resolve_settings(early)  # type: ignore[arg-type]
    if not (settings.remote and settings.slurm_cluster):
        return False
    clusters = options.clusters_file(early)  # type: ignore[arg-type]
    if not clusters.clusters and not settings.config_path:
        from pytest_trtllm_slurm.planning.settings import load_clusters_file

        clusters = load_clusters_file(None, config.rootpath)  # the default locations
    cluster = clusters.find(settings.slurm_cluster)
    if cluster is None:
        return False
    from pytest_trtllm_slurm.execution.remote import early_connect, early_start

    ask = None
    if settings.persistent and settings.warm_workers:
        from pytest_trtllm_slurm.controller.run_loop import (
            pytest_base_argv,
            worker_cwd,
            worker_env,
        )

        ask = early_start.SessionAsk(
            base=pytest_base_argv(early),  # type: ignore[arg-type]
            cwd=str(worker_cwd(early)),  # type: ignore[arg-type]
            targets=run_targets(config),
            # as a batch's: the worker's, then the clusters file's env (and models root)
            env={**worker_env(early), **cluster.job_env},  # type: ignore[arg-type]
            capture_no=getattr(early.option, "capture", "fd") == "no",
            local_work_root=settings.work_dir or str(config.rootpath / "work_dirs"))
    rootdir = config.rootpath

    def sync_and_start(shell: Any) -> early_start.EarlyRemote:
        # sync first: a session never imports code older than the run's sync
        return early_start.sync_and_start(shell, cluster, rootdir, ask)

    return early_connect.start(cluster, then=sync_and_start)


def stop_unused_sessions() -> None:
    """Sessions no pool took (nothing ran on their node): end them now, not at their
    idle timeout."""
    import pytest_trtllm_slurm.execution.slurm.early_sessions as early_sessions
    from pytest_trtllm_slurm.transport.shell import LocalShell

    shell = LocalShell()
    for sdir in early_sessions.drain():
        try:
            shell.write_file(f"{sdir}/inbox/stop", "")
        except OSError:
            pass
