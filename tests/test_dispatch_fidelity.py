"""Dispatched runs must read exactly like plain runs (report by report, and in junit XML)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dispatch_helpers import copy_suite, junit_cases, run_suite, without_addresses

DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(3) as threads:
        yield threads


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory: pytest.TempPathFactory, pool: ThreadPoolExecutor):
    """The plain, dispatched and xdist runs of one copy of the suite, started side by side
    (they share only the suite's files: each has its own reports, junit file and batch
    folders, and the suite's tests write no file)."""
    base = tmp_path_factory.mktemp("fidelity")
    marker = base / "injected"
    suite = copy_suite("fidelity_suite", base, {"MARKER_PATH": str(marker)})
    started = {
        "plain": pool.submit(run_suite, suite, "-p", "no:cacheprovider", tag="plain"),
        "dispatched": pool.submit(run_suite, suite, "-p", "no:cacheprovider", *DISPATCH,
                                  tag="dispatched"),
        "xdist": pool.submit(run_suite, suite, "-p", "no:cacheprovider", "-n", "2", *DISPATCH,
                             tag="xdist"),
    }
    return started, marker


@pytest.fixture(scope="module")
def runs(suite_runs):
    started, marker = suite_runs
    return started["plain"].result(), started["dispatched"].result(), marker


@pytest.fixture(scope="module")
def xdist_run(suite_runs):
    started, _ = suite_runs
    return started["xdist"].result()


def _summary(run) -> str:
    """pytest's closing line without its time (other plugins may print after it)."""
    lines = [line for line in run.stdout.splitlines() if line.startswith("=") and " in " in line]
    return lines[-1].split(" in ")[0].strip("= ")


def test_under_xdist_every_test_is_reported_once(runs, xdist_run) -> None:
    plain, _, _ = runs
    assert xdist_run.returncode == plain.returncode, xdist_run.stdout
    assert _summary(xdist_run) == _summary(plain)
    key = lambda r: (r["nodeid"], r["when"])  # noqa: E731
    assert sorted(map(key, xdist_run.reports)) == sorted(map(key, plain.reports))
    assert junit_cases(xdist_run.junit) == junit_cases(plain.junit)


def test_same_exit_code_and_summary(runs) -> None:
    plain, dispatched, _ = runs
    assert plain.returncode == 1, plain.stdout
    assert dispatched.returncode == plain.returncode, dispatched.stdout
    assert _summary(dispatched) == _summary(plain)


def test_every_report_matches(runs) -> None:
    plain, dispatched, _ = runs
    assert len(plain.reports) > 40
    key = lambda r: (r["nodeid"], r["when"])  # noqa: E731
    plain_by = {key(r): r for r in plain.reports}
    dispatched_by = {key(r): r for r in dispatched.reports}
    assert sorted(dispatched_by) == sorted(plain_by)
    assert len(dispatched.reports) == len(plain.reports), "a phase was reported twice"
    for k, expected in plain_by.items():
        got = dispatched_by[k]
        for field in ("outcome", "longrepr", "sections", "wasxfail", "location", "keywords"):
            assert without_addresses(got[field]) == without_addresses(expected[field]), (k, field)


def test_dispatched_reports_carry_the_job_section(runs) -> None:
    _, dispatched, _ = runs
    assert "trtllm-slurm" in dispatched.stdout
    assert "re-run:" in dispatched.stdout and "-m pytest" in dispatched.stdout
    assert "scenario: local_direct" in dispatched.stdout


def test_junit_testcases_match(runs) -> None:
    plain, dispatched, _ = runs
    assert junit_cases(dispatched.junit) == junit_cases(plain.junit)


def test_chained_exceptions_survive(runs) -> None:
    _, dispatched, _ = runs
    assert "The above exception was the direct cause of the following exception" in dispatched.stdout
    assert "During handling of the above exception, another exception occurred" in dispatched.stdout


def test_hostile_ids_reach_no_shell(runs) -> None:
    plain, dispatched, marker = runs
    ids = [r["nodeid"] for r in dispatched.reports if "test_weird_ids" in r["nodeid"]]
    assert any("$(touch" in i for i in ids)
    assert not marker.exists(), "a node id was evaluated by a shell"


def test_work_dir_has_spec_and_reports(runs) -> None:
    plain, _, _ = runs
    suite = plain.junit.parent
    specs = list((suite / "work_dirs").glob("*/job_spec.json"))
    assert specs, "no job_spec.json written"
    assert all(oct(s.stat().st_mode & 0o777) == "0o600" for s in specs)
    assert all((s.parent / "reports.jsonl").stat().st_size > 0 for s in specs)


@pytest.fixture
def small_suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_small.py").write_text(
        "import time\n\n"
        "def test_a():\n    time.sleep(0.2)\n\n"
        "def test_b():\n    assert 0, 'b fails'\n\n"
        "def test_c():\n    pass\n\n"
        "def test_d():\n    assert 0, 'd fails'\n"
    )
    return tmp_path


def test_last_failed_cache_is_written_by_the_controller(small_suite: Path) -> None:
    first = run_suite(small_suite, *DISPATCH, tag="first")
    assert "2 failed, 2 passed" in first.stdout
    again = run_suite(small_suite, *DISPATCH, "--lf", tag="lf")
    assert "2 failed" in again.stdout and "passed" not in again.stdout.splitlines()[-1]
    assert sorted(again.outcomes()) == ["test_small.py::test_b", "test_small.py::test_d"]
    first_failed = run_suite(small_suite, *DISPATCH, "--ff", "-v", tag="ff")
    order = [line.split(" ")[0] for line in first_failed.stdout.splitlines()
             if line.startswith("test_small.py::")]
    assert order[:2] == ["test_small.py::test_b", "test_small.py::test_d"], order


def test_exitfirst_stops_the_run(small_suite: Path) -> None:
    run = run_suite(small_suite, "-p", "no:cacheprovider", *DISPATCH, "-x", tag="x")
    assert run.returncode == 1
    assert "stopping after 1 failures" in run.stdout
    assert "test_small.py::test_c" not in run.outcomes()
    assert "test_small.py::test_d" not in run.outcomes()


def test_durations_include_dispatched_tests(small_suite: Path) -> None:
    run = run_suite(small_suite, "-p", "no:cacheprovider", *DISPATCH, "--durations=2",
                    "--durations-min=0.1", tag="durations")
    assert "slowest 2 durations" in run.stdout
    assert "call     test_small.py::test_a" in run.stdout
