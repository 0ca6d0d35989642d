"""Options, ini keys, env vars and markers from one table: option NAME is also ini
``trtllm_<NAME>`` and env ``TRTLLM_SLURM_<NAME>`` (docs/options.md). With dispatch off
nothing here reads a file or probes anything."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

# stdlib only: registering options still imports no pydantic
import pytest_trtllm_slurm.planning.safe_values as safe_values
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.durations import (
    TIME_FORMATS,
    format_slurm_time,
    parse_time_limit,
)
from pytest_trtllm_slurm.transport.ssh.otp_env import HeldCode

if TYPE_CHECKING:  # config/requirements import pydantic: loaded only when settings are needed
    from pytest_trtllm_slurm.planning.settings import ClustersFile, Settings

Kind = Literal["bool", "str", "path", "choice", "int", "time", "seconds", "list", "counts"]


@dataclass(frozen=True)
class Opt:
    """One setting: where it comes from and how it is checked."""

    name: str  # base name: ini = trtllm_<name>, env = TRTLLM_SLURM_<NAME minus slurm_>
    field: str  # Settings attribute
    flag: str | None  # None: ini/env only
    kind: Kind
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    false_flag: str | None = None  # bool: a second flag storing False into the same dest
    cluster_key: str | None = None  # ClusterConfig attribute used as a fallback
    # what the text must look like beyond its kind (safe_values check), e.g. a Slurm name
    check: Literal["slurm_name", "argument"] | None = None

    @property
    def ini(self) -> str:
        """The ini key, also the argparse dest of its flags."""
        return f"trtllm_{self.name}"

    @property
    def env(self) -> str:
        return "TRTLLM_SLURM_" + self.name.removeprefix("slurm_").upper()

    def where(self) -> str:
        flags = " / ".join(f for f in (self.flag, self.false_flag) if f)
        return f"{flags + ', ' if flags else ''}ini {self.ini}, env {self.env}"


_SCENARIOS = ("auto", "local_direct", "local_docker", "local_slurm", "remote_slurm")

OPTIONS: tuple[Opt, ...] = (
    Opt("remote", "remote", "--trtllm-remote", "bool", False,
        "dispatch tests that need other hardware (on by default when --slurm-cluster or "
        "--device-type is given on the command line)"),
    Opt("slurm_cluster", "slurm_cluster", "--slurm-cluster", "str", None,
        "cluster name from the clusters file ([clusters.NAME])", check="slurm_name"),
    Opt("device_type", "device_type", "--device-type", "str", None,
        "device type the tests need, e.g. H200", cluster_key="device_type"),
    Opt("scenario", "scenario", "--trtllm-scenario", "choice", "auto",
        "where dispatched tests run", choices=_SCENARIOS),
    Opt("dispatch", "dispatch", "--trtllm-dispatch", "choice", "needed",
        "dispatch only tests this machine cannot serve, or all", choices=("needed", "all")),
    Opt("slurm_partition", "partition", "--slurm-partition", "str", None,
        "Slurm partition", cluster_key="partition", check="slurm_name"),
    Opt("slurm_account", "account", "--slurm-account", "str", None,
        "Slurm account", cluster_key="account", check="slurm_name"),
    Opt("slurm_time_limit", "time_limit", "--slurm-time-limit", "time", None,
        f"Slurm wall time ({TIME_FORMATS})", cluster_key="time_limit"),
    Opt("container_image", "container_image", "--trtllm-container-image", "str", None,
        "container image for dispatched tests", cluster_key="container_image", check="argument"),
    Opt("container_engine", "container_engine", "--trtllm-container-engine", "choice", "auto",
        "local_docker engine: the one that answers (docker first), or forced",
        choices=("auto", "docker", "podman")),
    Opt("perf_config_yaml", "perf_config_yaml", "--perf-config-yaml", "path", None,
        "perf-sanity YAML used for every test_e2e[...] id"),
    Opt("perf_config_dir", "perf_config_dir", None, "path", None,
        "folder of perf-sanity YAML files (<config>.yaml); ini/env only"),
    Opt("config", "config_path", "--trtllm-config", "path", None,
        "clusters file (TOML; default trtllm-slurm.toml at the rootdir, then "
        "~/.config/trtllm-slurm/clusters.toml)"),
    Opt("work_dir", "work_dir", "--trtllm-work-dir", "path", None,
        "where job folders (job_spec.json, logs, reports) are written"),
    Opt("monitor_timeout", "monitor_timeout_seconds", "--trtllm-monitor-timeout", "seconds", "1h",
        f"wall-clock limit for watching one job ({TIME_FORMATS})"),
    Opt("persistent", "persistent", "--trtllm-persistent", "bool", True,
        "reuse one Slurm allocation across runs (--trtllm-one-shot: one job per batch)",
        false_flag="--trtllm-one-shot"),
    Opt("warm_workers", "warm_workers", "--trtllm-warm-workers", "bool", True,
        "in a persistent allocation, one long-lived worker per node runs the batches by fork "
        "(no step, no interpreter start per batch); --trtllm-no-warm-workers: a step per batch",
        false_flag="--trtllm-no-warm-workers"),
    Opt("alloc_time_limit", "alloc_time_limit", "--trtllm-alloc-time-limit", "time", "4h",
        f"wall time of a new persistent allocation ({TIME_FORMATS})"),
    Opt("alloc_nodes", "alloc_nodes", "--trtllm-alloc-nodes", "int", None,
        "nodes of the persistent allocation (default: as many as the run's largest batch "
        "needs); more nodes run more batches side by side"),
    Opt("negotiate_walltime", "negotiate_walltime", "--trtllm-negotiate-walltime", "bool", False,
        "shorten the time limit (to 1h) of a one-shot job pending long with a far start"),
    Opt("release_allocation", "release_allocation", "--trtllm-release-allocation", "bool", False,
        "release the persistent allocation at the end of the run"),
    Opt("plan", "plan", "--trtllm-plan", "bool", False,
        "print where each test would run and the batches the run would submit (the run's "
        "packing, expected seconds, makespan); exit without running tests"),
    Opt("plan_json", "plan_json", "--trtllm-plan-json", "path", None,
        "write the plan as JSON to PATH and exit without running tests"),
    Opt("timeline", "timeline", "--trtllm-timeline", "path", None,
        "write the dispatched run's timeline to PATH: a Chrome trace-event JSON (Perfetto, "
        "chrome://tracing) and PATH's .svg sibling (a picture, no network needed)"),
    Opt("summary_json", "summary_json", "--trtllm-summary-json", "path", None,
        "write the dispatched run's efficiency summary and its batches as JSON to PATH"),
    Opt("keep_order", "keep_order", "--trtllm-keep-order", "bool", False,
        "run local tests in collection order, after the dispatched tests collected before them"),
    Opt("max_retries", "max_retries", "--trtllm-max-retries", "int", 1,
        "resubmissions of a batch lost to infrastructure (node failure, preemption)"),
    Opt("unsatisfied", "unsatisfied", "--trtllm-unsatisfied", "choice", "skip",
        "what happens to a test nothing can serve", choices=("skip", "fail")),
    Opt("collect", "collect", "--trtllm-collect", "choice", "here",
        "where the tests are collected: here, or on the target (a node of the device type "
        "the run targets) when the suite cannot be imported here (a conftest that needs a GPU, "
        "torch or model paths at import); see docs/collect-on-target.md",
        choices=("here", "target")),
    Opt("hang_pattern", "hang_patterns", "--trtllm-hang-pattern", "list", ("hang detected",),
        "log text that means a hang (repeatable; replaces the default; env: one per line)"),
    Opt("test_db", "test_db", "--trtllm-test-db", "path", None,
        "TensorRT-LLM test-db folder (YAML): run the blocks of --trtllm-test-db-context whose "
        "terms agree, each on a configured cluster that meets its condition (docs/test-db.md)"),
    Opt("test_db_context", "test_db_contexts", "--trtllm-test-db-context", "list", None,
        "test-db context(s) to run, e.g. l0_dgx_h200 (repeatable, or comma-separated)"),
    Opt("test_db_terms", "test_db_terms", "--trtllm-test-db-terms", "list", None,
        "KEY=VALUE terms a test-db block must have, e.g. 'stage=pre_merge backend=pytorch' "
        "(repeatable)"),
    Opt("marker_devices", "marker_devices", None, "counts", ("gpu2:2", "gpu4:4"),
        "named markers that size a test: NAME:COUNT words (a test marked NAME needs COUNT "
        "GPUs of one node), replacing TensorRT-LLM's table; ini/env only"),
)
BY_NAME: dict[str, Opt] = {opt.name: opt for opt in OPTIONS}

MARKERS: tuple[str, ...] = (
    "skip_less_device(n): needs n GPUs on one node (trtllm-slurm dispatches it where they exist)",
    "skip_less_device_memory(mib): needs GPUs with at least mib MiB of memory",
    "skip_less_host_memory(mib): needs a host with at least mib MiB of memory",
    "skip_less_mpi_world_size(n): needs n MPI ranks, possibly across nodes",
    "skip_device_not_contain(keywords): needs a device whose name contains one of keywords",
    "trtllm_slurm(devices=None, devices_per_node=None, nodes=None, device_type=None, "
    "cluster=None, partition=None, account=None, time_limit=None, container_image=None, "
    "mounts=(), env={}, "
    "launch=None, launcher=None, local=False): per-test resources and job settings for "
    "trtllm-slurm",
)

_SETTINGS_KEY = pytest.StashKey["Settings"]()
_CLUSTERS_KEY = pytest.StashKey["ClustersFile"]()
_CODE_KEY = pytest.StashKey[HeldCode]()
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def held_code(config: pytest.Config) -> HeldCode:
    """This run's TRTLLM_SLURM_OTP, taken out of the environment (``otp_env``)."""
    return config.stash.setdefault(_CODE_KEY, HeldCode())


def register(parser: pytest.Parser) -> None:
    """Add the option group and ini keys (defaults None so 'not given' is detectable)."""
    group = parser.getgroup(
        "trtllm-slurm",
        "trtllm-slurm (each option is also ini trtllm_<name> and env TRTLLM_SLURM_<NAME>, "
        "a leading SLURM_ dropped; "
        "precedence: CLI > env > ini > clusters file > default)",
    )
    for opt in OPTIONS:
        default = list(opt.default) if isinstance(opt.default, tuple) else opt.default
        text = f"{opt.help} (default: {default!r}; ini {opt.ini}; env {opt.env})"
        if opt.flag is not None:
            kwargs: dict[str, Any] = {"dest": opt.ini, "default": None, "help": text}
            if opt.kind == "bool":
                kwargs.update(action="store_const", const=True)
            elif opt.kind == "list":
                kwargs.update(action="append", metavar="TEXT")
            elif opt.kind == "choice":
                kwargs.update(choices=opt.choices)
            else:
                metavar = {"path": "PATH", "time": "DURATION", "seconds": "DURATION", "int": "N"}
                kwargs.update(metavar=metavar.get(opt.kind, opt.name.split("_")[-1].upper()))
            group.addoption(opt.flag, **kwargs)
            if opt.false_flag:
                group.addoption(opt.false_flag, dest=opt.ini, action="store_const", const=False,
                                default=None, help=f"opposite of {opt.flag} ({opt.ini}=false)")
        ini_type = {"bool": "bool", "int": "int", "list": "linelist",
                    "counts": "linelist"}.get(opt.kind, "string")
        parser.addini(opt.ini, f"{opt.help} (env {opt.env})", type=ini_type,  # type: ignore[arg-type]
                      default=None)


def register_markers(config: pytest.Config) -> Settings | None:
    """Declare the markers and validate the settings; the settings when active, else None."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    try:
        if not is_active(config):
            return None
        return resolve_settings(config)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


# --------------------------------------------------------------------------- raw values

def _first(config: pytest.Config, opt: Opt, environ: Mapping[str, str]) -> tuple[Any, str | None]:
    """The raw value of the first source that sets ``opt`` (cli, env, ini), and its name."""
    value = config.getoption(opt.ini) if opt.flag is not None else None
    if value is not None:
        return value, "cli"
    if environ.get(opt.env) not in (None, ""):
        return environ[opt.env], "env"
    try:
        value = config.getini(opt.ini)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ini {opt.ini}: {exc}; expected {_expected(opt)}") from None
    return (None, None) if value in (None, "", []) else (value, "ini")


def _given(config: pytest.Config, name: str, environ: Mapping[str, str] | None) -> Any:
    """Option ``name`` as its first source sets it, checked; None when none does."""
    value, source = _first(config, BY_NAME[name], os.environ if environ is None else environ)
    return None if value is None else coerce(BY_NAME[name], value, source or "cli")


def remote_requested(config: pytest.Config, environ: Mapping[str, str] | None = None) -> bool:
    """Is dispatch on? Cheap (no pydantic, no file): an explicit remote value wins, else
    --slurm-cluster, --device-type or --trtllm-test-db on the command line."""
    value = _given(config, "remote", environ)
    if value is not None:
        return bool(value)
    return any(config.getoption(BY_NAME[n].ini) for n in ("slurm_cluster", "device_type",
                                                            "test_db"))


def collect_on_target(config: pytest.Config, environ: Mapping[str, str] | None = None) -> bool:
    """--trtllm-collect=target on a dispatching run (a plain run collects here whatever the
    setting says: an ini shared with plain runs on GPU nodes changes nothing there)."""
    return _given(config, "collect", environ) == "target" and remote_requested(config, environ)


def is_active(config: pytest.Config, environ: Mapping[str, str] | None = None) -> bool:
    """Dispatch or a plan requested? Cheap: no file is read, no pydantic imported."""
    return (any(_given(config, name, environ) for name in ("plan", "plan_json"))
            or remote_requested(config, environ))


# --------------------------------------------------------------------------- coercion


# check -> (why a text fails it, what it expects); any other text must be one line (#SBATCH)
_CHECKS: dict[str, tuple[Callable[[str], str | None], str]] = {
    "slurm_name": (safe_values.slurm_name_problem,
                   f"a non-empty Slurm name ({safe_values.SLURM_NAME_RULE})"),
    "argument": (safe_values.argument_problem,
                 "a non-empty line of text that does not start with '-'"),
}


def _expected(opt: Opt) -> str:
    if opt.check:
        return _CHECKS[opt.check][1]
    return {
        "bool": "true/false (1/0, yes/no, on/off)",
        "choice": "one of " + ", ".join(opt.choices),
        "int": "a non-negative integer",
        "time": f"a duration such as {TIME_FORMATS}",
        "seconds": f"a positive duration such as {TIME_FORMATS}",
        "list": "one text per line",
        "counts": "NAME:COUNT words, e.g. 'gpu2:2 gpu4:4'",
    }.get(opt.kind, "a non-empty text")


def _source_name(opt: Opt, source: str) -> str:
    return {"cli": opt.flag or opt.ini, "env": f"env {opt.env}", "ini": f"ini {opt.ini}"}.get(
        source, source
    )


def coerce(opt: Opt, value: Any, source: str, base: Path | None = None) -> Any:
    """Check and convert one raw value; ConfigError names the option, the source and the value."""

    def bad(detail: str = "") -> ConfigError:
        return ConfigError(
            f"{_source_name(opt, source)} ({opt.where()}): found {value!r}{detail}; "
            f"expected {_expected(opt)}"
        )

    if opt.kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise bad()
    if opt.kind == "counts":
        from pytest_trtllm_slurm.planning.requirements import parse_marker_devices

        items = value.splitlines() if isinstance(value, str) else list(value)
        return parse_marker_devices(items, f"{_source_name(opt, source)} ({opt.where()})")
    if opt.kind == "list":
        items = value.splitlines() if isinstance(value, str) else list(value)
        items = [str(i).strip() for i in items if str(i).strip()]
        if not items:
            raise bad()
        return items
    text = str(value).strip()
    if not text:
        raise bad()
    problem = (_CHECKS[opt.check][0] if opt.check else safe_values.line_problem)(text)
    if problem:
        raise bad(f" ({problem})")
    if opt.kind == "choice":
        if text not in opt.choices:
            raise bad()
        return text
    if opt.kind == "int":
        if not text.isdigit():
            raise bad()
        return int(text)
    if opt.kind in ("time", "seconds"):
        try:
            seconds = parse_time_limit(text, what=opt.ini)
        except ConfigError:
            raise bad() from None
        if seconds <= 0:
            raise bad(" (zero)")
        return seconds if opt.kind == "seconds" else format_slurm_time(seconds)
    if opt.kind == "path":
        path = Path(text).expanduser()
        return str(path if path.is_absolute() or base is None else (base / path))
    return text


# --------------------------------------------------------------------------- settings


def build_settings(
    raw: Callable[[Opt], tuple[Any, str | None]],
    *,
    bases: Mapping[str, Path],
    rootdir: Path,
    load_clusters: Callable[[Path | None, Path], ClustersFile] | None = None,
) -> tuple[Settings, ClustersFile]:
    """Settings from ``raw(opt) -> (value, source)`` plus cluster-file fallbacks (read only
    when named); ``bases``: the folder each source's relative paths start from."""
    import pytest_trtllm_slurm.planning.settings as config_module

    load = load_clusters or config_module.load_clusters_file
    values: dict[str, Any] = {}
    sources: dict[str, str | None] = {}
    for opt in OPTIONS:
        value, source = raw(opt)
        sources[opt.name] = source
        if value is not None and source is not None:
            values[opt.field] = coerce(opt, value, source, bases.get(source))
    clusters = config_module.no_clusters()
    if values.get("slurm_cluster") or values.get("config_path"):
        path = values.get("config_path")
        clusters = load(Path(path) if path else None, rootdir)
    # a name the file lacks may be this machine's own Slurm cluster (routing decides, with
    # the probe's cluster name; an unknown remote name is a usage error there)
    cluster = clusters.find(values["slurm_cluster"]) if values.get("slurm_cluster") else None
    if cluster is not None:
        for opt in OPTIONS:
            fallback = getattr(cluster, opt.cluster_key) if opt.cluster_key else None
            if opt.field not in values and fallback:
                where = f"clusters file {clusters.path}"
                values[opt.field] = coerce(opt, fallback, f"{where}: clusters.{cluster.name}."
                                           f"{opt.cluster_key}")
    for opt in OPTIONS:
        if opt.field not in values and opt.default is not None:
            values[opt.field] = coerce(opt, opt.default, "default")
    if sources["remote"] is None:
        values["remote"] = any(sources[n] == "cli"
                               for n in ("slurm_cluster", "device_type", "test_db"))
    return config_module.Settings(**values), clusters


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """The run's Settings (cached on the config); raises ConfigError on bad values."""
    cached = config.stash.get(_SETTINGS_KEY, None)
    if cached is not None:
        return cached
    env = os.environ if environ is None else environ
    ini_base = config.inipath.parent if config.inipath is not None else config.rootpath
    cwd = Path(config.invocation_params.dir)
    settings, clusters = build_settings(
        lambda opt: _first(config, opt, env),
        bases={"cli": cwd, "env": cwd, "ini": ini_base},
        rootdir=config.rootpath,
    )
    config.stash[_SETTINGS_KEY] = settings
    config.stash[_CLUSTERS_KEY] = clusters
    return settings


def clusters_file(config: pytest.Config) -> ClustersFile:
    """The clusters file loaded while resolving settings (empty when none was needed)."""
    resolve_settings(config)
    return config.stash[_CLUSTERS_KEY]
