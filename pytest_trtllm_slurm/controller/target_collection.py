"""``--trtllm-collect=target``: one collect-only batch on a node of the device type the
run targets, its ``collection.json`` read back and checked (``-k``/``-m`` stay here)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_trtllm_slurm.controller.artefacts import read_whole
from pytest_trtllm_slurm.controller.forwarding import forwarding_plan
from pytest_trtllm_slurm.controller.item_routes import batch_key
from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.execution.monitor import Monitor, log_tail
from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.node.collection import COLLECTION_VERSION
from pytest_trtllm_slurm.node.paths import COLLECTION_FILE, Batch
from pytest_trtllm_slurm.node.paths import work_root as work_root_of
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import DeviceRequirement, target_name, target_of
from pytest_trtllm_slurm.planning.requirements import TestConfig
from pytest_trtllm_slurm.planning.routing import route_item

LOG_LINES = 40
_WHERE = "--trtllm-collect (ini trtllm_collect, env TRTLLM_SLURM_COLLECT)"


class CollectedMarker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class CollectedItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    nodeid: str
    location: tuple[str, int | None, str]
    markers: list[CollectedMarker] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @property
    def file(self) -> str:
        return self.key.split("::", 1)[0]

    @property
    def names(self) -> list[str]:
        return self.key.split("::")[1:]


class CollectedReport(BaseModel):
    """A collector that failed or skipped on the target: its serialized CollectReport."""

    model_config = ConfigDict(extra="forbid")
    nodeid: str
    data: dict[str, Any]


class Collection(BaseModel):
    """``collection.json`` as the controller accepts it (``node.collection`` writes it)."""

    model_config = ConfigDict(extra="forbid")
    v: int
    rootdir: str
    items: list[CollectedItem]
    deselected: list[CollectedItem] = Field(default_factory=list)
    reports: list[CollectedReport] = Field(default_factory=list)
    host: dict[str, str] = Field(default_factory=dict)


class TargetCollection:
    """The target's collection as the placeholders read it."""

    def __init__(self, collection: Collection) -> None:
        self.order = {item.key: index for index, item in enumerate(collection.items)}
        # the suite's own deselection comes first, then this run's (-k, -m, ...)
        self.all_items = [*collection.deselected, *collection.items]
        self.reports = {report.nodeid: report.data for report in collection.reports}


def collect_key(ctx: RunContext) -> BatchKey:
    """Where to collect: one GPU of the run's device type, routed as a test needing it."""
    req = DeviceRequirement(total=1, per_node=1, device_type=ctx.settings.device_type,
                            source="collect")
    route = route_item(req, TestConfig(), ctx)
    key = batch_key(route, TestConfig(), ctx) if route.decision.dispatched else None
    if key is None:
        raise ConfigError(
            f"{_WHERE}=target: no target can collect the tests ("
            f"{route.decision.reason or 'the run routes a one-GPU test to this machine'}); name "
            "one with --slurm-cluster NAME, --device-type TYPE or --trtllm-scenario")
    return key


def describe(key: BatchKey, host: dict[str, str], job_id: str) -> str:
    where = [target_name(target_of(key))]
    if key.partition:
        where.append(f"partition {key.partition}")
    node = host.get("node") or host.get("hostname")
    if node:
        where.append(f"node {node}")
    if host.get("gpu"):
        where.append(host["gpu"])
    elif key.device_type:
        where.append(key.device_type)
    return ", ".join(where) + f" (job {job_id})"


def collect_spec(config: pytest.Config, key: BatchKey, work_root: Path,
                 executor: Executor, settings_time_limit: str | None,
                 monitor_timeout: int) -> JobSpec:
    from pytest_trtllm_slurm.controller.run_loop import (
        key_spec,
        new_work_dir,
        pytest_base_argv,
        worker_cwd,
        worker_env,
    )

    work_dir = new_work_dir(work_root, "collect", datetime.now().strftime("%Y%m%d_%H%M%S"))
    options = forwarding_plan(config)[0]
    argv = pytest_base_argv(config, options=options)
    argv += ["-p", "pytest_trtllm_slurm.node.worker",
             "--trtllm-worker-collect", str(Batch(work_dir).collection),
             "--collect-only", "-o", f"cache_dir={Batch(work_dir).pytest_cache}"]
    here = Path(config.invocation_params.dir)
    argv += [str(here / arg) for arg in config.args]
    return key_spec(
        key, config.rootpath, work_dir, "collect", workflow="collect", name=work_dir.name,
        command=argv, invocation_dir=str(worker_cwd(config)),
        total_devices=key.total_devices, devices_per_node=key.devices_per_node,
        device_type=key.device_type, time_limit=key.time_limit or settings_time_limit,
        mounts=list(key.mounts), env={**worker_env(config), **dict(key.env)},
        monitor_timeout_seconds=monitor_timeout, slurm_env=executor.slurm_env,
    )


def _wait(executor: Executor, spec: JobSpec) -> tuple[JobSpec, str, JobState]:
    monitor = Monitor(spec.hang_patterns, poll_interval=CADENCE.monitor)
    handle = executor.submit(spec)
    monitor.add(handle, executor)
    while True:
        for event in monitor.poll():
            if event.final is not None:
                return handle.spec, handle.job_id, event.final
        time.sleep(CADENCE.monitor)


def collect_on_target(config: pytest.Config, ctx: RunContext,
                      say: Any) -> TargetCollection:
    """Run the collect-only job and return what it collected; else a usage error (its log)."""
    from pytest_trtllm_slurm.controller.session import make_executors

    settings = ctx.settings
    key = collect_key(ctx)
    work_root = work_root_of(settings.work_dir, config.rootpath).dir
    try:
        executors = make_executors(ctx, config, [key])
    except (ConfigError, ExecutionError) as exc:
        raise pytest.UsageError(f"collecting on the target: {exc}") from None
    executor = executors[target_of(key)]
    try:
        say(f"collecting the tests on the target ({target_name(target_of(key))}"
            + (f", partition {key.partition}" if key.partition else "") + "): the suite is not "
            "imported here (--trtllm-collect=target)")
        spec = collect_spec(config, key, work_root, executor, settings.time_limit,
                            settings.monitor_timeout_seconds)
        spec.write()
        try:
            ran, job_id, state = _wait(executor, spec)
        except (ExecutionError, OSError) as exc:
            raise pytest.UsageError(f"the collect job could not run: {exc}") from None
        path = Batch(ran.work_dir).collection
        if not executor.shell.exists(path):
            tail = log_tail(executor, ran.log_path, LOG_LINES)
            raise pytest.UsageError(
                f"collecting on the target failed: job {job_id} ended {state.status.value}"
                + (f" with exit code {state.exit_code}" if state.exit_code is not None else "")
                + f" and wrote no {COLLECTION_FILE}\nlog: {ran.log_path}\n"
                f"--- last {LOG_LINES} lines of the log ---\n{tail}")
        try:
            text = read_whole(executor.shell, path, limit=sys.maxsize).decode("utf-8", "replace")
            collection = Collection.model_validate(json.loads(text))
        except (ValueError, ValidationError) as exc:
            raise pytest.UsageError(f"{path}: not a collection this controller reads "
                                    f"({exc})") from None
        if collection.v != COLLECTION_VERSION:
            raise pytest.UsageError(f"{path}: collection version {collection.v}, this "
                                    f"controller reads {COLLECTION_VERSION} (update the "
                                    "plugin on one side)")
        say(f"{len(collection.items)} tests collected on {describe(key, collection.host, job_id)}"
            "; the run plans and dispatches from that collection")
        return TargetCollection(collection)
    finally:
        for one in executors.values():
            one.close()
