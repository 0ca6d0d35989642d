"""A remote cluster's sync and warm-worker sessions, from the early connection's thread.

A session must never import code older than what the run syncs: one session is asked of
each live agent of the persistent allocation once the run holds the checkout's lock (no
other run changes the checkout from then on), and kept only when the sync under that lock
changed no file there. The executor takes what was done (``EarlyRemote``); when the local
code changed meanwhile the early sessions are stopped and it syncs again."""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.records import load_json
from pytest_trtllm_slurm.execution.remote.executor import PathMap
from pytest_trtllm_slurm.execution.remote.session_ask import SessionAsk
from pytest_trtllm_slurm.execution.remote.workspace import (
    RemotePaths,
    preflight,
    prepare_for,
    remote_paths,
    shared_state_dir,
    sync_cluster,
)
from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
from pytest_trtllm_slurm.execution.slurm.parse import expand_hostlist
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
from pytest_trtllm_slurm.execution.slurm.warm_pool import (
    agent_dir,
    agents_alive,
    env_for_session,
    secrets_key,
    send_session,
    session_argv,
)
from pytest_trtllm_slurm.node.paths import (
    STATE_NAME,
    Agent,
    Session,
    StateDir,
    WorkRoot,
    root_of,
    work_root,
)
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import Shell

log = logging.getLogger(__name__)


@dataclass
class EarlyRemote:
    """What the early thread did on one cluster, for the executor to take over."""

    runs: RunRegistry
    checked: bool = False  # preflight passed
    synced: bool = False  # the checkout holds ``code`` (the sync ended without error)
    code: str | None = None  # the synced code's key (``PreparedSync.key``)
    notes: list[str] = field(default_factory=list)  # what the sync said to the user
    sessions: list[str] = field(default_factory=list)  # session dirs started
    registry: EarlySessions = field(default_factory=EarlySessions)  # the run's, they are in


def layout(cluster: ClusterConfig, rootdir: Path, local_work_root: Path
           ) -> tuple[RemotePaths, str, PathMap]:
    """Where the checkout and work dirs are on the cluster, where the shared state is, and
    the local->remote path map (the same for the early thread and the executor)."""
    paths = remote_paths(cluster, rootdir)
    remote_root = root_of(paths.remote_work_root)
    path_map = PathMap({str(rootdir): remote_root, str(local_work_root): paths.remote_work_root},
                       python=cluster.python)
    return paths, shared_state_dir(cluster, paths), path_map


def sync_and_start(shell: Shell, cluster: ClusterConfig, rootdir: Path,
                   ask: SessionAsk | None, registry: EarlySessions) -> EarlyRemote:
    """Preflight, sync, then (``ask``) a session on each live agent of the cluster's
    allocation (see the module docstring). Stops at the first failure quietly: the executor
    does that step again and reports it."""
    local = Path(ask.local_work_root) if ask else work_root(None, rootdir).dir
    paths, state_dir, path_map = layout(cluster, rootdir, local)
    done = EarlyRemote(RunRegistry(shell, StateDir(state_dir).runs.dir), registry=registry)
    beside = None
    try:
        preflight(shell, cluster)
        done.checked = True
        if ask is not None and cluster.sync != "none":
            beside = _SessionsBesideClaim(lambda: _live_agents(
                shell, cluster, paths, state_dir, registry, ask), lambda adir: _ask_session(
                shell, cluster, path_map, ask, adir))
        result = sync_cluster(cluster, rootdir, shell, name=f"pytest_{rootdir.name}",
                              say=done.notes.append, runs=done.runs,
                              taken=beside.taken if beside else None)
        done.code = done.runs.me.code if cluster.sync != "none" else None
        done.synced = True
        kept = None
        if beside is not None and result is not None and not result.files_changed:
            kept = beside.keep(registry)  # None: the lock was never seen held
        if kept is not None:
            done.sessions = kept
        elif ask is not None:
            looked = None
            if beside is not None:
                beside.stop(shell)  # they may have read files the sync then changed
                looked = beside.looked()  # the agents' look made beside the claim
            done.sessions = _start_sessions(shell, cluster, paths, state_dir, path_map, ask,
                                            registry, looked)
    except (ConfigError, ExecutionError, OSError, ValueError) as exc:
        log.debug("ssh: early sync/sessions on %s stopped: %s", cluster.name, exc)
    finally:
        if beside is not None:
            beside.stop(shell)  # (none left once kept)
    return done


class _SessionsBesideClaim:
    """Sessions asked for while the checkout's claim runs: sent once its lock is held
    (``taken``); ``keep`` or ``stop`` them after the sync."""

    def __init__(self, look: Callable[[], list[str]], ask: Callable[[str], str]) -> None:
        self._ask = ask
        self._gate = threading.Event()
        self._open = False  # the lock was seen held before the claim ended
        self._closed = False  # the claim ended: no request is sent after this
        self._lock = threading.Lock()
        self._asked: list[tuple[str, str]] = []  # (agent dir, session dir)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="early-sessions")
        self._looked = self._pool.submit(look)
        self._sent = self._pool.submit(self._send)

    def taken(self) -> None:
        """The claim's lock is held: send the requests."""
        with self._lock:
            if self._closed:
                return
            self._open = True
        self._gate.set()

    def _send(self) -> None:
        self._gate.wait()
        with self._lock:
            if not self._open:
                return
        for adir in self._looked.result():
            sdir = self._ask(adir)  # remembered before the next one (to be stopped)
            with self._lock:
                self._asked.append((adir, sdir))

    def looked(self) -> list[str] | None:
        """The live agents found beside the claim (None: that look failed)."""
        try:
            return self._looked.result()
        except (ConfigError, ExecutionError, OSError, ValueError):
            return None

    def _end(self) -> bool:
        """No request is sent after this (the claim ended); whether any was."""
        with self._lock:
            self._closed = True
            opened = self._open
        self._gate.set()
        try:
            if opened:
                self._sent.result()
        except (ConfigError, ExecutionError, OSError, ValueError) as exc:
            log.debug("ssh: an early session beside the claim failed: %s", exc)
        finally:
            self._pool.shutdown(wait=True)
        return opened

    def keep(self, registry: EarlySessions) -> list[str] | None:
        """The sessions asked for, now the run's; None when none was (lock not seen in time)."""
        if not self._end():
            return None
        with self._lock:
            asked, self._asked = self._asked, []
        for adir, sdir in asked:
            registry.remember(adir, sdir)
        return [sdir for _, sdir in asked]

    def stop(self, shell: Shell) -> None:
        """End the sessions asked for and not kept."""
        self._end()
        with self._lock:
            asked, self._asked = self._asked, []
        for _, sdir in asked:
            try:
                shell.write_file(Session(sdir).stop, "")
            except (ExecutionError, OSError) as exc:
                log.debug("ssh: could not stop the early session %s: %s", sdir, exc)


def _live_agents(shell: Shell, cluster: ClusterConfig, paths: RemotePaths, state_dir: str,
                 registry: EarlySessions, ask: SessionAsk) -> list[str]:
    """The agent dirs of the allocation's live agents with no session yet (one look)."""
    raw = StateStore(shell, state_dir, STATE_NAME).read()
    try:
        state = load_json(raw or "null", "the state file")
        job_id, nodelist = str(state["job_id"]), str(state.get("nodelist") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return []  # no allocation yet (or a state file the allocation manager will judge)
    # as the warm pool names them: the remote interpreter, the key of the values the
    # agent must hold (remote: only the batch's hidden ones)
    dirs = [agent_dir(WorkRoot(paths.remote_work_root).agents_of(job_id), node,
                      cluster.python, secrets_key(ask.env, local=False))
            for node in expand_hostlist(nodelist)]
    dirs = [adir for adir in dirs if not registry.has(adir)]
    return [adir for adir, alive in zip(dirs, agents_alive(shell, dirs), strict=True) if alive]


def _ask_session(shell: Shell, cluster: ClusterConfig, path_map: PathMap, ask: SessionAsk,
                 adir: str) -> str:
    """Ask the agent ``adir`` for a session of ``ask`` (one round trip); its dir."""
    base = path_map.argv(ask.base, interpreter=sys.executable)
    targets = [path_map.text(t) for t in ask.targets]
    name = f"early-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    argv = session_argv(cluster.python, base, Agent(adir).session(name).dir, targets,
                        capture_no=ask.capture_no, nodeids_file=False)
    return send_session(shell, adir, name, argv, cwd=path_map.text(ask.cwd),
                        env=env_for_session(ask.env, local=False))


def _start_sessions(shell: Shell, cluster: ClusterConfig, paths: RemotePaths, state_dir: str,
                    path_map: PathMap, ask: SessionAsk, registry: EarlySessions,
                    looked: list[str] | None = None) -> list[str]:
    """A session on each live agent (``looked``: found already, else looked up now)."""
    if looked is None:
        looked = _live_agents(shell, cluster, paths, state_dir, registry, ask)
    started = []
    for adir in looked:
        # one round trip per session: one that was asked for is remembered before the next
        sdir = _ask_session(shell, cluster, path_map, ask, adir)
        registry.remember(adir, sdir)
        started.append(sdir)
    return started


def code_key(cluster: ClusterConfig, rootdir: Path) -> str | None:
    """The key of the local code as a sync would send it now (None: ``sync = "none"``)."""
    if cluster.sync == "none":
        return None
    return prepare_for(cluster, rootdir, user="early", name="check").key


def still_current(early: EarlyRemote, cluster: ClusterConfig, rootdir: Path,
                  key: Future[str | None] | None = None) -> bool:
    """Whether the local code is still what the early thread synced (files may change during
    collection). ``key``: ``code_key`` computed meanwhile; else computed now."""
    return (key.result() if key is not None else code_key(cluster, rootdir)) == early.code


def stop_sessions(shell: Shell, early: EarlyRemote) -> None:
    """End the early sessions no batch has taken."""
    for sdir in early.sessions:
        adir = Session(sdir).agent
        if early.registry.take(adir) != sdir:
            continue  # a batch took it, or it was never recorded
        try:
            shell.write_file(Session(sdir).stop, "")
        except (ExecutionError, OSError) as exc:
            log.debug("ssh: could not stop the early session %s: %s", sdir, exc)
    early.sessions = []
