"""TensorRT-LLM cases without a cluster: classification, device counts, log parsing of every
workflow, pattern and status rules, metric checks, the result JSON; a few cases run for real
as local subprocesses (local_direct: no Slurm, no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pytest_trtllm_slurm.cases.parse as case_parse
from pytest_trtllm_slurm.cases.items import case_fields
from pytest_trtllm_slurm.cases.model import (
    CASE_WRAPPER,
    EXIT_CODES,
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
    parse_custom_env,
)
from pytest_trtllm_slurm.cases.parse import LogScan, MetricCheck, parse_accuracy, scan_log
from pytest_trtllm_slurm.cases.run import (
    CaseContext,
    prepare_case,
    pytest_args_of,
    rerun_spec_copy,
    run_case,
)
from pytest_trtllm_slurm.cli.main import main as cli_main
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.outcome import JobStatus
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import LocalEnv
from pytest_trtllm_slurm.planning.settings import ClustersFile, Settings

FAKES = Path(__file__).resolve().parent / "fakes"


def run_fake(tool: str, *args: str, **env: str) -> str:
    proc = subprocess.run([str(FAKES / tool), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=30, check=False)
    return proc.stdout


def scan_text(text: str, **kwargs: Any) -> LogScan:
    """``scan_log`` over a string."""
    data = text.encode()
    return scan_log(lambda offset, limit: data[offset:offset + limit], **kwargs)


# --------------------------------------------------------------------------- classification

def test_classification_order_and_commands(tmp_path: Path) -> None:
    assert classify(CaseInput(test_cmd="pytest a.py")).workflow is Workflow.PYTEST
    assert classify(CaseInput(bench_cmd="trtllm-bench x")).workflow is Workflow.BENCH
    assert classify(CaseInput(eval_cmd="trtllm-eval mmlu")).workflow is Workflow.EVAL
    assert classify(CaseInput(custom_cmd=" echo hi ")).command == "echo hi"
    script = tmp_path / "my dir" / "run.sh"
    script.parent.mkdir()
    script.write_text("echo hi\n")
    got = classify(CaseInput(custom_script=str(script), custom_cmd="ignored"))
    assert got.workflow is Workflow.CUSTOM
    assert got.command == f"bash '{script}'"  # quoted: the folder has a space
    assert got.mounts == [f"{script.parent}:{script.parent}"]
    assert "takes precedence" in got.notes[0]
    rel = classify(CaseInput(custom_script="run.sh"), base=script.parent)
    assert rel.command == f"bash '{script}'"


@pytest.mark.parametrize("fields", [
    {"test_cmd": "pytest", "bench_cmd": "trtllm-bench"},
    {"bench_cmd": "trtllm-bench", "eval_cmd": "trtllm-eval"},
    {"custom_cmd": "echo", "test_cmd": "pytest"},
    {"custom_script": "/x.sh", "eval_cmd": "trtllm-eval"},
])
def test_two_workflows_are_a_config_error(fields: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="mutually exclusive"):
        classify(CaseInput(**fields))


def test_no_command_and_missing_script_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no command"):
        classify(CaseInput())
    with pytest.raises(ConfigError, match="is not a file"):
        classify(CaseInput(custom_script=str(tmp_path / "nope.sh")))


def test_custom_env_pairs() -> None:
    assert parse_custom_env(["A=1 B=2", 'MSG="hello world"', "EMPTY="]) == {
        "A": "1", "B": "2", "MSG": "hello world", "EMPTY": ""}
    for bad in (["NOEQUALS"], ["1BAD=x"], ['A="unterminated']):
        with pytest.raises(ConfigError):
            parse_custom_env(bad)


def test_model_name_derivation() -> None:
    assert model_name_of(Workflow.BENCH, "trtllm-bench --model /models/llama-3/ throughput") \
        == "llama-3"
    assert model_name_of(Workflow.EVAL, "trtllm-eval --model=meta/Llama mmlu") == "Llama"
    assert model_name_of(Workflow.PYTEST, "pytest t/test_perf_sanity.py "
                         "'test_e2e[aggr-gpt_oss-tp4]'") == "aggr-gpt_oss-tp4"
    assert model_name_of(Workflow.PYTEST, "pytest tests/test_llm.py::test_x -v") == "test_llm"
    assert model_name_of(Workflow.CUSTOM, "bash /a/b/bench run.sh") == "bench"
    assert model_name_of(Workflow.CUSTOM, "echo $((1+1))") == "echo"
    assert model_name_of(Workflow.CUSTOM, "x", "my model!") == "my_model"


# --------------------------------------------------------------------------- device counts

def _devices(workflow: Workflow, cmd: str, **kw: object):  # noqa: ANN202
    collected = kw.pop("collected", None)
    return derive_devices(workflow, cmd, CaseInput(**kw), collected=collected)  # type: ignore[arg-type]


def test_bench_devices_from_the_last_trtllm_bench() -> None:
    chain = ("trtllm-bench --model m prepare-dataset --output d.json && "
             "trtllm-bench --model m throughput --tp 4 --pp 2 --dataset d.json")
    got = _devices(Workflow.BENCH, chain)
    assert (got.required, got.total, got.per_node) == (8, 8, 8)
    assert got.source == "trtllm-bench --tp 4 --pp 2"
    assert got.requirement().nodes() == 1
    with pytest.raises(ConfigError, match="--tp"):
        _devices(Workflow.BENCH, "trtllm-bench throughput --tp four")


def test_eval_devices_tp_size_times_pp_size() -> None:
    got = _devices(Workflow.EVAL, "trtllm-eval --model m --tp_size 2 --pp_size=2 gsm8k")
    assert (got.required, got.total, got.per_node) == (4, 4, 4)


def test_test_devices_from_collection_or_one() -> None:
    found = TestDevices(total=2, per_node=2, source="skip_less_device")
    got = _devices(Workflow.PYTEST, "pytest t.py", collected=found)
    assert (got.total, got.per_node, got.source) == (2, 2, "skip_less_device (collected)")
    world = TestDevices(total=8, per_node=None, source="skip_less_mpi_world_size")
    spread = _devices(Workflow.PYTEST, "pytest t.py", collected=world)
    assert spread.per_node is None and spread.requirement().nodes(4) == 2 and spread.requirement().nodes(8) == 1
    none = TestDevices(total=0, source="default")
    assert _devices(Workflow.PYTEST, "pytest t.py", collected=none).total == 1  # seed default
    assert _devices(Workflow.PYTEST, "python run.py").total == 1
    assert _devices(Workflow.CUSTOM, "echo hi").total == 1


def test_perf_sanity_devices_from_the_yaml(tmp_path: Path) -> None:
    yaml_path = tmp_path / "gpt_oss.yaml"
    yaml_path.write_text(textwrap.dedent("""\
        hardware: {gpus_per_node: 4}
        server_configs:
          - {name: gpt_oss_tp4ep4pp2_mtp1, tensor_parallel_size: 4, pipeline_parallel_size: 2}
          - {name: small, tensor_parallel_size: 2}
    """))
    cmd = "pytest tests/perf/test_perf_sanity.py -v 'test_e2e[aggr-gpt_oss-gpt_oss_tp4ep4pp2_mtp1]'"
    got = _devices(Workflow.PYTEST, cmd, perf_config_yaml=str(yaml_path))
    assert (got.total, got.per_node, got.requirement().nodes()) == (8, 4, 2)
    small = _devices(Workflow.PYTEST, "pytest 'test_e2e[aggr-gpt_oss-small]'",
                     perf_config_yaml=str(yaml_path))
    assert (small.total, small.per_node, small.requirement().nodes()) == (2, 2, 1)
    with pytest.raises(ConfigError, match="names no perf-sanity test"):
        _devices(Workflow.PYTEST, "pytest t.py", perf_config_yaml=str(yaml_path))
    with pytest.raises(ConfigError, match="not in server_configs"):
        _devices(Workflow.PYTEST, "pytest 'test_e2e[aggr-gpt_oss-nope]'",
                 perf_config_yaml=str(yaml_path))


def test_explicit_device_counts_win() -> None:
    bench = "trtllm-bench throughput --tp 8"
    got = _devices(Workflow.BENCH, bench, required_devices=2)
    assert (got.total, got.per_node, got.source) == (2, 2, "explicit")
    both = _devices(Workflow.BENCH, bench, total_required_devices=16, required_devices_per_node=4)
    assert (both.total, both.per_node, both.requirement().nodes(), both.source) == (16, 4, 4, "explicit")
    per_node = _devices(Workflow.BENCH, bench, required_devices_per_node=4)
    assert (per_node.total, per_node.per_node, per_node.requirement().nodes()) == (8, 4, 2)
    cpu = _devices(Workflow.CUSTOM, "echo", required_devices=0)
    assert (cpu.total, cpu.per_node, cpu.requirement().nodes()) == (0, None, 1)
    bad = _devices(Workflow.BENCH, bench, total_required_devices=2, required_devices_per_node=4)
    with pytest.raises(ConfigError, match="per node"):
        bad.requirement()


def test_pytest_args_of_a_command() -> None:
    assert pytest_args_of("pytest a.py::t -v") == ["a.py::t", "-v"]
    assert pytest_args_of("cd x && python3 -m pytest 'a.py::t[1 2]' && echo done") \
        == ["a.py::t[1 2]"]
    assert pytest_args_of("/usr/bin/py.test -k x") == ["-k", "x"]
    assert pytest_args_of("python run_tests.py") is None


# --------------------------------------------------------------------------- log parsing

def test_pytest_summary_lines() -> None:
    scan = scan_text("collected 4 items\n\x1b[32m=== 3 passed, 1 failed, 2 warnings in "
                     "12.34s (0:00:12) ===\x1b[0m\n", workflow="pytest")
    assert scan.summary() == {"pytest": {"line": "3 passed, 1 failed, 2 warnings in 12.34s "
                                         "(0:00:12)", "counts": {"passed": 3, "failed": 1,
                                                                "warnings": 2},
                                         "seconds": 12.34}}
    quiet = scan_text("..\n2 passed, 1 error in 0.05s\n", workflow="pytest")
    assert quiet.pytest is not None and quiet.pytest.counts == {"passed": 2, "errors": 1}
    none_ran = scan_text("== no tests ran in 0.01s ==", workflow="pytest").pytest
    assert none_ran is not None and none_ran.counts == {}
    assert scan_text("the model passed in 3 steps", workflow="pytest").pytest is None
    missing = scan_text("\n".join(f"l{i}" for i in range(15)), workflow="pytest").summary()
    assert missing["pytest"] is None and missing["last_lines"][-1] == "l14"


def test_eval_accuracy_lines_from_the_fake_and_real_prefixes() -> None:
    out = run_fake("trtllm-eval", "--model", "m", "mmlu") + run_fake(
        "trtllm-eval", "gsm8k", FAKE_TRTLLM_ACCURACY="55.5")
    scan = scan_text(out, workflow="eval")
    assert scan.summary()["accuracy"] == [
        {"task": "MMLU", "value": 79.09, "samples": 14042,
         "line": "MMLU weighted average accuracy: 79.09 (14042)"},
        {"task": "gsm8k", "value": 55.5, "samples": None,
         "line": "lm-eval gsm8k average accuracy: 55.50"}]
    assert scan.metrics() == {"MMLU accuracy": 79.09, "gsm8k accuracy": 55.5, "accuracy": 55.5}
    acc = parse_accuracy("[TensorRT-LLM][INFO] JSON Mode Eval accuracy: 88.12")
    assert acc is not None and (acc.task, acc.value) == ("JSON", 88.12)
    assert parse_accuracy("nothing to see") is None


def test_bench_performance_block_as_named_numbers() -> None:
    out = run_fake("trtllm-bench", "--model", "m", "throughput", "--tp", "2",
                   FAKE_TRTLLM_THROUGHPUT="2000")
    scan = scan_text(out, workflow="bench")
    perf = scan.summary()["performance"]
    assert perf["Total Output Throughput (tokens/sec)"] == 2000.0
    assert perf["Per GPU Output Throughput (tps/gpu)"] == 1000.0
    assert perf["Request Throughput (req/sec)"] == 15.625
    assert perf["Per User Output Throughput [w/ ctx] (tps/user)"] == 31.25
    assert perf["[Latency] P99"] > 0 and "[Latency] AVERAGE" in perf
    assert "TP Size" not in perf and "Number of Sequences" not in perf  # other blocks
    assert len(perf) == 14 and scan.performance_blocks == 1


def test_bench_block_ends_at_a_foreign_line_and_the_last_block_wins() -> None:
    text = textwrap.dedent("""\
        [11/29/2026-10:00:00] [TRT-LLM] [I] first run
        ===========================================================
        = PERFORMANCE OVERVIEW
        ===========================================================
        Request Throughput (req/sec):        1.0
        Total Output Throughput (tokens/sec): 100.5
        [11/29/2026-10:00:01] [TRT-LLM] [I] second run
        [11/29/2026-10:00:02] [TRT-LLM] [I] = PERFORMANCE OVERVIEW
        Total Output Throughput (tokens/sec): 1e3
        Average time-to-first-token [TTFT] (ms):          12.5000

        -- Per-Request Time-to-First-Token [TTFT] Breakdown (ms)

        [TTFT] P99    : 20.0
        something else entirely
        Total Output Throughput (tokens/sec): 5
    """)
    scan = scan_text(text, workflow="bench")
    assert scan.performance == {"Total Output Throughput (tokens/sec)": 1000.0,
                                "Average time-to-first-token [TTFT] (ms)": 12.5,
                                "[TTFT] P99": 20.0}
    assert scan.performance_blocks == 2


def test_custom_last_ten_lines_and_bounded_memory() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    scan = scan_text(text, workflow="custom")
    assert scan.summary() == {"last_lines": [f"line {i}" for i in range(990, 1000)]}
    assert scan.lines == 1000 and len(scan.head) == 50 and len(scan.tail) == 100


def test_chunked_reading_splits_lines_correctly() -> None:
    text = ("é" * 10 + "\n" + "progress 10%\rprogress 100%\r\n" + "x" * 20000 + "\n"
            + "lm-eval mmlu average accuracy: 70.00\n" + "no newline at the end")
    data = text.encode()
    reads: list[tuple[int, int]] = []

    def read(offset: int, limit: int) -> bytes:
        reads.append((offset, limit))
        return data[offset:offset + limit]

    scan = case_parse.scan_log(read, workflow="eval", chunk=7)
    assert scan.head[0] == "é" * 10
    assert scan.head[1:3] == ["progress 10%", "progress 100%"]
    assert scan.head[3].endswith(" [...]") and len(scan.head[3]) < 5000
    assert scan.accuracy[0].value == 70.0
    assert scan.tail[-1] == "no newline at the end"
    assert all(limit == 7 for _, limit in reads)  # never the whole file at once


def test_success_failure_and_oom_patterns() -> None:
    text = "start\nERROR: NCCL timeout\nTotal Output Throughput (tokens/sec): 5\nCUDA out of memory\n"
    scan = scan_text(text, workflow="custom", success_patterns=[r"Throughput \(tokens"],
                     failure_patterns=["NCCL (timeout|error)", "never"])
    assert scan.success_hits[r"Throughput \(tokens"].line_no == 3
    assert list(scan.failure_hits) == ["NCCL (timeout|error)"]
    assert scan.failure_hits["NCCL (timeout|error)"].line == "ERROR: NCCL timeout"
    assert scan.oom is not None and scan.oom.line_no == 4
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        scan_text("x", workflow="custom", success_patterns=["Throughput (tokens"])


# --------------------------------------------------------------------------- status rules

class Hit:
    def __init__(self, line_no: int, line: str) -> None:
        self.line_no, self.line = line_no, line


@pytest.mark.parametrize("job, code, kw, expected", [
    (JobStatus.COMPLETED, 0, {}, CaseStatus.PASSED),
    (JobStatus.COMPLETED, 0, {"failure_hits": {"FAIL": Hit(3, "FAIL here")}}, CaseStatus.FAILED),
    (JobStatus.COMPLETED, 0, {"success_patterns": ["done"]}, CaseStatus.FAILED),
    (JobStatus.COMPLETED, 0, {"success_patterns": ["done", "ok"],
                              "success_hits": {"ok": Hit(1, "ok")}}, CaseStatus.PASSED),
    (JobStatus.FAILED, 1, {}, CaseStatus.FAILED),
    (JobStatus.FAILED, 1, {"oom_line": "CUDA out of memory"}, CaseStatus.OUT_OF_MEMORY),
    (JobStatus.FAILED, 127, {}, CaseStatus.ERROR),
    (JobStatus.FAILED, 2, {"workflow": "pytest"}, CaseStatus.ERROR),
    (JobStatus.FAILED, 5, {"workflow": "pytest"}, CaseStatus.ERROR),
    (JobStatus.FAILED, 2, {"workflow": "bench"}, CaseStatus.FAILED),
    (JobStatus.CRASHED, None, {}, CaseStatus.FAILED),
    (JobStatus.TIMEOUT, None, {}, CaseStatus.TIMEOUT),
    (JobStatus.HANG_DETECTED, None, {}, CaseStatus.HANG_DETECTED),
    (JobStatus.OUT_OF_MEMORY, 137, {}, CaseStatus.OUT_OF_MEMORY),
    (JobStatus.CANCELLED, None, {}, CaseStatus.CANCELLED),
    (JobStatus.PREEMPTED, None, {}, CaseStatus.CANCELLED),
    (JobStatus.BUILD_FAILED, 1, {}, CaseStatus.BUILD_FAILED),
    (JobStatus.NODE_FAIL, None, {}, CaseStatus.ERROR),
    (JobStatus.ERROR, None, {"reason": "sbatch: Invalid account"}, CaseStatus.ERROR),
])
def test_status_rules(job: JobStatus, code: int | None, kw: dict, expected: CaseStatus) -> None:
    workflow = kw.pop("workflow", "custom")
    status, errors = decide_status(workflow, job, code, **kw)
    assert status is expected
    assert (errors == []) == (expected is CaseStatus.PASSED)
    if "reason" in kw:
        assert "Invalid account" in errors[0]


def test_exit_codes_cover_every_status_and_are_distinct() -> None:
    assert set(EXIT_CODES) == set(CaseStatus)
    assert EXIT_CODES[CaseStatus.PASSED] == 0
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES) and 4 not in EXIT_CODES.values()


# --------------------------------------------------------------------------- metric checks

def test_metric_checks() -> None:
    metrics = {"accuracy": 79.09, "Total Output Throughput (tokens/sec)": 960.0}
    assert MetricCheck.parse("accuracy >= 79.0").evaluate(metrics).ok
    assert not MetricCheck.parse("accuracy > 80").evaluate(metrics).ok
    tol = MetricCheck.parse("Total Output Throughput (tokens/sec) >= 1000 (tolerance 5%)")
    assert (tol.metric, tol.op, tol.threshold, tol.tolerance_pct, tol.bound) == (
        "Total Output Throughput (tokens/sec)", ">=", 1000.0, 5.0, 950.0)
    got = tol.evaluate(metrics)
    assert got.ok and got.value == 960.0 and "bound 950" in got.message
    assert not MetricCheck.parse("total output throughput (tokens/sec) >= 1000 (tolerance 3%)"
                                 ).evaluate(metrics).ok  # name matched case-insensitively
    assert MetricCheck.parse("accuracy <= 75 (tolerance 10%)").evaluate(metrics).ok
    assert MetricCheck.parse("accuracy == 80 (tolerance 2%)").evaluate(metrics).ok
    assert MetricCheck.parse("accuracy != 80 (tolerance 0.5%)").evaluate(metrics).ok
    missing = MetricCheck.parse("rouge1 >= 30").evaluate(metrics)
    assert not missing.ok and "not found" in missing.message and "accuracy" in missing.message
    for bad in ("accuracy", ">= 5", "accuracy >= high", "accuracy >= 5 (tolerance x)"):
        with pytest.raises(ConfigError, match="metric check"):
            MetricCheck.parse(bad)


# --------------------------------------------------------------------------- job spec + result

def test_case_argv_wrapper_records_the_exit_status(tmp_path: Path) -> None:
    cmd = "echo 'it''s'; exit 3"
    argv = case_argv(cmd)
    assert case_command_of(argv) == cmd and CASE_WRAPPER in argv
    assert case_command_of(["python", "-m", "pytest", "a b"]) == "python -m pytest 'a b'"
    reports = tmp_path / "reports.jsonl"
    proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "TRTLLM_CASE_REPORTS": str(reports)})
    assert proc.returncode == 3 and proc.stdout == "its\n"
    assert json.loads(reports.read_text()) == {"v": 1, "type": "session_finish", "exitstatus": 3}


def _ctx(tmp_path: Path, **settings: object) -> CaseContext:
    return CaseContext(settings=Settings(**settings), clusters=ClustersFile(),  # type: ignore[arg-type]
                       local=LocalEnv(), slurm_env=None, rootdir=tmp_path,
                       warn=lambda m: None, say=lambda m: None)


def test_prepare_writes_the_job_spec_and_refuses_what_nothing_serves(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    prepared = prepare_case(CaseInput(custom_cmd="echo hi", required_devices=0,
                                      custom_env={"A": "1"}, monitor_timeout="2m",
                                      time_limit="1h", success_patterns=["hi"]), ctx)
    spec = prepared.spec
    assert spec is not None and prepared.refused is None
    assert spec.scenario.value == "local_direct" and spec.workflow == "custom"
    assert spec.env["A"] == "1" and spec.env["TRTLLM_CASE_REPORTS"] == spec.reports_path
    assert (spec.monitor_timeout_seconds, spec.time_limit) == (120, "01:00:00")
    assert spec.rerun_argv == [] and spec.success_patterns == ["hi"]
    assert JobSpec.read(Path(spec.work_dir) / "job_spec.json") == spec.masked()
    # one GPU wanted, this machine has none and there is no Slurm: ERROR, nothing submitted
    refused = prepare_case(CaseInput(bench_cmd="trtllm-bench throughput --tp 2"), ctx).refused
    assert refused is not None and refused.status is CaseStatus.ERROR
    assert "nothing can run this case" in refused.errors[0]
    assert refused.devices is not None and refused.devices.total == 2
    assert json.loads((Path(str(refused.work_dir)) / "result.json").read_text())["status"] \
        == "ERROR"


def test_collection_is_asked_only_when_the_count_is_not_given(tmp_path: Path) -> None:
    asked: list[str] = []

    def collect(command: str, rootdir: Path) -> TestDevices:
        asked.append(command)
        return TestDevices(total=0, source="trtllm_slurm")  # a CPU-only test

    prepared = prepare_case(CaseInput(test_cmd="pytest t.py::x"), _ctx(tmp_path), collect=collect)
    assert asked == ["pytest t.py::x"] and prepared.spec is not None
    assert prepared.spec.total_devices == 0 and prepared.devices.source.startswith("trtllm_slurm")
    prepare_case(CaseInput(test_cmd="pytest t.py::x", required_devices=0), _ctx(tmp_path),
                 collect=collect)
    assert len(asked) == 1


def test_result_json_round_trip() -> None:
    result = CaseResult(status=CaseStatus.TIMEOUT, exit_code=None, workflow="bench",
                        command="trtllm-bench", metrics={"x": 1.5},
                        summary={"performance": {"x": 1.5}}, errors=["TIMEOUT: too long"])
    data = json.loads(result.model_dump_json())
    assert data["status"] == "TIMEOUT" and data["metrics"] == {"x": 1.5}
    assert CaseResult.model_validate(data) == result
    assert EXIT_CODES[result.status] == 3


def test_rerun_copy_moves_every_path_to_a_fresh_work_dir(tmp_path: Path) -> None:
    prepared = prepare_case(CaseInput(custom_cmd="echo hi", required_devices=0), _ctx(tmp_path))
    spec = prepared.spec
    assert spec is not None
    copy = rerun_spec_copy(spec, monitor_timeout_seconds=7)
    assert copy.work_dir != spec.work_dir and Path(copy.work_dir).parent == Path(spec.work_dir).parent
    assert copy.log_path.startswith(copy.work_dir + "/")
    assert copy.env["TRTLLM_CASE_REPORTS"] == copy.reports_path
    assert copy.reports_path.startswith(copy.work_dir + "/")
    assert copy.monitor_timeout_seconds == 7 and copy.command == spec.command
    assert (Path(copy.work_dir) / "job_spec.json").is_file()


# --------------------------------------------------------------------------- local runs

def test_local_direct_runs_pass_fail_timeout_and_hang(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ok = run_case(CaseInput(custom_cmd="for i in $(seq 1 12); do echo line$i; done; "
                            "echo \"env=$MY_VAR\"", custom_env={"MY_VAR": "v"},
                            required_devices=0, success_patterns=["env=v"]), ctx)
    assert ok.status is CaseStatus.PASSED and ok.exit_code == 0, ok.errors
    assert ok.summary == {"last_lines": [f"line{i}" for i in range(4, 13)] + ["env=v"]}
    assert ok.patterns["success"] == {"env=v": "line 13: env=v"}
    assert ok.log_head == [] and ok.elapsed_seconds is not None

    pattern = run_case(CaseInput(custom_cmd="echo 'RuntimeError: boom'", required_devices=0,
                                 failure_patterns=["RuntimeError"]), ctx)
    assert pattern.status is CaseStatus.FAILED and pattern.exit_code == 0
    assert "matched line 1: RuntimeError: boom" in pattern.errors[0]

    failed = run_case(CaseInput(custom_cmd="echo first; echo last; exit 4",
                                required_devices=0), ctx)
    assert failed.status is CaseStatus.FAILED and failed.exit_code == 4
    assert failed.log_head == ["first", "last"] and failed.log_tail == ["first", "last"]

    slow = run_case(CaseInput(custom_cmd="sleep 30", required_devices=0,
                              monitor_timeout="1s"), ctx)
    assert slow.status is CaseStatus.TIMEOUT and (slow.wall_seconds or 0) < 15

    hang = run_case(CaseInput(custom_cmd="echo 'Hang detected after 5 seconds.'; sleep 30",
                              required_devices=0), ctx)
    assert hang.status is CaseStatus.HANG_DETECTED and (hang.wall_seconds or 0) < 15

    checked = run_case(CaseInput(custom_cmd="echo 'MMLU weighted average accuracy: 70.00 (5)'",
                                 required_devices=0, checks=["accuracy >= 79"]), ctx)
    assert checked.status is CaseStatus.FAILED and checked.exit_code == 0
    assert checked.checks[0]["ok"] is False and checked.checks[0]["value"] == 70.0
    assert "check failed: accuracy = 70, threshold >= 79: FAILED" in checked.errors


def test_cli_input_errors_exit_4(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_main(["run", "--bench-cmd", "trtllm-bench", "--eval-cmd", "trtllm-eval",
                     "--rootdir", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert code == 4 and "mutually exclusive" in err
    assert json.loads(out)["status"] == "ERROR"
    assert cli_main(["run", "--job-spec", "x.json", "--bench-cmd", "b"]) == 4
    assert "takes no case inputs" in capsys.readouterr().err
    assert cli_main(["run", "--custom-cmd", "true", "--check", "accuracy ~ 3",
                     "--rootdir", str(tmp_path)]) == 4
    assert "metric check" in capsys.readouterr().err


def test_cli_runs_a_local_case(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "run", "--custom-cmd", "echo hi",
         "--required-devices", "0", "--rootdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "PASSED" and result["summary"] == {"last_lines": ["hi"]}
    assert "submitted (local_direct)" in proc.stderr
    assert json.loads(Path(result["log_paths"]["result"]).read_text()) == result


# --------------------------------------------------------------------------- case files

def test_case_file_fields() -> None:
    got = case_fields({"name": "a", "workflow": "bench", "command": "trtllm-bench x",
                       "devices": 2, "env": {"A": "1"}, "script": "run.sh",
                       "monitor_timeout": 30, "marks": ["slow"]}, Path("/base"), "w")
    assert got == {"name": "a", "bench_cmd": "trtllm-bench x", "required_devices": 2,
                   "custom_env": {"A": "1"}, "custom_script": "/base/run.sh",
                   "monitor_timeout": "30s"}
    with pytest.raises(ConfigError, match="workflow 'nope'"):
        case_fields({"workflow": "nope", "command": "x"}, Path("/"), "w")


def test_case_file_collection_and_errors(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "good.yaml").write_text(textwrap.dedent("""\
        defaults: {time_limit: 10m, marks: [trtllm_case]}
        cases:
          - {name: one, custom_cmd: "echo 1", checks: ["accuracy >= 1"]}
          - {name: two, workflow: eval, command: "trtllm-eval mmlu"}
    """))
    (tmp_path / "cases" / "bad.yaml").write_text("cases:\n  - {name: x, bench_cmd: a, eval_cmd: b}\n")
    (tmp_path / "other.yaml").write_text("not: a case file\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrtllm_case_files = cases/good.yaml\n"
                                         "markers = trtllm_case\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    base = [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.cases.items",
            "--collect-only", "-q", "-p", "no:cacheprovider"]
    by_ini = subprocess.run([*base, "-m", "trtllm_case"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=120, check=False)
    assert by_ini.returncode == 0, by_ini.stdout + by_ini.stderr
    assert "cases/good.yaml::one\ncases/good.yaml::two\n" in by_ini.stdout
    by_flag = subprocess.run([*base, "--trtllm-cases", "cases/bad.yaml"], cwd=tmp_path,
                             capture_output=True, text=True, env=env, timeout=120, check=False)
    assert by_flag.returncode != 0 and "mutually exclusive" in by_flag.stdout
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "good.yaml").write_text((tmp_path / "cases" / "good.yaml").read_text())
    plain = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                            "-p", "no:cacheprovider", "good.yaml"], cwd=plain_dir,
                           capture_output=True, text=True, env=env, timeout=120, check=False)
    assert "good.yaml::one" not in plain.stdout  # nothing asked for: no case items


def test_human_output_of_a_failed_result() -> None:
    from pytest_trtllm_slurm.cases.report import format_result

    result = CaseResult(
        status=CaseStatus.FAILED, exit_code=1, workflow="eval", command="trtllm-eval mmlu",
        model_name="llama", scenario="local_slurm", job_id="42", job_name="acct_a.llama",
        partition="batch", account="acct_a", work_dir="/w", log_paths={"log": "/w/x.log"},
        summary={"accuracy": [{"task": "MMLU", "value": 70.5, "samples": 3, "line": "x"}]},
        errors=["FAILED: exit code 1"], log_head=[f"h{i}" for i in range(30)],
        log_tail=[f"t{i}" for i in range(60)], elapsed_seconds=1.25, wall_seconds=2.0)
    text = format_result(result)
    assert text.splitlines()[0] == "Status:     FAILED (exit code 1)"
    assert "Job:        42 (acct_a.llama)" in text and "  log:      /w/x.log" in text
    assert "  MMLU: 70.5 (3 samples)" in text and "  FAILED: exit code 1" in text
    assert "--- first 20 lines of the log ---\nh0" in text and "h20" not in text
    assert "--- last 40 lines of the log ---\nt20" in text and text.endswith("t59")
    quiet = format_result(result, head=0, tail=0)
    assert "lines of the log" not in quiet
