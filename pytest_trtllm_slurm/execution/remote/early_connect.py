"""A remote cluster's SSH connection (and relay) opened in a thread before pytest imports
the suite, overlapping import, collection and planning; ``RemoteClusters`` takes it. Only
for logins that need nothing typed (paramiko, ``mfa = false``); a failure stays quiet and
the run connects again the usual way."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.execution.remote.session_ask import SessionAsk
from pytest_trtllm_slurm.planning.settings import ClusterConfig

log = logging.getLogger(__name__)


def sync_then_sessions(shell: Any, *, cluster: ClusterConfig, rootdir: Path,
                       ask: Future[SessionAsk | None], registry: Any,
                       cache_dir: Path | None = None) -> Any:
    """``early_start.sync_and_start`` (a ``then`` of ``EarlyConnections.start``), imported
    here, in the connection's thread once it is connected: the sync's modules are not
    imported before the connection starts. ``ask``: made by the main thread meanwhile.
    Then, with ``cache_dir``, the cluster's discovery if its cache is stale (planning's)."""
    from pytest_trtllm_slurm.execution.remote.early_start import sync_and_start

    done = sync_and_start(shell, cluster, rootdir, ask.result(), registry)
    if cache_dir is not None:
        from pytest_trtllm_slurm.execution.remote.discovery_cache import refresh_discovery

        try:
            refresh_discovery(cache_dir, cluster, shell)
        except Exception as exc:  # noqa: BLE001 - planning discovers again and says why
            log.debug("ssh: the early discovery of %s failed: %s", cluster.name, exc)
    return done


class _QuickSwitch:
    """While a run's early connections work, the GIL changes hands every 0.5 ms, not 5 ms.
    Their round trips are many and short (the handshake, the relay, the locks, the
    checkout's look), and each woken thread waits for the main thread, importing the suite,
    to let go of the GIL: a warm one-test run over SSH ends ~45 ms sooner on 2 CPUs."""

    INTERVAL = 0.0005

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before = 0.0

    def enter(self) -> None:
        with self._lock:
            if not self._users:
                self._before = sys.getswitchinterval()
                sys.setswitchinterval(min(self._before, self.INTERVAL))
            self._users += 1

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            if not self._users:
                sys.setswitchinterval(self._before)


@dataclass
class _Early:
    cluster: ClusterConfig
    thread: threading.Thread
    then: Callable[[Any], Any] | None = None  # more work on the connected shell
    shell: Any = None  # the connected shell, once it is
    done: Any = None  # what ``then`` returned
    connected: threading.Event = field(default_factory=threading.Event)  # or failed to


class EarlyConnections:
    """The early connections of one run: taken once by ``RemoteClusters``, the rest closed."""

    def __init__(self) -> None:
        self._early: dict[str, _Early] = {}
        self._switch = _QuickSwitch()  # (the interval is the process's; the count is this run's)
        # connections handed out, their ``then`` maybe still running
        self._taken: dict[str, _Early] = {}

    def start(self, cluster: ClusterConfig, then: Callable[[Any], Any] | None = None) -> bool:
        """Connect to ``cluster`` in a thread now (once), then run ``then(shell)``; whether so."""
        # only a login that needs nothing typed is safe to open from a thread
        suitable = cluster.is_remote and cluster.transport == "paramiko" and cluster.mfa is False
        if not suitable or cluster.name in self._early:
            return False
        # imported here, not in the thread: one thread runs Python at a time, so the
        # connection's imports (paramiko's, ~0.1 s) in the thread would only interleave with
        # what the caller does next; done first, the caller's work overlaps the handshake's
        # and the relay's network waits instead
        from pytest_trtllm_slurm.transport.ssh import shells  # noqa: F401

        switch = self._switch  # entered here, left by the thread once its work is done
        early = _Early(cluster, threading.Thread(name=f"ssh-early-{cluster.name}", daemon=True,
                                                 target=lambda: _connect(early, switch)), then)
        self._early[cluster.name] = early
        switch.enter()
        early.thread.start()
        return True

    def take(self, cluster: ClusterConfig) -> Any | None:
        """The early connection to ``cluster`` (waited for, not the work on it: the shell
        takes commands from several threads), handed out once; None when there is none, it
        failed, or the cluster's settings are not the ones it was opened with."""
        early = self._early.pop(cluster.name, None)
        if early is None:
            return None
        early.connected.wait()
        shell = early.shell
        if shell is not None and early.cluster != cluster:
            early.thread.join()
            _undo(early, shell)
            shell.close()
            return None
        if shell is not None:
            self._taken[cluster.name] = early
        return shell

    def worked(self, cluster: ClusterConfig) -> None:
        """Wait for the work (``then``) of ``cluster``'s early connection, if it has one,
        taken or not (its shell and result are handed out as before)."""
        early = self._early.get(cluster.name) or self._taken.get(cluster.name)
        if early is not None:
            early.thread.join()

    def pending(self, cluster: ClusterConfig) -> bool:
        """Whether ``cluster``'s connection was taken and ``done`` is still to be handed out."""
        return cluster.name in self._taken

    def done(self, cluster: ClusterConfig) -> Any | None:
        """What ``then`` did on ``cluster``'s taken connection (waited for), handed out once."""
        early = self._taken.pop(cluster.name, None)
        if early is None:
            return None
        early.thread.join()
        return early.done

    def close_unused(self) -> None:
        """End the connections no one took, and stop the early sessions (and the record) of
        clusters given nothing: they would hold their node's memory until their idle exit."""
        # a taken one was used by planning (discovery) only: RemoteClusters closes it later
        for pending, close in ((self._early, True), (self._taken, False)):
            while pending:
                _, early = pending.popitem()
                early.thread.join()
                if early.shell is not None:
                    _undo(early, early.shell)
                    if close:
                        early.shell.close()


def _connect(early: _Early, switch: _QuickSwitch) -> None:
    try:
        _connect_then(early)
    finally:
        switch.leave()


def _connect_then(early: _Early) -> None:
    from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

    shell = None
    try:
        shell = shell_for_cluster(early.cluster)
        shell.connect()
        relay_up = getattr(shell, "relay_up", None)
        if relay_up is not None:
            relay_up()  # its relay too: the first command finds it running
        early.shell = shell
    except Exception as exc:  # noqa: BLE001 - the run connects again and says why
        log.debug("ssh: early connection to %s failed: %s", early.cluster.name, exc)
        if shell is not None:
            shell.close()  # no connection (nor relay) left open beside the run's own
        return
    finally:
        early.connected.set()  # planning may use the connection while ``then`` runs
    if early.then is not None:
        try:
            early.done = early.then(shell)
        except Exception as exc:  # noqa: BLE001 - the executor does it again and says why
            log.debug("ssh: early work on %s failed: %s", early.cluster.name, exc)


def _undo(early: _Early, shell: Any) -> None:
    """Stop the early sessions and end the run's record on the cluster (no one will)."""
    from pytest_trtllm_slurm.execution.remote import early_start

    work = early.done
    if isinstance(work, early_start.EarlyRemote):
        early_start.stop_sessions(shell, work)
        try:
            work.runs.finish()
        except Exception as exc:  # noqa: BLE001 - best effort at the end of a run
            log.debug("ssh: ending the early run record failed: %s", exc)
