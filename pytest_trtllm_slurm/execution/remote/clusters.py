"""The run's remote clusters: one SSH connection each, and what discovery found there.

Planning (sizing tests) and the executor (sync, submit) share one ``RemoteClusters``, so a
cluster is connected once per run (one one-time code with MFA) and discovered once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.remote.discovery_cache import discovery_cache
from pytest_trtllm_slurm.execution.remote.early_connect import EarlyConnections
from pytest_trtllm_slurm.execution.slurm.client import DEFAULT_TTL, cached_discovery
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.settings import ClusterConfig

if TYPE_CHECKING:
    from pytest_trtllm_slurm.transport.ssh.otp_env import HeldCode

log = logging.getLogger(__name__)


class RemoteClusters:
    """Connections and discoveries of the remote clusters a run touches, made on first use."""

    def __init__(self, cache_dir: Path | None, *, ttl: float = DEFAULT_TTL,
                 shell_factory: Any = None, early: EarlyConnections | None = None,
                 held: HeldCode | None = None) -> None:
        """``held``: the run's TRTLLM_SLURM_OTP (None: the environment's only)."""
        self.cache_dir = cache_dir
        # connections opened before collection (taken on first use) and what was done there
        self.early = early or EarlyConnections()
        self.ttl = ttl if cache_dir is not None else 0.0
        self._shell_factory = shell_factory
        self._held = held
        self._shells: dict[str, Any] = {}
        self._envs: dict[str, SlurmEnv] = {}
        self._failed: dict[str, ConfigError] = {}

    def shell(self, cluster: ClusterConfig) -> Any:
        """The connected shell of ``cluster`` (connected on the first call)."""
        name = cluster.name
        if name not in self._shells:
            if self._shell_factory is not None:
                shell = self._shell_factory(cluster)
            else:
                from pytest_trtllm_slurm.transport.ssh.auth import otp_provider
                from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

                shell = self.early.take(cluster) or shell_for_cluster(
                    cluster, otp_provider=otp_provider(self._held))
            shell.connect()
            self._shells[name] = shell
        return self._shells[name]

    def env(self, cluster: ClusterConfig) -> SlurmEnv:
        """What discovery finds on ``cluster`` (cached); a connection failure is a
        ConfigError naming the cluster and how to plan without connecting."""
        name = cluster.name
        if name in self._envs:
            return self._envs[name]
        if name in self._failed:  # once per run: not one connection attempt per test
            raise self._failed[name]
        try:
            env = self._discover(cluster)
        except ConfigError as exc:  # a setting to fix (host key, ssh_host, ...): as it is
            self._failed[name] = exc
            raise
        except (ExecutionError, OSError) as exc:
            self._failed[name] = ConfigError(
                f"cluster {name!r}: Slurm discovery over SSH ({cluster.ssh_host}) failed: "
                f"{exc}. Fix the connection, or set partition, gpus_per_node and device_type "
                f"in [clusters.{name}] (they are then used as given)")
            raise self._failed[name] from None
        if env.errors:
            log.warning("discovery on cluster %s was partial: %s", name, "; ".join(env.errors))
        self._envs[name] = env
        return env

    __call__ = env  # planning's ``remote_env(cluster)``

    def _discover(self, cluster: ClusterConfig) -> SlurmEnv:
        from pytest_trtllm_slurm.execution.slurm.client import SlurmClient

        def discover() -> SlurmEnv:
            return SlurmClient(self.shell(cluster)).discover()

        if self.cache_dir is None:
            return discover()
        path, key = discovery_cache(self.cache_dir, cluster)

        def after_the_early_work() -> SlurmEnv:
            """Stale: the early connection may be refreshing it (``refresh_discovery``)."""
            self.early.worked(cluster)
            return cached_discovery(path, key, discover, self.ttl)

        return cached_discovery(path, key, after_the_early_work, self.ttl)

    def close(self) -> None:
        for shell in self._shells.values():
            try:
                shell.close()
            except Exception:  # noqa: BLE001 - closing is best effort at the end of a run
                log.debug("closing a remote shell failed", exc_info=True)
        self._shells.clear()
