"""TensorRT-LLM cases (a test, bench, eval or custom command run as one job), the pure half of
``trtllm-slurm run`` and case items: classify, size, build the JobSpec, decide (docs/cases.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.outcome import JobStatus
from pytest_trtllm_slurm.node import records
from pytest_trtllm_slurm.planning.durations import parse_time_limit
from pytest_trtllm_slurm.planning.fields import (
    Argument,
    Env,
    Mounts,
    OneLine,
    OneOrMany,
    SlurmName,
    validation_message,
)
from pytest_trtllm_slurm.planning.models import DeviceRequirement


class Workflow(str, Enum):
    PYTEST = "pytest"
    BENCH = "bench"
    EVAL = "eval"
    CUSTOM = "custom"


class CaseStatus(str, Enum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    HANG_DETECTED = "HANG_DETECTED"
    BUILD_FAILED = "BUILD_FAILED"
    ERROR = "ERROR"


#: exit code of ``trtllm-slurm run`` per status (4 stays every command's usage/config error)
EXIT_CODES: dict[CaseStatus, int] = {
    CaseStatus.PASSED: 0, CaseStatus.FAILED: 1, CaseStatus.ERROR: 2, CaseStatus.TIMEOUT: 3,
    CaseStatus.CANCELLED: 5, CaseStatus.OUT_OF_MEMORY: 6, CaseStatus.HANG_DETECTED: 7,
    CaseStatus.BUILD_FAILED: 8}
EXIT_CONFIG = 4
EXIT_INTERRUPTED = 130

DEFAULT_TIME_LIMIT = "02:00:00"  # seed: Slurm walltime default
WORKFLOW_INPUTS = ("custom_script", "custom_cmd", "bench_cmd", "eval_cmd", "test_cmd")
REPORTS_ENV = "TRTLLM_CASE_REPORTS"
WRAPPER_NAME = "trtllm-case"
# the worker plugin's last record (``node.records.session_finish``), printf's %d the status
FINISH_FORMAT = json.dumps(records.session_finish(0)).replace(
    '"exitstatus": 0}', '"exitstatus": %d}')
# runs the case command in a child shell (an ``exit`` in it cannot skip the record),
# then appends its exit status to reports.jsonl as the worker plugin's last record
CASE_WRAPPER = (
    'bash -c "$1"; rc=$?; '
    'if [ -n "${' + REPORTS_ENV + ':-}" ]; then '
    "printf " + shlex.quote(FINISH_FORMAT + "\\n") + ' "$rc" '
    '>> "$' + REPORTS_ENV + '"; fi; '
    'exit "$rc"'
)


class CaseInput(BaseModel):
    """One case as a caller gives it (``trtllm-slurm run`` flags, a case file entry)."""

    model_config = ConfigDict(extra="forbid")

    # the trtllm_slurm marker's checks (by their types): these reach #SBATCH lines and argv
    name: OneLine | None = None
    test_cmd: str | None = None
    bench_cmd: str | None = None
    eval_cmd: str | None = None
    custom_cmd: str | None = None
    custom_script: str | None = None
    custom_env: Env = Field(default_factory=dict)
    perf_config_yaml: OneLine | None = None
    model_name: OneLine | None = None
    required_devices: int | None = Field(default=None, ge=0)
    total_required_devices: int | None = Field(default=None, ge=0)
    required_devices_per_node: int | None = Field(default=None, ge=1)
    monitor_timeout: str | None = None  # 1h, 30m, 3600s, HH:MM:SS
    time_limit: OneLine | None = None  # Slurm walltime
    mem_mb: int | None = Field(default=None, ge=1)  # memory per node (Slurm --mem)
    success_patterns: Annotated[list[str], OneOrMany] = Field(default_factory=list)
    failure_patterns: Annotated[list[str], OneOrMany] = Field(default_factory=list)
    partition: SlurmName | None = None
    account: SlurmName | None = None
    device_type: OneLine | None = None
    container_image: Argument | None = None
    mounts: Annotated[Mounts, OneOrMany] = Field(default_factory=list)
    checks: Annotated[list[str], OneOrMany] = Field(default_factory=list)  # metric checks

    @field_validator("custom_env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        if isinstance(value, (str, list, tuple)):
            return parse_custom_env([value] if isinstance(value, str) else value)
        return value

    @field_validator("checks")
    @classmethod
    def _checks(cls, value: list[str]) -> list[str]:
        from pytest_trtllm_slurm.cases.parse import MetricCheck

        for text in value:
            MetricCheck.parse(text)  # a ConfigError names the check and the syntax
        return value

    @classmethod
    def build(cls, where: str, **fields: Any) -> CaseInput:
        """Validated input; a bad field is a ConfigError naming ``where``."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            problems = validation_message(exc, found_unknown=False)
            raise ConfigError(f"{where}: {problems}") from None


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_custom_env(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs; each item may hold several, space separated (shell quoting)."""
    env: dict[str, str] = {}
    for item in items:
        try:
            words = shlex.split(str(item))
        except ValueError as exc:
            raise ConfigError(f"custom env {item!r}: {exc}; expected KEY=VALUE pairs") from None
        for word in words:
            key, sep, value = word.partition("=")
            if not sep or not _ENV_NAME.match(key):
                raise ConfigError(f"custom env {word!r}: expected KEY=VALUE with KEY a shell "
                                  "variable name, e.g. BATCH_SIZE=32")
            env[key] = value
    return env


class Classified(BaseModel):
    workflow: Workflow
    command: str  # the shell command line that runs in the job
    mounts: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def classify(inp: CaseInput, *, base: Path | None = None) -> Classified:
    """The workflow and command of ``inp`` (custom > bench > eval > pytest)."""
    given = [name for name in WORKFLOW_INPUTS if (getattr(inp, name) or "").strip()]
    groups = {"custom" if n.startswith("custom") else n for n in given}
    if len(groups) > 1:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in given)
        raise ConfigError(f"{flags}: these are mutually exclusive; give one of --test-cmd, "
                          "--bench-cmd, --eval-cmd, --custom-cmd / --custom-script")
    if not given:
        raise ConfigError("no command: give one of --test-cmd, --bench-cmd, --eval-cmd, "
                          "--custom-cmd or --custom-script")
    notes: list[str] = []
    if inp.custom_script:
        script = Path(inp.custom_script).expanduser()
        if not script.is_absolute():
            script = (base or Path.cwd()) / script
        if not script.is_file():
            raise ConfigError(f"--custom-script {inp.custom_script}: {script} is not a file")
        if inp.custom_cmd:
            notes.append("--custom-script takes precedence over --custom-cmd (ignored)")
        folder = str(script.parent)
        return Classified(workflow=Workflow.CUSTOM, command=f"bash {shlex.quote(str(script))}",
                          mounts=[f"{folder}:{folder}"], notes=notes)
    workflow, command = next((w, c) for w, c in (
        (Workflow.CUSTOM, inp.custom_cmd), (Workflow.BENCH, inp.bench_cmd),
        (Workflow.EVAL, inp.eval_cmd), (Workflow.PYTEST, inp.test_cmd)) if c)
    return Classified(workflow=workflow, command=command.strip())


class TestDevices(BaseModel):
    """What collecting a pytest command found (the plugin's plan row of its largest test)."""

    __test__ = False  # not a test class

    total: int = Field(ge=0)
    per_node: int | None = None  # None: may span nodes (skip_less_mpi_world_size)
    device_type: str | None = None
    source: str = "collected"


class DeviceCounts(BaseModel):
    """The seed's required / total / per-node devices of one case."""

    required: int
    total: int
    per_node: int | None  # None: as many per node as the target has (spans nodes)
    source: str
    device_type: str | None = None

    def requirement(self, device_type: str | None = None) -> DeviceRequirement:
        try:
            return DeviceRequirement(total=self.total,
                                     per_node=self.per_node if self.total else None,
                                     device_type=device_type or self.device_type,
                                     source=self.source)
        except ValidationError as exc:
            raise ConfigError(
                f"devices: total {self.total}, per node {self.per_node}: "
                f"{exc.errors()[0]['msg']}; expected --required-devices-per-node <= "
                "--total-required-devices"
            ) from None


_PERF_ID = re.compile(r"test_e2e\[([^\]\s]+)\]")


def perf_label(command: str) -> str | None:
    """The perf-sanity id of the last ``test_e2e[<id>]`` in a test command."""
    found = _PERF_ID.findall(command)
    return found[-1] if found else None


def derive_devices(
    workflow: Workflow,
    command: str,
    inp: CaseInput,
    *,
    collected: TestDevices | None = None,
) -> DeviceCounts:
    """Device counts per the seed's table; ``collected`` is what collecting a pytest
    command found (None: not collected, or it failed: 1 device)."""
    import pytest_trtllm_slurm.planning.perf_sanity as perf
    import pytest_trtllm_slurm.planning.requirements as req

    total_x, per_node_x = inp.total_required_devices, inp.required_devices_per_node
    if total_x is not None and per_node_x is not None:
        return DeviceCounts(required=inp.required_devices if inp.required_devices is not None
                            else total_x, total=total_x, per_node=per_node_x or None,
                            source="explicit")
    cap: int | None = None  # the source's devices per node (None: all on one node)
    spread = False  # ranks spread as the target's nodes allow
    device_type = None
    if workflow is Workflow.BENCH:
        tp, pp = req.parse_bench_command(command)
        required, source = tp * pp, f"trtllm-bench --tp {tp} --pp {pp}"
    elif workflow is Workflow.EVAL:
        tp, pp = req.parse_eval_command(command)
        required, source = tp * pp, f"trtllm-eval --tp_size {tp} --pp_size {pp}"
    elif workflow is Workflow.PYTEST and inp.perf_config_yaml:
        label = perf_label(command)
        if label is None:
            raise ConfigError(f"--perf-config-yaml {inp.perf_config_yaml}: the test command "
                              f"{command!r} names no perf-sanity test; expected "
                              "test_e2e[<prefix>-<config>[-<server>]]")
        path = Path(inp.perf_config_yaml).expanduser()
        case = perf.parse_perf_case(label, f"test_e2e[{label}]")
        required, cap = perf.perf_requirement(case, perf.load_perf_yaml(path), path,
                                              f"test_e2e[{label}]")
        source = f"perf_yaml:{path}"
    elif workflow is Workflow.PYTEST and collected is not None:
        if collected.source == "default":  # no device marker: the seed's default
            required, source = 1, "default (no device marker on the test)"
        else:
            required, source = collected.total, f"{collected.source} (collected)"
            cap, device_type = collected.per_node, collected.device_type
            spread = cap is None  # skip_less_mpi_world_size
    else:
        required, source = 1, "default"
    if inp.required_devices is not None:
        required, source = inp.required_devices, "explicit"
        cap, spread, device_type = None, False, None
    total = total_x if total_x is not None else required
    per_node = per_node_x if per_node_x is not None else (
        None if spread else min(cap or total, total) or None)
    return DeviceCounts(required=required, total=total, per_node=per_node, source=source,
                        device_type=device_type)


def model_name_of(workflow: Workflow, command: str, given: str | None = None) -> str:
    """A short name for the job and work dir: given, else the ``--model`` value (bench,
    eval, custom), the perf-sanity id or test file (pytest), the script or program
    (custom); sanitized to ``[A-Za-z0-9_.-]``."""
    name = given
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if not name and workflow is not Workflow.PYTEST:
        for i, word in enumerate(words):
            if word in ("--model", "--model_path") and i + 1 < len(words):
                name = os.path.basename(words[i + 1].rstrip("/"))
            elif word.startswith(("--model=", "--model_path=")):
                name = os.path.basename(word.split("=", 1)[1].rstrip("/"))
    if not name and workflow is Workflow.PYTEST:
        test_file = next((w for w in words if ".py" in w), None)
        name = perf_label(command) or (Path(test_file.split("::")[0]).stem if test_file
                                       else None)
    if not name and workflow is Workflow.CUSTOM and words:
        runners = ("bash", "sh", "python", "python3")
        name = Path(words[1] if words[0] in runners and len(words) > 1 else words[0]).stem
    clean = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name or workflow.value).strip("_.-")
    return (clean or workflow.value)[:60]


def case_argv(command: str) -> list[str]:
    """The job's argv for a case command line (never joined into a larger shell string)."""
    return ["bash", "-c", CASE_WRAPPER, WRAPPER_NAME, command]


def case_command_of(argv: list[str]) -> str:
    """The case command line inside ``case_argv`` (else the argv, shell-quoted)."""
    if len(argv) == 5 and argv[:2] == ["bash", "-c"] and argv[3] == WRAPPER_NAME:
        return argv[4]
    return shlex.join(argv)


def timeout_seconds(text: str | None, default: int) -> int:
    if text is None:
        return default
    seconds = parse_time_limit(str(text), what="monitor timeout")
    if seconds <= 0:
        raise ConfigError(f"monitor timeout {text!r}: expected a positive duration")
    return seconds


_PYTEST_ERROR_CODES = {
    2: "pytest was interrupted (or collection failed: check the first lines for ImportError)",
    3: "pytest hit an internal error",
    4: "pytest usage error (bad option or path)",
    5: "pytest collected no tests",
}
_SHELL_ERROR_CODES = {126: "the command could not be executed (exit 126)",
                      127: "command not found (exit 127)"}
_JOB_TO_CASE = {
    JobStatus.TIMEOUT: CaseStatus.TIMEOUT,
    JobStatus.HANG_DETECTED: CaseStatus.HANG_DETECTED,
    JobStatus.OUT_OF_MEMORY: CaseStatus.OUT_OF_MEMORY,
    JobStatus.CANCELLED: CaseStatus.CANCELLED,
    JobStatus.PREEMPTED: CaseStatus.CANCELLED,  # seed: CANCELLED = preempted or cancelled
    JobStatus.BUILD_FAILED: CaseStatus.BUILD_FAILED,
    JobStatus.NODE_FAIL: CaseStatus.ERROR,
    JobStatus.ERROR: CaseStatus.ERROR,
}


def decide_status(
    workflow: str,
    job_status: JobStatus,
    exit_code: int | None,
    *,
    success_hits: Mapping[str, Any] | None = None,
    success_patterns: Iterable[str] = (),
    failure_hits: Mapping[str, Any] | None = None,
    oom_line: str | None = None,
    reason: str | None = None,
) -> tuple[CaseStatus, list[str]]:
    """The case status and the reasons behind it: the monitor's or scheduler's verdict
    stands; exit 0 is PASSED unless the patterns say otherwise; a non-zero exit is
    OUT_OF_MEMORY (a log signature), ERROR (126/127, a pytest exit 2-5) or FAILED."""
    errors: list[str] = []
    success_hits = success_hits or {}
    failure_hits = failure_hits or {}
    patterns = list(success_patterns)
    for pattern, hit in failure_hits.items():
        where = f"line {hit.line_no}: {hit.line.strip()}" if hasattr(hit, "line_no") else hit
        errors.append(f"failure pattern {pattern!r} matched {where}")
    if job_status in _JOB_TO_CASE:
        status = _JOB_TO_CASE[job_status]
        errors.insert(0, f"{status.value}: {reason or job_status.value}")
        return status, errors
    if job_status is JobStatus.COMPLETED and exit_code in (0, None):  # no code: as 0
        if failure_hits:
            return CaseStatus.FAILED, errors
        if patterns and not success_hits:
            shown = ", ".join(repr(p) for p in patterns)
            return CaseStatus.FAILED, [f"exit code 0, but no success pattern ({shown}) "
                                       "appeared in the log"]
        return CaseStatus.PASSED, []
    code_text = f"exit code {exit_code}" if exit_code is not None else "no exit code"
    detail = f"{code_text}" + (f" ({reason})" if reason else "")
    if oom_line is not None:
        return CaseStatus.OUT_OF_MEMORY, [f"OUT_OF_MEMORY: {detail}; the log says: "
                                          f"{oom_line.strip()}", *errors]
    if exit_code in _SHELL_ERROR_CODES:
        return CaseStatus.ERROR, [f"ERROR: {_SHELL_ERROR_CODES[exit_code]}", *errors]
    if workflow == Workflow.PYTEST.value and exit_code in _PYTEST_ERROR_CODES:
        return CaseStatus.ERROR, [f"ERROR: {detail}: {_PYTEST_ERROR_CODES[exit_code]}", *errors]
    return CaseStatus.FAILED, [f"FAILED: {detail}", *errors]


class CaseDevices(BaseModel):
    required: int | None = None
    total: int
    per_node: int
    nodes: int
    source: str | None = None


class CaseResult(BaseModel):
    """What ``trtllm-slurm run --json`` prints and ``<work_dir>/result.json`` holds."""

    status: CaseStatus
    exit_code: int | None = None
    workflow: str
    command: str
    model_name: str | None = None
    scenario: str | None = None
    job_id: str | None = None
    job_name: str | None = None
    nodelist: str | None = None
    partition: str | None = None
    account: str | None = None
    container_image: str | None = None
    devices: CaseDevices | None = None
    elapsed_seconds: float | None = None  # from the job starting to its end
    wall_seconds: float | None = None  # from submission to the end (queue wait included)
    work_dir: str | None = None
    log_paths: dict[str, str] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    patterns: dict[str, dict[str, str | None]] = Field(default_factory=dict)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    log_head: list[str] = Field(default_factory=list)  # on failure: first lines of the log
    log_tail: list[str] = Field(default_factory=list)  # on failure: last lines of the log
    reason: str | None = None
    notes: list[str] = Field(default_factory=list)
