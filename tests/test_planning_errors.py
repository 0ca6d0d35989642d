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
