"""What each test needs (pure): markers, perf-sanity YAML, bench/eval commands, time limits;
``size_item`` sizes a test (docs/sizing.md), bad input is a ConfigError naming the test."""

from __future__ import annotations

import itertools
import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)

from pytest_trtllm_slurm.errors import ConfigError, TestSpecError
from pytest_trtllm_slurm.planning.durations import slurm_time
from pytest_trtllm_slurm.planning.fields import (
    Argument,
    Env,
    MountTuple,
    OneLine,
    OneOrMany,
    SlurmName,
    checked,
    validation_message,
)
from pytest_trtllm_slurm.planning.models import DeviceRequirement, Launch
from pytest_trtllm_slurm.planning.perf_sanity import PerfSources, perf_id, perf_size
from pytest_trtllm_slurm.planning.safe_values import argument_problem, line_problem
from pytest_trtllm_slurm.planning.settings import Settings

SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ";;", "(", ")", "\n"}


def shell_tokens(cmd: str) -> list[str]:
    """``cmd`` as shell words, each operator a token; ValueError on unbalanced quotes."""
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def words_until_operator(tokens: Sequence[str]) -> list[str]:
    """The leading words of ``tokens``, up to the first shell operator."""
    return list(itertools.takewhile(lambda t: t not in SHELL_OPERATORS, tokens))


def _last_invocation(cmd: str, program: str) -> list[str]:
    """Arguments of the last ``program`` call in a shell chain (``a && b; c``)."""
    try:
        tokens = shell_tokens(cmd)
    except ValueError as exc:
        raise ConfigError(f"command {cmd!r}: cannot be split as shell words ({exc}); "
                          "expected balanced quotes") from None
    starts = [i for i, token in enumerate(tokens) if os.path.basename(token) == program]
    if not starts:
        raise ConfigError(f"command {cmd!r}: found no {program} invocation; "
                          f"expected '{program} ...'")
    return words_until_operator(tokens[starts[-1] + 1:])


def _int_flag(args: Sequence[str], flag: str, cmd: str) -> int:
    """Value of the last ``--flag N`` / ``--flag=N`` in ``args`` (1 when absent)."""
    value: str | None = None
    for index, arg in enumerate(args):
        if arg == flag:
            value = args[index + 1] if index + 1 < len(args) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"command {cmd!r}: {flag} {value!r}; expected a positive integer")
    return int(value)


def parse_bench_command(cmd: str) -> tuple[int, int]:
    """(tp, pp) of the last ``trtllm-bench`` in ``cmd``; each defaults to 1."""
    args = _last_invocation(cmd, "trtllm-bench")
    return _int_flag(args, "--tp", cmd), _int_flag(args, "--pp", cmd)


def parse_eval_command(cmd: str) -> tuple[int, int]:
    """(tp_size, pp_size) of the last ``trtllm-eval`` in ``cmd``; each defaults to 1."""
    args = _last_invocation(cmd, "trtllm-eval")
    return _int_flag(args, "--tp_size", cmd), _int_flag(args, "--pp_size", cmd)


class MarkLike(Protocol):
    """What we read of a pytest Mark (so tests need no real items)."""

    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> Mapping[str, Any]: ...


MarkerLookup = Callable[[str], "MarkLike | None"]


def _launcher_words(value: object) -> object:
    """A launcher given as one text is split as shell words (``"mpirun -n 1"``)."""
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise ValueError(f"cannot be split as shell words ({exc})") from None
    return value


def _launcher_problem(words: tuple[str, ...]) -> str | None:
    """The launcher runs first on the srun line: its program is a positional argument
    (not an option srun would read), and no word may break a line."""
    if not words:
        return None
    return argument_problem(words[0]) or next(
        (f"word {w!r} {p}" for w in words[1:] for p in [line_problem(w)] if p), None)


Launcher = Annotated[tuple[str, ...], BeforeValidator(_launcher_words),
                     AfterValidator(lambda v: checked(v, _launcher_problem))]


class TestConfig(BaseModel):
    """Fields of the per-test ``trtllm_slurm(...)`` marker; unknown keys are errors."""

    __test__ = False  # not a test class, even when imported into a test module
    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: StrictInt | None = Field(default=None, ge=0)
    devices_per_node: StrictInt | None = Field(default=None, ge=1)
    nodes: StrictInt | None = Field(default=None, ge=1)
    # checked at planning (by their types): they reach #SBATCH lines, argv and the environment
    device_type: OneLine | None = None
    cluster: SlurmName | None = None  # run on this cluster (as --slurm-cluster, for this test)
    partition: SlurmName | None = None
    account: SlurmName | None = None
    time_limit: str | None = None  # normalized to Slurm's D-HH:MM:SS / HH:MM:SS
    container_image: Argument | None = None
    mounts: Annotated[MountTuple, OneOrMany] = ()
    env: Env = Field(default_factory=dict)
    launch: Launch | None = None
    # the prefix every rank runs (``trtllm-llmapi-launch``): pytest then runs on rank 0 only
    launcher: Launcher | None = None
    local: bool = False  # run in this pytest process, never dispatch

    @field_validator("time_limit", mode="before")
    @classmethod
    def _normalize_time(cls, value: object) -> object:
        return slurm_time(value, "time_limit")


_NO_CONFIG = TestConfig()  # shared by every test without a trtllm_slurm marker (frozen)


def marker_config(nodeid: str, mark: MarkLike | None) -> TestConfig:
    """TestConfig of a ``trtllm_slurm`` mark; one optional positional argument means devices."""
    if mark is None:
        return _NO_CONFIG
    fields = dict(mark.kwargs)
    if len(mark.args) > 1 or (mark.args and "devices" in fields):
        raise ConfigError(
            f"{nodeid}: trtllm_slurm{tuple(mark.args)!r}: found {len(mark.args)} positional "
            "argument(s); expected at most one (devices) plus keywords, "
            "e.g. @pytest.mark.trtllm_slurm(devices=8, nodes=2)"
        )
    if mark.args:
        fields["devices"] = mark.args[0]
    try:
        return TestConfig(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{nodeid}: trtllm_slurm marker: {exc}") from None
    except ValidationError as exc:
        unknown = any(err["type"] == "extra_forbidden" for err in exc.errors())
        expected = f"; expected keywords {', '.join(TestConfig.model_fields)}" if unknown else ""
        raise ConfigError(
            f"{nodeid}: trtllm_slurm marker: {validation_message(exc)}{expected}"
        ) from None


def _count_arg(nodeid: str, mark: MarkLike, name: str, unit: str) -> int:
    """The single non-negative integer argument of a ``skip_less_*`` marker."""
    example = {"MiB": 80000}.get(unit, 4)
    expected = f"one non-negative integer ({unit}), e.g. @pytest.mark.{name}({example})"
    if len(mark.args) != 1 or mark.kwargs:
        found = ", ".join(
            [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
        )
        raise TestSpecError(
            f"{nodeid}: {name}({found}): found {len(mark.args) + len(mark.kwargs)} arguments; "
            f"expected {expected}"
        )
    value = mark.args[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TestSpecError(f"{nodeid}: {name}({value!r}): found {value!r}; expected {expected}")
    return value


def _keywords(nodeid: str, mark: MarkLike) -> list[str]:
    value: Any = mark.args[0] if len(mark.args) == 1 else list(mark.args)
    if isinstance(value, str):
        value = [value]
    if not value or not all(isinstance(v, str) for v in value):
        raise TestSpecError(
            f"{nodeid}: skip_device_not_contain{tuple(mark.args)!r}: expected a list of device "
            "name keywords, e.g. @pytest.mark.skip_device_not_contain(['H100', 'H200'])"
        )
    return list(value)


def _marker_counts(nodeid: str, cfg: TestConfig) -> tuple[int, int | None]:
    """(total, per_node) from the marker; ``devices`` alone means one node (as skip_less_device)."""
    total, per_node, nodes = cfg.devices, cfg.devices_per_node, cfg.nodes
    found = f"devices={total}, devices_per_node={per_node}, nodes={nodes}"
    if total is None:
        if per_node is None:
            raise TestSpecError(
                f"{nodeid}: trtllm_slurm({found}): nodes alone says nothing about devices; "
                "expected devices= or devices_per_node= as well"
            )
        return per_node * (nodes or 1), per_node
    if total == 0:
        return 0, None
    if per_node is None:
        per_node = math.ceil(total / (nodes or 1))
    if per_node > total or (nodes is not None and math.ceil(total / per_node) != nodes):
        raise TestSpecError(
            f"{nodeid}: trtllm_slurm({found}) is inconsistent; expected "
            "nodes == ceil(devices / devices_per_node) and devices_per_node <= devices"
        )
    return total, per_node


def size_marks(
    nodeid: str, get_marker: MarkerLookup, settings: Settings, perf_case: str | None = None,
    perf: PerfSources | Callable[[], PerfSources] | None = None,
) -> tuple[TestConfig, DeviceRequirement]:
    """(marker fields, requirement) from the closest markers, else ``perf_case``'s YAML."""
    cfg = marker_config(nodeid, get_marker("trtllm_slurm"))
    device_type = cfg.device_type or settings.device_type  # keywords: picked by routing
    contain = get_marker("skip_device_not_contain")
    keywords = tuple(_keywords(nodeid, contain)) if contain is not None else ()
    memory = {
        field: _count_arg(nodeid, mark, name, "MiB") if mark is not None else None
        for field, name in (("device_memory_mib", "skip_less_device_memory"),
                            ("host_memory_mib", "skip_less_host_memory"))
        for mark in [get_marker(name)]
    }
    mpi, device = get_marker("skip_less_mpi_world_size"), get_marker("skip_less_device")
    per_node: int | None
    if any(v is not None for v in (cfg.devices, cfg.devices_per_node, cfg.nodes)):
        (total, per_node), source = _marker_counts(nodeid, cfg), "trtllm_slurm"
    elif mpi is not None:
        source = "skip_less_mpi_world_size"
        total, per_node = _count_arg(nodeid, mpi, source, "ranks"), None
        if device is not None:
            # skip_less_device(M) is a lower bound checked on each node, not a size: the
            # ranks still spread as the target's nodes allow (validated, not applied)
            _count_arg(nodeid, device, "skip_less_device", "devices")
    elif device is not None:
        source = "skip_less_device"
        total = _count_arg(nodeid, device, source, "devices")
        per_node = total or None
    elif (named := _named_marker(get_marker, settings.marker_devices)) is not None:
        total, source = named
        per_node = total or None
    elif perf_case is not None:
        sources = (perf() if callable(perf) else perf) or PerfSources()
        total, per_node, source = perf_size(perf_case, nodeid, sources)
    else:
        total, per_node, source = 0, None, "default"
    try:
        return cfg, DeviceRequirement(
            total=total, per_node=per_node if total else None, device_type=device_type,
            device_keywords=keywords, source=source, **memory,
        )
    except ValidationError as exc:
        raise TestSpecError(f"{nodeid}: {validation_message(exc)}") from None


MARKER_NAMES = frozenset({"trtllm_slurm", "skip_less_device", "skip_less_mpi_world_size",
                          "skip_less_device_memory", "skip_less_host_memory",
                          "skip_device_not_contain"})

MARKER_DEVICES_FORMAT = "NAME:COUNT words, e.g. 'gpu2:2 gpu4:4 gpu8:8'"


def parse_marker_devices(items: Sequence[str], where: str) -> dict[str, int]:
    """``["gpu2:2 gpu4:4", "gpu8:8"]`` (ini lines, each with any number of words) -> table."""
    table: dict[str, int] = {}
    for word in (w for item in items for w in str(item).split()):
        name, sep, count = word.partition(":")
        if not sep or not name.isidentifier() or not count.isdigit():
            raise ConfigError(f"{where}: found {word!r}; expected {MARKER_DEVICES_FORMAT} "
                              "(a marker name, a colon, a non-negative integer)")
        if name in MARKER_NAMES:
            raise ConfigError(f"{where}: {name!r} is one of the plugin's own markers; "
                              f"expected other marker names ({MARKER_DEVICES_FORMAT})")
        table[name] = int(count)
    if not table:
        raise ConfigError(f"{where}: empty; expected {MARKER_DEVICES_FORMAT}")
    return table


def _named_marker(get_marker: MarkerLookup,
                  table: Mapping[str, int]) -> tuple[int, str] | None:
    """(devices, marker name) of the table's markers the test has; the largest when it has
    several (a class marked ``gpu2`` holding a method marked ``gpu4`` needs 4)."""
    return max(((count, name) for name, count in table.items() if get_marker(name) is not None),
               default=None)


def launcher_for(cfg: TestConfig, cluster_launcher: Sequence[str], nodes: int) -> tuple[str, ...]:
    """The launcher prefix a test's ranks run: its marker's (``launcher=[]``: none), else the
    cluster's for a test that spans nodes (TensorRT-LLM's ``trtllm-llmapi-launch``), else none."""
    if cfg.launcher is not None:
        return tuple(cfg.launcher)
    return tuple(cluster_launcher) if nodes > 1 else ()


def closest_markers(item: Any, names: frozenset[str] | None = None) -> MarkerLookup:
    """``get_closest_marker`` for our marker names (and ``names``) in one walk."""
    wanted = MARKER_NAMES | names if names else MARKER_NAMES
    marks = [mark for mark in item.iter_markers() if mark.name in wanted]
    return {mark.name: mark for mark in reversed(marks)}.get  # the closest wins


@dataclass(frozen=True)
class Sized:
    """What one test needs, its marker's fields, and its id as the user wrote it (for messages)."""

    requirement: DeviceRequirement
    config: TestConfig
    name: str


def size_item(item: Any, settings: Settings, perf: PerfSources | None = None) -> Sized:
    """A pytest item's needs from its markers or perf-sanity YAML (else TestSpecError)."""
    label, name = perf_id(item)

    def sources() -> PerfSources:
        return perf or PerfSources.from_settings(settings, Path(item.config.rootpath))

    cfg, req = size_marks(name, closest_markers(item, frozenset(settings.marker_devices)),
                     settings, label, sources)
    return Sized(req, cfg, name)
