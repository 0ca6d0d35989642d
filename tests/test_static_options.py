"""A conftest's options read from its source (``controller.static_options``), never imported:
what a CI stage's command line needs of them is accepted and parsed as the conftest would."""

from __future__ import annotations

from pathlib import Path

from _pytest.config.argparsing import Parser

from pytest_trtllm_slurm.controller.static_options import (
    initial_conftests,
    read_options,
    static_plugin,
)

CONFTEST = '''
import subprocess
import pytest

ROOT = "/models"
skip_pre_hopper = pytest.mark.skipif(int(subprocess.check_output("nvidia-smi -L")) < 90,
                                     reason="pre-Hopper")


def pytest_addoption(parser):
    parser.addoption("--test-list", "-F", action="store", default=None, help="list")
    parser.addoption("--waives-file", "-S", action="store", default=None)
    parser.addoption("--perf", action="store_true", help="perf tests")
    parser.addoption("--perf-log-formats", action="append", default=[])
    parser.addoption("--periodic-batch-size", type=int, default=10)
    parser.addoption("--models-root", default=ROOT)  # not a literal: left out, still parsed
    group = parser.getgroup("periodic")
    group.addoption("--periodic-junit", action="store_true")
    parser.addini("perf_metrics", "metrics to keep", type="linelist", default=[])


def helper(parser):
    parser.addoption("--not-an-option-of-the-suite")
'''


def test_literal_options_are_registered_and_parse_as_the_conftest_says(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    plugin = static_plugin(tmp_path, [str(tmp_path)], tmp_path)
    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    args = ["-F", "l0.txt", "--waives-file=w.txt", "--perf", "--perf-log-formats", "csv",
            "--perf-log-formats", "yaml", "--periodic-batch-size", "3", "--models-root", "/m",
            "--periodic-junit", "tests/"]
    ns = parser.parse(args)
    assert (ns.test_list, ns.waives_file, ns.perf, ns.perf_log_formats) == (
        "l0.txt", "w.txt", True, ["csv", "yaml"])
    assert (ns.periodic_batch_size, ns.models_root, ns.periodic_junit) == (3, "/m", True)
    assert "perf_metrics" in parser._inidict
    names = [o.names for o in read_options(tmp_path / "conftest.py")]
    assert ["--not-an-option-of-the-suite"] not in names  # only pytest_addoption counts
    assert plugin.skipped == []


def test_the_initial_conftests_are_those_of_the_arguments_and_their_parents(
        tmp_path: Path) -> None:
    for folder in ("", "defs", "defs/accuracy", "other", "defs/tests_x"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "conftest.py").write_text("")
    found = initial_conftests(tmp_path, ["defs/accuracy/test_a.py::test_x"], tmp_path)
    assert found == [(tmp_path / "conftest.py").resolve(), (tmp_path / "defs/conftest.py"),
                     (tmp_path / "defs/accuracy/conftest.py")]
    found = initial_conftests(tmp_path, ["defs"], tmp_path)
    assert (tmp_path / "defs/tests_x/conftest.py") in found
    assert (tmp_path / "other/conftest.py") not in found


def test_a_conftest_that_cannot_be_parsed_adds_nothing(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("def pytest_addoption(parser:\n")
    assert read_options(tmp_path / "conftest.py") == []
