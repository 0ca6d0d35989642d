"""What each test needs: markers, perf-sanity YAML, bench/eval commands, time limits.

Pure functions (no subprocess, no pytest import): the planning layer derives a
DeviceRequirement per test from, in order, the ``trtllm_slurm(...)`` marker,
``skip_less_mpi_world_size`` / ``skip_less_device``, a perf-sanity YAML, else 0
(a CPU test). Bad input raises ConfigError naming the test, what was found and
what is expected -- never a silent default.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from .config import Settings
from .errors import ConfigError
from .models import DeviceRequirement, Launch

# --------------------------------------------------------------------------- time limits

_UNIT_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_CLOCK_RE = re.compile(
    r"(?:(\d+)-(\d{1,2}):(\d{1,2}):(\d{1,2}))"  # D-HH:MM:SS
    r"|(?:(\d+):(\d{1,2})(?::(\d{1,2}))?)"  # HH:MM:SS or MM:SS
)
TIME_FORMATS = "1h, 30m, 3600s, 1h30m, HH:MM:SS, MM:SS or D-HH:MM:SS"


def parse_time_limit(text: str, *, what: str = "time limit") -> int:
    """Seconds in ``text``.

    A bare number is refused: Slurm reads it as minutes, people often mean seconds.
    """
    raw = str(text).strip().lower()
    unit = _UNIT_RE.fullmatch(raw)
    if raw and unit and any(unit.groups()):
        d, h, m, s = (int(g or 0) for g in unit.groups())
        return d * 86400 + h * 3600 + m * 60 + s
    clock = _CLOCK_RE.fullmatch(raw)
    if clock:
        days, dh, dm, ds, a, b, c = clock.groups()
        if days is not None:
            hours, minutes, seconds = int(dh), int(dm), int(ds)
            if hours < 24 and minutes < 60 and seconds < 60:
                return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
        elif c is not None:  # HH:MM:SS
            if int(b) < 60 and int(c) < 60:
                return int(a) * 3600 + int(b) * 60 + int(c)
        elif int(b) < 60:  # MM:SS
            return int(a) * 60 + int(b)
    raise ConfigError(f"{what}: found {text!r}; expected a duration such as {TIME_FORMATS}")


def format_slurm_time(seconds: int) -> str:
    """``D-HH:MM:SS`` (a day or more) or ``HH:MM:SS``: what ``sbatch --time`` takes."""
    if seconds < 0:
        raise ValueError(f"negative duration: {seconds}")
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


# --------------------------------------------------------------------------- commands

_SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ";;", "(", ")", "\n"}


def _last_invocation(cmd: str, program: str) -> list[str]:
    """Arguments of the last ``program`` call in a shell chain (``a && b; c``)."""
    try:
        lexer = shlex.shlex(cmd, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        raise ConfigError(f"command {cmd!r}: cannot be split as shell words ({exc}); "
                          "expected balanced quotes") from None
    start = None
    for index, token in enumerate(tokens):
        if os.path.basename(token) == program:
            start = index
    if start is None:
        raise ConfigError(
            f"command {cmd!r}: found no {program} invocation; expected '{program} ...'"
        )
    args: list[str] = []
    for token in tokens[start + 1 :]:
        if token in _SHELL_OPERATORS:
            break
        args.append(token)
    return args


def _int_flag(args: Sequence[str], names: Sequence[str], cmd: str) -> int:
    """Value of the last ``--name N`` / ``--name=N`` in ``args`` (1 when absent)."""
    value: str | None = None
    flag = names[0]
    for index, arg in enumerate(args):
        for name in names:
            if arg == name:
                value = args[index + 1] if index + 1 < len(args) else ""
                flag = name
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
                flag = name
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"command {cmd!r}: {flag} {value!r}; expected a positive integer")
    return int(value)


def parse_bench_command(cmd: str) -> tuple[int, int]:
    """(tp, pp) of the last ``trtllm-bench`` in ``cmd``; each defaults to 1."""
    args = _last_invocation(cmd, "trtllm-bench")
    return _int_flag(args, ("--tp",), cmd), _int_flag(args, ("--pp",), cmd)


def parse_eval_command(cmd: str) -> tuple[int, int]:
    """(tp_size, pp_size) of the last ``trtllm-eval`` in ``cmd``; each defaults to 1."""
    args = _last_invocation(cmd, "trtllm-eval")
    return _int_flag(args, ("--tp_size",), cmd), _int_flag(args, ("--pp_size",), cmd)


# --------------------------------------------------------------------------- markers


class MarkLike(Protocol):
    """What we read of a pytest Mark (so tests need no real items)."""

    @property
    def args(self) -> tuple[Any, ...]: ...

    @property
    def kwargs(self) -> Mapping[str, Any]: ...


MarkerLookup = Callable[[str], "MarkLike | None"]


class TestConfig(BaseModel):
    """Fields of the per-test ``trtllm_slurm(...)`` marker; unknown keys are errors."""

    __test__ = False  # not a test class, even when imported into a test module
    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: StrictInt | None = Field(default=None, ge=0)
    devices_per_node: StrictInt | None = Field(default=None, ge=1)
    nodes: StrictInt | None = Field(default=None, ge=1)
    device_type: str | None = None
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # normalized to Slurm's D-HH:MM:SS / HH:MM:SS
    container_image: str | None = None
    mounts: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    launch: Launch | None = None
    local: bool = False  # run in this pytest process, never dispatch

    @field_validator("time_limit", mode="before")
    @classmethod
    def _normalize_time(cls, value: object) -> object:
        if value is None:
            return None
        return format_slurm_time(parse_time_limit(str(value), what="time_limit"))

    @field_validator("mounts", mode="before")
    @classmethod
    def _one_mount(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @property
    def has_devices(self) -> bool:
        return any(v is not None for v in (self.devices, self.devices_per_node, self.nodes))


_NO_CONFIG = TestConfig()  # shared by every test without a trtllm_slurm marker (frozen)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']} (found {err['input']!r})"
        for err in exc.errors()
    )


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
        raise ConfigError(
            f"{nodeid}: trtllm_slurm marker: {_validation_message(exc)}; expected keywords "
            f"{', '.join(TestConfig.model_fields)}"
        ) from None



def _count_arg(nodeid: str, mark: MarkLike, name: str, unit: str) -> int:
    """The single non-negative integer argument of a ``skip_less_*`` marker."""
    example = {"MiB": 80000}.get(unit, 4)
    expected = f"one non-negative integer ({unit}), e.g. @pytest.mark.{name}({example})"
    if len(mark.args) != 1 or mark.kwargs:
        found = ", ".join(
            [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
        )
        raise ConfigError(
            f"{nodeid}: {name}({found}): found {len(mark.args) + len(mark.kwargs)} arguments; "
            f"expected {expected}"
        )
    value = mark.args[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{nodeid}: {name}({value!r}): found {value!r}; expected {expected}")
    return value


def _keywords(nodeid: str, mark: MarkLike) -> list[str]:
    value: Any = mark.args[0] if len(mark.args) == 1 else list(mark.args)
    if isinstance(value, str):
        value = [value]
    if not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{nodeid}: skip_device_not_contain{tuple(mark.args)!r}: expected a list of device "
            "name keywords, e.g. @pytest.mark.skip_device_not_contain(['H100', 'H200'])"
        )
    return list(value)


def _device_type(cfg: TestConfig, settings: Settings) -> str | None:
    """Marker device_type > option. skip_device_not_contain keywords are kept apart
    (``device_keywords``): planning picks a concrete type among those available."""
    return cfg.device_type or settings.device_type


def _marker_counts(nodeid: str, cfg: TestConfig) -> tuple[int, int | None]:
    """(total, per_node) from trtllm_slurm(devices=, devices_per_node=, nodes=).

    ``devices`` alone means one node (like skip_less_device); give ``nodes`` or
    ``devices_per_node`` to span nodes.
    """
    total, per_node, nodes = cfg.devices, cfg.devices_per_node, cfg.nodes
    found = f"devices={total}, devices_per_node={per_node}, nodes={nodes}"
    if total is None:
        if per_node is None:
            raise ConfigError(
                f"{nodeid}: trtllm_slurm({found}): nodes alone says nothing about devices; "
                "expected devices= or devices_per_node= as well"
            )
        return per_node * (nodes or 1), per_node
    if total == 0:
        return 0, None
    if per_node is None:
        per_node = math.ceil(total / (nodes or 1))
    if per_node > total or (nodes is not None and math.ceil(total / per_node) != nodes):
        raise ConfigError(
            f"{nodeid}: trtllm_slurm({found}) is inconsistent; expected "
            "nodes == ceil(devices / devices_per_node) and devices_per_node <= devices"
        )
    return total, per_node


# --------------------------------------------------------------------------- perf-sanity

PERF_PREFIXES = ("aggr", "aggr_upload", "disagg", "disagg_upload")
PERF_PARAM = "perf_sanity_test_case"
DEFAULT_AGG_FOLDER = "tests/scripts/perf-sanity/aggregated"
DEFAULT_DISAGG_FOLDER = "tests/scripts/perf-sanity/disaggregated"


@dataclass(frozen=True)
class PerfCase:
    """A parsed perf-sanity label such as ``aggr-gpt_oss-gpt_oss_tp4ep4pp2_mtp1``."""

    label: str
    config: str  # YAML base name
    mode: Literal["aggr", "disagg", "ctx_only"]
    servers: tuple[str, ...] = ()  # aggr: selected server_configs names; () = all of them
    benchmark_mode: str | None = None  # disagg: e2e | gen_only


def parse_perf_case(label: str, nodeid: str = "") -> PerfCase:
    """Split a perf-sanity label the way TensorRT-LLM's test_perf_sanity.py does."""
    where = nodeid or label
    labels = label.split("-")
    prefix = labels[0]
    if prefix not in PERF_PREFIXES or len(labels) < 2 or not labels[1]:
        raise ConfigError(
            f"{where}: perf-sanity id {label!r}; expected '<prefix>-<config>[-<server>]' "
            f"with prefix one of {', '.join(PERF_PREFIXES)}"
        )
    if prefix.startswith("disagg"):
        if len(labels) < 3 or labels[1] not in ("e2e", "gen_only"):
            raise ConfigError(
                f"{where}: disaggregated perf-sanity id {label!r}; expected "
                f"'{prefix}-{{e2e|gen_only}}-<config_base>'"
            )
        return PerfCase(label, "-".join(labels[2:]), "disagg", (), labels[1])
    if len(labels) > 2 and labels[1] == "ctx_only":
        return PerfCase(label, "-".join(labels[2:]), "ctx_only", (), "ctx_only")
    servers = "-".join(labels[2:])
    names = tuple(s.strip() for s in servers.split(",") if s.strip()) if servers else ()
    return PerfCase(label, labels[1], "aggr", names)


@dataclass(frozen=True)
class PerfSources:
    """Where perf YAML files are looked for (built once per run, hashable for caching)."""

    yaml_path: Path | None = None  # --perf-config-yaml: one file for every perf id
    config_dirs: tuple[Path, ...] = ()  # trtllm_perf_config_dir
    agg_dirs: tuple[Path, ...] = ()  # AGG_CONFIG_FOLDER or TRT-LLM's default
    disagg_dirs: tuple[Path, ...] = ()  # DISAGG_CONFIG_FOLDER or TRT-LLM's default

    @classmethod
    def from_settings(
        cls, settings: Settings, rootdir: Path, environ: Mapping[str, str] | None = None
    ) -> PerfSources:
        env = os.environ if environ is None else environ

        def anchored(folder: str) -> tuple[Path, ...]:
            path = Path(folder).expanduser()
            if path.is_absolute():
                return (path,)
            return tuple(base / path for base in (rootdir, *rootdir.parents))

        return cls(
            yaml_path=Path(settings.perf_config_yaml) if settings.perf_config_yaml else None,
            config_dirs=anchored(settings.perf_config_dir) if settings.perf_config_dir else (),
            agg_dirs=anchored(env.get("AGG_CONFIG_FOLDER") or DEFAULT_AGG_FOLDER),
            disagg_dirs=anchored(env.get("DISAGG_CONFIG_FOLDER") or DEFAULT_DISAGG_FOLDER),
        )

    def yaml_for(self, case: PerfCase, nodeid: str) -> Path:
        """The YAML of ``case``; ConfigError listing what was tried when none exists."""
        if self.yaml_path is not None:
            if not self.yaml_path.is_file():
                raise ConfigError(
                    f"{nodeid}: perf config {self.yaml_path} (--perf-config-yaml) does not exist"
                )
            return self.yaml_path
        found, tried = _find_yaml(self, case.mode, case.config)
        if found is not None:
            return found
        shown = ", ".join(str(p) for p in tried[:4]) + (", ..." if len(tried) > 4 else "")
        env = "AGG_CONFIG_FOLDER" if case.mode == "aggr" else "DISAGG_CONFIG_FOLDER"
        name = case.config if case.config.endswith(".yaml") else f"{case.config}.yaml"
        raise ConfigError(
            f"{nodeid}: perf config {name} not found (tried {shown or 'no folder'}); "
            "set --perf-config-yaml PATH, ini trtllm_perf_config_dir / env "
            f"TRTLLM_SLURM_PERF_CONFIG_DIR, or env {env}"
        )


@functools.lru_cache(maxsize=1024)
def _find_yaml(
    sources: PerfSources, mode: str, config: str
) -> tuple[Path | None, tuple[Path, ...]]:
    """(the first existing candidate or None, every candidate) for one config name."""
    name = config if config.endswith(".yaml") else f"{config}.yaml"
    folders = sources.agg_dirs if mode == "aggr" else sources.disagg_dirs
    tried = tuple(folder / name for folder in (*sources.config_dirs, *folders))
    return next((c for c in tried if c.is_file()), None), tried


def load_perf_yaml(path: Path) -> dict[str, Any]:
    """Parsed YAML mapping, cached per (path, mtime, size): thousands of ids share a file."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ConfigError(f"perf config {path}: cannot be read ({exc})") from None
    return _load_yaml_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _load_yaml_cached(path: str, _mtime_ns: int, _size: int) -> dict[str, Any]:
    import yaml  # only perf-sanity runs pay for it

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"perf config {path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"perf config {path}: found {type(data).__name__}; expected a mapping")
    return data


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: found {value!r}; expected a positive integer")
    return value


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key!r} is {'missing' if value is None else repr(value)}; "
                          "expected a mapping")
    return value


def server_gpus(server: Mapping[str, Any], where: str) -> int:
    """GPUs of one server config: ``gpus`` if set, else tp * cp * pp (EP adds none)."""
    if "gpus" in server:
        return _positive(server["gpus"], f"{where}.gpus")
    product = 1
    for key in ("tensor_parallel_size", "context_parallel_size", "pipeline_parallel_size"):
        product *= _positive(server.get(key, 1), f"{where}.{key}")
    return product


def perf_requirement(
    case: PerfCase, data: Mapping[str, Any], path: Path, nodeid: str
) -> tuple[int, int]:
    """(total devices, devices per node) of a perf-sanity case from its parsed YAML."""
    hardware = _table(data, "hardware", f"{nodeid}: {path}")
    if "gpus_per_node" not in hardware:
        raise ConfigError(f"{nodeid}: {path}: hardware.gpus_per_node is missing; expected a "
                          "positive integer (GPUs per node of the target)")
    per_node = _positive(hardware["gpus_per_node"], f"{nodeid}: {path}: hardware.gpus_per_node")
    if case.mode == "aggr":
        gpus = _aggr_gpus(case, data, path, nodeid)
        return gpus, min(gpus, per_node)
    workers = _table(data, "worker_config", f"{nodeid}: {path}")
    if case.mode == "ctx_only":
        gpus = server_gpus(_table(workers, "ctx", f"{nodeid}: {path}: worker_config"),
                           f"{nodeid}: {path}: worker_config.ctx")
        return gpus, min(gpus, per_node)
    nodes = 0
    for role in ("ctx", "gen"):
        count_key = f"num_{role}_servers"
        if count_key not in hardware:
            raise ConfigError(f"{nodeid}: {path}: hardware.{count_key} is missing; expected "
                              "a non-negative integer")
        count = hardware[count_key]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"{nodeid}: {path}: hardware.{count_key}: found {count!r}; "
                              "expected a non-negative integer")
        if role == "ctx" and case.benchmark_mode == "gen_only":
            bench = data.get("benchmark") or {}
            if isinstance(bench, Mapping) and "gen_only_no_context" in str(bench.get("mode", "")):
                count = 0
        if count:
            where = f"{nodeid}: {path}: worker_config.{role}"
            gpus = server_gpus(_table(workers, role, f"{nodeid}: {path}: worker_config"), where)
            nodes += math.ceil(gpus / per_node) * count
    if nodes == 0:
        raise ConfigError(f"{nodeid}: {path}: no ctx or gen servers; expected "
                          "hardware.num_ctx_servers + num_gen_servers > 0")
    return nodes * per_node, per_node


def _aggr_gpus(case: PerfCase, data: Mapping[str, Any], path: Path, nodeid: str) -> int:
    servers = data.get("server_configs")
    if not isinstance(servers, list) or not servers:
        raise ConfigError(f"{nodeid}: {path}: server_configs is missing or empty; expected a list")
    by_name = {str(s.get("name", "")): s for s in servers if isinstance(s, Mapping)}
    if len(by_name) != len(servers) and not case.servers:
        raise ConfigError(f"{nodeid}: {path}: server_configs entries must be mappings")
    if case.servers:
        missing = [name for name in case.servers if name not in by_name]
        if missing:
            raise ConfigError(
                f"{nodeid}: {path}: server {', '.join(missing)!s} not in server_configs; "
                f"expected one of {', '.join(sorted(by_name))}"
            )
        chosen = [by_name[name] for name in case.servers]
    else:
        chosen = list(by_name.values())  # no server named: the largest one decides
    return max(server_gpus(s, f"{nodeid}: {path}: server_configs[{s.get('name')}]") for s in chosen)


def perf_case_of(item: Any) -> str | None:
    """The perf-sanity label of a ``test_e2e[...]`` item, or None."""
    if getattr(item, "originalname", None) != "test_e2e":
        return None
    callspec = getattr(item, "callspec", None)
    params = getattr(callspec, "params", {}) if callspec is not None else {}
    label = params.get(PERF_PARAM)
    if not isinstance(label, str):
        match = re.fullmatch(r"test_e2e\[(.+)\]", getattr(item, "name", ""))
        label = match.group(1) if match else None
    if label is None or label.split("-", 1)[0] not in PERF_PREFIXES:
        return None
    return label


# --------------------------------------------------------------------------- the requirement


def requirement_from_marks(
    nodeid: str,
    get_marker: MarkerLookup,
    settings: Settings,
    *,
    perf_case: str | None = None,
    perf: PerfSources | Callable[[], PerfSources] | None = None,
) -> DeviceRequirement:
    """DeviceRequirement from the closest markers (``get_marker`` = item.get_closest_marker)."""
    cfg = marker_config(nodeid, get_marker("trtllm_slurm"))
    device_type = _device_type(cfg, settings)
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
    if cfg.has_devices:
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
    elif perf_case is not None:
        sources = (perf() if callable(perf) else perf) or PerfSources()
        case = parse_perf_case(perf_case, nodeid)
        path = sources.yaml_for(case, nodeid)
        total, per_node = perf_requirement(case, load_perf_yaml(path), path, nodeid)
        source = f"perf_yaml:{path}"
    else:
        total, per_node, source = 0, None, "default"
    try:
        return DeviceRequirement(
            total=total, per_node=per_node if total else None, device_type=device_type,
            device_keywords=keywords, source=source, **memory,
        )
    except ValidationError as exc:
        raise ConfigError(f"{nodeid}: {_validation_message(exc)}") from None


MARKER_NAMES = frozenset({"trtllm_slurm", "skip_less_device", "skip_less_mpi_world_size",
                          "skip_less_device_memory", "skip_less_host_memory",
                          "skip_device_not_contain"})


def closest_markers(item: Any) -> MarkerLookup:
    """``get_closest_marker`` for our marker names in one walk (method > class > module)."""
    found: dict[str, MarkLike] = {}
    for mark in item.iter_markers():
        if mark.name in MARKER_NAMES and mark.name not in found:
            found[mark.name] = mark
    return found.get


def requirement_for_item(
    item: Any, settings: Settings, perf: PerfSources | None = None
) -> DeviceRequirement:
    """DeviceRequirement of a pytest item (closest marker wins: method > class > module)."""
    def sources() -> PerfSources:
        return perf or PerfSources.from_settings(settings, Path(item.config.rootpath))

    return requirement_from_marks(
        item.nodeid, closest_markers(item), settings, perf_case=perf_case_of(item), perf=sources
    )


def test_config_for_item(item: Any) -> TestConfig:
    """TestConfig of the item's closest ``trtllm_slurm`` marker (defaults when none)."""
    return marker_config(item.nodeid, item.get_closest_marker("trtllm_slurm"))


test_config_for_item.__test__ = False  # type: ignore[attr-defined]  # not a test when imported

