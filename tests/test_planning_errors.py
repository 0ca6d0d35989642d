"""A test whose device markers or perf-sanity id cannot be read errors on its own; the run
goes on (issue 17 item 4). Configuration errors still stop it with exit 4."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_cpu_runs():
    pass

@pytest.mark.skip_less_device("four")
def test_unreadable_marker():
    raise AssertionError("must not run")

@pytest.mark.parametrize("perf_sanity_test_case", ["agg-some_config-srv", "disagg-e2e-time_breakdown"])
def test_e2e(perf_sanity_test_case):
    raise AssertionError("must not run")

def test_cpu_after():
    pass
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_") or name.endswith("_CONFIG_FOLDER"):
            monkeypatch.delenv(name)


def test_unreadable_tests_error_and_the_others_run(pytester: pytest.Pytester,
                                                  devcluster: dict) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trtllm-remote", "-rA")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.assert_outcomes(passed=2, errors=3)
    assert "must not run" not in out and "Traceback" not in out
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_unreadable_marker*",
        "skip_less_device('four'): found 'four'; "
        "expected one non-negative integer*",
        "*ERROR at setup of test_e2e?agg-some_config-srv?*",
        "perf-sanity id 'agg-some_config-srv': "
        "prefix 'agg' names neither aggr nor disagg; expected TensorRT-LLM perf-sanity id "
        "grammar 2026.2: *",
        "*ERROR at setup of test_e2e?disagg-e2e-time_breakdown?*",
        "perf-sanity id 'disagg-e2e-time_breakdown': no config name after the mode and "
        "modifier; expected *",
        "PASSED test_suite.py::test_cpu_runs",
        "PASSED test_suite.py::test_cpu_after",
    ])


def test_a_bad_option_still_stops_the_run(pytester: pytest.Pytester, devcluster: dict) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trtllm-remote",
                                           "--perf-config-yaml=nosuch.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--perf-config-yaml" in result.stderr.str()


LONG_BAD = ("disagg_upload-gen_only_no_context-"
            "gb300_deepseek-v4-pro-fp4_8k1k_con4301_ctx12_dep4_gen1_dep8_eplb384_mtp1_ccb-NIXL")


def test_a_renamed_id_errors_under_the_name_the_test_list_uses(pytester: pytest.Pytester,
                                                               devcluster: dict) -> None:
    """pytest's short id strategy calls it test_e2e[perf_sanity_test_case0]; the error says
    test_e2e[<the id as written>]."""
    from test_perf_sanity_stages import EMULATION, NATIVE_STRATEGY

    assert len(LONG_BAD) > 100  # what pytest renames

    pytester.makepyfile(test_perf_sanity=(
        "import pytest\n\n"
        f"@pytest.mark.parametrize('perf_sanity_test_case', [{LONG_BAD!r}])\n"
        "def test_e2e(perf_sanity_test_case):\n    raise AssertionError('must not run')\n\n"
        "def test_cpu():\n    pass\n"))
    args = ["-o", "parametrize_long_str_id_strategy=short"] if NATIVE_STRATEGY else []
    if not NATIVE_STRATEGY:
        pytester.makeconftest(f"STRATEGY = 'short'\n{EMULATION}")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trtllm-remote", *args)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_e2e?perf_sanity_test_case0?*",
        f"test_perf_sanity.py::test_e2e?{LONG_BAD}?: perf-sanity id '{LONG_BAD}': mode "
        "'gen_only_no_context' runs on the aggregated launch path*",
    ])
