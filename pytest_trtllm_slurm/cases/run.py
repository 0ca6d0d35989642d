"""Running a case with the plugin's probes, routing, executors and Monitor (no pytest):
``prepare_case`` + ``run_spec``; ``rerun_job_spec`` re-runs a job_spec.json in a fresh work dir."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest_trtllm_slurm.planning.routing as routing
from pytest_trtllm_slurm.cases.model import (
    DEFAULT_TIME_LIMIT,
    REPORTS_ENV,
    CaseDevices,
    CaseInput,
    CaseResult,
    CaseStatus,
    TestDevices,
    Workflow,
    case_argv,
    case_command_of,
    classify,
    decide_status,
    derive_devices,
    model_name_of,
    timeout_seconds,
)
from pytest_trtllm_slurm.cases.parse import HEAD_LINES, MetricCheck, scan_log
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.context import RunContext, discover_local
from pytest_trtllm_slurm.execution.monitor import Monitor, WatchedJob
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.execution.records import BadRecord, SessionFinishRecord, parse_record
from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node import paths
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.records import SESSION_FINISH
from pytest_trtllm_slurm.planning.durations import slurm_time
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import is_masked
from pytest_trtllm_slurm.planning.models import Scenario, target_name, target_of
from pytest_trtllm_slurm.planning.requirements import shell_tokens, words_until_operator
from pytest_trtllm_slurm.planning.settings import ClustersFile, Settings, with_mounts

if TYPE_CHECKING:
    from pytest_trtllm_slurm.transport.ssh.otp_env import HeldCode

Say = Callable[[str], None]
TAIL_ON_FAILURE = 100


def _stderr(message: str) -> None:
    print(f"trtllm-slurm: {message}", file=sys.stderr, flush=True)


@dataclass
class CaseContext(RunContext):
    """What a case run finds once, plus where it speaks and the executors it built."""

    warn: Say = _stderr  # execution-layer warnings
    say: Say = _stderr  # progress (submitted, pending, running)
    executors: dict[str, Executor] = field(default_factory=dict)

    @property
    def work_root(self) -> Path:
        return paths.work_root(self.settings.work_dir, self.rootdir).dir


def discover_context(settings: Settings, clusters: ClustersFile, rootdir: Path, *,
                     warn: Say = _stderr, say: Say = _stderr,
                     held: HeldCode | None = None) -> CaseContext:
    """Probe this machine and discover the local Slurm (uncached)."""
    local, slurm_env = discover_local(rootdir)
    remote_env = None
    if clusters.clusters:
        from pytest_trtllm_slurm.execution.remote.clusters import RemoteClusters

        remote_env = RemoteClusters(paths.work_root(None, rootdir).cache.dir, held=held)
    return CaseContext(settings=settings, clusters=clusters, local=local, slurm_env=slurm_env,
                       rootdir=rootdir, warn=warn, say=say, remote_env=remote_env)


def pytest_args_of(command: str) -> list[str] | None:
    """Arguments of the first ``pytest`` / ``python -m pytest`` in a shell command line."""
    try:
        tokens = shell_tokens(command)
    except ValueError:
        return None
    for i, token in enumerate(tokens):
        base = os.path.basename(token)
        if base in ("pytest", "py.test"):
            return words_until_operator(tokens[i + 1:])
        if base.startswith("python") and tokens[i + 1:i + 3] == ["-m", "pytest"]:
            return words_until_operator(tokens[i + 3:])
    return None


def collect_test_devices(command: str, rootdir: Path, *, timeout: float = 300,
                         say: Say = _stderr) -> TestDevices | None:
    """The largest need among a pytest command's tests (``--trtllm-plan-json``); None when
    it is no pytest command or collection failed (the caller then uses 1 device)."""
    args = pytest_args_of(command)
    if args is None:
        return None
    if any(a in ("-n", "--numprocesses", "-d", "--dist") or a.startswith(("-n", "--dist="))
           for a in args):
        args += ["-n", "0"]  # xdist: the controller itself must collect
    with tempfile.TemporaryDirectory(prefix="trtllm-collect-") as tmp:
        plan = Path(tmp) / "plan.json"
        argv = [sys.executable, "-m", "pytest", *args, "--collect-only", "-q",
                "-p", "no:cacheprovider", "--trtllm-plan-json", str(plan)]
        # a forced local_direct plan: routing then needs no cluster and cannot fail
        env = {**os.environ, "TRTLLM_SLURM_SCENARIO": "local_direct"}
        env.pop("PYTEST_ADDOPTS", None)
        try:
            proc = subprocess.run(argv, cwd=rootdir, env=env, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            say(f"collecting {shlex.join(args)} failed ({exc}); using 1 device")
            return None
        if not plan.is_file():
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            say(f"collecting {shlex.join(args)} failed (exit {proc.returncode}: {tail}); "
                "using 1 device (pass --required-devices N to choose)")
            return None
        rows = json.loads(plan.read_text(encoding="utf-8"))["tests"]  # write_plan_json's
    if not rows:
        say(f"collecting {shlex.join(args)} found no tests; using 1 device")
        return None
    row = max(rows, key=lambda r: (r.get("devices") or 0, r.get("nodes") or 0))
    source = row.get("source") or "default"
    per_node = None if source == "skip_less_mpi_world_size" else (
        row.get("devices_per_node") or None)
    return TestDevices(total=row.get("devices") or 0, per_node=per_node,
                       device_type=row.get("device_type"), source=source)


def executor_for(spec: JobSpec, ctx: CaseContext) -> Executor:
    """The executor of ``spec``'s target, from ``execution.factory``, one per target."""
    from pytest_trtllm_slurm.execution.factory import build_executor

    key = target_name(target_of(spec))
    if key not in ctx.executors:
        ctx.executors[key] = build_executor(spec.scenario, ctx, [spec], warn=ctx.warn)
    return ctx.executors[key]


def close_executors(ctx: CaseContext) -> None:
    for executor in ctx.executors.values():
        executor.close()
    ctx.executors.clear()
    if ctx.remote_env is not None:
        ctx.remote_env.close()


@dataclass
class PreparedCase:
    """A case ready to submit (``spec``), or refused before submission (``refused``)."""

    devices: CaseDevices
    spec: JobSpec | None = None
    refused: CaseResult | None = None
    notes: list[str] = field(default_factory=list)


def _new_work_dir(root: Path, name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    ensure_work_root(root)
    return Path(tempfile.mkdtemp(prefix=f"{name}_{stamp}_", dir=root))


def prepare_case(
    inp: CaseInput,
    ctx: CaseContext,
    *,
    collect: Callable[[str, Path], TestDevices | None] | None = None,
) -> PreparedCase:
    """Classify, count devices, route, and write ``<work_dir>/job_spec.json``."""
    settings = ctx.settings
    classified = classify(inp, base=ctx.rootdir)
    workflow, command = classified.workflow, classified.command
    notes = list(classified.notes)
    collected = None
    needs_collection = (
        workflow is Workflow.PYTEST and not inp.perf_config_yaml
        and inp.required_devices is None
        and (inp.total_required_devices is None or inp.required_devices_per_node is None)
    )
    if needs_collection:
        collected = (collect(command, ctx.rootdir) if collect else
                     collect_test_devices(command, ctx.rootdir, say=ctx.say))
        if collected is None:
            notes.append("device count: the test command was not collected; using 1")
    devices = derive_devices(workflow, command, inp, collected=collected)
    device_type = inp.device_type or settings.device_type or devices.device_type
    req = devices.requirement(device_type)
    update = {k: v for k, v in (("account", inp.account), ("device_type", device_type),
                                ("container_image", inp.container_image)) if v}
    run_settings = settings.model_copy(update=update) if update else settings
    model = model_name_of(workflow, command, inp.model_name or inp.name)
    work_dir = _new_work_dir(ctx.work_root, f"{model}_{workflow.value}")
    decision = routing.route(req, settings=run_settings, local=ctx.local, clusters=ctx.clusters,
                             slurm_env=ctx.slurm_env, partition=inp.partition,
                             remote_env=ctx.remote_env)
    per_node = req.resolve_per_node(decision.target_gpus_per_node)
    case_devices = CaseDevices(required=devices.required, total=req.total, per_node=per_node,
                               nodes=req.nodes(decision.target_gpus_per_node),
                               source=devices.source)
    if decision.scenario is None:
        result = CaseResult(
            status=CaseStatus.ERROR, workflow=workflow.value, command=command,
            model_name=model, devices=case_devices, work_dir=str(work_dir),
            errors=[f"ERROR: nothing can run this case: {decision.reason}"],
            reason=decision.reason, notes=notes,
            log_paths={"result": str(paths.Batch(work_dir).result)},
        )
        write_result(result, work_dir)
        return PreparedCase(case_devices, refused=result, notes=notes)
    on_slurm = decision.scenario in (Scenario.LOCAL_SLURM, Scenario.REMOTE_SLURM)
    account = decision.account if on_slurm else None
    reports = paths.Batch(work_dir).reports
    # the clusters file's values are the cluster's defaults (the case's win)
    table = ctx.clusters.table_of(decision.scenario, decision.cluster, ctx.local.cluster_name)
    # a pytest in the job must not dispatch again, whatever the repo's ini says
    env = {"TRTLLM_SLURM_REMOTE": "0", **(table.job_env if table else {}), **inp.custom_env,
           REPORTS_ENV: str(reports)}
    mounts = [*classified.mounts, *inp.mounts]
    if table and run_settings.container_image:
        mounts = list(with_mounts(mounts, table.container_mounts))
    spec = JobSpec(
        scenario=decision.scenario, workflow=workflow.value, name=f"{model}_{workflow.value}",
        job_name=f"{account or 'trtllm'}.{model}", command=case_argv(command), rerun_argv=[],
        rootdir=str(ctx.rootdir), invocation_dir=str(ctx.rootdir),
        node_count=case_devices.nodes, total_devices=req.total, devices_per_node=per_node,
        device_type=device_type, cluster=decision.cluster, account=account,
        partition=decision.partition,
        time_limit=slurm_time(inp.time_limit, "time limit") or settings.time_limit
        or (table.time_limit if table else None) or DEFAULT_TIME_LIMIT,
        mem_mb=inp.mem_mb, container_image=run_settings.container_image, mounts=mounts, env=env,
        work_dir=str(work_dir), reports_path=str(reports),
        log_path=str(paths.Batch(work_dir).case_log(model, workflow.value)),
        monitor_timeout_seconds=timeout_seconds(inp.monitor_timeout,
                                                settings.monitor_timeout_seconds),
        success_patterns=list(inp.success_patterns), failure_patterns=list(inp.failure_patterns),
        hang_patterns=list(settings.hang_patterns),
        slurm_env=ctx.slurm_env if decision.scenario is Scenario.LOCAL_SLURM else None,
    )
    spec.write()
    return PreparedCase(case_devices, spec, notes=notes)


def run_spec(
    spec: JobSpec,
    ctx: CaseContext,
    *,
    devices: CaseDevices | None = None,
    notes: list[str] | None = None,
    checks: list[MetricCheck] | None = None,
) -> CaseResult:
    """Submit ``spec``, watch it with the Monitor (hang, timeout), then read its log."""
    executor = executor_for(spec, ctx)
    started = time.monotonic()
    handle = executor.submit(spec)
    ctx.say(f"job {handle.job_id} submitted ({spec.scenario.value}"
            + (f", partition {spec.partition}" if spec.partition else "")
            + f"); log: {spec.log_path}")
    monitor = Monitor(spec.hang_patterns, on_change=lambda job: _show(job, ctx.say))
    watched = monitor.add(handle, executor)
    final: JobState | None = None
    records: list[dict] = []
    interrupted = False
    try:
        while monitor.active:
            events = list(monitor.poll())
            for event in events:
                records += event.records
                if event.final is not None:
                    final = event.final
            if not events and monitor.active:
                time.sleep(monitor.poll_interval)
    except KeyboardInterrupt:
        interrupted = True
        monitor.cancel_all()
        final = JobState(status=JobStatus.CANCELLED, reason="interrupted (Ctrl-C): job cancelled")
    ended = time.monotonic()
    assert final is not None
    result = _result(spec, ctx, executor, final, records, watched, started, ended,
                     devices=devices, notes=notes, checks=checks)
    write_result(result, Path(spec.work_dir))
    if interrupted:
        raise CaseInterrupted(result)
    return result


class CaseInterrupted(KeyboardInterrupt):
    """Ctrl-C during a case: the job was cancelled; ``result`` says what was seen."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__("interrupted")
        self.result = result


def _show(job: WatchedJob, say: Say) -> None:
    state = job.state
    if state.status.finished:
        return
    why = f" ({state.reason})" if state.reason else ""
    where = f" on {state.nodelist}" if state.nodelist and state.status is JobStatus.RUNNING \
        else ""
    say(f"job {job.handle.job_id}: {state.status.value}{where}{why}")


def _finish_status(records: list[dict]) -> int | None:
    """The case command's exit status: the last ``session_finish`` record that reads as one
    (checked as every record is: what the target wrote is not trusted)."""
    status = None
    for raw in records:
        if raw.get("type") != SESSION_FINISH:
            continue
        try:
            record = parse_record(raw, frozenset())
        except BadRecord:
            continue
        if isinstance(record, SessionFinishRecord):
            status = record.exitstatus
    return status


def _result(spec: JobSpec, ctx: CaseContext, executor: Executor, final: JobState,
            records: list[dict], watched: WatchedJob, started: float, ended: float, *,
            devices: CaseDevices | None, notes: list[str] | None,
            checks: list[MetricCheck] | None) -> CaseResult:
    shell = executor.shell
    scan = scan_log(lambda offset, limit: shell.read_from(spec.log_path, offset, limit),
                    workflow=spec.workflow, success_patterns=spec.success_patterns,
                    failure_patterns=spec.failure_patterns)
    finished = _finish_status(records)
    exit_code = final.exit_code
    job_status = final.status
    if finished is not None and job_status in (JobStatus.COMPLETED, JobStatus.FAILED):
        exit_code = finished
    status, errors = decide_status(
        spec.workflow, job_status, exit_code, success_hits=scan.success_hits,
        success_patterns=spec.success_patterns, failure_hits=scan.failure_hits,
        oom_line=scan.oom.line if scan.oom else None, reason=final.reason,
    )
    metrics = scan.metrics()
    check_rows = []
    for check in checks or []:
        outcome = check.evaluate(metrics)
        check_rows.append({"check": check.text, "metric": check.metric, "value": outcome.value,
                           "threshold": check.threshold, "op": check.op,
                           "tolerance_pct": check.tolerance_pct, "ok": outcome.ok,
                           "message": outcome.message})
        if not outcome.ok:
            errors.append(f"check failed: {outcome.message}")
            if status is CaseStatus.PASSED:
                status = CaseStatus.FAILED
    def where(hits: dict, patterns: list[str]) -> dict[str, str | None]:
        return {p: f"line {h.line_no}: {h.line.strip()}" if (h := hits.get(p)) else None
                for p in patterns}

    result = CaseResult(
        status=status, exit_code=exit_code, workflow=spec.workflow,
        command=case_command_of(spec.command),
        model_name=spec.name.rsplit("_", 1)[0] if spec.name.endswith(f"_{spec.workflow}")
        else spec.name,
        scenario=spec.scenario.value, job_id=watched.handle.job_id, job_name=spec.job_name,
        nodelist=final.nodelist or watched.handle.nodelist, partition=spec.partition,
        account=spec.account, container_image=spec.container_image,
        devices=devices or CaseDevices(total=spec.total_devices, per_node=spec.devices_per_node,
                                       nodes=spec.node_count),
        elapsed_seconds=round(ended - (watched.started or started), 3),
        wall_seconds=round(ended - started, 3), work_dir=spec.work_dir,
        log_paths={"log": spec.log_path, "job_spec": paths.Batch(spec.work_dir).job_spec,
                   "result": paths.Batch(spec.work_dir).result},
        summary=scan.summary(), metrics=metrics,
        patterns={"success": where(scan.success_hits, spec.success_patterns),
                  "failure": where(scan.failure_hits, spec.failure_patterns)},
        checks=check_rows, errors=errors, reason=final.reason, notes=list(notes or []),
    )
    if status is not CaseStatus.PASSED:
        result.log_head = list(scan.head[:HEAD_LINES])
        result.log_tail = list(scan.tail)[-TAIL_ON_FAILURE:]
        if scan.lines == 0:
            result.errors.append(f"the log {spec.log_path} is empty (the job never started, "
                                 "or its container failed to start)")
    script = paths.Batch(spec.work_dir).sbatch
    if shell.exists(script):
        result.log_paths["script"] = str(script)
    return result


def write_result(result: CaseResult, work_dir: Path) -> Path:
    path = paths.Batch(work_dir).result
    write_atomic(path, result.model_dump_json(indent=2) + "\n", parents=True)
    return path


def run_case(inp: CaseInput, ctx: CaseContext, *,
             collect: Callable[[str, Path], TestDevices | None] | None = None) -> CaseResult:
    """prepare_case + run_spec (+ the case's metric checks)."""
    checks = [MetricCheck.parse(c) for c in inp.checks]
    prepared = prepare_case(inp, ctx, collect=collect)
    if prepared.refused is not None:
        return prepared.refused
    assert prepared.spec is not None
    return run_spec(prepared.spec, ctx, devices=prepared.devices, notes=prepared.notes,
                    checks=checks)


def rerun_spec_copy(spec: JobSpec, *, monitor_timeout_seconds: int | None = None) -> JobSpec:
    """``spec`` with a fresh work dir next to the old one (references moved, files copied)."""
    old = spec.work_dir.rstrip("/")
    new_dir = _new_work_dir(Path(old).parent, f"{spec.name}_rerun")
    new = str(new_dir)

    def moved(value: str) -> str:
        return value.replace(old + "/", new + "/") if (old + "/") in value else (
            new if value == old else value)

    if spec.nodeids_file and Path(spec.nodeids_file).is_file():
        shutil.copy(spec.nodeids_file, moved(spec.nodeids_file))
    update: dict[str, object] = {
        "work_dir": new, "log_path": moved(spec.log_path),
        "reports_path": moved(spec.reports_path),
        "nodeids_file": moved(spec.nodeids_file) if spec.nodeids_file else None,
        "command": [moved(a) for a in spec.command],
        "rerun_argv": [moved(a) for a in spec.rerun_argv],
        "env": {k: moved(v) for k, v in spec.env.items()}}
    if monitor_timeout_seconds is not None:
        update["monitor_timeout_seconds"] = monitor_timeout_seconds
    copy = spec.model_copy(update=update)
    copy.write()
    return copy


def rerun_job_spec(path: Path, ctx: CaseContext, *,
                   monitor_timeout_seconds: int | None = None) -> CaseResult:
    """Re-run a ``job_spec.json`` (written by a case or a plugin batch) as written."""
    try:
        spec = JobSpec.read(path)
    except FileNotFoundError:
        raise ConfigError(f"--job-spec {path}: no such file") from None
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--job-spec {path}: not a valid job_spec.json "
                          f"({str(exc).splitlines()[0]})") from None
    notes = [f"re-run of {path}"]
    masked = [k for k, v in spec.env.items() if is_masked(v)]
    if masked:
        notes.append(f"env {', '.join(masked)} were masked when the spec was written; "
                     "set them in this environment")
        spec = spec.model_copy(update={"env": {k: v for k, v in spec.env.items()
                                               if not is_masked(v)}})
    if spec.slurm_env is None and ctx.slurm_env is not None:
        spec = spec.model_copy(update={"slurm_env": ctx.slurm_env})
    copy = rerun_spec_copy(spec, monitor_timeout_seconds=monitor_timeout_seconds)
    return run_spec(copy, ctx, notes=notes)
