"""requirements.py: markers, perf-sanity YAML, bench/eval commands, time limits."""

from __future__ import annotations

import hashlib
import math
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_trtllm_slurm.errors import ConfigError, TestSpecError
from pytest_trtllm_slurm.planning.durations import format_slurm_time, parse_time_limit
from pytest_trtllm_slurm.planning.models import DeviceRequirement, Launch
from pytest_trtllm_slurm.planning.perf_sanity import (
    GRAMMAR_VERSION,
    PerfCase,
    PerfSources,
    load_perf_yaml,
    parse_perf_case,
    perf_requirement,
)
from pytest_trtllm_slurm.planning.requirements import (
    marker_config,
    parse_bench_command,
    parse_eval_command,
    size_marks,
)
from pytest_trtllm_slurm.planning.settings import Settings

NODEID = "tests/test_x.py::test_y[a]"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGG_CONFIG_FOLDER", "DISAGG_CONFIG_FOLDER"):
        monkeypatch.delenv(name, raising=False)


def marks(**by_name: Any) -> Any:
    """A get_closest_marker stand-in: marks(skip_less_device=(4,)) or (args, kwargs)."""
    table = {}
    for name, spec in by_name.items():
        args, kwargs = spec if isinstance(spec, tuple) and len(spec) == 2 and isinstance(
            spec[1], dict) else (spec if isinstance(spec, tuple) else (spec,), {})
        table[name] = getattr(pytest.mark, name)(*args, **kwargs).mark
    return table.get


def req(settings_: Settings | None = None, **by_name: Any):  # type: ignore[no-untyped-def]
    return size_marks(NODEID, marks(**by_name), settings_ or Settings())[1]


# --------------------------------------------------------------------------- time limits


@pytest.mark.parametrize(
    "text, seconds",
    [("1h", 3600), ("30m", 1800), ("3600s", 3600), ("1h30m", 5400), ("2d", 172800),
     ("01:00:00", 3600), ("36:00:00", 129600), ("45:30", 2730), ("1-02:03:04", 93784),
     (" 10M ", 600), ("0s", 0)],
)
def test_parse_time_limit_accepts(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "1x", "h", "1:60", "1:2:3:4", "1-24:00:00",
                                  "1-02:03", "-5m", "1.5h", "1h 30m", "abc"])
def test_parse_time_limit_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_time_limit(text, what="--slurm-time-limit")
    assert "--slurm-time-limit" in str(info.value) and repr(text) in str(info.value)
    assert "HH:MM:SS" in str(info.value)


def test_format_slurm_time() -> None:
    assert format_slurm_time(0) == "00:00:00"
    assert format_slurm_time(3661) == "01:01:01"
    assert format_slurm_time(86400 + 5) == "1-00:00:05"
    with pytest.raises(ValueError):
        format_slurm_time(-1)


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_time_round_trip(seconds: int) -> None:
    text = format_slurm_time(seconds)
    assert parse_time_limit(text) == seconds
    clock = text.split("-")[-1]
    assert len(clock.split(":")) == 3 and all(len(part) >= 2 for part in clock.split(":"))


@given(st.integers(0, 30), st.integers(0, 100), st.integers(0, 200), st.integers(0, 5000))
def test_unit_durations(d: int, h: int, m: int, s: int) -> None:
    parts = [(d, "d"), (h, "h"), (m, "m"), (s, "s")]
    text = "".join(f"{value}{unit}" for value, unit in parts if value)
    if not text:
        text = "0s"
    assert parse_time_limit(text) == d * 86400 + h * 3600 + m * 60 + s


# --------------------------------------------------------------------------- commands


@pytest.mark.parametrize(
    "cmd, expected",
    [
        ("trtllm-bench --model m throughput --tp 4 --pp 2", (4, 2)),
        ("trtllm-bench --model m throughput --tp=8", (8, 1)),
        ("trtllm-bench --model m latency", (1, 1)),
        ("trtllm-bench --tp 2 prepare-dataset && trtllm-bench --model m throughput --tp 4",
         (4, 1)),
        ("cd /x; /usr/bin/trtllm-bench throughput --pp=3 --tp 2 | tee log", (2, 3)),
        ("trtllm-bench throughput --tp 4 --tp 2", (2, 1)),
    ],
)
def test_parse_bench_command(cmd: str, expected: tuple[int, int]) -> None:
    assert parse_bench_command(cmd) == expected


def test_parse_eval_command() -> None:
    assert parse_eval_command("trtllm-eval --model m --tp_size 4 --pp_size 2 mmlu") == (4, 2)
    assert parse_eval_command("trtllm-eval --model m --tp_size=8 gsm8k") == (8, 1)
    assert parse_eval_command("trtllm-eval --model m gsm8k") == (1, 1)


@pytest.mark.parametrize("cmd", ["echo hi", "trtllm-bench --tp four", "trtllm-bench --tp",
                                 "trtllm-bench --tp 0", "trtllm-bench 'unclosed"])
def test_parse_bench_command_errors(cmd: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bench_command(cmd)
    assert "expected" in str(info.value)


_extra = st.sampled_from(["--model", "/m", "throughput", "--dataset", "d.json", "--ep", "2",
                          "--backend", "pytorch", "--streaming"])


@given(
    tp=st.integers(1, 64), pp=st.integers(1, 16), use_eq=st.booleans(),
    before=st.lists(_extra, max_size=4), after=st.lists(_extra, max_size=4),
    earlier=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 16)), max_size=3),
    sep=st.sampled_from([" && ", "; ", " || "]),
)
def test_bench_last_invocation_counts(tp: int, pp: int, use_eq: bool, before: list[str],
                                      after: list[str], earlier: list[tuple[int, int]],
                                      sep: str) -> None:
    def flags(t: int, p: int) -> list[str]:
        return [f"--tp={t}", f"--pp={p}"] if use_eq else ["--tp", str(t), "--pp", str(p)]

    chain = [shlex.join(["trtllm-bench", *flags(t, p)]) for t, p in earlier]
    chain.append(shlex.join(["trtllm-bench", *before, *flags(tp, pp), *after]))
    assert parse_bench_command(sep.join(chain)) == (tp, pp)


@given(tp=st.integers(1, 64), pp=st.integers(1, 16), task=st.sampled_from(["mmlu", "gsm8k"]))
def test_eval_round_trip(tp: int, pp: int, task: str) -> None:
    cmd = f"trtllm-eval --model /m --tp_size {tp} --pp_size {pp} --ep_size 2 {task}"
    assert parse_eval_command(cmd) == (tp, pp)


# --------------------------------------------------------------------------- markers


def test_no_marker_is_a_cpu_test() -> None:
    r = req()
    assert (r.total, r.per_node, r.nodes(), r.source) == (0, None, 1, "default")


def test_skip_less_device_is_one_node() -> None:
    r = req(skip_less_device=4)
    assert (r.total, r.per_node, r.nodes(2), r.source) == (4, 4, 1, "skip_less_device")


def test_skip_less_device_zero() -> None:
    r = req(skip_less_device=0)
    assert (r.total, r.per_node) == (0, None)


def test_mpi_world_size_may_span_nodes() -> None:
    r = req(skip_less_mpi_world_size=8)
    assert (r.total, r.per_node, r.source) == (8, None, "skip_less_mpi_world_size")
    assert (r.resolve_per_node(4), r.nodes(4)) == (4, 2)
    assert (r.resolve_per_node(8), r.nodes(8)) == (8, 1)


def test_mpi_world_size_with_device_marker_keeps_spreading() -> None:
    """skip_less_device(2) next to mpi(8) is a per-node lower bound, not a per-node size."""
    r = req(skip_less_mpi_world_size=8, skip_less_device=2)
    assert (r.total, r.per_node, r.nodes(4), r.nodes(8)) == (8, None, 2, 1)


def test_memory_markers_and_device_type() -> None:
    r = req(Settings(device_type="H200"), skip_less_device=1, skip_less_device_memory=80000,
            skip_less_host_memory=256000)
    assert (r.device_memory_mib, r.host_memory_mib, r.device_type) == (80000, 256000, "H200")


@pytest.mark.parametrize(
    "option, keywords, expected_type, expected_keywords",
    [(None, ["H100", "H200"], None, ("H100", "H200")),
     ("NVIDIA H200", ["H100", "H200"], "NVIDIA H200", ("H100", "H200")),
     ("B200", ["H100"], "B200", ("H100",)), (None, "B200", None, ("B200",))],
)
def test_skip_device_not_contain(
    option: str | None, keywords: Any, expected_type: str | None, expected_keywords: tuple
) -> None:
    """Keywords are kept apart from the type: planning picks an available type among them."""
    r = req(Settings(device_type=option), skip_less_device=1, skip_device_not_contain=(keywords,))
    assert r.device_type == expected_type
    assert r.device_keywords == expected_keywords


def test_trtllm_slurm_device_type_wins() -> None:
    r = req(Settings(device_type="H100"), trtllm_slurm=((), {"devices": 2, "device_type": "B200"}),
            skip_device_not_contain=(["H100"],))
    assert r.device_type == "B200"


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"devices": 8}, (8, 8, 1)),
        ({"devices": 8, "nodes": 2}, (8, 4, 2)),
        ({"devices": 8, "devices_per_node": 4}, (8, 4, 2)),
        ({"devices_per_node": 4, "nodes": 3}, (12, 4, 3)),
        ({"devices": 6, "devices_per_node": 4, "nodes": 2}, (6, 4, 2)),
        ({"devices": 0}, (0, None, 1)),
    ],
)
def test_trtllm_slurm_counts(kwargs: dict[str, int], expected: tuple[Any, ...]) -> None:
    r = req(trtllm_slurm=((), kwargs), skip_less_device=1, skip_less_mpi_world_size=2)
    assert (r.total, r.per_node, r.nodes(8)) == expected
    assert r.source == "trtllm_slurm"


def test_trtllm_slurm_positional_devices() -> None:
    assert req(trtllm_slurm=(4,)).total == 4


def test_trtllm_slurm_without_devices_falls_through() -> None:
    r = req(trtllm_slurm=((), {"partition": "p"}), skip_less_device=2)
    assert (r.total, r.source) == (2, "skip_less_device")


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"nodes": 2}, "nodes alone"),
        ({"devices": 5, "nodes": 4}, "inconsistent"),
        ({"devices": 2, "devices_per_node": 4}, "inconsistent"),
        ({"devices": "four"}, "devices"),
        ({"devices": -1}, "devices"),
        ({"devcies": 4}, "devcies"),
        ({"time_limit": "soon"}, "soon"),
    ],
)
def test_trtllm_slurm_errors(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        req(trtllm_slurm=((), spec))
    assert NODEID in str(info.value) and needle in str(info.value)


def test_marker_config_fields() -> None:
    mark = pytest.mark.trtllm_slurm(partition="p", account="a", time_limit="90m",
                                    container_image="img", mounts="/a:/a", env={"X": "1"},
                                    launch="mpi", local=True).mark
    cfg = marker_config(NODEID, mark)
    assert (cfg.partition, cfg.account, cfg.time_limit, cfg.container_image) == (
        "p", "a", "01:30:00", "img")
    assert (cfg.mounts, cfg.env, cfg.launch, cfg.local) == (("/a:/a",), {"X": "1"}, Launch.MPI,
                                                            True)
    assert marker_config(NODEID, None).local is False


@pytest.mark.parametrize(
    "name, args, kwargs",
    [("skip_less_device", ("four",), {}), ("skip_less_device", (), {}),
     ("skip_less_device", (-2,), {}), ("skip_less_device", (True,), {}),
     ("skip_less_device", (4, 2), {}), ("skip_less_device", (), {"n": 4}),
     ("skip_less_mpi_world_size", (2.5,), {}), ("skip_less_device_memory", ("80GB",), {}),
     ("skip_less_host_memory", (-1,), {})],
)
def test_bad_marker_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        req(**{name: (args, kwargs)})
    text = str(info.value)
    assert NODEID in text and name in text and "expected" in text and "non-negative integer" in text


def test_bad_skip_device_not_contain() -> None:
    with pytest.raises(ConfigError, match="list of device"):
        req(skip_less_device=1, skip_device_not_contain=([1, 2],))


# --------------------------------------------------------------------------- perf-sanity


@pytest.mark.parametrize(
    "label, expected",
    [
        ("aggr-gpt_oss-gpt_oss_tp4ep4pp2_mtp1",
         PerfCase("aggr-gpt_oss-gpt_oss_tp4ep4pp2_mtp1", "gpt_oss", "aggr",
                  ("gpt_oss_tp4ep4pp2_mtp1",))),
        ("aggr_upload-cfg-srv-with-dash", PerfCase("aggr_upload-cfg-srv-with-dash", "cfg", "aggr",
                                                   ("srv-with-dash",))),
        ("aggr-cfg", PerfCase("aggr-cfg", "cfg", "aggr", ())),
        ("aggr-cfg-a,b", PerfCase("aggr-cfg-a,b", "cfg", "aggr", ("a", "b"))),
        ("disagg-e2e-ds-r1-fp4",
         PerfCase("disagg-e2e-ds-r1-fp4", "ds-r1-fp4", "disagg", (), "e2e")),
        ("disagg_upload-gen_only-x", PerfCase("disagg_upload-gen_only-x", "x", "disagg", (),
                                              "gen_only")),
        ("aggr-ctx_only-x", PerfCase("aggr-ctx_only-x", "x", "ctx_only", (), "ctx_only")),
        # the modifier sits between the mode and a config name that may hold '-'
        ("disagg_upload-e2e-time_breakdown-gb300_ds-v4-pro_ccb-NIXL",
         PerfCase("disagg_upload-e2e-time_breakdown-gb300_ds-v4-pro_ccb-NIXL",
                  "gb300_ds-v4-pro_ccb-NIXL", "disagg", (), "e2e", True)),
        ("disagg-gen_only-time_breakdown-x",
         PerfCase("disagg-gen_only-time_breakdown-x", "x", "disagg", (), "gen_only", True)),
        ("aggr_upload-ctx_only-time_breakdown-a-b",
         PerfCase("aggr_upload-ctx_only-time_breakdown-a-b", "a-b", "ctx_only", (), "ctx_only",
                  True)),
        # the generation worker alone, from the disaggregated YAML, on the aggregated path
        ("aggr-gen_only_no_context-c-UCX",
         PerfCase("aggr-gen_only_no_context-c-UCX", "c-UCX", "gen_only_no_context", (),
                  "gen_only_no_context")),
        ("aggr_upload-gen_only_no_context-time_breakdown-c",
         PerfCase("aggr_upload-gen_only_no_context-time_breakdown-c", "c",
                  "gen_only_no_context", (), "gen_only_no_context", True)),
        # a config name that merely contains the modifier is not a modifier
        ("disagg-e2e-time_breakdownx-c",
         PerfCase("disagg-e2e-time_breakdownx-c", "time_breakdownx-c", "disagg", (), "e2e")),
        # plain aggr ids have no modifier segment: the rest names the server
        ("aggr-cfg-time_breakdown", PerfCase("aggr-cfg-time_breakdown", "cfg", "aggr",
                                             ("time_breakdown",))),
    ],
)
def test_parse_perf_case(label: str, expected: PerfCase) -> None:
    assert parse_perf_case(label) == expected


@pytest.mark.parametrize(
    "label, needle",
    [("aggr", "no config name"), ("aggr-", "no config name"),
     ("bogus-x-y", "prefix 'bogus'"), ("disagg-x", "'x' is not one of e2e, gen_only"),
     ("disagg-ctx-x", "'ctx' is not one of"),
     ("disagg-e2e-time_breakdown", "no config name after the mode and modifier"),
     ("aggr-ctx_only-time_breakdown", "no config name after the mode and modifier"),
     ("disagg-e2e--x", "no config name"),
     ("disagg_upload-gen_only_no_context-c", "write it 'aggr-gen_only_no_context-<config>'"),
     ("disagg-ctx_only-c", "aggregated launch path")],
)
def test_parse_perf_case_errors(label: str, needle: str) -> None:
    """The message names the test, the id, what is wrong, the grammar and its version."""
    with pytest.raises(TestSpecError) as info:
        parse_perf_case(label, NODEID)
    text = str(info.value)
    assert text.startswith(f"{NODEID}: perf-sanity id {label!r}: ")
    assert needle in text and f"grammar {GRAMMAR_VERSION}" in text
    assert "time_breakdown" in text and "gen_only_no_context" in text  # the grammar is spelled


AGG = {
    "metadata": {"model_name": "m"},
    "hardware": {"gpus_per_node": 4},
    "server_configs": [
        {"name": "tp1", "tensor_parallel_size": 1},
        {"name": "tp4ep4", "tensor_parallel_size": 4, "moe_expert_parallel_size": 4},
        {"name": "tp2pp2cp2", "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
         "context_parallel_size": 2},
        {"name": "fixed", "tensor_parallel_size": 8, "gpus": 2},
    ],
}


@pytest.mark.parametrize(
    "label, expected",
    [("aggr-c-tp1", (1, 1)), ("aggr-c-tp4ep4", (4, 4)), ("aggr-c-tp2pp2cp2", (8, 4)),
     ("aggr-c-fixed", (2, 2)), ("aggr-c", (8, 4)), ("aggr-c-tp1,fixed", (2, 2))],
)
def test_aggr_requirement(label: str, expected: tuple[int, int]) -> None:
    assert perf_requirement(parse_perf_case(label), AGG, Path("c.yaml"), NODEID) == expected


def test_aggr_unknown_server() -> None:
    with pytest.raises(ConfigError) as info:
        perf_requirement(parse_perf_case("aggr-c-tp16"), AGG, Path("c.yaml"), NODEID)
    text = str(info.value)
    assert NODEID in text and "tp16" in text and "tp4ep4" in text and "c.yaml" in text


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"server_configs": [{"name": "a"}]}, "hardware"),
        ({"hardware": {}, "server_configs": [{"name": "a"}]}, "hardware.gpus_per_node"),
        ({"hardware": {"gpus_per_node": 0}, "server_configs": [{"name": "a"}]}, "gpus_per_node"),
        ({"hardware": {"gpus_per_node": 4}}, "server_configs"),
        ({"hardware": {"gpus_per_node": 4},
          "server_configs": [{"name": "a", "tensor_parallel_size": "x"}]}, "tensor_parallel_size"),
    ],
)
def test_perf_yaml_errors(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        perf_requirement(parse_perf_case("aggr-c"), data, Path("c.yaml"), NODEID)
    assert NODEID in str(info.value) and needle in str(info.value)


def disagg(ctx: int, gen: int, n_ctx: int, n_gen: int, gpn: int, **extra: Any) -> dict[str, Any]:
    return {
        "hardware": {"gpus_per_node": gpn, "num_ctx_servers": n_ctx, "num_gen_servers": n_gen},
        "worker_config": {"ctx": {"tensor_parallel_size": ctx},
                          "gen": {"tensor_parallel_size": gen}},
        **extra,
    }


def test_disagg_node_math() -> None:
    # ctx: ceil(4/4)=1 node x 2 servers; gen: ceil(8/4)=2 nodes x 1 server -> 4 nodes
    total, per_node = perf_requirement(parse_perf_case("disagg-e2e-x"), disagg(4, 8, 2, 1, 4),
                                       Path("x.yaml"), NODEID)
    assert (total, per_node) == (16, 4)


def test_disagg_gen_only_no_context() -> None:
    data = disagg(4, 8, 2, 1, 4, benchmark={"mode": "gen_only_no_context"})
    assert perf_requirement(parse_perf_case("disagg-gen_only-x"), data, Path("x"), NODEID) == (8, 4)
    assert perf_requirement(parse_perf_case("disagg-e2e-x"), data, Path("x"), NODEID) == (16, 4)


def test_ctx_only_uses_ctx_worker() -> None:
    data = disagg(2, 8, 1, 1, 4)
    assert perf_requirement(parse_perf_case("aggr-ctx_only-x"), data, Path("x"), NODEID) == (2, 2)


def test_gen_only_no_context_is_one_gen_worker() -> None:
    """One gen worker (num_gen_servers does not multiply it), no ctx worker at all."""
    data = disagg(4, 8, 12, 4, 4)
    for label in ("aggr-gen_only_no_context-x", "aggr_upload-gen_only_no_context-time_breakdown-x"):
        assert perf_requirement(parse_perf_case(label), data, Path("x"), NODEID) == (8, 4)
    # the same YAML for gen_only keeps both fleets: 12 x 1 node + 4 x 2 nodes
    assert perf_requirement(parse_perf_case("disagg-gen_only-x"), data, Path("x"), NODEID) == (
        80, 4)
    with pytest.raises(TestSpecError, match="worker_config"):
        perf_requirement(parse_perf_case("aggr-gen_only_no_context-x"),
                         {"hardware": {"gpus_per_node": 4}}, Path("x"), NODEID)


def test_world_size_wins_over_parallel_sizes() -> None:
    """A server's explicit world_size is what the launchers size it by."""
    data = disagg(2, 8, 1, 1, 4)
    data["worker_config"]["ctx"]["world_size"] = 8
    assert perf_requirement(parse_perf_case("aggr-ctx_only-x"), data, Path("x"), NODEID) == (8, 4)
    agg = {"hardware": {"gpus_per_node": 8},
           "server_configs": [{"name": "s", "tensor_parallel_size": 2, "world_size": 4}]}
    assert perf_requirement(parse_perf_case("aggr-c-s"), agg, Path("x"), NODEID) == (4, 4)


def test_disagg_errors() -> None:
    data = disagg(4, 8, 1, 1, 4)
    del data["hardware"]["num_gen_servers"]
    with pytest.raises(TestSpecError, match="num_gen_servers"):
        perf_requirement(parse_perf_case("disagg-e2e-x"), data, Path("x"), NODEID)
    with pytest.raises(ConfigError, match="no ctx or gen"):
        perf_requirement(parse_perf_case("disagg-e2e-x"), disagg(1, 1, 0, 0, 4), Path("x"), NODEID)


@settings(max_examples=200)
@given(tp=st.integers(1, 16), pp=st.integers(1, 8), cp=st.integers(1, 4), ep=st.integers(1, 16),
       gpn=st.integers(1, 16))
def test_aggr_node_math_property(tp: int, pp: int, cp: int, ep: int, gpn: int) -> None:
    data = {"hardware": {"gpus_per_node": gpn}, "server_configs": [
        {"name": "s", "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
         "context_parallel_size": cp, "moe_expert_parallel_size": ep}]}
    total, per_node = perf_requirement(parse_perf_case("aggr-c-s"), data, Path("c"), NODEID)
    assert total == tp * pp * cp
    assert 1 <= per_node <= min(total, gpn)
    d = DeviceRequirement(total=total, per_node=per_node)
    assert d.nodes() == math.ceil(total / per_node)


@settings(max_examples=200)
@given(ctx=st.integers(1, 32), gen=st.integers(1, 32), n_ctx=st.integers(0, 4),
       n_gen=st.integers(0, 4), gpn=st.integers(1, 8))
def test_disagg_node_math_property(ctx: int, gen: int, n_ctx: int, n_gen: int, gpn: int) -> None:
    nodes = math.ceil(ctx / gpn) * n_ctx + math.ceil(gen / gpn) * n_gen
    case = parse_perf_case("disagg-e2e-x")
    if nodes == 0:
        with pytest.raises(ConfigError):
            perf_requirement(case, disagg(ctx, gen, n_ctx, n_gen, gpn), Path("x"), NODEID)
        return
    total, per_node = perf_requirement(case, disagg(ctx, gen, n_ctx, n_gen, gpn), Path("x"), NODEID)
    assert per_node == gpn and total == nodes * gpn
    assert math.ceil(total / per_node) == nodes
    assert total >= ctx * n_ctx + gen * n_gen


@settings(max_examples=200)
@given(n=st.integers(0, 256), m=st.one_of(st.none(), st.integers(0, 64)),
       target=st.one_of(st.none(), st.integers(1, 16)))
def test_marker_node_math_property(n: int, m: int | None, target: int | None) -> None:
    spec: dict[str, Any] = {"skip_less_mpi_world_size": n}
    if m is not None:
        spec["skip_less_device"] = m
    r = req(**spec)
    assert r.total == n
    per_node = r.resolve_per_node(target)
    if n == 0:
        assert (per_node, r.nodes(target)) == (0, 1)
        return
    assert 1 <= per_node <= n
    if target is not None and r.per_node is None:
        assert per_node <= target
    assert r.nodes(target) == math.ceil(n / per_node)


# --------------------------------------------------------------------------- perf sources


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def perf_req(sources: PerfSources, label: str):  # type: ignore[no-untyped-def]
    return size_marks(NODEID, marks(), Settings(), perf_case=label, perf=sources)[1]


def test_perf_config_dir_and_env_folders(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_yaml(tmp_path / "mine" / "c.yaml", AGG)
    write_yaml(tmp_path / "agg" / "d.yaml", AGG)
    write_yaml(tmp_path / "dis" / "x.yaml", disagg(4, 4, 1, 1, 4))
    monkeypatch.setenv("AGG_CONFIG_FOLDER", "agg")  # relative: against the rootdir
    monkeypatch.setenv("DISAGG_CONFIG_FOLDER", str(tmp_path / "dis"))
    sources = PerfSources.from_settings(Settings(perf_config_dir=str(tmp_path / "mine")), tmp_path)
    assert perf_req(sources, "aggr-c-tp4ep4").total == 4
    r = perf_req(sources, "aggr-d")
    assert (r.total, r.per_node) == (8, 4)
    assert r.source == f"perf_yaml:{tmp_path / 'agg' / 'd.yaml'}"
    assert perf_req(sources, "disagg-e2e-x").total == 8


def test_default_folder_found_from_a_subdirectory_rootdir(tmp_path: Path) -> None:
    write_yaml(tmp_path / "tests/scripts/perf-sanity/aggregated/c.yaml", AGG)
    rootdir = tmp_path / "tests" / "integration" / "defs"
    rootdir.mkdir(parents=True)
    assert perf_req(PerfSources.from_settings(Settings(), rootdir), "aggr-c-tp1").total == 1


def test_perf_config_yaml_is_used_for_every_id(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "one.yaml", AGG)
    sources = PerfSources.from_settings(Settings(perf_config_yaml=str(path)), tmp_path)
    assert perf_req(sources, "aggr-anything-tp4ep4").total == 4


def test_missing_yaml_names_test_and_paths(tmp_path: Path) -> None:
    sources = PerfSources.from_settings(Settings(perf_config_dir=str(tmp_path)), tmp_path)
    with pytest.raises(ConfigError) as info:
        perf_req(sources, "aggr-nope-tp1")
    text = str(info.value)
    assert NODEID in text and "nope.yaml" in text and str(tmp_path) in text
    assert "AGG_CONFIG_FOLDER" in text
    with pytest.raises(ConfigError, match="tried no folder"):
        perf_req(PerfSources(), "aggr-nope")
    missing = PerfSources(yaml_path=tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match="--perf-config-yaml"):
        perf_req(missing, "aggr-x")


def test_markers_beat_perf_yaml() -> None:
    _, r = size_marks(NODEID, marks(skip_less_device=2), Settings(),
                      perf_case="aggr-x-y", perf=PerfSources())
    assert (r.total, r.source) == (2, "skip_less_device")


def test_yaml_cache_and_invalidation(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c.yaml", AGG)
    assert load_perf_yaml(path) is load_perf_yaml(path)
    write_yaml(path, {**AGG, "hardware": {"gpus_per_node": 8, "extra": "changed size"}})
    assert load_perf_yaml(path)["hardware"]["gpus_per_node"] == 8
    path.write_text("- just\n- a list\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_perf_yaml(path)
    path.write_text("a: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_perf_yaml(path)


# --------------------------------------------------------------------------- perf items


def perf_item(nodeid: str, params: dict[str, Any] | None = None) -> Any:
    from types import SimpleNamespace

    name = nodeid.rsplit("::", 1)[-1]
    return SimpleNamespace(nodeid=nodeid, name=name, originalname=name.split("[", 1)[0],
                           callspec=SimpleNamespace(params=params) if params else None)


LONG = "disagg_upload-e2e-time_breakdown-gb300_deepseek-v4-pro-fp4_8k1k_con4301_ctx12_dep4_gen1_dep8_ccb-NIXL"


@pytest.mark.parametrize(
    "nodeid, params, label",
    [
        # the parameter makes it a perf-sanity id, whatever its spelling (then it errors)
        ("t.py::test_e2e[agg-x]", {"perf_sanity_test_case": "agg-x"}, "agg-x"),
        ("t.py::test_e2e[perf_sanity_test_case0]", {"perf_sanity_test_case": LONG}, LONG),
        # without it, only a prefix upstream mints
        ("t.py::test_e2e[aggr_upload-c-s]", None, "aggr_upload-c-s"),
        ("t.py::test_e2e[aggregate-x]", None, None),
        ("t.py::test_other[aggr-c-s]", None, None),
    ],
)
def test_perf_label(nodeid: str, params: dict[str, Any] | None, label: str | None) -> None:
    from pytest_trtllm_slurm.planning.perf_sanity import perf_label

    assert perf_label(perf_item(nodeid, params)) == label


@pytest.mark.parametrize(
    "nodeid, written",
    [
        ("perf/test_perf_sanity.py::test_e2e[perf_sanity_test_case12]",
         f"perf/test_perf_sanity.py::test_e2e[{LONG}]"),
        (f"perf/test_perf_sanity.py::test_e2e[{hashlib.sha256(LONG.encode()).hexdigest()}]",
         f"perf/test_perf_sanity.py::test_e2e[{LONG}]"),
        ("perf/test_perf_sanity.py::test_e2e[perf_sanity_test_case3-fp8]",
         f"perf/test_perf_sanity.py::test_e2e[{LONG}-fp8]"),
        (f"perf/test_perf_sanity.py::test_e2e[{LONG}]", f"perf/test_perf_sanity.py::test_e2e[{LONG}]"),
    ],
)
def test_name_as_written_undoes_pytest_renaming(nodeid: str, written: str) -> None:
    from pytest_trtllm_slurm.planning.perf_sanity import perf_id

    assert perf_id(perf_item(nodeid, {"perf_sanity_test_case": LONG}))[1] == written
    assert perf_id(perf_item("t.py::test_x[a]"))[1] == "t.py::test_x[a]"
