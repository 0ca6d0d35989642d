"""A dispatched run honours the user's whole invocation and reads like the plain run.

The sample suite (tests/data/invocation_suite) has an 'unknown' plugin (its conftest)
whose options come from the command line, PYTEST_ADDOPTS and the ini's addopts, one
with a path relative to the invocation directory; a pytest-rerunfailures test that
fails every attempt; a test id that contains the default hang pattern; junit
recorders; pytest-xdist's identity. Each is run plainly and dispatched
(local_direct here; local Slurm with warm workers in test_invocation_fidelity_slurm.py)
and compared: exit code, summary line, every report, junit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# the suite's flaky marker and --reruns are pytest-rerunfailures' (the test extra pins it);
# without it this module must fail, not skip
import pytest_rerunfailures  # noqa: E402,F401
from dispatch_helpers import (
    copy_suite,
    dispatch_properties,
    junit_cases,
    run_suite,
    suite_properties,
    without_addresses,
)

DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
# what a user types, from a sub-directory of the rootdir: options of a plugin the
# plugin does not know, a path relative to here, rerunfailures' option, verbosity
USER_ARGS = ["-p", "no:cacheprovider", "-v", "--suite-value", "v 1", "--data-file=data.txt",
             "--reruns", "2", "../check_invocation.py"]
USER_ENV = {"PYTEST_ADDOPTS": "--from-env=env-value"}


def summary(run) -> str:
    lines = [line for line in run.stdout.splitlines() if line.startswith("=") and " in " in line]
    return lines[-1].split(" in ")[0].strip("= ") if lines else ""


def compare(plain, dispatched) -> None:
    """What a user checks: exit code, summary, each report in order, junit."""
    assert dispatched.returncode == plain.returncode, dispatched.stdout
    assert summary(dispatched) == summary(plain), dispatched.stdout
    # each test's reports in order (batches that run side by side interleave tests)
    assert dispatched.outcomes() == plain.outcomes()
    by_test = lambda run: {n: [without_addresses(r["longrepr"]) for r in run.reports  # noqa: E731
                               if r["nodeid"] == n] for n in run.outcomes()}
    assert by_test(dispatched) == by_test(plain)
    assert junit_cases(dispatched.junit) == junit_cases(plain.junit)
    assert suite_properties(dispatched.junit) == suite_properties(plain.junit)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_suite("invocation_suite", tmp_path_factory.mktemp("invocation"))


@pytest.fixture(scope="module")
def runs(suite: Path):
    here = suite / "sub"
    plain = run_suite(suite, *USER_ARGS, env=USER_ENV, tag="plain", cwd=here)
    dispatched = run_suite(suite, *USER_ARGS, *DISPATCH, env=USER_ENV, tag="dispatched", cwd=here)
    return plain, dispatched


def test_the_plain_run_is_what_the_comparison_expects(runs) -> None:
    plain, _ = runs
    assert plain.returncode == 1, plain.stdout
    assert summary(plain) == "2 failed, 3 passed, 1 warning, 3 rerun", plain.stdout


def test_dispatched_run_reads_as_the_plain_one(runs) -> None:
    plain, dispatched = runs
    compare(plain, dispatched)


def test_every_attempt_of_a_rerun_test_is_replayed(runs) -> None:
    _, dispatched = runs
    flaky = dispatched.outcomes()["check_invocation.py::test_flaky_fails_every_time"]
    assert [o for w, o in flaky if w == "call"] == ["rerun", "failed"]
    always = dispatched.outcomes()["check_invocation.py::test_fails_every_time"]
    assert [o for w, o in always if w == "call"] == ["rerun", "rerun", "failed"]


def test_a_test_id_with_a_hang_pattern_is_no_hang(runs) -> None:
    _, dispatched = runs
    nodeid = "check_invocation.py::test_id_names_a_hang_pattern[hang detected]"
    assert dispatched.outcomes()[nodeid] == [
        ("setup", "passed"), ("call", "passed"), ("teardown", "passed")], dispatched.stdout
    assert "HANG_DETECTED" not in dispatched.stdout


def test_the_rerun_line_carries_the_forwarded_options(runs, suite: Path) -> None:
    _, dispatched = runs
    rerun = [line for line in dispatched.stdout.splitlines() if "re-run:" in line]
    assert rerun, dispatched.stdout
    line = rerun[0]
    assert "--suite-value='v 1'" in line or "'--suite-value=v 1'" in line, line
    assert f"--data-file={suite / 'sub' / 'data.txt'}" in line, line
    assert "--from-ini=ini-value" in line, line
    # PYTEST_ADDOPTS is never argv (it may hold a secret): the shell the line is run in
    # has it, as the worker had it in its environment
    assert "--from-env=env-value" not in line, line
    assert "--reruns=2" in line, line
    assert "--trtllm-remote" not in line and "../check_invocation.py" not in line, line


def test_junit_records_and_dispatch_properties_reach_the_controller(runs) -> None:
    plain, dispatched = runs
    assert ("build", "42") in suite_properties(dispatched.junit)
    case = next(c for c in junit_cases(dispatched.junit)
                if c["attrs"]["name"] == "test_records_junit")
    assert case["attrs"]["owner"] == "team-a"
    props = dispatch_properties(dispatched.junit)
    assert set(props) == {c["attrs"]["name"] for c in junit_cases(plain.junit)}
    for name, found in props.items():
        assert set(found) == {"trtllm_slurm_job_id", "trtllm_slurm_nodes",
                              "trtllm_slurm_scenario", "trtllm_slurm_log"}, name
        assert found["trtllm_slurm_scenario"] == "local_direct"
        assert Path(found["trtllm_slurm_log"]).name == "job.log"
    assert not any(dispatch_properties(plain.junit).values())


def test_an_option_the_target_cannot_parse_fails_the_batch_with_pytests_message(
        suite: Path) -> None:
    run = run_suite(suite, "-p", "no:cacheprovider", "--only-here", "check_hostile.py",
                    *DISPATCH, tag="only-here")
    assert run.returncode == 1, run.stdout
    assert "3 failed" in summary(run), run.stdout
    assert "unrecognized arguments: --only-here" in run.stdout
    assert "usage error" in run.stdout
    assert "INTERNALERROR" not in run.stdout


def test_xdist_workers_pass_their_identity_to_dispatched_tests(suite: Path,
                                                                tmp_path: Path) -> None:
    seen: dict[str, list[dict]] = {}
    for tag, extra in (("plain-xdist", []), ("dispatched-xdist", DISPATCH)):
        out = tmp_path / tag
        out.mkdir()
        run = run_suite(suite, "-p", "no:cacheprovider", "-n", "2", "check_identity.py",
                        *extra, env={"IDENTITY_DIR": str(out)}, tag=tag)
        assert run.returncode == 0, run.stdout
        seen[tag] = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    for tag, views in seen.items():
        assert len(views) == 6, tag
        uids = {v["testrun_uid"] for v in views}
        assert len(uids) == 1, (tag, views)
        for view in views:
            assert view["worker_id"] in ("gw0", "gw1"), (tag, view)
            assert view["PYTEST_XDIST_WORKER"] == view["worker_id"], (tag, view)
            assert view["PYTEST_XDIST_WORKER_COUNT"] == "2", (tag, view)
            assert view["PYTEST_XDIST_TESTRUNUID"] == view["testrun_uid"], (tag, view)


HOSTILE = {
    "not-json-object": ("[1, 2]", "not a JSON object"),
    "another-batchs-test": (json.dumps({"v": 1, "type": "start", "location": ["x", 0, "y"],
                                        "nodeid": "check_other.py::test_elsewhere"}),
                            "not a test of this batch"),
    "other-version": (json.dumps({"v": 99, "type": "finish",
                                  "nodeid": "check_hostile.py::test_hostile"}),
                      "record version 99"),
    "malformed-report": (json.dumps({"v": 1, "type": "report", "data": {
        "$report_type": "TestReport", "nodeid": "check_hostile.py::test_hostile"}}),
                         "malformed 'report' record"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_record_the_controller_refuses_fails_its_batch_and_the_run_goes_on(
        suite: Path, case: str) -> None:
    line, why = HOSTILE[case]
    run = run_suite(suite, "-p", "no:cacheprovider", "check_hostile.py", *DISPATCH,
                    env={"HOSTILE_LINE": line}, tag=f"hostile-{case}")
    assert run.returncode == 1, run.stdout
    assert "INTERNALERROR" not in run.stdout
    outcomes = {n.split("::")[1]: [o for w, o in r if w == "call"]
                for n, r in run.outcomes().items()}
    assert outcomes == {"test_before": ["passed"], "test_hostile": ["failed"],
                        "test_after": ["failed"]}, run.stdout
    assert "wrote a record the controller refuses" in run.stdout
    assert why in run.stdout
    assert line[:40] in run.stdout  # the raw line is shown


def test_a_warning_category_in_a_record_imports_nothing(suite: Path) -> None:
    line = json.dumps({"v": 1, "type": "warning", "when": "runtest",
                       "nodeid": "check_hostile.py::test_hostile", "message": "from a record",
                       "category": "this.Zen", "filename": "f.py", "lineno": 1})
    run = run_suite(suite, "-p", "no:cacheprovider", "check_hostile.py", *DISPATCH,
                    env={"HOSTILE_LINE": line}, tag="category")
    assert run.returncode == 0, run.stdout
    assert "Beautiful is better than ugly" not in run.stdout
    assert "UserWarning: from a record" in run.stdout


def test_a_hang_the_test_prints_is_still_seen_among_pytests_own_lines(suite: Path) -> None:
    run = run_suite(suite, "-p", "no:cacheprovider", "-v", "check_hang.py", *DISPATCH,
                    tag="hang")
    assert run.returncode == 1, run.stdout
    assert "HANG_DETECTED" in run.stdout, run.stdout
