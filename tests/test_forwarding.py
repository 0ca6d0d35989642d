"""What the worker gets of the user's invocation, the records the controller accepts,
and which log lines the hang scan reads (pure parts: no job runs here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _pytest.config import _prepareconfig

from pytest_trtllm_slurm.controller.forwarding import forwarded_addopts, forwarding_plan
from pytest_trtllm_slurm.execution.monitor import OwnOutput
from pytest_trtllm_slurm.execution.records import BadRecord, parse_record, warning_category
from pytest_trtllm_slurm.node.forkloop import LOG_MARK


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A pytest Config parsed from ``args`` in ``tmp_path/sub`` (ini in ``tmp_path``)."""
    (tmp_path / "sub" / "conf").mkdir(parents=True)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -x --tb=short\n")
    monkeypatch.chdir(tmp_path / "sub")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    made = []

    def parse(*args: str, env_addopts: str | None = None):
        if env_addopts is not None:
            monkeypatch.setenv("PYTEST_ADDOPTS", env_addopts)
        config = _prepareconfig([*args, str(tmp_path)])
        made.append(config)
        return config

    yield parse
    for config in made:
        config._ensure_unconfigure()


def test_everything_but_what_the_controller_owns_is_forwarded(configured, tmp_path) -> None:
    config = configured(
        "-vv", "-rA", "-pno:doctest", "-k", "slow and not gpu", "-m", "gpu",
        "--deselect", "a.py::b", "-n", "2", "--dist=loadfile", "--junitxml=out.xml",
        "--lf", "--maxfail", "3", "--trtllm-remote", "--slurm-partition", "p",
        "--confcutdir=conf", "-W", "error::UserWarning", "-o", "console_output_style=classic",
        "--import-mode=importlib", "-s", env_addopts="--showlocals --durations 2")
    options, refused = forwarding_plan(config)[:2]
    # PYTEST_ADDOPTS reaches the worker as the variable it was, after the ini's addopts
    assert forwarded_addopts(config) == "--tb=short --showlocals --durations=2"
    assert forwarding_plan(config, with_ini=False)[0][0] == "-v"
    assert options == [
        "--tb=short", "-v", "-v", "-r", "A",
        "-p", "no:doctest", f"--confcutdir={tmp_path / 'sub' / 'conf'}",
        "-W", "error::UserWarning", "-o", "console_output_style=classic",
        "--import-mode=importlib", "-s"]
    assert refused == []


def test_log_file_level_and_format_are_no_paths(configured, tmp_path) -> None:
    """--log-file is the controller's; the level and format the worker's logging uses stay
    as written (a level made into a path stopped every worker: 'not a logging level')."""
    config = configured("--log-file=run.log", "--log-file-level=DEBUG",
                        "--log-file-format=%(name)s %(message)s", "--log-level", "INFO")
    options, _ = forwarding_plan(config)[:2]
    assert options == ["--tb=short", "--log-file-level=DEBUG",
                       "--log-file-format=%(name)s %(message)s", "--log-level=INFO"]


def test_short_flags_run_together_are_split_and_values_stay_with_their_flag(configured) -> None:
    config = configured("-vx", "-qq", "-Werror", "--", "-k")
    options, _ = forwarding_plan(config)[:2]
    assert options == ["--tb=short", "-v", "-q", "-q", "-W", "error"]


def test_plugin_options_pass_with_their_values_and_pdb_is_refused(configured) -> None:
    config = configured("--reruns", "2", "--reruns-delay=0", "--only-rerun", "Err",
                        "--pdb", "-p", "pytest_trtllm_slurm.node.worker", "-o", "addopts=")
    options, refused = forwarding_plan(config)[:2]
    assert options == ["--reruns=2", "--reruns-delay=0", "--only-rerun=Err"]
    assert refused == ["--pdb"]


def test_report_writers_with_a_worker_half_reach_the_worker_without_their_file(
        configured, tmp_path) -> None:
    """pytest-json-report's worker attaches each test's streams and metadata to its
    reports but writes no file; allure's worker writes its results where a plain run does,
    and the directory is cleaned once, by the controller; pytest-html is the controller's."""
    config = configured("--json-report", "--json-report-file=r.json", "--json-report-omit",
                        "log", "--json-report-indent=2", "--alluredir=out", "--clean-alluredir",
                        "--html=r.html", "--self-contained-html")
    options, _ = forwarding_plan(config)[:2]
    assert options == ["--tb=short", "--json-report", "--json-report-omit=log",
                       f"--alluredir={tmp_path / 'sub' / 'out'}", "--json-report-file=none"]


def test_own_output_leaves_out_the_plugins_lines_even_split_across_reads() -> None:
    mark = LOG_MARK.encode()
    reader = OwnOutput()
    seen = b"".join(reader.feed(chunk) for chunk in [
        b"test says hi\n" + mark[:5], mark[5:] + b"START a.py::t[hang detected]\n",
        mark + b"a.py::t[hang detected] PASSED\nthe test: hang det", b"ected\n"])
    assert b"hang detected]" not in seen
    assert b"test says hi" in seen
    assert b"hang detected" in seen.replace(b"\n", b"") or b"hang det" in seen
    both = OwnOutput()
    text = both.feed(b"the test: hang det") + b"|" + both.feed(b"ected\n")
    assert b"hang detected" in text


BATCH = frozenset({"t.py::a"})


def _report(**over):
    data = {"$report_type": "TestReport", "nodeid": "t.py::a", "when": "call",
            "outcome": "passed", "location": ["t.py", 1, "a"], "keywords": {"a": 1},
            "longrepr": None, "sections": [], "duration": 0.1, "user_properties": []}
    return {"v": 1, "type": "report", "data": {**data, **over}}


@pytest.mark.parametrize(("record", "why"), [
    ({"v": 2, "type": "start", "nodeid": "t.py::a"}, "record version 2"),
    ({"v": 1, "type": "shell", "cmd": "x"}, "unknown record type 'shell'"),
    ({"v": 1, "type": "start", "nodeid": "t.py::other"}, "not a test of this batch"),
    ({"v": 1, "type": "missing", "nodeids": ["t.py::a", "u.py::b"]}, "not a test of this batch"),
    (_report(when=None), "malformed 'report' record"),
    (_report(nodeid="u.py::b"), "not a test of this batch"),
    ({"v": 1, "type": "start", "nodeid": ["t.py::a"]}, "malformed 'start' record"),
])
def test_records_of_another_shape_version_or_batch_are_refused(record, why) -> None:
    with pytest.raises(BadRecord, match=why.replace("(", r"\(")):
        parse_record(record, BATCH)


def test_well_formed_records_are_accepted() -> None:
    assert parse_record({"type": "start", "nodeid": "t.py::a"}, BATCH).v == 1  # before "v"
    assert parse_record(_report(), BATCH).data.outcome == "passed"
    assert parse_record(_report(outcome="rerun"), BATCH).data.outcome == "rerun"
    rec = parse_record({"v": 1, "type": "warning", "when": "runtest", "nodeid": "t.py::a",
                        "category": "x.Y", "message": "m", "filename": "f", "lineno": 3}, BATCH)
    assert rec.lineno == 3


def test_a_warning_category_is_looked_up_never_imported() -> None:
    sys.modules.pop("this", None)
    assert warning_category("this.Zen") is UserWarning
    assert "this" not in sys.modules
    assert warning_category("builtins.DeprecationWarning") is DeprecationWarning
    assert warning_category("pytest.PytestWarning") is pytest.PytestWarning
    assert warning_category("builtins.ValueError") is UserWarning  # not a Warning
    assert json.dumps(parse_record({"v": 1, "type": "session_finish", "exitstatus": 0},
                                   BATCH).model_dump()) == '{"v": 1, "type": "session_finish", "exitstatus": 0}'


def test_output_options_are_found_in_the_ini_addopts_and_pytest_addopts_too(
        configured, tmp_path) -> None:
    """An output dir given only in ``addopts`` or PYTEST_ADDOPTS is each batch's own place,
    like one typed on the command line: never handed to the workers as the user's path
    (they would race on it), and the last of each flag wins as in pytest's parse."""
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--output-dir', default=None)\n"
        "    parser.addoption('--csv', default=None)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --output-dir=ini_out -x\n")
    from pytest_trtllm_slurm.controller.forwarding import forwarding_plan
    config = configured("-v", env_addopts="--csv env.csv")
    options, _, outputs = forwarding_plan(config, with_ini=False)
    assert {o.flag: o.local for o in outputs} == {
        "--output-dir": str(tmp_path / "sub" / "ini_out"),
        "--csv": str(tmp_path / "sub" / "env.csv")}
    assert "out" not in forwarded_addopts(config) and "csv" not in forwarded_addopts(config)
    assert not any("out" in token or "csv" in token for token in options)
    config = configured("--output-dir=cli_out", env_addopts="--output-dir=env_out")
    assert [o.local for o in forwarding_plan(config)[2]] == [str(tmp_path / "sub" / "cli_out")]
