"""The records of ``reports.jsonl`` as the controller accepts them (the boundary): a pydantic
model per ``node.records`` type words a refusal, a dict check of the same fields checks each
line in one pass; a record a target should not have written is a ``BadRecord``, never replayed."""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Mapping
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic_core import from_json
from typing_extensions import NotRequired, TypedDict

from pytest_trtllm_slurm.node import records as node_records
from pytest_trtllm_slurm.node.paths import BENCHMARKS_FILE
from pytest_trtllm_slurm.node.protocol import RECORD_VERSION

RAW_SHOWN = 500  # characters of a refused line kept in the message
MAX_LINE = 64 << 20  # the longest line of reports.jsonl read (a report holds captured output)
XML_NAME = r"^[A-Za-z_][A-Za-z0-9._-]{0,199}$"

# a report's fields go to pytest as written: checked for pytest's types, never coerced
Str = Annotated[str, Strict()]
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[RECORD_VERSION] = RECORD_VERSION  # type: ignore[valid-type]


MODELS: dict[str, type[_Record]] = {}  # record type -> its model
_M = TypeVar("_M", bound=_Record)


def _shape(declared: type) -> Callable[[type[_M]], type[_M]]:
    """Registers the model of ``declared`` (``node.records``), refusing other fields."""

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


@_shape(node_records.FinishRecord)
class FinishRecord(_Record):
    type: Literal["finish"]
    nodeid: str


@_shape(node_records.DoneRecord)
class DoneRecord(_Record):
    """The item's whole protocol returned: no further attempt of it follows."""

    type: Literal["done"]
    nodeid: str


class _Kwargs(BaseModel):
    """A dataclass of ``_pytest._code.code``, rebuilt by pytest with ``Class(**fields)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ReprFileLocation(_Kwargs):
    path: Str
    lineno: Int
    message: Str


class ReprFuncArgs(_Kwargs):
    args: list[tuple[Str, Any]]


class ReprLocals(_Kwargs):
    lines: list[Str]


class ReprEntryData(_Kwargs):
    lines: list[Str]
    reprfuncargs: ReprFuncArgs | None = None
    reprlocals: ReprLocals | None = None
    reprfileloc: ReprFileLocation | None = None
    style: Str = "long"


class ReprEntryNativeData(_Kwargs):
    lines: list[Str]
    style: Str = "native"


class ReprEntry(_Kwargs):
    type: Literal["ReprEntry"]
    data: ReprEntryData


class ReprEntryNative(_Kwargs):
    type: Literal["ReprEntryNative"]
    data: ReprEntryNativeData


class ReprTraceback(_Kwargs):
    reprentries: list[Annotated[ReprEntry | ReprEntryNative, Field(discriminator="type")]]
    extraline: Str | None = None
    style: Str = "long"


class ExceptionRepr(_Kwargs):
    """A failure's traceback (``longrepr`` of an exception), every field pytest renders."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    reprcrash: ReprFileLocation | None
    reprtraceback: ReprTraceback
    sections: list[tuple[Str, Str, Str]] = Field(default_factory=list)
    chain: list[tuple[ReprTraceback, ReprFileLocation | None, Str | None]] | None = None


_LONGREPR_KINDS: dict[type, str] = {type(None): "none", str: "text", list: "skip",
                                     tuple: "skip", dict: "exception"}

# None (passed), a text, a skip's (path, lineno, reason) or an exception's repr, told
# apart by their JSON type
Longrepr = Annotated[
    Annotated[None, Tag("none")] | Annotated[Str, Tag("text")]
    | Annotated[tuple[Str, Int | None, Str], Tag("skip")]
    | Annotated[ExceptionRepr, Tag("exception")],
    Discriminator(lambda value: _LONGREPR_KINDS.get(type(value), "other")),
]


class ReportData(BaseModel):
    """The fields of pytest's serialized TestReport the summary and junit read."""

    model_config = ConfigDict(extra="allow")

    # absent for report classes pytest does not serialize itself (pytest 9's subtests)
    report_type: Str | None = Field(default=None, alias="$report_type")
    nodeid: Str
    # pytest types it str: plugins report other phases (pytest-forked: "???" for a crash)
    when: Str = Field(min_length=1)
    outcome: Str = Field(min_length=1)
    location: tuple[Str, Int | None, Str]
    keywords: dict[str, Any]
    longrepr: Longrepr = None
    sections: list[tuple[Str, Str]] = Field(default_factory=list)
    user_properties: list[tuple[Str, Any]] = Field(default_factory=list)
    duration: Num = 0.0
    wasxfail: Str | None = None


@_shape(node_records.ReportRecord)
class ReportRecord(_Record):
    type: Literal["report"]
    data: ReportData


@_shape(node_records.ItemRecord)
class ItemRecord(_Record):
    """A test's reports, then its attempt's end and its protocol's end."""

    type: Literal["item"]
    nodeid: str
    reports: list[ReportData] = Field(default_factory=list)
    finish: Annotated[bool, Strict()] = False
    done: Annotated[bool, Strict()] = False


class CollectErrorData(BaseModel):
    model_config = ConfigDict(extra="allow")

    nodeid: Str = "?"
    longrepr: Longrepr = None


@_shape(node_records.CollectErrorRecord)
class CollectErrorRecord(_Record):
    type: Literal["collect_error"]
    data: CollectErrorData


@_shape(node_records.MissingRecord)
class MissingRecord(_Record):
    type: Literal["missing"]
    nodeids: list[str]
    rootdir: str = "?"


@_shape(node_records.WarningRecord)
class WarningRecord(_Record):
    type: Literal["warning"]
    when: str
    nodeid: str = ""
    message: str = ""
    category: str = "builtins.UserWarning"
    filename: str = ""
    lineno: int | None = None


@_shape(node_records.XmlAttributeRecord)
class XmlAttributeRecord(_Record):
    type: Literal["xml_attribute"]
    nodeid: str
    name: str = Field(pattern=XML_NAME)  # pytest's junit writer puts it in unescaped
    value: str


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
    StartRecord | FinishRecord | DoneRecord | ReportRecord | ItemRecord | CollectErrorRecord
    | MissingRecord | WarningRecord | XmlAttributeRecord | SuitePropertyRecord
    | SessionFinishRecord,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


class BadRecord(ValueError):
    """A line of reports.jsonl the controller refuses; ``raw`` is the line (shortened)."""

    def __init__(self, why: str, raw: str | dict[str, Any]) -> None:
        self.why = why
        raw = raw if isinstance(raw, str) else json.dumps(raw, default=repr)
        self.raw = raw if len(raw) <= RAW_SHOWN else raw[:RAW_SHOWN] + "..."
        super().__init__(f"{why}; the line: {self.raw}")


def parse_record(data: dict[str, Any], batch_nodeids: Container[str] | None) -> Record:
    """``data`` (one object of reports.jsonl) as a typed record of this batch (None: any)."""
    try:
        record = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        _refuse_known(data)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        raise BadRecord(f"malformed {data.get('type')!r} record ({where}: {first['msg']})",
                        data) from None
    except Exception as exc:  # noqa: BLE001 - whatever a target wrote, never an INTERNALERROR
        _refuse_known(data)
        raise BadRecord(f"unreadable {data.get('type')!r} record ({type(exc).__name__})",
                        data) from None
    for nodeid in named_tests(data):
        if batch_nodeids is not None and nodeid not in batch_nodeids:
            raise BadRecord(f"a record for {nodeid!r}, which is not a test of this batch",
                            data)
    return record


def _refuse_known(data: dict[str, Any]) -> None:
    """A ``BadRecord`` for a record of another version or of an unknown type."""
    # no "v": a worker from before records had a version (the same shapes, without "done")
    version = data.get("v", RECORD_VERSION)
    if version != RECORD_VERSION:
        raise BadRecord(
            f"record version {version!r}, this controller reads version {RECORD_VERSION} "
            "(does the target run another version of pytest-trtllm-slurm?)", data)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in MODELS:
        raise BadRecord(
            f"unknown record type {repr(kind)[:80]} (this controller reads the types "
            f"{', '.join(MODELS)}; does the target run another version of "
            "pytest-trtllm-slurm?)", data)


# -- the same checks on plain dicts, derived from the models: what the run loop reads, in
# one pass of pydantic-core, with no model object per record; extra keys kept

_List = AfterValidator(list)  # a fixed-length tuple's check, kept the JSON array it was


def _typed_dicts(models: Mapping[str, type[BaseModel]]) -> dict[str, Any]:
    """Tag -> the TypedDict of its model (one per model): its fields by alias, each checked
    as the model checks it (tuples kept lists), required ones first; "ignore" is "allow"."""
    made: dict[type[BaseModel], Any] = {}

    def typed(model: type[BaseModel]) -> Any:
        if model not in made:
            fields = {f.alias or name: (convert(f.rebuild_annotation()) if f.is_required()
                                        else NotRequired[convert(f.rebuild_annotation())])
                      for name, f in sorted(model.model_fields.items(),
                                            key=lambda item: not item[1].is_required())}
            extra: Literal["forbid", "allow"] = (
                "forbid" if model.model_config.get("extra") == "forbid" else "allow")
            made[model] = with_config(ConfigDict(extra=extra))(  # type: ignore[operator]
                TypedDict(model.__name__, fields))  # type: ignore[operator]
        return made[model]

    def convert(kind: Any) -> Any:
        origin, args = get_origin(kind), get_args(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return typed(kind)
        if origin is Annotated:
            return Annotated[(convert(args[0]),) + args[1:]]
        if origin in (Union, UnionType):
            return Union[tuple(convert(arg) for arg in args)]  # noqa: UP007
        if origin is list:
            return list[convert(args[0])]  # type: ignore[misc]
        if origin is tuple:
            return Annotated[tuple[tuple(convert(arg) for arg in args)], _List]
        return kind

    return {tag: typed(model) for tag, model in models.items()}


DICTS: dict[str, Any] = _typed_dicts(MODELS)
_DICT_ADAPTER: TypeAdapter[dict[str, Any]] = TypeAdapter(Annotated[  # type: ignore[arg-type]
    Union[tuple(DICTS.values())], Field(discriminator="type")])  # noqa: UP007


class RefusedLine(dict):  # type: ignore[type-arg]
    """A JSON object that is no accepted record, in its place; ``bad`` says why."""

    def __init__(self, data: dict[str, Any], bad: BadRecord) -> None:
        super().__init__(data)
        self.bad = bad


def check_line(line: bytes, batch: Container[str] | None = None) -> dict[str, Any]:
    """One line of reports.jsonl as a checked record of ``batch`` (a plain dict; None: any
    test), else an ``UnreadableLine`` / ``RefusedLine``; the models word a refusal."""
    try:
        # pydantic-core's own validator: the adapter's wrapper reads its defaults per call
        record = _DICT_ADAPTER.validator.validate_json(line)
    except Exception:  # noqa: BLE001 - the slow path below says what is wrong
        record = _judged(line)
        if type(record) is not dict:
            return record
    if batch is not None:
        for nodeid in named_tests(record):
            if nodeid not in batch:
                data = decode_line(line)  # the object as the target wrote it, for the message
                return RefusedLine(data, BadRecord(
                    f"a record for {nodeid!r}, which is not a test of this batch",
                    data))
    return record


def _judged(line: bytes) -> dict[str, Any]:
    """``check_line`` of a line the one-pass check refused."""
    data = decode_line(line)
    if type(data) is not dict:
        return data
    try:
        return _DICT_ADAPTER.validate_python(data)
    except Exception:  # noqa: BLE001 - whatever a target wrote, never an INTERNALERROR
        pass
    try:
        parse_record(data, None)
    except BadRecord as bad:
        return RefusedLine(data, bad)
    return data  # the models accept what the dicts refuse: never the case (tested)


def named_tests(record: dict[str, Any]) -> list[str]:
    """The node ids a checked record is about (each must be a test of the batch)."""
    kind = record["type"]
    if kind == "item":
        nodeid = record["nodeid"]
        others = [report["nodeid"] for report in record.get("reports", ())
                  if report["nodeid"] != nodeid]  # most often none: one look, not four
        return [nodeid, *others]
    if kind in ("start", "finish", "done", "xml_attribute"):
        return [record["nodeid"]]
    if kind == "report":
        return [record["data"]["nodeid"]]
    if kind == "missing":
        return list(record["nodeids"])
    if kind == "warning" and record["when"] == "runtest":
        return [record.get("nodeid", "")]
    return []


class UnreadableLine(dict):  # type: ignore[type-arg]
    """A line that is no JSON object (an empty dict); ``line``: its start, ``why``."""

    def __init__(self, line: str, why: str = "not a JSON object") -> None:
        super().__init__()
        self.line = line[:RAW_SHOWN * 2]
        self.why = why


class LineReader:
    """The bytes of reports.jsonl, as read, as checked records (``check_line``): the one way a
    target's reports become records; a line longer than ``max_line`` is one ``UnreadableLine``."""

    def __init__(self, max_line: int = MAX_LINE, batch: Container[str] | None = None) -> None:
        self.max_line = max_line
        self.batch = batch  # the node ids a record may name (``check_line``)
        self._pieces: list[bytes] = []  # the start of the line that has no end yet
        self._kept = 0  # bytes in _pieces
        self._skipping = False  # inside a line that was too long: dropped to its end


    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The records whose lines end in ``chunk``."""
        records: list[dict[str, Any]] = []
        pos = 0
        while pos < len(chunk):
            end = chunk.find(b"\n", pos)
            stop = len(chunk) if end < 0 else end
            if self._skipping:
                if end >= 0:
                    self._skipping = False
            elif self._kept + stop - pos > self.max_line:
                start = (self._pieces[0] if self._pieces else chunk[pos:])[:RAW_SHOWN]
                records.append(UnreadableLine(
                    start.decode("utf-8", "replace"),
                    f"a line longer than {self.max_line} bytes (the longest the controller "
                    "reads)"))
                self._pieces, self._kept, self._skipping = [], 0, end < 0
            elif end < 0:
                self._pieces.append(chunk[pos:])
                self._kept += len(chunk) - pos
            else:
                line = chunk[pos:end]
                if self._pieces:
                    line = b"".join([*self._pieces, line])
                    self._pieces, self._kept = [], 0
                if line.strip():
                    records.append(check_line(line, self.batch))
            if end < 0:
                break
            pos = end + 1
        return records


def decode_line(line: bytes) -> dict[str, Any]:
    """One line as a JSON object, or an ``UnreadableLine`` saying why it is none:
    pydantic-core's parser first (twice as fast), ``json.loads`` decides what it refuses."""
    try:
        record = from_json(line)
    except Exception:  # noqa: BLE001 - the slow path below says what is wrong
        pass
    else:
        if type(record) is dict:
            return record
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return UnreadableLine(line[:RAW_SHOWN].decode("utf-8", "replace"), "not UTF-8")
    try:
        record = json.loads(text)
    except ValueError:
        return UnreadableLine(text, "not a JSON object")
    except RecursionError:
        return UnreadableLine(text, "JSON nested too deep")
    except Exception as exc:  # noqa: BLE001 - whatever a target wrote, never an INTERNALERROR
        return UnreadableLine(text, f"unreadable JSON ({type(exc).__name__})")
    if not isinstance(record, dict):
        return UnreadableLine(text, "not a JSON object")
    return record


def warning_category(qualified: str) -> type[Warning]:
    """The loaded Warning subclass named ``module.QualName`` (never an import), else UserWarning."""
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


# -- the other files a target writes: each read through one model here --------------------

MAX_ARTEFACT = 256 << 20  # bytes of an artefact (coverage data, benchmarks.json) read


def load_json(raw: bytes | str, what: str) -> Any:
    """``raw`` (a file a target wrote) as JSON; else ``BadRecord`` naming ``what``."""
    try:
        return json.loads(raw)
    except RecursionError:
        why = "JSON nested too deep"
    except ValueError as exc:
        why = f"not JSON ({exc})"
    except Exception as exc:  # noqa: BLE001 - whatever a target wrote, never an INTERNALERROR
        why = f"unreadable ({type(exc).__name__})"
    raise _bad(f"{what}: {why}", raw)


def _bad(why: str, raw: bytes | str) -> BadRecord:
    return BadRecord(why, raw if isinstance(raw, str) else
                     raw[:RAW_SHOWN].decode("utf-8", "replace"))


_B = TypeVar("_B", bound=BaseModel)


def validated(model: type[_B], raw: bytes | str, what: str) -> _B:
    """``raw`` as ``model``; else ``BadRecord`` with the first problem, nothing else."""
    data = load_json(raw, what)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the top level"
        why = f"{what}: {where}: {first['msg']}"
    except Exception as exc:  # noqa: BLE001 - whatever a target wrote, never an INTERNALERROR
        why = f"{what}: unreadable ({type(exc).__name__})"
    raise _bad(why, raw)


class Heartbeat(BaseModel):
    """``heartbeat.json`` of a warm worker's agent (``node.forkloop``)."""

    model_config = ConfigDict(extra="allow")

    time: Annotated[float, Field(allow_inf_nan=False)]
    running: Int = 0
    pending: Int = 0


class BenchmarkStats(BaseModel):
    """What pytest-benchmark's table, JSON and comparisons compute with."""

    model_config = ConfigDict(extra="allow")

    min: Num
    max: Num
    mean: Num
    stddev: Num
    rounds: Int
    median: Num
    iqr: Num
    q1: Num
    q3: Num
    iqr_outliers: Int
    stddev_outliers: Int
    outliers: Str
    ld15iqr: Num
    hd15iqr: Num
    ops: Num
    total: Num
    iterations: Int = 1
    data: list[Num] = Field(default_factory=list)


class Benchmark(BaseModel):
    """One result of ``benchmarks.json`` (pytest-benchmark's ``as_dict``)."""

    model_config = ConfigDict(extra="allow")

    name: Str
    fullname: Str
    group: Str | None = None
    param: Str | None = None
    params: dict[str, Any] | None = None
    extra_info: dict[str, Any] = Field(default_factory=dict)
    stats: BenchmarkStats


class Benchmarks(RootModel[list[Benchmark]]):
    """``benchmarks.json``: the results a batch's worker measured."""


def parse_benchmarks(raw: bytes) -> list[dict[str, Any]]:
    """The checked results of ``benchmarks.json``; ``BadRecord`` otherwise."""
    return [b.model_dump() for b in validated(Benchmarks, raw, BENCHMARKS_FILE).root]
