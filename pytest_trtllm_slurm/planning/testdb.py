"""An open, pure renderer of TensorRT-LLM's test-db: each block runs on the first configured
target that meets its condition (upstream's sees one machine). Format: docs/test-db.md."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_trtllm_slurm.errors import ConfigError

#: condition keys read; any other is named in the plan as not checked
CHECKED_RANGES = ("system_gpu_count",)
CHECKED_WILDCARDS = ("gpu", "cpu")


@dataclass(frozen=True)
class Entry:
    """One line of a block's ``tests``: a node id (or a file or folder), its options."""

    text: str  # as written
    test: str  # the node id / path part
    timeout_minutes: int | None = None  # ``TIMEOUT (N)``
    isolation: bool = False  # ``ISOLATION``: read, not applied (docs/test-db.md)
    unsupported: str | None = None  # why the entry cannot be selected (``-k``)


@dataclass(frozen=True)
class Block:
    """One block of a context: its condition and its tests."""

    context: str
    index: int  # 1-based, in the file
    path: str
    gpu_count: tuple[int | None, int | None]  # ranges.system_gpu_count (gte, lte)
    gpu_patterns: tuple[str, ...]
    cpu_patterns: tuple[str, ...]
    terms: Mapping[str, str]
    unchecked: tuple[str, ...]  # condition keys read but not checked
    entries: tuple[Entry, ...]

    @property
    def name(self) -> str:
        return f"{self.context}#{self.index}"

    def describe(self) -> str:
        gte, lte = self.gpu_count
        count = (f"{gte}" if gte == lte and gte is not None
                 else f"{gte if gte is not None else 0}..{lte if lte is not None else 'any'}")
        terms = " ".join(f"{k}={v}" for k, v in self.terms.items())
        gpus = ",".join(self.gpu_patterns) or "any GPU"
        cpu = f", cpu {','.join(self.cpu_patterns)}" if self.cpu_patterns else ""
        return f"{self.name} ({count} x {gpus}{cpu}; {terms or 'no terms'})"


@dataclass(frozen=True)
class Target:
    """A place a block can run: one partition of a cluster, as discovered or configured."""

    cluster: str | None
    partition: str | None
    gpu_type: str  # gres type or device type (``h200``)
    gpus_per_node: int
    nodes: int | None = None  # None: not known (a clusters-file table): any count
    cpu: str | None = None  # x86_64 / aarch64; None: not known

    def describe(self) -> str:
        where = "/".join(filter(None, (self.cluster, self.partition))) or "?"
        return f"{where} ({self.gpus_per_node}x {self.gpu_type} per node)"


@dataclass(frozen=True)
class Selection:
    """A selected block and where it runs: ``devices`` GPUs over ``nodes`` nodes."""

    block: Block
    target: Target
    devices: int
    nodes: int

    @property
    def per_node(self) -> int:
        return self.devices // self.nodes if self.devices else 0


@dataclass
class Rendering:
    """What the renderer chose, and what it could not place (for the plan's report)."""

    selections: list[Selection] = field(default_factory=list)
    unplaced: list[Block] = field(default_factory=list)  # terms agree, no target meets it
    considered: int = 0  # blocks of the asked contexts whose terms agree


_TIMEOUT = re.compile(r"\s+TIMEOUT\s*\(\s*(\d+)\s*\)")
_ISOLATION = re.compile(r"\s+ISOLATION\b")


def parse_entry(text: str) -> Entry:
    """``path::test[id] TIMEOUT (90) ISOLATION`` -> Entry. ``-k "expr"`` and other
    trailing words are kept as unsupported (never silently read as part of the id)."""
    rest = text.strip()
    timeout = None
    match = _TIMEOUT.search(rest)
    if match:
        timeout = int(match.group(1))
        rest = rest[:match.start()] + rest[match.end():]
    isolation = bool(_ISOLATION.search(rest))
    rest = _ISOLATION.sub("", rest).strip()
    test, _, extra = rest.partition(" ")
    unsupported = None
    if extra.strip().startswith("-k"):
        unsupported = "a '-k' expression selects tests by keyword, which is not supported"
    elif extra.strip():
        unsupported = f"unexpected words after the test id: {extra.strip()!r}"
    return Entry(text=text, test=test, timeout_minutes=timeout, isolation=isolation,
                 unsupported=unsupported)


def _bound(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: found {value!r}; expected a non-negative integer")
    return value


def _patterns(value: object, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{where}: found {value!r}; expected a pattern or a list of them")
    return tuple(items)


def _table(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: found {value!r}; expected a mapping")
    return value


def parse_block(context: str, index: int, raw: object, path: str) -> Block:
    """One block of ``context`` (``raw``: the YAML mapping) -> Block, else ConfigError."""
    where = f"{path}: {context} block {index}"
    block = _table(raw, where)
    cond = _table(block.get("condition"), f"{where}: condition")
    ranges = _table(cond.get("ranges"), f"{where}: condition.ranges")
    wildcards = _table(cond.get("wildcards"), f"{where}: condition.wildcards")
    terms = _table(cond.get("terms"), f"{where}: condition.terms")
    count = _table(ranges.get("system_gpu_count"), f"{where}: ranges.system_gpu_count")
    gte = _bound(count.get("gte"), f"{where}: system_gpu_count.gte")
    lte = _bound(count.get("lte"), f"{where}: system_gpu_count.lte")
    unchecked = [f"ranges.{k}" for k in ranges if k not in CHECKED_RANGES]
    unchecked += [f"wildcards.{k}" for k in wildcards if k not in CHECKED_WILDCARDS]
    unchecked += [f"condition.{k}" for k in cond if k not in ("ranges", "wildcards", "terms")]
    tests = block.get("tests") or []
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ConfigError(f"{where}: tests: expected a list of test ids")
    return Block(
        context=context, index=index, path=path, gpu_count=(gte, lte),
        gpu_patterns=_patterns(wildcards.get("gpu", []), f"{where}: wildcards.gpu"),
        cpu_patterns=_patterns(wildcards.get("cpu", []), f"{where}: wildcards.cpu"),
        terms={str(k): _term(v) for k, v in terms.items()},
        unchecked=tuple(unchecked), entries=tuple(parse_entry(t) for t in tests),
    )


def _term(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_test_db(folder: Path, contexts: Sequence[str]) -> list[Block]:
    """The blocks of ``contexts`` in the folder's YAML files (a context may span files), in
    file and block order; ConfigError for a missing folder, bad YAML or unknown context."""
    if not folder.is_dir():
        raise ConfigError(f"test-db folder {folder} (--trtllm-test-db) does not exist")
    found: dict[str, list[Block]] = {}
    for path in sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")]):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"test-db file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            continue
        for context in contexts:
            blocks = data.get(context)
            if blocks is None:
                continue
            if not isinstance(blocks, list):
                raise ConfigError(f"{path}: {context}: expected a list of blocks")
            found.setdefault(context, []).extend(
                parse_block(context, i, raw, str(path)) for i, raw in enumerate(blocks, 1))
    missing = [c for c in contexts if c not in found]
    if missing:
        raise ConfigError(f"test-db folder {folder}: no file has context(s) "
                          f"{', '.join(missing)}; expected a top-level key of that name")
    return [b for c in contexts for b in found[c]]


def parse_terms(items: Iterable[str]) -> dict[str, str]:
    """``["stage=pre_merge backend=pytorch"]`` (words, or several items) -> mapping."""
    terms: dict[str, str] = {}
    for word in (w for item in items for w in re.split(r"[\s,]+", item) if w):
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--trtllm-test-db-terms: found {word!r}; expected KEY=VALUE "
                              "words, e.g. stage=pre_merge backend=pytorch")
        terms[key] = value
    return terms


def terms_agree(block: Block, wanted: Mapping[str, str]) -> bool:
    """Every asked term has the block's value (case-insensitive); other block terms pass."""
    return all(block.terms.get(k, "").lower() == v.lower() for k, v in wanted.items())


def _matches(patterns: Sequence[str], value: str | None) -> bool:
    if not patterns or value is None:
        return True  # value None: not known here, the cluster is trusted (docs/test-db.md)
    return any(fnmatch.fnmatchcase(value.lower(), p.lower()) for p in patterns)


def size_on(block: Block, target: Target) -> tuple[int, int] | None:
    """(GPUs, nodes) with which ``target`` meets the block's GPU count: the smallest
    count in range that fits one node, or whole nodes; None when none does."""
    gte, lte = block.gpu_count
    low = gte if gte is not None else 1
    high = lte if lte is not None else max(low, target.gpus_per_node * (target.nodes or 1))
    for count in range(low, high + 1):
        if count <= target.gpus_per_node:
            return count, 1
        if count % target.gpus_per_node == 0:
            nodes = count // target.gpus_per_node
            if target.nodes is None or nodes <= target.nodes:
                return count, nodes
    return None


def meets(block: Block, target: Target) -> tuple[int, int] | None:
    """The (GPUs, nodes) of ``block`` on ``target``; None when it does not meet the condition."""
    if (not target.gpus_per_node or not _matches(block.gpu_patterns, target.gpu_type)
            or not _matches(block.cpu_patterns, target.cpu)):
        return None
    return size_on(block, target)


def render(blocks: Sequence[Block], terms: Mapping[str, str],
           targets: Sequence[Target]) -> Rendering:
    """Each block whose terms agree, on the first target that meets its condition."""
    out = Rendering()
    for block in blocks:
        if not terms_agree(block, terms):
            continue
        out.considered += 1
        for target in targets:
            size = meets(block, target)
            if size is not None:
                out.selections.append(Selection(block, target, *size))
                break
        else:
            out.unplaced.append(block)
    return out
