"""The job manifests: SlurmEnv (what discovery found) and JobSpec (one batch).

A JobSpec is the single source of truth for an executor: it is written to
``<work_dir>/job_spec.json`` and a job can be re-run from that file alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

import pytest_trtllm_slurm.planning.safe_values as safe_values
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.planning.masking import mask_env
from pytest_trtllm_slurm.planning.models import Launch, Scenario
from pytest_trtllm_slurm.planning.settings import checked


class PartitionInfo(BaseModel):
    """One Slurm partition as discovery saw it."""

    name: str
    state: str | None = None
    time_limit: str | None = None
    nodes: list[str] = Field(default_factory=list)
    arch: str | None = None
    gres: str | None = None
    gpu_type: str | None = None
    gpus_per_node: int = 0
    requires_gres: bool = False
    default: bool = False


class PmixInfo(BaseModel):
    available: list[str] = Field(default_factory=list)
    preferred: str | None = None


class SlurmEnv(BaseModel):
    """What detect_slurm_env.sh reports, as a model."""

    cluster_name: str | None = None
    user: str | None = None
    default_account: str | None = None
    accounts: list[str] = Field(default_factory=list)
    default_partition: str | None = None
    partitions: list[PartitionInfo] = Field(default_factory=list)
    pmix: PmixInfo = Field(default_factory=PmixInfo)
    slurm_version: str | None = None
    errors: list[str] = Field(default_factory=list)

    def partition(self, name: str) -> PartitionInfo | None:
        return next((p for p in self.partitions if p.name == name), None)


class JobSpec(BaseModel):
    """One batch of tests (or one case) to run somewhere."""

    model_config = ConfigDict(extra="forbid")

    scenario: Scenario
    workflow: str = "pytest"
    name: str
    job_name: str
    nodeids: list[str] = Field(default_factory=list)
    nodeids_file: str | None = None
    command: list[str] = Field(default_factory=list)
    rerun_argv: list[str] = Field(default_factory=list)  # pytest argv to re-run one node id
    rootdir: str
    invocation_dir: str | None = None
    node_count: int = 1
    total_devices: int = 0
    devices_per_node: int = 0
    device_type: str | None = None
    launch: Launch = Launch.SINGLE
    cluster: str | None = None
    account: str | None = None
    partition: str | None = None
    time_limit: str | None = None
    mem_mb: int | None = None  # memory per node (Slurm --mem); None: the scheduler's default
    container_image: str | None = None
    mounts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    work_dir: str
    log_path: str
    reports_path: str
    remote_work_dir: str | None = None
    monitor_timeout_seconds: int = 3600
    success_patterns: list[str] = Field(default_factory=list)
    failure_patterns: list[str] = Field(default_factory=list)
    hang_patterns: list[str] = Field(default_factory=lambda: ["hang detected"])
    build_arch: str | None = None
    slurm_env: SlurmEnv | None = None

    # The last line of defence: planning refuses these values with their source; a spec
    # read back from a job_spec.json that was edited by hand is checked here too.
    @field_validator("account", "partition")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        return checked(value, safe_values.slurm_name_problem)

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, value: str) -> str:
        return checked(value, safe_values.job_name_problem)

    @field_validator("container_image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return checked(value, safe_values.argument_problem)

    @field_validator("rootdir", "invocation_dir", "work_dir", "log_path", "reports_path",
                     "nodeids_file", "remote_work_dir", "time_limit", "device_type", "cluster")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        return checked(value, safe_values.line_problem)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        return checked(value, safe_values.mounts_problem)

    @field_validator("command", "rerun_argv")
    @classmethod
    def _argv(cls, value: list[str]) -> list[str]:
        return checked(value, safe_values.argv_problem)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return checked(value, safe_values.env_problem)

    def masked(self) -> JobSpec:
        """A copy safe to write: secret env values masked (``masking.mask_env``)."""
        return self.model_copy(update={"env": mask_env(self.env)})

    def write(self, path: Path | None = None) -> Path:
        """Write job_spec.json atomically, mode 0600, secrets masked."""
        target = path or Path(self.work_dir) / "job_spec.json"
        write_atomic(target, self.masked().model_dump_json(indent=2) + "\n", parents=True)
        return target

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
