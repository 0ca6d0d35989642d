"""One record protocol between the node and the controller: every record type a node
writes (``node.records``) has a builder, a pydantic model the controller checks it
against, and an ``on_<type>`` handler; a type the controller does not know is refused
with a message that names it. The record types are taken from a real worker session
(the worker plugin in a pytest subprocess), not from a list kept by hand."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest

from pytest_trtllm_slurm.controller.record_handlers import RecordHandlers
from pytest_trtllm_slurm.execution import records as controller_records
from pytest_trtllm_slurm.execution.records import MODELS, BadRecord, parse_record
from pytest_trtllm_slurm.node import records as node_records

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_trtllm_slurm"

# a suite whose one session writes every record type there is
SUITE = {
    "test_all.py": """
import warnings


def test_plain():
    pass


def test_prints():
    print("what a hang after this phase must not lose")


def test_warns(record_xml_attribute, record_testsuite_property):
    record_xml_attribute("owner", "me")
    record_testsuite_property("build", "42")
    warnings.warn(UserWarning("careful"))
""",
    "test_broken.py": "def test_never(:\n",  # a collection error
    # pytest-timeout's thread method ends the process: the worker writes the test's
    # reports, finish and done on their own lines first (node/timeouts.py)
    "test_hangs.py": """
import time

import pydantic
import pytest


@pytest.mark.timeout(1, method="thread")
def test_hangs():
    time.sleep(60)
""",
}
WANTED = ["test_all.py::test_plain", "test_all.py::test_prints", "test_all.py::test_warns",
          "test_all.py::test_gone"]
HANGS = "test_hangs.py::test_hangs"


def run_worker(root: Path, reports: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A real worker session (the node side's plugin) in ``root``, writing ``reports``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE.parent),
                                                      env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
         "-p", "no:cacheprovider", "--rootdir", str(root),
         "--trtllm-worker-reports", str(reports), *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The records one real worker session wrote, as JSON objects."""
    root = tmp_path_factory.mktemp("protocol")
    for name, text in SUITE.items():
        (root / name).write_text(text)
    (root / "nodeids.json").write_text(json.dumps(WANTED))
    reports = root / "reports.jsonl"
    proc = run_worker(root, reports, "--trtllm-worker-nodeids", str(root / "nodeids.json"),
                      "--continue-on-collection-errors", "test_all.py", "test_broken.py")
    assert reports.exists(), proc.stdout + proc.stderr
    (root / "hangs.json").write_text(json.dumps([HANGS]))
    hangs = root / "hangs.jsonl"
    proc = run_worker(root, hangs, "--trtllm-worker-nodeids", str(root / "hangs.json"),
                      "test_hangs.py")
    assert hangs.exists(), proc.stdout + proc.stderr
    return [json.loads(line) for path in (reports, hangs) for line in path.read_text().splitlines()]


def test_a_worker_session_writes_every_declared_type_and_only_those(written) -> None:
    types = {record["type"] for record in written}
    assert types == set(node_records.RECORD_TYPES), (
        "extend SUITE so that its session writes each record type of node.records")
    assert all(record["v"] == node_records.RECORD_VERSION for record in written)


def test_every_record_a_worker_writes_is_accepted_and_has_a_handler(written) -> None:
    batch = frozenset([*WANTED, HANGS])
    for raw in written:
        record = parse_record(raw, batch)
        assert record.type == raw["type"]
        assert callable(getattr(RecordHandlers, f"on_{record.type}", None)), (
            f"no RecordHandlers.on_{record.type}")


def test_every_declared_type_has_a_builder_a_model_and_a_handler() -> None:
    for tag, shape in node_records.RECORD_TYPES.items():
        builder = getattr(node_records, tag)
        assert typing.get_type_hints(builder)["return"] is shape, tag
        model = MODELS[tag]
        assert set(model.model_fields) == set(typing.get_type_hints(shape)), tag
        assert callable(getattr(RecordHandlers, f"on_{tag}", None)), f"no on_{tag}"
    # and nothing the node cannot write: no stray model, handler or union member
    assert set(MODELS) == set(node_records.RECORD_TYPES)
    handlers = {name.removeprefix("on_") for name in vars(RecordHandlers)
                if name.startswith("on_")}
    assert handlers == set(node_records.RECORD_TYPES)
    union = typing.get_args(typing.get_args(controller_records.Record)[0])
    assert set(union) == set(MODELS.values())


def test_a_model_that_is_not_the_nodes_declaration_is_refused_at_import() -> None:
    from typing import Literal

    with pytest.raises(TypeError, match="fields"):
        @controller_records._shape(node_records.FinishRecord)
        class Finish(controller_records._Record):  # the node writes no "why"
            type: Literal["finish"]
            nodeid: str
            why: str = ""


def test_the_node_builds_records_only_through_node_records() -> None:
    """A record is never a dict literal of its own: a ``{"type": ...}`` outside
    ``node.records`` is a type the controller may not know."""
    offenders = []
    for path in sorted(PACKAGE.glob("node/*.py")):
        if path.name == "records.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value == "type" for k in node.keys):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders


def test_the_case_wrappers_exit_status_line_is_a_session_finish_record(tmp_path: Path) -> None:
    from pytest_trtllm_slurm.cases.model import CASE_WRAPPER, REPORTS_ENV

    reports = tmp_path / "reports.jsonl"
    subprocess.run(["bash", "-c", CASE_WRAPPER, "trtllm-case", "exit 7"], check=False,
                   env={**os.environ, REPORTS_ENV: str(reports)}, timeout=30)
    (line,) = reports.read_text().splitlines()
    assert parse_record(json.loads(line), frozenset()) == MODELS["session_finish"](
        type="session_finish", exitstatus=7)


@pytest.mark.parametrize(("kind", "shown"), [
    ("shell", "'shell'"), (["start"], "['start']"), (None, "None")])
def test_an_unknown_record_type_is_refused_with_a_message_that_names_it(kind, shown) -> None:
    record = {"v": 1, "nodeid": "t.py::a"} | ({} if kind is None else {"type": kind})
    with pytest.raises(BadRecord) as refused:
        parse_record(record, frozenset({"t.py::a"}))
    message = str(refused.value)
    assert f"unknown record type {shown}" in message
    assert all(tag in message for tag in node_records.RECORD_TYPES)  # what it does read
    assert "another version of pytest-trtllm-slurm" in message


def test_a_worker_without_a_junit_file_ends_cleanly_and_sends_suite_properties(
        tmp_path: Path) -> None:
    """A warm session and a worker started by hand have no junit file: the suite property
    still reaches the controller, and the session ends with pytest's exit code (a stand-in
    for the junit writer that pytest could not unregister made it exit 1 with a traceback)."""
    (tmp_path / "test_one.py").write_text(
        "def test_one(record_testsuite_property):\n    record_testsuite_property('b', '7')\n")
    reports = tmp_path / "reports.jsonl"
    proc = run_worker(tmp_path, reports, "test_one.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    written = [json.loads(line) for line in reports.read_text().splitlines()]
    assert [(r["name"], r["value"]) for r in written if r["type"] == "suite_property"] == [
        ("b", "7")], written


def test_a_test_is_its_start_line_and_one_line_with_its_reports_and_end(written) -> None:
    """One JSON object per test carries its three reports, its attempt's end and its
    protocol's end (decoded and checked once on the controller); the start stays a line of
    its own, written as the test starts: it says where a worker died."""
    lines = [r for r in written if r.get("nodeid") == "test_all.py::test_plain"]
    assert [r["type"] for r in lines] == ["start", "item"]
    item = lines[1]
    assert [(r["when"], r["outcome"]) for r in item["reports"]] == [
        ("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
    assert item["finish"] is True and item["done"] is True
    record = parse_record(item, frozenset(WANTED))
    assert [r.when for r in record.reports] == ["setup", "call", "teardown"]


def test_a_phase_whose_loss_would_hide_something_is_written_at_once(written) -> None:
    """A call that printed (or failed, or took long) is on disk before the teardown runs:
    a teardown that hangs or crashes the worker does not take the test's output along."""
    lines = [r for r in written if r.get("nodeid") == "test_all.py::test_prints"]
    assert [(r["type"], [p["when"] for p in r.get("reports", [])], r.get("finish"))
            for r in lines] == [("start", [], None), ("item", ["setup", "call"], False),
                                ("item", ["teardown"], True)]
    assert "must not lose" in str(lines[1]["reports"][1]["sections"])


def test_every_report_of_an_item_line_is_checked_as_a_report_line_is(written) -> None:
    """The trust boundary stays whole: a malformed report inside an item line (a longrepr
    whose traceback is not pytest's shape, a report of another batch's test) refuses it."""
    item = next(r for r in written if r["type"] == "item"
                and r["nodeid"] == "test_all.py::test_plain")
    bad_longrepr = json.loads(json.dumps(item))
    bad_longrepr["reports"][1]["longrepr"] = {"reprcrash": None, "reprtraceback": {
        "reprentries": [{"type": "ReprEntry", "data": {"lines": [7]}}]}}
    with pytest.raises(BadRecord, match=r"reports\.1\.longrepr"):
        parse_record(bad_longrepr, frozenset(WANTED))
    foreign = json.loads(json.dumps(item))
    foreign["reports"][2]["nodeid"] = "test_other.py::test_x"
    with pytest.raises(BadRecord, match="not a test of this batch"):
        parse_record(foreign, frozenset(WANTED))
    not_a_flag = {**item, "done": "yes"}
    with pytest.raises(BadRecord, match="done"):
        parse_record(not_a_flag, frozenset(WANTED))


def test_a_line_is_read_as_json_loads_reads_it_and_refused_where_it_refuses(written) -> None:
    """Lines go through pydantic-core's parser first: what it reads is what json.loads
    reads, what only json.loads reads (a lone surrogate that captured output can hold,
    nesting past the fast parser's limit) is still a record, what neither reads is an
    unreadable line in json.loads's words, and a record of another version or type is
    refused as such however malformed the rest of it is."""
    item = next(r for r in written if r["type"] == "item")
    encoded = json.dumps(item).encode()
    (read,) = controller_records.LineReader().feed(encoded + b"\n")
    assert read == json.loads(encoded) and type(read) is dict
    lone = {**item, "reports": [{**item["reports"][0], "sections": [["Captured stdout call",
                                                                       "\udc80 bytes"]]}]}
    deep = {"v": 1, "type": "suite_property", "name": "n", "value": "v",
            "extra": json.loads("[" * 300 + "]" * 300)}
    lines = [json.dumps(lone), json.dumps(deep), '{"v": 1, "type": "start", "nodeid": ',
             "\ufeff" + json.dumps(item)]
    records = controller_records.LineReader().feed("\n".join(lines).encode("utf-8", "surrogatepass")
                                                   + b"\n")
    assert [type(r) for r in records] == [dict, dict, controller_records.UnreadableLine,
                                          controller_records.UnreadableLine]
    assert records[0]["reports"][0]["sections"][0][1] == "\udc80 bytes"
    parse_record(records[0], frozenset(WANTED))
    parse_record(records[1], frozenset(WANTED))
    assert [r.why for r in records[2:]] == ["not a JSON object"] * 2
    with pytest.raises(BadRecord, match="record version 2"):
        parse_record({"v": 2, "type": "item", "nodeid": 7}, frozenset(WANTED))
    with pytest.raises(BadRecord, match="unknown record type 'itemz'"):
        parse_record({"v": 1, "type": "itemz", "nodeid": 7}, frozenset(WANTED))


# reports of every shape pytest gives a longrepr: a chained exception with locals, a skip,
# an xfail, a text (``pytrace=False``), a native traceback; properties and captured output
FAILING = """
import pydantic
import pytest


def test_fails():
    here = [1, 2]
    try:
        raise KeyError("inner")
    except KeyError as exc:
        raise ValueError("outer") from exc


def test_skips():
    pytest.skip("not here")


@pytest.mark.xfail(reason="known")
def test_xfails():
    assert 0


def test_props(record_property):
    record_property("k", 1)
    print("out")


def test_text():
    pytest.fail("plain", pytrace=False)
"""
FAILING_IDS = [f"test_failing.py::test_{name}"
               for name in ("fails", "skips", "xfails", "props", "text")]


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The records of real failing, skipped and xfailed tests (long and native tracebacks)."""
    root = tmp_path_factory.mktemp("failing")
    (root / "test_failing.py").write_text(FAILING)
    (root / "nodeids.json").write_text(json.dumps(FAILING_IDS))
    written: list[dict] = []
    for tb in ("long", "native"):
        reports = root / f"{tb}.jsonl"
        proc = run_worker(root, reports, "--trtllm-worker-nodeids", str(root / "nodeids.json"),
                          "--showlocals", f"--tb={tb}", "test_failing.py")
        assert reports.exists(), proc.stdout + proc.stderr
        written += [json.loads(line) for line in reports.read_text().splitlines()]
    return written


def _paths(value: object, at: tuple = ()) -> typing.Iterator[tuple]:
    yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*at, index))


OTHER_VALUES = [None, 0, 7, -1, 2**70, 1.5, 1.0, float("inf"), True, False, "", "x", "7",
                "runtest", "test_all.py::test_plain", "test_other.py::test_x", [], {},
                ["a", 1, "b"], ["a", None, "b"], ["a", "b"], [["a", "b"]], {"a": 1},
                {"type": "ReprEntry", "data": {"lines": []}}]


def _mutants(record: dict) -> typing.Iterator[dict]:
    """``record`` with each value in turn replaced by each of ``OTHER_VALUES``, each key
    dropped, a key added to each object and an item to each array."""
    for at in _paths(record):
        for change in [*OTHER_VALUES, "drop", "extra"]:
            copy = json.loads(json.dumps(record))
            parent, last = copy, None
            for step in at[:-1]:
                parent = parent[step]
            target = parent[at[-1]] if at else copy
            last = at[-1] if at else None
            if change == "drop":
                if last is None or not isinstance(parent, dict):
                    continue
                del parent[last]
            elif change == "extra":
                if isinstance(target, dict):
                    target["zz_extra"] = 1
                elif isinstance(target, list):
                    target.append("zz")
                else:
                    continue
            elif last is None:
                continue
            else:
                parent[last] = change
            yield copy


def _as_the_models_read_it(line: bytes, batch: frozenset[str]) -> tuple[str, object]:
    """What the controller made of a line before the one-pass check: ``decode_line``, then
    ``parse_record`` (the models); accepted, the JSON object with each top-level field as
    the model read it."""
    data = controller_records.decode_line(line)
    if isinstance(data, controller_records.UnreadableLine):
        return "unreadable", data.why
    try:
        model = parse_record(data, batch)
    except BadRecord as bad:
        return "refused", str(bad)
    expected = dict(data)
    for name, info in type(model).model_fields.items():
        key, value = info.alias or name, getattr(model, name)
        if key in data and not isinstance(value, (list, pydantic.BaseModel)):
            expected[key] = value
    return "accepted", expected


def _as_the_reader_reads_it(line: bytes, batch: frozenset[str]) -> tuple[str, object]:
    (got,) = controller_records.LineReader(batch=batch).feed(line + b"\n")
    if isinstance(got, controller_records.RefusedLine):
        return "refused", str(got.bad)
    if isinstance(got, controller_records.UnreadableLine):
        return "unreadable", got.why
    assert type(got) is dict
    return "accepted", got


def test_the_one_pass_check_accepts_and_refuses_what_the_models_do_in_their_words(
        written, failing) -> None:
    """The trust boundary is the same with the check in one pass on plain dicts: every
    record a worker writes, and each of it with any one field broken, dropped or added,
    is accepted as the same JSON object (each field as the model reads it) or refused
    with the same message as the models refuse it."""
    batch = frozenset([*WANTED, HANGS, *FAILING_IDS])
    seen: dict[tuple, dict] = {}
    for record in [*written, *failing]:  # one record of each shape
        shape = (record["type"], record.get("data", {}).get("outcome"),
                 tuple((r["when"], r["outcome"], type(r.get("longrepr")).__name__)
                       for r in record.get("reports", ())))
        seen.setdefault(shape, record)
    tried = accepted = 0
    for record in seen.values():
        for mutant in [record, *_mutants(record)]:
            line = json.dumps(mutant).encode()
            old = _as_the_models_read_it(line, batch)
            assert _as_the_reader_reads_it(line, batch) == old, line[:300]
            tried += 1
            accepted += old[0] == "accepted"
    assert tried > 5000 and 0 < accepted < tried, (tried, accepted)
