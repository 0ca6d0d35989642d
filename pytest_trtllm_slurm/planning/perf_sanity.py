"""TensorRT-LLM perf-sanity ids (pure): their grammar (:data:`GRAMMAR`, as upstream's
``test_perf_sanity.py``), config YAML and GPUs; an unreadable id errors that test alone."""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_trtllm_slurm.errors import ConfigError, TestSpecError
from pytest_trtllm_slurm.planning.settings import Settings

PERF_PARAM = "perf_sanity_test_case"
DEFAULT_AGG_FOLDER = "tests/scripts/perf-sanity/aggregated"
DEFAULT_DISAGG_FOLDER = "tests/scripts/perf-sanity/disaggregated"

AGGR_TOKEN, DISAGG_TOKEN = "aggr", "disagg"
PERF_PREFIXES = ("aggr", "aggr_upload", "disagg", "disagg_upload")  # the ones upstream mints
DISAGG_MODES = ("e2e", "gen_only")  # disaggregated launch: ctx + gen workers + proxy
# read from the disaggregated YAML, launched as one aggregated pytest
AGGR_DISAGG_YAML_MODES = ("ctx_only", "gen_only_no_context")
MODIFIERS = ("time_breakdown",)  # optional segment between the mode and the config

GRAMMAR_VERSION = "2026.2"
GRAMMAR = (
    f"TensorRT-LLM perf-sanity id grammar {GRAMMAR_VERSION}: "
    "'aggr[_upload]-<config>[-<server_config name>]', "
    "'aggr[_upload]-{ctx_only|gen_only_no_context}[-time_breakdown]-<disaggregated config>' or "
    "'disagg[_upload]-{e2e|gen_only}[-time_breakdown]-<disaggregated config>'"
)

Mode = Literal["aggr", "disagg", "ctx_only", "gen_only_no_context"]


@dataclass(frozen=True)
class PerfCase:
    """A parsed perf-sanity label such as ``aggr-gpt_oss-gpt_oss_tp4ep4pp2_mtp1``."""

    label: str
    config: str  # YAML base name
    mode: Mode
    servers: tuple[str, ...] = ()  # aggr: selected server_configs names; () = all of them
    benchmark_mode: str | None = None  # e2e | gen_only | ctx_only | gen_only_no_context
    time_breakdown: bool = False  # the modifier: same workload, more spans recorded

    @property
    def disaggregated_yaml(self) -> bool:
        """Its config lives in the disaggregated folder (every mode but plain aggr)."""
        return self.mode != "aggr"


def _bad(where: str, label: str, found: str) -> TestSpecError:
    return TestSpecError(f"{where}: perf-sanity id {label!r}: {found}; expected {GRAMMAR}")


def _modifier_and_config(rest: list[str], where: str, label: str) -> tuple[bool, str]:
    """Peel the optional modifier off the front of a config name (which may hold '-')."""
    modified = bool(rest) and rest[0] in MODIFIERS
    if modified:
        rest = rest[1:]
    if not rest or not all(rest):
        raise _bad(where, label, "no config name after the mode" + (" and modifier"
                                                                    if modified else ""))
    return modified, "-".join(rest)


def parse_perf_case(label: str, nodeid: str = "") -> PerfCase:
    """Split a perf-sanity label the way TensorRT-LLM's test_perf_sanity.py does."""
    where = nodeid or label
    labels = label.split("-")
    prefix = labels[0]
    if len(labels) < 2 or not labels[1]:
        raise _bad(where, label, "no config name")
    if DISAGG_TOKEN in prefix:
        mode = labels[1]
        if mode in AGGR_DISAGG_YAML_MODES:
            raise _bad(where, label, f"mode {mode!r} runs on the aggregated launch path; "
                       f"write it 'aggr-{mode}-<config>'")
        if mode not in DISAGG_MODES:
            raise _bad(where, label, f"disaggregated mode {mode!r} is not one of "
                       f"{', '.join(DISAGG_MODES)}")
        modified, config = _modifier_and_config(labels[2:], where, label)
        return PerfCase(label, config, "disagg", (), mode, modified)
    if AGGR_TOKEN in prefix:
        if len(labels) > 2 and labels[1] in AGGR_DISAGG_YAML_MODES:
            modified, config = _modifier_and_config(labels[2:], where, label)
            mode = labels[1]
            return PerfCase(label, config, mode, (), mode, modified)  # type: ignore[arg-type]
        servers = "-".join(labels[2:])
        # older ids list several servers (a,b) or a client (server:client); the server decides
        names = tuple(dict.fromkeys(s.split(":", 1)[0].strip() for s in servers.split(",")
                                    if s.strip()))
        return PerfCase(label, labels[1], "aggr", names)
    raise _bad(where, label, f"prefix {prefix!r} names neither {AGGR_TOKEN} nor {DISAGG_TOKEN}")


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

    def check_option(self, nodeid: str) -> None:
        """--perf-config-yaml naming no file: ConfigError, before any id can hide it."""
        if self.yaml_path is not None and not self.yaml_path.is_file():
            raise ConfigError(
                f"{nodeid}: perf config {self.yaml_path} (--perf-config-yaml) does not exist"
            )


@functools.lru_cache(maxsize=1024)
def _find_yaml(
    sources: PerfSources, disaggregated: bool, config: str
) -> tuple[Path | None, tuple[Path, ...]]:
    """(the first existing candidate or None, every candidate) for one config name."""
    name = config if config.endswith(".yaml") else f"{config}.yaml"
    folders = sources.disagg_dirs if disaggregated else sources.agg_dirs
    tried = tuple(folder / name for folder in (*sources.config_dirs, *folders))
    return next((c for c in tried if c.is_file()), None), tried


def load_perf_yaml(path: Path) -> dict[str, Any]:
    """Parsed YAML mapping, cached per (path, mtime, size): thousands of ids share a file."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise TestSpecError(f"perf config {path}: cannot be read ({exc})") from None
    return _load_yaml_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _load_yaml_cached(path: str, _mtime_ns: int, _size: int) -> dict[str, Any]:
    import yaml  # only perf-sanity runs pay for it

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise TestSpecError(f"perf config {path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise TestSpecError(f"perf config {path}: found {type(data).__name__}; expected a mapping")
    return data


def _positive(value: Any, where: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "positive" if least else "non-negative"
        raise TestSpecError(f"{where}: found {value!r}; expected a {kind} integer")
    return value


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise TestSpecError(f"{where}: {key!r} is {'missing' if value is None else repr(value)}; "
                            "expected a mapping")
    return value


def server_gpus(server: Mapping[str, Any], where: str) -> int:
    """GPUs of one server: ``world_size`` (or the older ``gpus``) if set, else tp * cp * pp
    (expert parallelism splits the same GPUs, it adds none)."""
    for key in ("world_size", "gpus"):
        if server.get(key) is not None:
            return _positive(server[key], f"{where}.{key}")
    product = 1
    for key in ("tensor_parallel_size", "context_parallel_size", "pipeline_parallel_size"):
        product *= _positive(server.get(key, 1), f"{where}.{key}")
    return product


def perf_requirement(
    case: PerfCase, data: Mapping[str, Any], path: Path, nodeid: str
) -> tuple[int, int]:
    """(total devices, devices per node) from the YAML, as TensorRT-LLM's launchers size it:
    one server on ceil(gpus / gpus_per_node) nodes, or whole nodes per ctx and gen server."""
    where = f"{nodeid}: {path}"
    hardware = _table(data, "hardware", where)
    if "gpus_per_node" not in hardware:
        raise TestSpecError(f"{where}: hardware.gpus_per_node is missing; expected a positive "
                            "integer (GPUs per node of the target)")
    per_node = _positive(hardware["gpus_per_node"], f"{where}: hardware.gpus_per_node")
    if case.mode == "aggr":
        gpus = _aggr_gpus(case, data, path, nodeid)
        return gpus, min(gpus, per_node)
    workers = _table(data, "worker_config", where)
    if case.mode in ("ctx_only", "gen_only_no_context"):
        role = "ctx" if case.mode == "ctx_only" else "gen"
        gpus = server_gpus(_table(workers, role, f"{where}: worker_config"),
                           f"{where}: worker_config.{role}")
        return gpus, min(gpus, per_node)
    bench = data.get("benchmark") or {}
    # the older opt-in: a gen_only id whose YAML sets benchmark.mode gen_only_no_context
    no_context = (case.benchmark_mode == "gen_only" and isinstance(bench, Mapping)
                  and "gen_only_no_context" in str(bench.get("mode", "")))
    nodes = 0
    for role in ("ctx", "gen"):
        key = f"num_{role}_servers"
        if key not in hardware:
            raise TestSpecError(f"{where}: hardware.{key} is missing; expected a non-negative "
                                "integer")
        count = _positive(hardware[key], f"{where}: hardware.{key}", least=0)
        if role == "ctx" and no_context:
            count = 0
        if count:
            gpus = server_gpus(_table(workers, role, f"{where}: worker_config"),
                               f"{where}: worker_config.{role}")
            nodes += math.ceil(gpus / per_node) * count
    if nodes == 0:
        raise TestSpecError(f"{where}: no ctx or gen servers; expected "
                            "hardware.num_ctx_servers + num_gen_servers > 0")
    return nodes * per_node, per_node


def _aggr_gpus(case: PerfCase, data: Mapping[str, Any], path: Path, nodeid: str) -> int:
    servers = data.get("server_configs")
    where = f"{nodeid}: {path}"
    if not isinstance(servers, list) or not servers:
        raise TestSpecError(f"{where}: server_configs is missing or empty; expected a list")
    by_name = {str(s.get("name", "")): s for s in servers if isinstance(s, Mapping)}
    if len(by_name) != len(servers) and not case.servers:
        raise TestSpecError(f"{where}: server_configs entries must be mappings")
    if case.servers:
        missing = [name for name in case.servers if name not in by_name]
        if missing:
            raise TestSpecError(
                f"{where}: server {', '.join(missing)!s} not in server_configs; "
                f"expected one of {', '.join(sorted(by_name))}"
            )
        chosen = [by_name[name] for name in case.servers]
    else:
        chosen = list(by_name.values())  # no server named: the largest one decides
    return max(server_gpus(s, f"{where}: server_configs[{s.get('name')}]") for s in chosen)


def perf_label(item: Any) -> str | None:
    """The perf-sanity label of a ``test_e2e[...]`` item, or None: any value of a
    ``perf_sanity_test_case`` parameter (an unknown one must error, not run on a CPU), else
    only an id with a prefix upstream mints (another suite's ``test_e2e[...]`` stays plain)."""
    if getattr(item, "originalname", None) != "test_e2e":
        return None
    label = getattr(getattr(item, "callspec", None), "params", {}).get(PERF_PARAM)
    if isinstance(label, str):
        return label
    name = getattr(item, "name", "")
    if not (name.startswith("test_e2e[") and name.endswith("]")):
        return None
    label = name[len("test_e2e["):-1]
    return label if label.split("-", 1)[0] in PERF_PREFIXES else None


def perf_id(item: Any) -> tuple[str | None, str]:
    """(perf-sanity label or None, node id as a test list spells it): pytest >= 9.2 renames
    a parameter over 100 characters (every perf-sanity id) to ``perf_sanity_test_case<N>``."""
    nodeid = str(getattr(item, "nodeid", ""))
    label = perf_label(item)
    if label is None or f"[{label}" in nodeid or "-" + label in nodeid or not nodeid.endswith("]"):
        return label, nodeid
    head, _, ids = nodeid[:-1].rpartition("[")
    digest = hashlib.sha256(label.encode("utf-8")).hexdigest()
    renamed = re.sub(rf"(?<![^-]){PERF_PARAM}\d+(?![^-])|{digest}", lambda _: label, ids, count=1)
    return label, f"{head}[{renamed}]"


def perf_size(label: str, nodeid: str, sources: PerfSources) -> tuple[int, int, str]:
    """(total devices, devices per node, source) of a perf-sanity id, else TestSpecError."""
    sources.check_option(nodeid)
    case = parse_perf_case(label, nodeid)
    path, tried = sources.yaml_path, ()
    if path is None:
        path, tried = _find_yaml(sources, case.disaggregated_yaml, case.config)
    if path is None:
        shown = ", ".join(str(p) for p in tried[:4]) + (", ..." if len(tried) > 4 else "")
        env = "DISAGG_CONFIG_FOLDER" if case.disaggregated_yaml else "AGG_CONFIG_FOLDER"
        name = case.config if case.config.endswith(".yaml") else f"{case.config}.yaml"
        raise TestSpecError(
            f"{nodeid}: perf config {name} not found (tried {shown or 'no folder'}); "
            "set --perf-config-yaml PATH, ini trtllm_perf_config_dir / env "
            f"TRTLLM_SLURM_PERF_CONFIG_DIR, or env {env}"
        )
    total, per_node = perf_requirement(case, load_perf_yaml(path), path, nodeid)
    return total, per_node, f"perf_yaml:{path}"
