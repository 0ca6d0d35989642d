"""Validated configuration: the clusters file and the run's resolved settings (the models
and the loader; ``controller.options`` registers the options and builds ``Settings``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import pytest_trtllm_slurm.planning.safe_values as safe_values
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.fields import (  # noqa: F401  (checked: re-exported)
    Argument,
    Argv,
    Env,
    Host,
    MountPath,
    Mounts,
    OneLine,
    SlurmName,
    User,
    checked,
    validation_message,
)
from pytest_trtllm_slurm.planning.models import Scenario

#: TensorRT-LLM's tests find their models through this variable (``llm_models_root()``)
MODELS_ROOT_ENV = "LLM_MODELS_ROOT"

#: TensorRT-LLM's unit tests (``tests/unittest/pytest.ini``): ``gpu2`` / ``gpu4`` say how
#: many GPUs of one node a test uses; ini ``trtllm_marker_devices`` replaces the table
DEFAULT_MARKER_DEVICES: dict[str, int] = {"gpu2": 2, "gpu4": 4}


class ClusterConfig(BaseModel):
    """One ``[clusters.NAME]`` table. Unknown keys are errors (typos must not pass silently)."""

    # built on first validation: a run without a clusters file never needs it
    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str = ""
    ssh_host: Host | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535)
    user: User | None = None
    identity_file: OneLine | None = None
    known_hosts: OneLine | None = None
    accept_new_host_key: bool = False
    mfa: bool | None = None  # None: unknown, try key first and fall back if asked
    transport: Literal["paramiko", "openssh"] = "paramiko"
    otp_command: str | None = None
    user_root_dir: Argument | None = None  # `cd DIR`: not an option
    remote_cwd: Argument | None = None
    python: Argument = "python3"  # the interpreter that runs the worker pytest on the cluster
    # git: the snapshot over the run's SSH connection (a bundle); git-origin: through a temp
    # branch on origin (the seed's way); none: a shared file system
    sync: Literal["git", "git-origin", "none"] = "none"
    sync_secrets: bool = False  # also ship untracked files that look like secrets (.env, keys)
    account: SlurmName | None = None
    partition: SlurmName | None = None
    device_type: OneLine | None = None
    gpus_per_node: int | None = Field(None, ge=1)
    container_image: Argument | None = None
    container_runtime: Literal["pyxis", "podman", "docker", "none"] = "none"
    # pyxis + persistent allocation: run once per node, --container-writable, in the repo
    container_install_command: str | None = Field(None, min_length=1)
    mounts: Mounts = Field(default_factory=list)
    models_root: MountPath | None = None
    env: Env = Field(default_factory=dict)
    # the default walltime of this cluster's jobs (a marker's or the run's option wins)
    time_limit: OneLine | None = None
    build_project: bool = False
    build_cmd: str | None = None
    # the prefix each rank of a multi-node test runs (``["trtllm-llmapi-launch"]``): the
    # batch gets one task per GPU, and the launcher runs pytest on rank 0 only
    launcher: Argv = Field(default_factory=list)

    @field_validator("time_limit", mode="before")
    @classmethod
    def _normalize_time(cls, value: object) -> object:
        from pytest_trtllm_slurm.planning.durations import slurm_time

        try:
            return slurm_time(value, "time_limit")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None  # named with the file and the cluster

    @property
    def is_remote(self) -> bool:
        return self.ssh_host is not None

    @property
    def job_env(self) -> dict[str, str]:
        """The env of every test on this cluster (a marker's wins): LLM_MODELS_ROOT =
        ``models_root`` (where TensorRT-LLM's tests find models), then the ``env`` table."""
        return {**({MODELS_ROOT_ENV: self.models_root} if self.models_root else {}),
                **self.env}

    @property
    def container_mounts(self) -> list[str]:
        """What every container batch here mounts besides its own: ``mounts``, models root (ro)."""
        root = [f"{self.models_root}:{self.models_root}:ro"] if self.models_root else []
        return [*self.mounts, *root]


def mount_target(text: str) -> str:
    """Where a ``SRC[:DST[:FLAGS]]`` mount appears in the container (DST, else SRC)."""
    parts = text.split(":")
    return parts[1] if len(parts) > 1 and parts[1] else parts[0]


def with_mounts(own: Sequence[str], more: Sequence[str]) -> tuple[str, ...]:
    """``own`` (a batch's own mounts, which win), then those of ``more`` (the cluster's)
    at a container path not taken yet: docker refuses two mounts at one path."""
    taken = {mount_target(m).rstrip("/") for m in own}
    out = list(own)
    for mount in more:
        target = mount_target(mount).rstrip("/")
        if target not in taken:
            taken.add(target)
            out.append(mount)
    return tuple(out)


class ClustersFile(BaseModel):
    """The whole clusters file."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    path: str | None = None
    clusters: dict[str, ClusterConfig] = Field(default_factory=dict)

    def find(self, name: str) -> ClusterConfig | None:
        """The cluster named ``name`` (case-insensitive), or None."""
        return next((c for key, c in self.clusters.items() if key.lower() == name.lower()), None)

    def table_of(self, scenario: Scenario | None, cluster: str | None,
                 local_name: str | None) -> ClusterConfig | None:
        """The table of the Slurm cluster a batch runs on (its defaults); None for other
        targets or without one."""
        if scenario not in (Scenario.LOCAL_SLURM, Scenario.REMOTE_SLURM):
            return None
        name = cluster or local_name
        return self.find(name) if name else None

    def get(self, name: str) -> ClusterConfig:
        cluster = self.find(name)
        if cluster is not None:
            return cluster
        raise ConfigError(self.unknown_message(name))

    def unknown_message(self, name: str) -> str:
        known = ", ".join(sorted(self.clusters)) or "none"
        where = self.path or "no clusters file found"
        return (
            f"unknown cluster {name!r} (--slurm-cluster): clusters defined in {where}: {known}. "
            "Add a [clusters.NAME] table to the clusters file (--trtllm-config PATH, "
            "trtllm-slurm.toml at the rootdir, or ~/.config/trtllm-slurm/clusters.toml)."
        )


def default_clusters_paths(rootdir: Path) -> list[Path]:
    """Where the clusters file is looked for when --trtllm-config is not given."""
    return [
        rootdir / "trtllm-slurm.toml",
        Path.home() / ".config" / "trtllm-slurm" / "clusters.toml",
    ]


def no_clusters() -> ClustersFile:
    """The empty clusters file (nothing to validate: builds neither model's validator)."""
    return ClustersFile.model_construct()


def load_clusters_file(path: Path | None, rootdir: Path) -> ClustersFile:
    """Load and validate the clusters file; an absent default file means no clusters."""
    if path is None:
        path = next((p for p in default_clusters_paths(rootdir) if p.is_file()), None)
        if path is None:
            return no_clusters()
    elif not path.is_file():
        raise ConfigError(f"clusters file {path} (--trtllm-config) does not exist")
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"clusters file {path} is not valid TOML: {exc}") from None
    unknown_top = set(raw) - {"clusters"}
    if unknown_top:
        raise ConfigError(
            f"clusters file {path}: unknown top-level key(s) {sorted(unknown_top)}; "
            "expected only [clusters.NAME] tables"
        )
    clusters: dict[str, ClusterConfig] = {}
    for name, table in (raw.get("clusters") or {}).items():
        problem = safe_values.slurm_name_problem(name)
        if problem:
            raise ConfigError(f"clusters file {path}: cluster name {name!r} {problem} (it "
                              "names the cluster's jobs); rename the [clusters.NAME] table")
        if not isinstance(table, dict):
            raise ConfigError(f"clusters file {path}: clusters.{name} must be a table")
        try:
            clusters[name] = ClusterConfig(name=name, **table)
        except ValidationError as exc:
            problems = validation_message(exc, prefix=f"clusters.{name}.", found_unknown=False)
            raise ConfigError(f"clusters file {path}: {problems}") from None
    return ClustersFile(path=str(path), clusters=clusters)


class Settings(BaseModel):
    """The run's resolved settings (after CLI > env > ini > cluster file > default)."""

    model_config = ConfigDict(extra="forbid")

    remote: bool = False
    slurm_cluster: str | None = None
    device_type: str | None = None
    scenario: Literal["auto"] | Scenario = "auto"
    dispatch: Literal["needed", "all"] = "needed"
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    container_image: str | None = None
    container_engine: Literal["auto", "docker", "podman"] = "auto"
    perf_config_yaml: str | None = None
    perf_config_dir: str | None = None
    config_path: str | None = None
    work_dir: str | None = None
    monitor_timeout_seconds: int = 3600
    persistent: bool = True
    warm_workers: bool = True
    alloc_time_limit: str = "04:00:00"
    alloc_nodes: int | None = None
    negotiate_walltime: bool = False
    release_allocation: bool = False
    plan: bool = False
    plan_json: str | None = None
    timeline: str | None = None
    summary_json: str | None = None
    keep_order: bool = False
    max_retries: int = 1
    unsatisfied: Literal["skip", "fail"] = "skip"
    collect: Literal["here", "target"] = "here"
    hang_patterns: list[str] = Field(default_factory=lambda: ["hang detected"])
    # TensorRT-LLM's test-db: folder, contexts, terms (planning/testdb.py)
    test_db: str | None = None
    test_db_contexts: list[str] = Field(default_factory=list)
    test_db_terms: list[str] = Field(default_factory=list)
    # named markers -> devices on one node (ini trtllm_marker_devices)
    marker_devices: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_MARKER_DEVICES))

    def uses_local_slurm(self) -> bool:
        """Whether this run can read this machine's Slurm: not when every test is forced to
        run here (``--trtllm-scenario=local_direct`` or ``local_docker``) and no cluster,
        test-db or allocation release names one. Its probe (``scontrol show config``) waits
        10 s for a controller that does not answer."""
        return not (self.scenario in (Scenario.LOCAL_DIRECT, Scenario.LOCAL_DOCKER)
                    and not self.slurm_cluster and not self.test_db
                    and not self.release_allocation)
