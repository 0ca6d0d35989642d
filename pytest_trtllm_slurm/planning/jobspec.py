"""The job manifests: SlurmEnv (what discovery found) and JobSpec (one batch), which is
written to ``<work_dir>/job_spec.json``: a job can be re-run from that file alone."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from pytest_trtllm_slurm.node.assignment import Assignment, pairs
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.node.protocol import WORKER_OUTPUTS_FLAG
from pytest_trtllm_slurm.planning.fields import (
    Argument,
    Argv,
    Env,
    JobName,
    Mounts,
    OneLine,
    SlurmName,
)
from pytest_trtllm_slurm.planning.masking import mask_argv, mask_env
from pytest_trtllm_slurm.planning.models import Launch, Scenario


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

    def partition_named(self, name: str | None) -> PartitionInfo | None:
        """The partition called ``name`` (None: no name, or discovery did not see it)."""
        return next((p for p in self.partitions if name and p.name == name), None)


class JobSpec(BaseModel):
    """One batch of tests (or one case) to run somewhere; its field types are the last check
    of what reaches a script (a hand-edited job_spec.json too)."""

    model_config = ConfigDict(extra="forbid")

    scenario: Scenario
    workflow: str = "pytest"
    name: str
    job_name: JobName
    nodeids: list[str] = Field(default_factory=list)
    # node id -> what identifies the test on the worker (``node.item_key``); none: the node id
    item_keys: dict[str, str] = Field(default_factory=dict)
    nodeids_file: OneLine | None = None
    command: Argv = Field(default_factory=list)
    rerun_argv: Argv = Field(default_factory=list)  # pytest argv to re-run one node id
    rootdir: OneLine
    invocation_dir: OneLine | None = None
    node_count: int = 1
    total_devices: int = 0
    devices_per_node: int = 0
    device_type: OneLine | None = None
    launch: Launch = Launch.SINGLE
    # what each rank of a launch=mpi batch runs before the command (trtllm-llmapi-launch);
    # empty: the executor's (from its construction), if any
    launcher_prefix: Argv = Field(default_factory=list)
    cluster: OneLine | None = None
    account: SlurmName | None = None
    partition: SlurmName | None = None
    time_limit: OneLine | None = None
    mem_mb: int | None = None  # memory per node (Slurm --mem); None: the scheduler's default
    container_image: Argument | None = None
    mounts: Mounts = Field(default_factory=list)
    env: Env = Field(default_factory=dict)
    work_dir: OneLine
    log_path: OneLine
    reports_path: OneLine
    remote_work_dir: OneLine | None = None
    monitor_timeout_seconds: int = 3600
    success_patterns: list[str] = Field(default_factory=list)
    failure_patterns: list[str] = Field(default_factory=list)
    hang_patterns: list[str] = Field(default_factory=lambda: ["hang detected"])
    build_arch: str | None = None
    slurm_env: SlurmEnv | None = None

    def assignment(self) -> Assignment:
        """The batch's tests as the worker gets them: (node id, key), in order."""
        return pairs(self.nodeids, self.item_keys)

    def serves_by_fork(self) -> bool:
        """Whether a warm session's fork can run it: pytest node ids, one process, no
        container, no launcher prefix, no output paths of its own (a session's options
        are fixed)."""
        if self.workflow != "pytest" or not self.nodeids or not self.rerun_argv:
            return False
        if self.launcher_prefix or any(t.startswith(WORKER_OUTPUTS_FLAG) for t in self.command):
            return False
        return not self.container_image and (self.launch is not Launch.MPI or
                                             (self.total_devices or 0) <= 1)

    # (the argv it was made from, ``mask_argv`` of it): see ``masked_rerun_argv``
    _masked_rerun: tuple[tuple[str, ...], tuple[str, ...]] | None = PrivateAttr(default=None)

    def masked_rerun_argv(self) -> tuple[str, ...]:
        """``mask_argv(rerun_argv)``, made once per batch, not once per replayed test (every
        test's re-run line starts with it); a copy with another ``rerun_argv`` masks anew."""
        argv = tuple(self.rerun_argv)
        cached = self._masked_rerun
        if cached is None or cached[0] != argv:
            cached = self._masked_rerun = (argv, tuple(mask_argv(argv)))
        return cached[1]

    def masked(self) -> JobSpec:
        """A copy safe to write: env values not on the allow-list and the values of
        secret-named options masked (``masking.mask_env``, ``masking.mask_argv``)."""
        return self.model_copy(update={"env": mask_env(self.env),
                                       "command": mask_argv(self.command),
                                       "rerun_argv": mask_argv(self.rerun_argv)})

    def write(self, path: Path | None = None) -> Path:
        """Write job_spec.json atomically, mode 0600, secrets masked."""
        target = path or Batch(Path(self.work_dir)).job_spec
        write_atomic(target, self.text(), parents=True)
        return target

    def text(self) -> str:
        """job_spec.json's text: secrets masked."""
        return self.masked().model_dump_json(indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
