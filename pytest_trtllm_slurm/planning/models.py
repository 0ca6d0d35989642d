"""Pydantic models shared by the planning and execution layers: execution reads only
them, never pytest objects."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Scenario(str, Enum):
    """Where a batch runs."""

    LOCAL_DIRECT = "local_direct"
    LOCAL_DOCKER = "local_docker"
    LOCAL_SLURM = "local_slurm"
    REMOTE_SLURM = "remote_slurm"


# Which executor a batch goes to: its scenario, except that each remote cluster has its own
# (a run may span several clusters, each with its own connection, allocation and sync).
Target = Scenario | tuple[Scenario, str]


def target_of(key: Any) -> Target:
    """The executor of a batch key (anything with ``scenario`` and, maybe, ``cluster``):
    ``(REMOTE_SLURM, cluster)`` for a remote cluster, else the scenario alone."""
    scenario = key.scenario
    cluster = getattr(key, "cluster", None)
    if scenario is Scenario.REMOTE_SLURM and cluster:
        return (scenario, cluster)
    return scenario  # type: ignore[no-any-return]


def target_name(target: Target) -> str:
    """``remote_slurm:NAME`` or the scenario's value: for messages and case keys."""
    if isinstance(target, tuple):
        return f"{target[0].value}:{target[1]}"
    return target.value


class Launch(str, Enum):
    """How the worker pytest is started inside the job."""

    SINGLE = "single"  # one pytest process that sees the whole allocation
    MPI = "mpi"  # one task per device, rank 0 writes reports


class DeviceRequirement(BaseModel):
    """What one test needs. ``per_node`` None means "as many as the target has, up to total"."""

    model_config = ConfigDict(frozen=True)

    total: int = Field(0, ge=0)
    per_node: int | None = Field(None, ge=1)
    device_type: str | None = None
    # skip_device_not_contain([...]): any device whose name contains one of these will do
    device_keywords: tuple[str, ...] = ()
    device_memory_mib: int | None = Field(None, ge=0)
    host_memory_mib: int | None = Field(None, ge=0)
    source: str = "default"

    def resolve_per_node(self, target_gpus_per_node: int | None) -> int:
        """Devices per node on a target with ``target_gpus_per_node`` GPUs per node."""
        if self.total == 0:
            return 0
        if self.per_node is not None:
            return self.per_node
        if not target_gpus_per_node:
            return self.total
        return min(self.total, target_gpus_per_node)

    def nodes(self, target_gpus_per_node: int | None = None) -> int:
        """ceil(total / per node); 1 for CPU tests."""
        per_node = self.resolve_per_node(target_gpus_per_node)  # 0 for CPU tests
        return max(1, math.ceil(self.total / per_node)) if per_node else 1

    @model_validator(mode="after")
    def _per_node_not_above_total(self) -> DeviceRequirement:
        if self.per_node is not None and self.total and self.per_node > self.total:
            raise ValueError(
                f"devices_per_node={self.per_node} is larger than devices={self.total}"
            )
        return self


class LocalEnv(BaseModel):
    """What the environment check found on this machine (execution/probe.py fills it)."""

    gpu_count: int = 0
    device_type: str | None = None  # normalized: "NVIDIA H200" -> "H200"
    gpu_names: list[str] = Field(default_factory=list)
    gpu_memory_mib: int | None = None
    container_engine: str | None = None  # "docker" | "podman" when its daemon answers
    slurm_available: bool = False
    cluster_name: str | None = None  # local Slurm ClusterName
    arch: str = "x86_64"
    notes: list[str] = Field(default_factory=list)  # why a probe came back empty


class RouteDecision(BaseModel):
    """Where one test goes. ``scenario`` None means nothing can serve it (skip or fail)."""

    model_config = ConfigDict(frozen=True)

    scenario: Scenario | None
    cluster: str | None = None  # clusters-file name for remote_slurm / local_slurm
    partition: str | None = None
    account: str | None = None
    target_gpus_per_node: int | None = None
    dispatched: bool = True  # False: runs in this pytest process
    reason: str | None = None  # why it cannot be served (for the skip/fail message)
