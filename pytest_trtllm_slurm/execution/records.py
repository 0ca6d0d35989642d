"""The records of ``reports.jsonl``, as the controller accepts them (the boundary).

The node declares the record types and their fields (``node.records``: TypedDicts and the
functions that build them, stdlib only, every record with ``v`` = ``RECORD_VERSION``; a
record without ``v`` comes from a worker older than the version, whose records have the
same shapes). Here each type has its pydantic model, which says how strictly a field is
read (a model whose fields are not the TypedDict's refuses to import), and everything
the controller reads from a target passes through ``parse_record`` first: a discriminated
union of the models. What a target writes is not trusted: a record of another version,
of an unknown type, of the wrong shape, or naming a test that is not the batch's own is
refused with a ``BadRecord`` that says which and why, never replayed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pytest_trtllm_slurm.node import records as node_records
from pytest_trtllm_slurm.node.protocol import RECORD_VERSION

RAW_SHOWN = 500  # characters of a refused line kept in the message


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[RECORD_VERSION] = RECORD_VERSION  # type: ignore[valid-type]

    def named_tests(self) -> list[str]:
        """The node ids this record is about (each must be a test of the batch)."""
        return []


MODELS: dict[str, type[_Record]] = {}  # record type -> its model
_M = TypeVar("_M", bound=_Record)


def _shape(declared: type) -> Callable[[type[_M]], type[_M]]:
    """The model of ``declared`` (a TypedDict of ``node.records``): the same fields, and
    the ``type`` the node writes; registered in ``MODELS``."""

    def check(model: type[_M]) -> type[_M]:
        keys = set(declared.__required_keys__) | set(declared.__optional_keys__)  # type: ignore[attr-defined]
        fields = set(model.model_fields)
        (tag,) = get_args(model.model_fields["type"].annotation)
        if fields != keys or node_records.RECORD_TYPES.get(tag) is not declared:
            raise TypeError(f"{model.__name__} (type {tag!r}, fields {sorted(fields)}) is not "
                            f"node.records.{declared.__name__} (fields {sorted(keys)})")
        MODELS[tag] = model
        return model

    return check


@_shape(node_records.StartRecord)
class StartRecord(_Record):
    type: Literal["start"]
    nodeid: str
    location: list[Any] = Field(default_factory=list)

    def named_tests(self) -> list[str]:
        return [self.nodeid]


@_shape(node_records.FinishRecord)
class FinishRecord(_Record):
    type: Literal["finish"]
    nodeid: str

    def named_tests(self) -> list[str]:
        return [self.nodeid]


@_shape(node_records.DoneRecord)
class DoneRecord(_Record):
    """The item's whole protocol returned: no further attempt of it follows."""

    type: Literal["done"]
    nodeid: str

    def named_tests(self) -> list[str]:
        return [self.nodeid]


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


@_shape(node_records.ReportRecord)
class ReportRecord(_Record):
    type: Literal["report"]
    data: ReportData

    def named_tests(self) -> list[str]:
        return [self.data.nodeid]


class CollectErrorData(BaseModel):
    model_config = ConfigDict(extra="allow")

    nodeid: str = "?"
    longrepr: Any = None


@_shape(node_records.CollectErrorRecord)
class CollectErrorRecord(_Record):
    type: Literal["collect_error"]
    data: CollectErrorData


@_shape(node_records.MissingRecord)
class MissingRecord(_Record):
    type: Literal["missing"]
    nodeids: list[str]
    rootdir: str = "?"

    def named_tests(self) -> list[str]:
        return list(self.nodeids)


@_shape(node_records.WarningRecord)
class WarningRecord(_Record):
    type: Literal["warning"]
    when: str
    nodeid: str = ""
    message: str = ""
    category: str = "builtins.UserWarning"
    filename: str = ""
    lineno: int | None = None

    def named_tests(self) -> list[str]:
        return [self.nodeid] if self.when == "runtest" else []


@_shape(node_records.XmlAttributeRecord)
class XmlAttributeRecord(_Record):
    type: Literal["xml_attribute"]
    nodeid: str
    name: str
    value: str

    def named_tests(self) -> list[str]:
        return [self.nodeid]


@_shape(node_records.SuitePropertyRecord)
class SuitePropertyRecord(_Record):
    type: Literal["suite_property"]
    name: str
    value: str


@_shape(node_records.SessionFinishRecord)
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


class _Line:
    """A record as the JSON text a message quotes, made only when one does."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __str__(self) -> str:
        return json.dumps(self.data, default=repr)


class BadRecord(ValueError):
    """A line of reports.jsonl the controller refuses; ``raw`` is the line (shortened)."""

    def __init__(self, why: str, raw: str | _Line) -> None:
        self.why = why
        raw = str(raw)
        self.raw = raw if len(raw) <= RAW_SHOWN else raw[:RAW_SHOWN] + "..."
        super().__init__(f"{why}; the line: {self.raw}")


def parse_record(data: dict[str, Any], batch_nodeids: frozenset[str] | set[str]) -> Record:
    """``data`` (one JSON object of reports.jsonl) as a typed record of this batch."""
    raw = _Line(data)
    # no "v": a worker from before records had a version (the same shapes, without "done")
    version = data.get("v", RECORD_VERSION)
    if version != RECORD_VERSION:
        raise BadRecord(
            f"record version {version!r}, this controller reads version {RECORD_VERSION} "
            "(does the target run another version of pytest-trtllm-slurm?)", raw)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in MODELS:
        raise BadRecord(
            f"unknown record type {repr(kind)[:80]} (this controller reads the types "
            f"{', '.join(MODELS)}; does the target run another version of "
            "pytest-trtllm-slurm?)", raw)
    try:
        record = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        raise BadRecord(f"malformed {data.get('type')!r} record ({where}: {first['msg']})",
                        raw) from None
    foreign = [n for n in record.named_tests() if n not in batch_nodeids]
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
