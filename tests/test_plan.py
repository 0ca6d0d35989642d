"""plan.py / plan_hooks.py: rows, renderers, and --trtllm-plan / --trtllm-plan-json end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_trtllm_slurm.planning.models import DeviceRequirement, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.plan_table import (
    PlanRow,
    format_plan_lines,
    plan_row,
    write_plan_json,
)

pytest_plugins = ["pytester"]

KEYS = {"nodeid", "devices", "devices_per_node", "nodes", "device_type", "scenario", "partition",
        "batch"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_") or name.endswith("_CONFIG_FOLDER"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def fake_item(nodeid: str, **marks: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    table = {name: getattr(pytest.mark, name)(*args, **kwargs).mark
             for name, (args, kwargs) in marks.items()}
    return SimpleNamespace(nodeid=nodeid, name=nodeid.split("::")[-1], get_closest_marker=table.get,
                           iter_markers=lambda: list(table.values()),
                           config=SimpleNamespace(rootpath=Path("/nonexistent")))


def test_plan_row_node_math_uses_the_target() -> None:
    req = DeviceRequirement(total=8, per_node=None, device_type="H200", source="mpi")
    decision = RouteDecision(scenario=Scenario.REMOTE_SLURM, cluster="far", partition="p",
                             target_gpus_per_node=4)
    row = plan_row("t::a", req, decision, partition="fallback", batch="b1")
    assert row.model_dump() == {
        "nodeid": "t::a", "devices": 8, "devices_per_node": 4, "nodes": 2,
        "device_type": "H200", "scenario": "remote_slurm", "partition": "p", "cluster": "far",
        "batch": "b1", "source": "mpi", "reason": None, "name": None, "error": None,
    }
    # the cluster is a Slurm target's only: a local test names none
    here = plan_row("t::c", req, RouteDecision(scenario=Scenario.LOCAL_DIRECT, cluster="x"))
    assert here.cluster is None
    unrouted = plan_row("t::b", req, RouteDecision(scenario=None, reason="no H200"), "fallback")
    assert (unrouted.scenario, unrouted.partition, unrouted.nodes) == (None, "fallback", 1)


def test_format_plan_lines() -> None:
    rows = [
        PlanRow(nodeid="a", devices=0, devices_per_node=0, nodes=1, scenario="local_direct"),
        PlanRow(nodeid="b", devices=8, devices_per_node=4, nodes=2, device_type="H200",
                scenario="remote_slurm", partition="batch", cluster="far", batch="b-3"),
        PlanRow(nodeid="c", devices=2, devices_per_node=2, nodes=1, reason="no GPUs anywhere"),
    ]
    assert format_plan_lines(rows) == [
        "a: CPU only -> local_direct",
        "b: 8 x H200 = 2 node(s) x 4 -> remote_slurm partition=batch cluster=far batch=b-3",
        "c: 2 x any GPU = 1 node(s) x 2 -> not served (no GPUs anywhere)",
    ]


def test_format_plan_lines_names_as_written_and_errors() -> None:
    """A renamed id shows the test list's spelling first; an error row shows its message
    (without repeating the name it leads with)."""
    rows = [
        PlanRow(nodeid="p.py::test_e2e[perf_sanity_test_case0]", name="p.py::test_e2e[aggr-c-s]",
                devices=8, devices_per_node=4, nodes=2, scenario="local_slurm"),
        PlanRow(nodeid="p.py::test_e2e[perf_sanity_test_case1]", name="p.py::test_e2e[agg-c]",
                devices=0, devices_per_node=0, nodes=1,
                error="p.py::test_e2e[agg-c]: perf-sanity id 'agg-c': prefix 'agg' ..."),
        PlanRow(nodeid="t.py::test_x", devices=0, devices_per_node=0, nodes=1,
                error="t.py::test_x: skip_less_device('four'): found 'four'"),
    ]
    assert format_plan_lines(rows) == [
        "p.py::test_e2e[aggr-c-s] (pytest id p.py::test_e2e[perf_sanity_test_case0]): "
        "8 x any GPU = 2 node(s) x 4 -> local_slurm",
        "p.py::test_e2e[agg-c] (pytest id p.py::test_e2e[perf_sanity_test_case1]): "
        "ERROR perf-sanity id 'agg-c': prefix 'agg' ...",
        "t.py::test_x: ERROR skip_less_device('four'): found 'four'",
    ]


def test_write_plan_json(tmp_path: Path) -> None:
    rows = [PlanRow(nodeid="a[x-y]", devices=4, devices_per_node=4, nodes=1)]
    path = write_plan_json(rows, tmp_path / "sub" / "plan.json")
    data = json.loads(path.read_text())
    tests = data["tests"]
    assert isinstance(tests, list) and KEYS <= set(tests[0]) and tests[0]["nodeid"] == "a[x-y]"
    assert [PlanRow.model_validate(d) for d in tests] == rows
    assert (data["batches"], data["expected_makespan_seconds"]) == ([], None)
    assert not list((tmp_path / "sub").glob(".*tmp"))


# --------------------------------------------------------------------------- end to end

SUITE = """
import pytest

pytestmark = pytest.mark.skip_less_device(1)

def test_module_level():
    raise AssertionError("a plan runs nothing")

@pytest.mark.skip_less_device(2)
class TestClass:
    def test_class_level(self):
        raise AssertionError("a plan runs nothing")

    @pytest.mark.skip_less_device(4)
    def test_method_level(self):
        raise AssertionError("a plan runs nothing")

    @pytest.mark.skip_less_mpi_world_size(8)
    @pytest.mark.parametrize("x", ["a b", "c$d"])
    def test_mpi(self, x):
        raise AssertionError("a plan runs nothing")

@pytest.mark.skip_less_device(0)
def test_cpu():
    raise AssertionError("a plan runs nothing")
"""


def test_closest_markers_match_get_closest_marker(pytester: pytest.Pytester) -> None:
    from pytest_trtllm_slurm.planning.requirements import MARKER_NAMES, closest_markers

    items = pytester.getitems(SUITE)
    assert len(items) == 6
    for item in items:
        lookup = closest_markers(item)
        for name in MARKER_NAMES:
            assert lookup(name) is item.get_closest_marker(name), (item.nodeid, name)


def run_plan_json(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[dict]]:
    out = pytester.path / "out" / "plan.json"
    result = pytester.runpytest("--trtllm-plan-json", str(out), *args)
    rows = json.loads(out.read_text())["tests"] if out.exists() else []
    return result, rows


def test_plan_json_end_to_end(pytester: pytest.Pytester, devcluster: dict) -> None:
    """Real routing against the dev cluster (batch: 2 nodes x 4 h200)."""
    pytester.makepyfile(test_suite=SUITE)
    result, rows = run_plan_json(pytester, "--strict-markers")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert "a plan runs nothing" not in result.stdout.str()
    by_id = {row["nodeid"].split("::", 1)[1]: row for row in rows}
    assert all(KEYS <= set(row) for row in rows)
    assert {k: v["devices"] for k, v in by_id.items()} == {
        "test_module_level": 1, "TestClass::test_class_level": 2,
        "TestClass::test_method_level": 4, "TestClass::test_mpi[a b]": 8,
        "TestClass::test_mpi[c$d]": 8, "test_cpu": 0,
    }
    assert by_id["TestClass::test_method_level"]["devices_per_node"] == 4
    assert by_id["test_cpu"]["scenario"] == "local_direct"
    assert by_id["TestClass::test_class_level"]["scenario"] == "local_slurm"
    assert by_id["TestClass::test_class_level"]["partition"] == "batch"
    mpi = by_id["TestClass::test_mpi[a b]"]
    assert (mpi["devices_per_node"], mpi["nodes"], mpi["partition"]) == (4, 2, "batch")
    assert mpi["batch"] == by_id["TestClass::test_mpi[c$d]"]["batch"] is not None


def test_plan_respects_deselection_and_prints(pytester: pytest.Pytester, devcluster: dict) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--trtllm-plan", "-k", "method or cpu")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*trtllm-slurm plan*",
        "*TestClass::test_method_level: 4 x any GPU = 1 node(s) x 4 -> local_slurm partition=batch*",
        "*test_cpu: CPU only -> local_direct",
        "2 test(s): 2 routed, 0 not served",
    ])
    assert "test_module_level" not in result.stdout.str()


def test_plan_device_type_from_option(pytester: pytest.Pytester, devcluster: dict) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\ntrtllm_device_type = H200\n")
    _, rows = run_plan_json(pytester)
    assert {row["device_type"] for row in rows} == {"H200"}


GOOD_TEST = "@pytest.mark.skip_less_device(2)\ndef test_good():\n    pass\n"


@pytest.mark.parametrize(
    "source, needles",
    [
        ("@pytest.mark.skip_less_device('four')\ndef test_bad():\n    pass\n",
         ["test_bad.py::test_bad", "skip_less_device('four')", "non-negative integer"]),
        ("@pytest.mark.skip_less_device()\ndef test_bad():\n    pass\n",
         ["test_bad.py::test_bad", "found 0 arguments"]),
        ("@pytest.mark.skip_less_mpi_world_size(-8)\ndef test_bad():\n    pass\n",
         ["test_bad.py::test_bad", "-8"]),
        ("@pytest.mark.trtllm_slurm(devices=4, nodes=3)\ndef test_bad():\n    pass\n",
         ["test_bad.py::test_bad", "inconsistent"]),
    ],
)
def test_unreadable_device_markers_error_that_test_only(
    pytester: pytest.Pytester, source: str, needles: list[str]
) -> None:
    """A test whose device markers cannot be read errors with the message; the plan of the
    others is written and printed (exit 1: a test errored, not 4: the run is usable)."""
    pytester.makepyfile(test_bad="import pytest\n\n" + source + "\n\n" + GOOD_TEST)
    result, rows = run_plan_json(pytester, "--trtllm-plan")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    by_name = {row["nodeid"].split("::")[-1]: row for row in rows}
    assert by_name["test_good"]["devices"] == 2 and by_name["test_good"]["error"] is None
    for needle in needles:
        assert needle in by_name["test_bad"]["error"]
    result.stdout.fnmatch_lines(["*test_bad.py::test_bad: ERROR *",
                                 "*test_bad.py::test_good: 2 x any GPU*",
                                 "2 test(s): *, 1 error(s)"])


def test_bad_trtllm_slurm_marker_value_stays_a_usage_error(pytester: pytest.Pytester) -> None:
    """A trtllm_slurm marker key or value pytest cannot accept (a typo, an env name, a
    mount) is a configuration error of the suite: exit 4 naming the test."""
    pytester.makepyfile(test_bad="import pytest\n\n@pytest.mark.trtllm_slurm(devcies=2)\n"
                        "def test_bad():\n    pass\n\n" + GOOD_TEST)
    result, _ = run_plan_json(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_bad.py::test_bad" in result.stderr.str() and "devcies" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


PERF_TEST = """
import pytest

@pytest.mark.parametrize("perf_sanity_test_case", [
    "aggr-cfg-small", "aggr-cfg-big", "aggr-cfg", "disagg-e2e-dis"])
def test_e2e(perf_sanity_test_case):
    raise AssertionError("a plan runs nothing")
"""
AGG_YAML = """
hardware: {gpus_per_node: 4}
server_configs:
  - {name: small, tensor_parallel_size: 2}
  - {name: big, tensor_parallel_size: 4, pipeline_parallel_size: 2, moe_expert_parallel_size: 8}
"""
DISAGG_YAML = """
hardware: {gpus_per_node: 4, num_ctx_servers: 1, num_gen_servers: 2}
worker_config: {ctx: {tensor_parallel_size: 4}, gen: {tensor_parallel_size: 8}}
"""


def perf_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf_sanity=PERF_TEST)
    (pytester.path / "perf").mkdir()
    (pytester.path / "perf" / "cfg.yaml").write_text(AGG_YAML)
    (pytester.path / "perf" / "dis.yaml").write_text(DISAGG_YAML)


def test_perf_yaml_end_to_end(pytester: pytest.Pytester) -> None:
    perf_suite(pytester)
    pytester.makeini("[pytest]\ntrtllm_perf_config_dir = perf\n")
    result, rows = run_plan_json(pytester)
    assert result.ret == 0, result.stderr.str()
    got = {row["nodeid"].split("[")[1].rstrip("]"): (row["devices"], row["devices_per_node"],
                                                      row["nodes"]) for row in rows}
    # disagg: ctx ceil(4/4)*1 + gen ceil(8/4)*2 = 5 nodes of 4
    assert got == {"aggr-cfg-small": (2, 2, 1), "aggr-cfg-big": (8, 4, 2), "aggr-cfg": (8, 4, 2),
                   "disagg-e2e-dis": (20, 4, 5)}


def test_perf_env_folders(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    perf_suite(pytester)
    monkeypatch.setenv("AGG_CONFIG_FOLDER", str(pytester.path / "perf"))
    monkeypatch.setenv("DISAGG_CONFIG_FOLDER", str(pytester.path / "perf"))
    result, rows = run_plan_json(pytester)
    assert result.ret == 0 and [r["devices"] for r in rows] == [2, 8, 8, 20]


@pytest.mark.parametrize(
    "yaml_text, needles",
    [
        (AGG_YAML.replace("name: small", "name: tiny"),
         ["test_e2e[aggr-cfg-small]", "small", "expected one of big, tiny"]),
        (AGG_YAML.replace("hardware: {gpus_per_node: 4}", "hardware: {}"),
         ["test_e2e[aggr-cfg-small]", "hardware.gpus_per_node", "cfg.yaml"]),
    ],
)
def test_bad_perf_yaml_errors_that_test(pytester: pytest.Pytester, yaml_text: str,
                                        needles: list[str]) -> None:
    perf_suite(pytester)
    (pytester.path / "perf" / "cfg.yaml").write_text(yaml_text)
    result, rows = run_plan_json(pytester, "--trtllm-plan", "-k", "small",
                                 f"--perf-config-yaml={pytester.path / 'perf' / 'cfg.yaml'}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str() + result.stderr.str()
    errors = {row["nodeid"]: row["error"] for row in rows if row["error"]}
    assert list(errors) == ["test_perf_sanity.py::test_e2e[aggr-cfg-small]"]
    for needle in needles:
        assert needle in errors["test_perf_sanity.py::test_e2e[aggr-cfg-small]"]


def test_missing_perf_yaml_errors_that_test(pytester: pytest.Pytester) -> None:
    perf_suite(pytester)
    (pytester.path / "perf" / "cfg.yaml").unlink()
    pytester.makeini("[pytest]\ntrtllm_perf_config_dir = perf\n")
    result, rows = run_plan_json(pytester, "--trtllm-plan")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    by_id = {row["nodeid"].split("[")[1].rstrip("]"): row for row in rows}
    assert "cfg.yaml not found" in by_id["aggr-cfg-small"]["error"]
    assert by_id["disagg-e2e-dis"]["error"] is None and by_id["disagg-e2e-dis"]["devices"] == 20
    result.stdout.fnmatch_lines(["*test_e2e?aggr-cfg-small?: ERROR perf config cfg.yaml not found*"])


def test_missing_perf_config_yaml_option_stays_a_usage_error(pytester: pytest.Pytester) -> None:
    """--perf-config-yaml naming no file is the option's fault: exit 4, nothing planned."""
    perf_suite(pytester)
    result, rows = run_plan_json(pytester, "--perf-config-yaml=nosuch.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and rows == []
    assert "nosuch.yaml (--perf-config-yaml) does not exist" in result.stderr.str()


def test_plan_wins_over_remote(pytester: pytest.Pytester) -> None:
    """--trtllm-plan with dispatch on still plans only: nothing is submitted or run."""
    pytester.makepyfile(test_suite=SUITE)
    result, rows = run_plan_json(pytester, "--trtllm-remote", "--trtllm-plan")
    assert result.ret == 0, result.stderr.str()
    assert len(rows) == 6 and "a plan runs nothing" not in result.stdout.str()


EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def plan_examples(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, dict]]:
    import subprocess
    import sys

    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--trtllm-plan",
         "--trtllm-plan-json", str(out), *args],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")},
    )
    rows = {r["nodeid"]: r for r in json.loads(out.read_text())["tests"]} if out.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, rows


def test_examples_plan_on_the_dev_cluster(devcluster: dict, tmp_path: Path) -> None:
    code, output, rows = plan_examples(tmp_path)
    assert code == 0, output
    mpi = rows["test_multi_gpu.py::test_multi_node_allreduce"]
    assert (mpi["scenario"], mpi["partition"], mpi["nodes"], mpi["devices_per_node"]) == (
        "local_slurm", "batch", 2, 4)
    eight = rows["test_multi_gpu.py::test_eight_gpus"]
    assert eight["scenario"] is None
    assert "needs 8 GPUs" in output and "batch (4x h200 per node, 2 nodes)" in output
    assert rows["test_cpu.py::test_json_round_trip"]["scenario"] == "local_direct"
    hopper = rows["test_multi_gpu.py::test_hopper_only"]
    assert (hopper["device_type"], hopper["partition"]) == ("H200", "batch")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--slurm-partition=nosuch"], ["nosuch", "valid partitions: batch, gb200"]),
        (["--slurm-account=nosuch", "-k", "test_one_gpu"], ["nosuch", "acct_a", "acct_b"]),
    ],
)
def test_examples_wrong_partition_or_account_exit_4(
    devcluster: dict, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    code, output, _ = plan_examples(tmp_path, *args)
    assert code == 4, output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in output
