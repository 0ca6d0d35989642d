"""The records of ``reports.jsonl``, as the controller accepts them (the boundary).

The node writes them as plain dicts (``worker.ReportWriter``: stdlib and pytest only,
every record with ``v`` = ``worker.RECORD_VERSION``; a record without ``v`` comes from a
worker older than the version, whose records have the same shapes); this module is the
one definition of their shape, and everything the controller reads from a target passes through
``parse_record`` first. What a target writes is not trusted: a record of another
version, of an unknown type, of the wrong shape, or naming a test that is not the
batch's own is refused with a ``BadRecord`` that says which and why, never replayed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pytest_trtllm_slurm.node.protocol import RECORD_VERSION

RAW_SHOWN = 500  # characters of a refused line kept in the message


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[RECORD_VERSION] = RECORD_VERSION  # type: ignore[valid-type]


class StartRecord(_Record):
    type: Literal["start"]
    nodeid: str
    location: list[Any] = Field(default_factory=list)


class FinishRecord(_Record):
    type: Literal["finish"]
    nodeid: str


class DoneRecord(_Record):
    """The item's whole protocol returned: no further attempt of it follows."""

    type: Literal["done"]
    nodeid: str


class ReportData(BaseModel):
    """The part of pytest's serialized TestReport the controller relies on."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    # absent for report classes pytest does not serialize itself (pytest 9's subtests)
    report_type: str | None = Field(default=None, alias="$report_type")
    nodeid: str
    # pytest types it str: plugins report other phases (pytest-forked: "???" for a crash)
    when: str = Field(min_length=1)
    outcome: str = Field(min_length=1)
    location: tuple[str, int | None, str]
    keywords: dict[str, Any]
    sections: list[tuple[str, str]] = Field(default_factory=list)
    user_properties: list[tuple[str, Any]] = Field(default_factory=list)
    duration: float = 0.0


class ReportRecord(_Record):
    type: Literal["report"]
    data: ReportData


class CollectErrorData(BaseModel):
    model_config = ConfigDict(extra="allow")

    nodeid: str = "?"
    longrepr: Any = None


class CollectErrorRecord(_Record):
    type: Literal["collect_error"]
    data: CollectErrorData


class MissingRecord(_Record):
    type: Literal["missing"]
    nodeids: list[str]
    rootdir: str = "?"


class WarningRecord(_Record):
    type: Literal["warning"]
    when: str
    nodeid: str = ""
    message: str = ""
    category: str = "builtins.UserWarning"
    filename: str = ""
    lineno: int | None = None


class XmlAttributeRecord(_Record):
    type: Literal["xml_attribute"]
    nodeid: str
    name: str
    value: str


class SuitePropertyRecord(_Record):
    type: Literal["suite_property"]
    name: str
    value: str


class SessionFinishRecord(_Record):
    type: Literal["session_finish"]
    exitstatus: int


Record = Annotated[
    StartRecord | FinishRecord | DoneRecord | ReportRecord | CollectErrorRecord
    | MissingRecord | WarningRecord | XmlAttributeRecord | SuitePropertyRecord
    | SessionFinishRecord,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


class BadRecord(ValueError):
    """A line of reports.jsonl the controller refuses; ``raw`` is the line (shortened)."""

    def __init__(self, why: str, raw: str) -> None:
        self.why = why
        self.raw = raw if len(raw) <= RAW_SHOWN else raw[:RAW_SHOWN] + "..."
        super().__init__(f"{why}; the line: {self.raw}")


def _nodeids(record: Any) -> list[str]:
    if isinstance(record, ReportRecord):
        return [record.data.nodeid]
    if isinstance(record, MissingRecord):
        return list(record.nodeids)
    if isinstance(record, StartRecord | FinishRecord | DoneRecord | XmlAttributeRecord):
        return [record.nodeid]
    if isinstance(record, WarningRecord) and record.when == "runtest":
        return [record.nodeid]
    return []


def parse_record(data: dict[str, Any], batch_nodeids: frozenset[str] | set[str]) -> Record:
    """``data`` (one JSON object of reports.jsonl) as a typed record of this batch."""
    raw = json.dumps(data, default=repr)
    # no "v": a worker from before records had a version (the same shapes, without "done")
    version = data.get("v", RECORD_VERSION)
    if version != RECORD_VERSION:
        raise BadRecord(
            f"record version {version!r}, this controller reads version {RECORD_VERSION} "
            "(does the target run another version of pytest-trtllm-slurm?)", raw)
    try:
        record = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        raise BadRecord(f"malformed {data.get('type')!r} record ({where}: {first['msg']})",
                        raw) from None
    foreign = [n for n in _nodeids(record) if n not in batch_nodeids]
    if foreign:
        raise BadRecord(f"a record for {foreign[0]!r}, which is not a test of this batch", raw)
    return record


def describe_line(line: str) -> BadRecord:
    """A line that is not a JSON object at all."""
    return BadRecord("not a JSON object", line)


def warning_category(qualified: str) -> type[Warning]:
    """The Warning subclass named ``module.QualName`` among those already loaded (never an
    import: a name in a record must not run code); UserWarning when there is none."""
    seen: set[type] = set()
    todo: list[type] = [Warning]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if f"{cls.__module__}.{cls.__qualname__}" == qualified:
            return cls
        todo.extend(cls.__subclasses__())
    return UserWarning
