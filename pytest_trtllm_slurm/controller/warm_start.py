"""Start this run's warm-worker sessions before pytest imports the suite, so the first batches
find it imported; only from a local state file and fresh heartbeats, else the pool does."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

import pytest_trtllm_slurm.controller.options as options
from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.node import paths

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.local.session import LocalSession
    from pytest_trtllm_slurm.execution.remote.early_connect import EarlyConnections
    from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
    from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
    from pytest_trtllm_slurm.planning.models import LocalEnv


class Discovered(NamedTuple):
    """This machine's probe and its Slurm's discovery, made beside the suite's import."""

    local: LocalEnv
    slurm_env: SlurmEnv | None
    slurm_probed: bool  # False: the run could not use this machine's Slurm, not asked


@dataclass
class EarlyStart:
    """What the early start shares with the run (sessions started, SSH connections opened):
    one per run in ``config.stash`` (``EARLY``), made by ``begin``, closed at unconfigure."""

    sessions: EarlySessions
    connections: EarlyConnections
    started: int = 0  # local agents asked for a session (at most)
    discovery: threading.Thread | None = None  # this machine's probe and Slurm discovery
    found: Discovered | None = None  # what it found; None until then
    local_session: LocalSession | None = None  # local_direct's warm session

    def discovered(self) -> Discovered | None:
        """Wait for this machine's probe and Slurm discovery made beside the suite's import;
        what they found (None: not done, or failed: planning makes its own)."""
        if self.discovery is not None:
            self.discovery.join(DISCOVERY_WAIT)
        return self.found

    def close(self) -> None:
        """End what no one took: connections (and their sessions), then local sessions."""
        self.connections.close_unused()
        if self.local_session is not None:  # (its executor stopped it already, if it had one)
            self.local_session.stop()
        if self.started:
            stop_unused_sessions(self.sessions)
            self.started = 0


log = logging.getLogger(__name__)
EARLY = pytest.StashKey[EarlyStart]()
DISCOVERY_WAIT = 120.0  # seconds planning waits for the early discovery before its own


def early_start(config: pytest.Config) -> EarlyStart | None:
    """The run's early start (None: it did not start one)."""
    return config.stash.get(EARLY, None)


def begin(config: pytest.Config) -> EarlyStart | None:
    """Connect and start the sessions while pytest imports the suite; the EarlyStart that
    holds them (None for a plain run: nothing imported, no file read)."""
    read = EarlyConfig(config)
    try:
        if not options.remote_requested(read):  # type: ignore[arg-type]
            return None
    except ConfigError:
        return None  # the run itself reports the bad setting, once configured
    from pytest_trtllm_slurm.execution.remote.early_connect import EarlyConnections
    from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions

    early = config.stash[EARLY] = EarlyStart(EarlySessions(), EarlyConnections())
    try:
        connect_early(config, read, early)  # a remote cluster's, while the suite imports
        early.local_session = start_local_session(config, read)
        early.started = start_early_sessions(config, read, early.sessions)
    except (ConfigError, ExecutionError, OSError):
        pass  # an optimization: the run itself reports a bad setting, once configured
    try:
        slurm = options.resolve_settings(read).uses_local_slurm()  # type: ignore[arg-type]
    except ConfigError:
        slurm = True  # the run itself reports the bad setting
    early.discovery = refresh_discovery(config.rootpath, early, slurm=slurm)
    return early


def refresh_discovery(rootdir: Path, early: EarlyStart, *, slurm: bool) -> threading.Thread:
    """This machine's probe (its GPUs; its Slurm, when the run can use it) and its Slurm's
    discovery, beside the suite's import, into ``early.found``: planning uses them instead
    of probing again (``nvidia-smi``, ``scontrol``: 10 s each when they do not answer), and
    the discovery is made again only when its five-minute cache is stale (``sinfo`` and
    the like: 0.2 s on the dev cluster)."""
    from pytest_trtllm_slurm.execution.context import discover_local

    def refresh() -> None:
        try:
            early.found = Discovered(*discover_local(rootdir, engines=False, cached=True,
                                                     slurm=slurm), slurm_probed=slurm)
        except Exception:  # noqa: BLE001 - an optimization: planning discovers and reports
            log.debug("the early Slurm discovery failed", exc_info=True)

    thread = threading.Thread(target=refresh, daemon=True, name="trtllm-slurm-discovery")
    thread.start()
    return thread


class EarlyConfig:
    """A pytest.Config as ``options`` and ``pytest_base_argv`` read it before the command
    line is parsed: the early parse (``known_args_namespace``) has every option."""

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
    """The run's positional arguments as absolute paths (the session runs in the rootdir);
    none: ``testpaths`` from the rootdir, else the invocation dir."""
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


def start_local_session(config: pytest.Config, early: EarlyConfig) -> LocalSession | None:
    """local_direct's warm session (``execution.local.session``), when every test is
    dispatched there: it imports and collects the run's arguments beside this process's own
    import and collection, and forks each batch; None when it would not serve the batches."""
    from pytest_trtllm_slurm.planning.models import Scenario

    settings = options.resolve_settings(early)  # type: ignore[arg-type]
    if not (settings.remote and settings.warm_workers and settings.dispatch == "all"
            and settings.scenario == Scenario.LOCAL_DIRECT and settings.collect != "target"):
        return None
    from pytest_trtllm_slurm.controller.forwarding import forwarding_plan

    if forwarding_plan(early)[2]:  # type: ignore[arg-type]
        return None  # batches with output paths of their own run in processes of their own
    from pytest_trtllm_slurm.controller.run_loop import pytest_base_argv, worker_cwd, worker_env
    from pytest_trtllm_slurm.execution.local.session import LocalSession
    from pytest_trtllm_slurm.execution.slurm.warm_pool import session_argv
    from pytest_trtllm_slurm.execution.work_root import ensure_work_root
    from pytest_trtllm_slurm.node.files import UntrustedPath

    base = pytest_base_argv(early)  # type: ignore[arg-type]
    root = paths.work_root(settings.work_dir, config.rootpath)
    folder = str(root.agents_of("local") / f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    argv = session_argv(base[0], base, folder, run_targets(config), nodeids_file=False,
                        capture_no=getattr(early.option, "capture", "fd") == "no")
    try:
        ensure_work_root(root.dir)  # git-ignored, before the session's folder is made in it
        return LocalSession.start(argv, cwd=str(worker_cwd(early)),  # type: ignore[arg-type]
                                  env={**os.environ, **worker_env(early)},  # type: ignore[arg-type]
                                  folder=folder)
    except UntrustedPath:
        return None  # the run says so, naming the folder, when it makes its work dirs


def start_early_sessions(config: pytest.Config, early: EarlyConfig,
                         sessions: EarlySessions) -> int:
    """One session per live agent of the local persistent allocation, asked for in a thread;
    how many agents it asks at most."""
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
    from pytest_trtllm_slurm.controller.forwarding import forwarding_plan

    if forwarding_plan(early)[2]:  # type: ignore[arg-type]
        return 0  # batches with output paths of their own run in processes of their own
    try:
        state = json.loads(paths.work_root(None, config.rootpath).state.read_text("utf-8"))
        job_id, nodelist = str(state["job_id"]), str(state.get("nodelist") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    from pytest_trtllm_slurm.controller.run_loop import pytest_base_argv, worker_cwd, worker_env

    base = pytest_base_argv(early)  # type: ignore[arg-type]
    cwd = worker_cwd(early)  # type: ignore[arg-type]
    work_root = paths.work_root(settings.work_dir, config.rootpath)
    shell = LocalShell()
    targets = run_targets(config)
    capture_no = getattr(early.option, "capture", "fd") == "no"
    job_env = worker_env(early)  # type: ignore[arg-type]
    env = env_for_session(job_env, local=True)  # no secrets, no value off the allow-list
    secrets = secrets_key(job_env, local=True)
    nodes = expand_hostlist(nodelist)

    def ask_each_agent() -> None:
        with contextlib.suppress(ConfigError, ExecutionError, OSError):  # as in ``begin``
            for node in nodes:
                adir = agent_dir(str(work_root.agents_of(job_id)), node, base[0], secrets)
                if sessions.has(adir) or not agent_alive(shell, adir):
                    continue
                name = f"early-{os.getpid()}-{uuid.uuid4().hex[:6]}"
                sdir = paths.Agent(adir).session(name).dir
                argv = session_argv(base[0], base, sdir, targets, capture_no=capture_no,
                                    nodeids_file=False)
                sessions.remember(adir, send_session(shell, adir, name, argv, cwd=str(cwd),
                                                     env=env))

    # everything read from the config and the environment above, here; the requests'
    # writes (32 nodes: ~0.5 s) beside the suite's import, which starts now
    sessions.fill_beside(ask_each_agent)
    return len(nodes)


def connect_early(config: pytest.Config, early: EarlyConfig, start: EarlyStart) -> bool:
    """Connect to the ``--slurm-cluster`` cluster in a thread while pytest imports the suite,
    then sync and start its warm sessions (``execution.remote.early_start``); whether it did."""
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
    from pytest_trtllm_slurm.execution.remote.early_connect import sync_then_sessions
    from pytest_trtllm_slurm.execution.remote.session_ask import SessionAsk

    # the connection first: what follows (the run loop's imports, ~0.15 s) overlaps it
    ask: Future[SessionAsk | None] = Future()
    # sync first, then the sessions: a session never imports code older than the run's sync
    if not start.connections.start(cluster, then=partial(
            sync_then_sessions, cluster=cluster, rootdir=config.rootpath, ask=ask,
            registry=start.sessions,
            cache_dir=paths.work_root(None, config.rootpath).cache.dir)):
        return False
    asked = None
    try:
        if settings.persistent and settings.warm_workers:
            from pytest_trtllm_slurm.controller.run_loop import (
                pytest_base_argv,
                worker_cwd,
                worker_env,
            )

            asked = SessionAsk(
                base=pytest_base_argv(early),  # type: ignore[arg-type]
                cwd=str(worker_cwd(early)),  # type: ignore[arg-type]
                targets=run_targets(config),
                # as a batch's: the worker's, then the clusters file's env (and models root)
                env={**worker_env(early), **cluster.job_env},  # type: ignore[arg-type]
                capture_no=getattr(early.option, "capture", "fd") == "no",
                local_work_root=str(paths.work_root(settings.work_dir, config.rootpath).dir))
    finally:
        ask.set_result(asked)  # (None, also when making it failed: no sessions then)
    return True


def stop_unused_sessions(sessions: EarlySessions) -> None:
    """Sessions no pool took: end them now, not at their idle timeout."""
    from pytest_trtllm_slurm.transport.shell import LocalShell

    shell = LocalShell()
    for sdir in sessions.drain():
        with contextlib.suppress(OSError):
            shell.write_file(paths.Session(sdir).stop, "")
