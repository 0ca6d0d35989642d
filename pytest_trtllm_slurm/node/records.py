"""The records of ``reports.jsonl``: every type the node writes, declared once (stdlib only).

The TypedDicts are the protocol (one JSON object a line, with ``v`` and ``type``) and every
producer writes only what the builders return. ``execution.records`` checks each line
against a model of the same fields; a new type needs a TypedDict, builder, model and handler."""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args, get_type_hints

from pytest_trtllm_slurm.node.protocol import RECORD_VERSION


class _Record(TypedDict):
    v: int  # RECORD_VERSION


class StartRecord(_Record):
    """A test's attempt started (``pytest_runtest_logstart``)."""

    type: Literal["start"]
    nodeid: str
    location: list[Any]


class ReportRecord(_Record):
    """One phase's TestReport, as pytest's ``pytest_report_to_serializable`` made it."""

    type: Literal["report"]
    data: dict[str, Any]


class FinishRecord(_Record):
    """A test's attempt ended (``pytest_runtest_logfinish``)."""

    type: Literal["finish"]
    nodeid: str


class ItemRecord(_Record):
    """A test's ``report``, ``finish`` and ``done`` events in one line (one object, not five)."""

    type: Literal["item"]
    nodeid: str
    reports: list[dict[str, Any]]
    finish: bool
    done: bool


class DoneRecord(_Record):
    """The item's whole protocol returned: no further attempt of it follows."""

    type: Literal["done"]
    nodeid: str


class CollectErrorRecord(_Record):
    """A collector failed on the target (its serialized CollectReport)."""

    type: Literal["collect_error"]
    data: dict[str, Any]


class MissingRecord(_Record):
    """Node ids of the batch the target did not collect (its code differs?)."""

    type: Literal["missing"]
    nodeids: list[str]
    rootdir: str


class WarningRecord(_Record):
    """A warning pytest recorded on the target (``pytest_warning_recorded``)."""

    type: Literal["warning"]
    when: str
    nodeid: str
    message: str
    category: str  # ``module.QualName``: looked up among loaded classes, never imported
    filename: str
    lineno: int | None


class XmlAttributeRecord(_Record):
    """``record_xml_attribute`` of a test: the controller's junit.xml gets it."""

    type: Literal["xml_attribute"]
    nodeid: str
    name: str
    value: str


class SuitePropertyRecord(_Record):
    """``record_testsuite_property``: the controller's junit.xml gets it."""

    type: Literal["suite_property"]
    name: str
    value: str


class SessionFinishRecord(_Record):
    """The session ended normally with this exit status (its absence means a crash)."""

    type: Literal["session_finish"]
    exitstatus: int


# every record type a node writes, by its ``type``
RECORD_TYPES: dict[str, type] = {get_args(get_type_hints(t)["type"])[0]: t for t in (
    StartRecord, ReportRecord, FinishRecord, DoneRecord, ItemRecord, CollectErrorRecord,
    MissingRecord, WarningRecord, XmlAttributeRecord, SuitePropertyRecord, SessionFinishRecord)}
SESSION_FINISH = "session_finish"  # the type whose line says the session ended normally


def start(nodeid: str, location: tuple[str, int | None, str]) -> StartRecord:
    return {"v": RECORD_VERSION, "type": "start", "nodeid": nodeid, "location": list(location)}


def report(data: dict[str, Any]) -> ReportRecord:
    return {"v": RECORD_VERSION, "type": "report", "data": data}


def finish(nodeid: str) -> FinishRecord:
    return {"v": RECORD_VERSION, "type": "finish", "nodeid": nodeid}


def done(nodeid: str) -> DoneRecord:
    return {"v": RECORD_VERSION, "type": "done", "nodeid": nodeid}


def item(nodeid: str, reports: list[dict[str, Any]], *, finish: bool,
         done: bool) -> ItemRecord:
    return {"v": RECORD_VERSION, "type": "item", "nodeid": nodeid, "reports": reports,
            "finish": finish, "done": done}


def collect_error(data: dict[str, Any]) -> CollectErrorRecord:
    return {"v": RECORD_VERSION, "type": "collect_error", "data": data}


def missing(nodeids: list[str], rootdir: str) -> MissingRecord:
    return {"v": RECORD_VERSION, "type": "missing", "nodeids": list(nodeids), "rootdir": rootdir}


def warning(when: str, nodeid: str, message: str, category: str, filename: str,
            lineno: int | None) -> WarningRecord:
    return {"v": RECORD_VERSION, "type": "warning", "when": when, "nodeid": nodeid,
            "message": message, "category": category, "filename": filename, "lineno": lineno}


def xml_attribute(nodeid: str, name: str, value: str) -> XmlAttributeRecord:
    return {"v": RECORD_VERSION, "type": "xml_attribute", "nodeid": nodeid, "name": name,
            "value": value}


def suite_property(name: str, value: str) -> SuitePropertyRecord:
    return {"v": RECORD_VERSION, "type": "suite_property", "name": name, "value": value}


def session_finish(exitstatus: int) -> SessionFinishRecord:
    return {"v": RECORD_VERSION, "type": "session_finish", "exitstatus": int(exitstatus)}
