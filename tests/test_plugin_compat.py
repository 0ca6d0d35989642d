"""Third-party pytest plugins, plain versus dispatched: the compatibility table.

Each row names a plugin, the sample tests that exercise it (tests/data/compat) and the
options it is run with. The sample project runs once plainly and once per dispatch mode
(local_direct; local Slurm with warm workers, on the real dev cluster), and every row
must read the same: exit code, pytest's closing line, each test's reports (every phase,
every attempt) and the plugin's own artefact (coverage table, benchmark JSON, timeout
message, rerun counts, junit properties...). Rows with the same options share one run per
mode, so the table grows without a run per row.

Plugins deliberately not in the table: pytest-randomly (active as soon as it is installed:
it would shuffle this project's own suite and every suite its tests run; the worker gets
the controller's seed, see ``forwarding.RESOLVED_HERE``), flaky (its ``flaky`` marker
clashes with pytest-rerunfailures', which is in the table) and pytest-instafail (it
prints from the replayed reports, as the terminal does: nothing a worker could change).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from devcluster import run as sh
from dispatch_helpers import SuiteRun, run_suite, without_addresses

DATA = Path(__file__).parent / "data" / "compat"
MODES = {
    "local_direct": ["--trtllm-remote", "--trtllm-dispatch=all",
                     "--trtllm-scenario=local_direct"],
    "slurm_warm": ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_slurm",
                   "--slurm-partition=batch"],
}


def _lines(text: str, pattern: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if re.search(pattern, line)]


def _call_longrepr(run: SuiteRun, nodeid: str, pattern: str) -> list[str]:
    """``nodeid`` and its parametrized copies (pytest-repeat's ``[1-2]``)."""
    return [line.strip() for r in run.reports
            if r["nodeid"] == nodeid or r["nodeid"].startswith(nodeid + "[")
            for line in (r["longrepr"] or "").splitlines() if re.search(pattern, line)]


def coverage_table(run: SuiteRun, state: Path) -> object:
    """pytest-cov's report rows and its fail-under verdict, as the user reads them."""
    return _lines(run.stdout, r"^(mymod\.py|TOTAL)\s|Required test coverage|Coverage failure")


def benchmark_results(run: SuiteRun, state: Path) -> object:
    """--benchmark-json's content that does not depend on timing, and the table's rows."""
    data = json.loads((state / "bench.json").read_text())
    benches = [(b["fullname"], b["name"], b["group"], b["params"], b["extra_info"],
                b["stats"]["rounds"], b["stats"]["iterations"], len(b["stats"]["data"]),
                sorted(b["stats"]), sorted(b["options"]))
               for b in data["benchmarks"]]
    table = [line.split()[0] for line in _lines(run.stdout, r"^test_(sum|sorted)\s")]
    return sorted(data), benches, table, re.findall(r"benchmark: \d+ tests", run.stdout)


def timeout_message(nodeid: str) -> Callable[[SuiteRun, Path], object]:
    return lambda run, state: _call_longrepr(run, nodeid, r"Timeout \(>")


def crash_message(nodeid: str) -> Callable[[SuiteRun, Path], object]:
    return lambda run, state: _call_longrepr(run, nodeid, r"CRASHED")


def summary_counts(run: SuiteRun, state: Path) -> object:
    return _summary(run)


def report_order(prefix: str) -> Callable[[SuiteRun, Path], object]:
    return lambda run, state: [r["nodeid"] for r in run.reports
                               if r["when"] == "call" and r["nodeid"].startswith(prefix)]


def each_copy_once(prefix: str) -> Callable[[SuiteRun, Path], object]:
    """Every copy of a repeated test reported once, with its outcome. Not their order: the
    copies may run in batches side by side, whose reports arrive as each test finishes (as
    pytest-xdist's workers' do); the order inside one batch is pytest-order's row's check."""
    return lambda run, state: sorted((r["nodeid"], r["outcome"]) for r in run.reports
                                     if r["when"] == "call" and r["nodeid"].startswith(prefix))


def subtest_lines(run: SuiteRun, state: Path) -> object:
    return sorted(_lines(run.stdout, r"^(SUBFAIL|SUBPASS|FAILED|PASSED) check_subtests"))


def unittest_subtest_lines(run: SuiteRun, state: Path) -> object:
    return sorted(_lines(run.stdout, r"^(SUB)?(FAILED|PASSED)\S* check_unittest_subtests"))


def longrepr_lines(nodeid: str, pattern: str) -> Callable[[SuiteRun, Path], object]:
    return lambda run, state: _call_longrepr(run, nodeid, pattern)


def html_results(run: SuiteRun, state: Path) -> object:
    """pytest-html's results table (result, test, links: not the duration) per test."""
    text = (state / "report.html").read_text()
    match = re.search(r'data-jsonblob="([^"]*)"', text)
    assert match, "no results in the html report"
    tests = json.loads(html.unescape(match.group(1)))["tests"]
    return {nodeid: [[cell for cell in result["resultsTableRow"]
                      if "col-duration" not in cell] for result in results]
            for nodeid, results in tests.items() if nodeid.startswith("check_html.py")}


def json_report(run: SuiteRun, state: Path) -> object:
    """pytest-json-report's file: each test's outcome, metadata, user properties, and per
    phase its outcome, streams, log messages and failure (not durations or times)."""
    data = json.loads((state / "report.json").read_text())

    def stage(s: dict) -> tuple:
        return (s.get("outcome"), s.get("stdout"), s.get("stderr"),
                [r.get("msg") for r in s.get("log", [])], (s.get("crash") or {}).get("message"))

    tests = [(t["nodeid"], t["outcome"], t.get("metadata"), t.get("user_properties"),
              [stage(t[w]) for w in ("setup", "call", "teardown") if w in t])
             for t in data["tests"] if t["nodeid"].startswith("check_json_report.py")]
    return data["exitcode"], data["summary"], sorted(tests, key=str)


def allure_results(run: SuiteRun, state: Path) -> object:
    """allure-pytest's results dir: each test's name, status, message, steps, labels (not
    host and thread: where it ran) and attachments; the fixtures its containers name."""
    results, fixtures = [], set()
    for path in (state / "allure").glob("*-result.json"):
        r = json.loads(path.read_text())
        results.append((r.get("fullName"), r.get("name"), r.get("status"),
                        (r.get("statusDetails") or {}).get("message"),
                        [(s.get("name"), s.get("status")) for s in r.get("steps", [])],
                        sorted((label["name"], label["value"]) for label in r.get("labels", [])
                               if label["name"] not in ("host", "thread")),
                        [a.get("name") for a in r.get("attachments", [])]))
    for path in (state / "allure").glob("*-container.json"):
        c = json.loads(path.read_text())
        fixtures.update(f.get("name") for f in c.get("befores", []) + c.get("afters", []))
    return sorted(results, key=str), sorted(fixtures)


def junit_properties(run: SuiteRun, state: Path) -> object:
    root = ET.parse(run.junit).getroot()
    # the plugin's own per-testcase properties (job id, nodes, ...) are dispatch-only
    return [(case.get("name"), [(p.get("name"), p.get("value")) for p in case.iter("property")
                                if not p.get("name", "").startswith("trtllm_slurm_")])
            for case in root.iter("testcase") if case.get("classname") == "check_junit_properties"]


def junit_suite_properties(run: SuiteRun, state: Path) -> object:
    root = ET.parse(run.junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    # hypothesis records each test's statistics (with its timings: only the name compares)
    props = [(p.get("name"), "?" if p.get("name", "").startswith("hypothesis-statistics-")
              else p.get("value")) for p in suite.findall("properties/property")]
    owners = [case.get("owner") for case in suite.iter("testcase")
              if case.get("classname") == "check_junit_suite_properties"]
    return props, owners


@dataclass(frozen=True)
class Row:
    plugin: str  # the distribution (pinned in pyproject.toml's test extra)
    case: str  # what is exercised
    files: tuple[str, ...]
    args: tuple[str, ...] = ()
    artefact: Callable[[SuiteRun, Path], object] | None = None  # the plugin's own output
    xfail: dict[str, str] = field(default_factory=dict)  # mode -> why it differs for now
    modes: tuple[str, ...] = tuple(MODES)

    @property
    def id(self) -> str:
        return f"{self.plugin}-{self.case}"


CLI_OPTIONS = ("--timeout=1", "--asyncio-mode=auto")  # (a rerun would not re-arm --timeout)
COLLECTION_OPTIONS = ("--forked", "--count=2")
# report writers (files under the run's state dir) and --disable-socket; pytest-dependency
# runs with them, away from pytest-order (which keeps a shape in one batch by itself)
REPORT_OPTIONS = ("--html={state}/report.html", "--json-report",
                  "--json-report-file={state}/report.json", "--alluredir={state}/allure",
                  "--clean-alluredir", "--disable-socket")

ROWS = [
    Row("pytest-cov", "branch-and-fail-under", ("check_cov.py",),
        ("--cov=mymod", "--cov-branch", "--cov-report=term-missing", "--cov-fail-under=50"),
        coverage_table),
    Row("pytest-cov", "under-xdist", ("check_cov.py",), ("--cov=mymod", "-n", "2"),
        coverage_table),
    Row("pytest-benchmark", "json-and-table", ("check_benchmark.py",),
        ("--benchmark-json={state}/bench.json",), benchmark_results),
    Row("pytest-timeout", "marker", ("check_timeout_marker.py",), (),
        timeout_message("check_timeout_marker.py::test_times_out")),
    Row("pytest-forked", "marker", ("check_forked_marker.py",), (),
        crash_message("check_forked_marker.py::test_crashes_in_its_fork")),
    Row("pytest-asyncio", "marker", ("check_asyncio_marker.py",)),
    Row("pytest-mock", "mocker", ("check_mock.py",)),
    Row("pytest-env", "ini-env", ("check_env.py",)),
    Row("pytest-order", "order-marker", ("check_order.py",), (),
        report_order("check_order.py")),
    Row("pytest", "junit-record-property", ("check_junit_properties.py",), (),
        junit_properties),
    Row("pytest", "subtests", ("check_subtests.py",), (), subtest_lines),
    Row("pytest-rerunfailures", "flaky-marker", ("check_rerunfailures_marker.py",), (),
        summary_counts),
    # options on the command line (rows sharing their options share their runs)
    Row("pytest-rerunfailures", "reruns-option", ("check_rerunfailures_option.py",),
        ("--reruns=1",), summary_counts),
    Row("pytest-timeout", "timeout-option", ("check_timeout_option.py",), CLI_OPTIONS,
        timeout_message("check_timeout_option.py::test_times_out_by_the_option")),
    Row("pytest-asyncio", "asyncio-mode-option", ("check_asyncio_option.py",),
        CLI_OPTIONS),
    Row("pytest-forked", "forked-option", ("check_forked_option.py",), COLLECTION_OPTIONS,
        crash_message("check_forked_option.py::test_crashes_in_its_fork")),
    Row("pytest-repeat", "count-option", ("check_repeat_option.py",), COLLECTION_OPTIONS,
        each_copy_once("check_repeat_option.py")),
    Row("pytest-xdist", "worker-identity", ("check_xdist_identity.py",), ("-n", "2")),
    Row("pytest", "junit-suite-property-and-xml-attribute", ("check_junit_suite_properties.py",),
        (), junit_suite_properties),
    Row("pytest", "unittest-subtests", ("check_unittest_subtests.py",), (),
        unittest_subtest_lines),
    Row("hypothesis", "falsifying-example", ("check_hypothesis.py",), (),
        longrepr_lines("check_hypothesis.py::test_falsified", r"Falsifying example|x=")),
    Row("pytest-check", "soft-assertions", ("check_check.py",), (),
        longrepr_lines("check_check.py::test_soft_failures", r"FAILURE:|Failed Checks")),
    Row("pytest-html", "report-results", ("check_html.py",), REPORT_OPTIONS, html_results),
    Row("pytest-json-report", "report-file", ("check_json_report.py",), REPORT_OPTIONS,
        json_report),
    Row("allure-pytest", "results-dir", ("check_allure.py",), REPORT_OPTIONS, allure_results),
    Row("pytest-socket", "disable-socket", ("check_socket.py",), REPORT_OPTIONS),
    Row("pytest-dependency", "depends-marker", ("check_dependency.py",), REPORT_OPTIONS),
]


def _group(row: Row) -> tuple:
    """Rows run together: same options, and all expected to match (or all not yet)."""
    return (row.args, bool(row.xfail))


def _deprecations(run: SuiteRun) -> list[str]:
    """pytest's own deprecation warnings (those a later pytest turns into errors)."""
    return _lines(run.stdout, r"PytestRemovedIn\d+Warning")


def _summary(run: SuiteRun) -> str:
    """pytest's closing line without its time."""
    lines = [line for line in run.stdout.splitlines() if line.startswith("=") and " in " in line]
    return lines[-1].split(" in ")[0].strip("= ") if lines else ""


@dataclass
class CompatRuns:
    """Runs the sample project once per group and mode, on first use."""

    root: Path
    runs: dict[tuple, tuple[SuiteRun, Path]] = field(default_factory=dict)

    def get(self, row: Row, mode: str) -> tuple[SuiteRun, Path]:
        key = (_group(row), mode)
        if key not in self.runs:
            members = [r for r in ROWS if _group(r) == _group(row)]
            files = sorted({f for r in members for f in r.files})
            tag = f"g{len(self.runs)}-{mode}"
            state = self.root / "state" / tag
            state.mkdir(parents=True)
            args = [a.format(state=state) for a in row.args]
            self.runs[key] = (run_suite(self.root, "-p", "no:cacheprovider", *files, *args,
                                        *MODES.get(mode, []), tag=tag, timeout=900,
                                        env={"COMPAT_STATE": str(state)}), state)
        return self.runs[key]


@pytest.fixture(scope="module")
def compat(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("compat") / "compat"
    shutil.copytree(DATA, root)
    yield CompatRuns(root)
    state = root / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def _params():
    for row in ROWS:
        for mode in row.modes:
            marks = []
            if mode in row.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=row.xfail[mode]))
            yield pytest.param(row, mode, id=f"{row.id}-{mode}", marks=marks)


def _outcomes(run: SuiteRun, files: tuple[str, ...]) -> dict[str, list[tuple[str, str, str]]]:
    """Every report of the row's tests, in order: (when, outcome, the failure's last line)."""
    result: dict[str, list[tuple[str, str, str]]] = {}
    for r in run.reports:
        if r["nodeid"].split("::")[0] in files:
            last = without_addresses((r["longrepr"] or "").strip().splitlines()[-1:])
            last = [re.sub(r"^\[gw\d+\] ", "[gw?] ", line) for line in last]  # any xdist worker
            result.setdefault(r["nodeid"], []).append((r["when"], r["outcome"], str(last)))
    return result


@pytest.mark.parametrize(("row", "mode"), list(_params()))
def test_plugin_reads_the_same_dispatched(compat: CompatRuns, row: Row, mode: str,
                                          request: pytest.FixtureRequest) -> None:
    if mode == "slurm_warm":
        request.getfixturevalue("devcluster")  # fails loudly when the cluster is missing
    plain, plain_state = compat.get(row, "plain")
    dispatched, state = compat.get(row, mode)
    assert plain.reports, plain.stdout  # the plain run itself worked
    assert _outcomes(dispatched, row.files) == _outcomes(plain, row.files), dispatched.stdout
    assert dispatched.returncode == plain.returncode, dispatched.stdout
    # the plugin's own fixtures must not add pytest's deprecations (pytest 10 refuses them)
    assert _deprecations(dispatched) == _deprecations(plain), dispatched.stdout
    assert _summary(dispatched) == _summary(plain), dispatched.stdout
    if row.artefact is not None:
        expected = row.artefact(plain, plain_state)
        assert expected, f"the plain run shows no {row.plugin} artefact:\n{plain.stdout}"
        assert row.artefact(dispatched, state) == expected, dispatched.stdout


def test_an_ordered_suite_runs_each_shape_as_one_batch_and_says_what_is_not_kept(
        compat: CompatRuns, request: pytest.FixtureRequest) -> None:
    """pytest-order on warm workers: split into batches running side by side, ordered tests
    would run in any order. They stay in one batch, and the run says once what it cannot
    keep (the order between shapes, and versus this machine's tests)."""
    request.getfixturevalue("devcluster")
    row = next(r for r in ROWS if r.case == "order-marker")
    dispatched, _ = compat.get(row, "slurm_warm")
    assert dispatched.stdout.count("pytest-order: ordered tests keep their order") == 1, (
        dispatched.stdout)
    jobs = set(re.findall(r"^job id:\s+(\S+)", dispatched.stdout, re.MULTILINE))
    assert len(jobs) == 1, jobs


def test_tests_that_depend_on_others_run_in_one_batch_and_the_run_says_so(
        compat: CompatRuns, request: pytest.FixtureRequest) -> None:
    """pytest-dependency on warm workers: a test sees the outcome of those it depends on
    only in its own batch (its own pytest session). The shape stays in one batch, and the
    run says once what is not kept (dependencies on tests of other shapes, or run here)."""
    request.getfixturevalue("devcluster")
    row = next(r for r in ROWS if r.case == "depends-marker")
    dispatched, _ = compat.get(row, "slurm_warm")
    assert dispatched.stdout.count("pytest-dependency: a test sees the outcome") == 1, (
        dispatched.stdout)
    assert "pytest-order:" not in dispatched.stdout
    jobs = set(re.findall(r"^job id:\s+(\S+)", dispatched.stdout, re.MULTILINE))
    assert len(jobs) == 1, jobs


ONCE_PER_PROCESS = {
    "old_api.py": "import warnings\n\nwarnings.warn(DeprecationWarning('old_api is old'))\n",
    "check_imports_old_api.py": "def test_imports_it():\n    import old_api  # noqa: F401\n",
    # a plugin's end of the run importing the same module (hypothesis writing its patch)
    "conftest.py": "def pytest_terminal_summary(terminalreporter):\n    import old_api  # noqa\n",
    "pytest.ini": "[pytest]\npython_files = check_*.py\n",
}


def test_a_warning_raised_once_per_process_is_shown_once(tmp_path: Path) -> None:
    """The worker imports the module in the test and its warning is replayed there; the
    controller's terminal summary imports it for the first time in its process: a plain
    run (one process) shows the warning once, and so does the dispatched one."""
    for name, text in ONCE_PER_PROCESS.items():
        (tmp_path / name).write_text(text)
    plain = run_suite(tmp_path, "-p", "no:cacheprovider", tag="plain")
    dispatched = run_suite(tmp_path, "-p", "no:cacheprovider", *MODES["local_direct"],
                           tag="local_direct")
    assert _summary(plain) == "1 passed, 1 warning", plain.stdout
    assert _summary(dispatched) == _summary(plain), dispatched.stdout
    assert dispatched.stdout.count("old_api is old") == plain.stdout.count("old_api is old")


def test_the_table_covers_the_plugins_users_expect() -> None:
    """The issue's list, and every plugin pinned in the test extra, has a row."""
    wanted = {"pytest-timeout", "pytest-rerunfailures", "pytest-forked", "pytest-xdist",
              "pytest-asyncio", "pytest-cov", "pytest-benchmark", "pytest-mock", "pytest-env",
              "pytest-order", "pytest-repeat", "pytest-html", "pytest-json-report",
              "pytest-check", "pytest-dependency", "allure-pytest", "pytest-socket"}
    assert wanted <= {row.plugin for row in ROWS}
    assert {"junit-record-property", "subtests", "unittest-subtests"} <= {
        row.case for row in ROWS}
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    for plugin in wanted - {"pytest-xdist"}:  # xdist is a runtime dependency
        assert f'"{plugin}==' in pyproject, f"{plugin} is not pinned in the test extra"
    assert os.path.isdir(DATA)


XDIST_FIXTURES = "def test_uses_them(worker_id, testrun_uid):\n    assert worker_id == 'gw1'\n"


def test_the_worker_fixtures_are_what_pytest_10_accepts(tmp_path: Path) -> None:
    """The worker's own ``worker_id`` / ``testrun_uid`` (a test dispatched from an xdist
    worker) are module-level fixtures: pytest 9 warns about session-scoped fixtures defined
    as instance methods (PytestRemovedIn10Warning) and pytest 10 refuses them; here such a
    warning is an error, so the test fails if one comes back."""
    (tmp_path / "test_ids.py").write_text(XDIST_FIXTURES)
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_TESTRUNUID": "uid1"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
         f"--trtllm-worker-reports={tmp_path / 'reports.jsonl'}", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestRemovedIn10Warning", "test_ids.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PytestRemovedIn10Warning" not in proc.stdout, proc.stdout
    assert re.search(r"\b1 passed in\b", proc.stdout), proc.stdout
