"""Real TensorRT-LLM perf-sanity stage lists planned end to end (tests/data/perf_sanity).

Every id of the copied stage lists is collected as TensorRT-LLM collects it
(``perf/test_perf_sanity.py::test_e2e[<id>]``) and planned with ``--trtllm-plan-json``
against the copied configs. The expected sizing comes from what each stage list declares
about its own machines (name segments and ``system_gpu_count``), never from the plugin.
Both pytest id strategies are checked: the full id, and pytest 9's renaming of parameters
over 100 characters (``parametrize_long_str_id_strategy``, ``short`` by default from 9.2).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import _pytest.python
import pytest
import yaml

pytest_plugins = ["pytester"]

DATA = Path(__file__).resolve().parent / "data" / "perf_sanity"
LINE = re.compile(r"^perf/test_perf_sanity\.py::test_e2e\[(?P<id>[^\]]+)\](?:\s+TIMEOUT\s*\(\d+\))?$")
# pytest >= 9.2 has the ini; on older pytest the conftest below emulates it
NATIVE_STRATEGY = hasattr(_pytest.python, "LongStrIdStrategy")


@dataclass(frozen=True)
class Expected:
    stage: str
    nodes: int
    gpus: int  # exact for multi-node stages; the stage's GPU count (an upper bound) on one node
    exact: bool


def stage_expectation(name: str, system_gpus: int) -> Expected:
    """What a stage list says its tests get: ``ctx<N>_node<a>_gpu<b>_gen<M>_node<c>_gpu<d>``
    (N ctx servers of a nodes, M gen servers of c nodes), ``node<n>_gpu<g>``, or one node."""
    disagg = re.search(r"ctx(\d+)_node(\d+)_gpu(\d+)_gen(\d+)_node(\d+)_gpu(\d+)", name)
    if disagg:
        n_ctx, ctx_nodes, ctx_gpus, n_gen, gen_nodes, gen_gpus = map(int, disagg.groups())
        assert n_ctx * ctx_gpus + n_gen * gen_gpus == system_gpus, name  # the list agrees
        return Expected(name, n_ctx * ctx_nodes + n_gen * gen_nodes, system_gpus, True)
    multi = re.search(r"node(\d+)_gpu(\d+)", name)
    if multi:
        nodes, gpus = map(int, multi.groups())
        assert gpus == system_gpus, name
        return Expected(name, nodes, gpus, True)
    return Expected(name, 1, system_gpus, False)


def stage_ids() -> dict[str, Expected]:
    """Every uncommented id of every copied stage list, with what its stage declares."""
    found: dict[str, Expected] = {}
    for path in sorted((DATA / "test-db").glob("*perf_sanity*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for stage, blocks in doc.items():
            if stage == "version":
                continue
            for block in blocks:
                gpus = block["condition"]["ranges"]["system_gpu_count"]
                assert gpus["gte"] == gpus["lte"], stage
                expected = stage_expectation(stage, gpus["gte"])
                for line in block["tests"]:
                    match = LINE.match(line.strip())
                    assert match, line
                    found[match["id"]] = expected
    return found


STAGES = stage_ids()
CON4301 = "gb300_deepseek-v4-pro-fp4_8k1k_con4301_ctx12_dep4_gen1_dep8_eplb384_mtp1_ccb-NIXL"
CON8 = "gb300_deepseek-v4-pro-fp4_8k1k_con8_ctx1_dep4_gen4_tep8_eplb0_mtp3_ccb-NIXL"
# gen_only_no_context (no stage list has one yet): TensorRT-LLM's launcher tests give
# con4301 2 nodes / 8 GPUs and con8 (one of four gen replicas) 2 nodes / 8 GPUs, against
# 14 / 56 and 9 / 36 for gen_only over the same files
GENERATOR_SIZES = {
    f"aggr-gen_only_no_context-{CON4301}": Expected("launcher tests", 2, 8, True),
    f"aggr_upload-gen_only_no_context-time_breakdown-{CON8}": Expected("launcher tests", 2, 8,
                                                                        True),
    f"disagg-gen_only-{CON8}": Expected("launcher tests", 9, 36, True),
}
# ids of a spelling the grammar does not know: each errors, the rest plans
UNREADABLE = {
    "aggr_upload-ctx_only-time_breakdown": "no config name after the mode and modifier",
    f"disagg_upload-gen_only_no_context-{CON4301}": "aggregated launch path",
    f"agg2_upload-{CON4301}": "prefix 'agg2_upload'",
}

# A fake of pytest >= 9.2's parametrize_long_str_id_strategy for the pytest installed here
# when it predates the option: the same renaming, by the hook pytest calls for every value.
EMULATION = '''
import hashlib

def pytest_make_parametrize_id(config, val, argname):
    strategy = STRATEGY
    if not isinstance(val, str) or len(val) <= 100 or strategy == "legacy":
        return None
    if strategy == "sha256":
        return hashlib.sha256(val.encode()).hexdigest()
    return argname + str(_index(val))

_SEEN = {}

def _index(val):
    return _SEEN.setdefault(val, len(_SEEN))
'''


def suite(pytester: pytest.Pytester, ids: list[str], strategy: str) -> list[str]:
    """TensorRT-LLM's layout: perf/test_perf_sanity.py with one test_e2e per id; returns
    the extra pytest arguments that select the id strategy."""
    (pytester.path / "perf").mkdir()
    (pytester.path / "perf" / "test_perf_sanity.py").write_text(
        "import pytest\n\n"
        f"@pytest.mark.parametrize('perf_sanity_test_case', {ids!r})\n"
        "def test_e2e(perf_sanity_test_case):\n"
        "    raise AssertionError('a plan runs nothing')\n", encoding="utf-8")
    if NATIVE_STRATEGY:
        return ["-o", f"parametrize_long_str_id_strategy={strategy}"]
    pytester.makeconftest(f"STRATEGY = {strategy!r}\n{EMULATION}")
    return []


@pytest.fixture(autouse=True)
def _config_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGG_CONFIG_FOLDER", str(DATA / "aggregated"))
    monkeypatch.setenv("DISAGG_CONFIG_FOLDER", str(DATA / "disaggregated"))


def plan(pytester: pytest.Pytester, ids: list[str], strategy: str
         ) -> tuple[pytest.RunResult, dict[str, dict]]:
    args = suite(pytester, ids, strategy)
    out = pytester.path / "plan.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--trtllm-plan",
                                           "--trtllm-plan-json", str(out), *args)
    rows = json.loads(out.read_text())["tests"] if out.exists() else []
    written = {}
    for row in rows:
        shown = row["name"] or row["nodeid"]  # the test as the test list spells it
        match = re.fullmatch(r"perf/test_perf_sanity\.py::test_e2e\[(.+)\]", shown)
        assert match, shown
        written[match[1]] = row
    return result, written


@pytest.mark.parametrize("strategy", ["legacy", "short", "sha256"])
def test_every_stage_id_is_sized_as_its_stage_declares(pytester: pytest.Pytester,
                                                       strategy: str) -> None:
    wanted = {**STAGES, **GENERATOR_SIZES}
    ids = [*wanted, *UNREADABLE]
    result, rows = plan(pytester, ids, strategy)
    output = result.stdout.str() + result.stderr.str()
    assert sorted(rows) == sorted(ids), output  # every id has a row, named as written
    # the unreadable ids error (exit 1), each naming itself as written and the grammar
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    for label, needle in UNREADABLE.items():
        error = rows[label]["error"]
        assert error and needle in error and "perf-sanity id grammar" in error, (label, error)
        assert f"test_e2e[{label}]" in error and "perf_sanity_test_case" not in error
    wrong = {}
    for label, expected in wanted.items():
        row = rows[label]
        got = (row["nodes"], row["devices"])
        ok = row["error"] is None and (got == (expected.nodes, expected.gpus) if expected.exact
                                       else row["nodes"] == 1 and 0 < row["devices"] <= expected.gpus)
        if not ok:
            wrong[label] = (expected, got, row["error"])
    assert not wrong, wrong
    # the printed plan names every test as the test list does
    for label in ids:
        assert f"perf/test_perf_sanity.py::test_e2e[{label}]" in result.stdout.str(), label
    renamed = strategy != "legacy"
    assert ("(pytest id perf/test_perf_sanity.py::test_e2e[" in result.stdout.str()) is renamed
    assert f"{len(ids)} test(s): " in result.stdout.str()
    assert f"{len(UNREADABLE)} error(s)" in result.stdout.str()


def test_fixture_covers_every_shape() -> None:
    """The copied stage lists hold every shape the grammar knows, so the test above plans
    them all: aggr with a server, ctx_only, e2e, gen_only and the time_breakdown modifier."""
    labels = list(STAGES)
    assert any(re.match(r"aggr_upload-[^-]+-.+", x) and "ctx_only" not in x for x in labels)
    for shape in ("aggr_upload-ctx_only-", "disagg_upload-e2e-", "disagg_upload-gen_only-",
                  "-time_breakdown-"):
        assert any(shape in x for x in labels), shape
    assert all(len(f"test_e2e[{x}]") > 100 for x in labels if x.startswith("disagg"))
