"""Bring the plugin artefacts of dispatched batches into this run (the pytest face).

A batch's worker writes what pytest-cov and pytest-benchmark measured into its work dir
(``worker_artefacts``). When the batch ends, the controller reads those files through the
executor's Shell (local, container or SSH alike) and hands them to its own plugins, as
pytest-xdist's controller does with what its workers send:

- coverage: the batch's data file becomes one more parallel data file next to this run's
  (paths mapped from the target's rootdir to ours), which pytest-cov combines with its own
  at the end of the run, exactly as it combines xdist workers' data;
- benchmarks: each result joins this run's BenchmarkSession, so the table, the
  ``--benchmark-json``, ``--benchmark-save`` and ``--benchmark-compare`` see every test.

The options that make the worker measure the same things are forwarded by
``forwarded_args`` (small and isolated: the worker's option forwarding is being replaced
by forwarding the whole invocation, which carries these too).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from .errors import ExecutionError
from .execution.shell import Shell
from .worker_artefacts import BENCHMARKS_FILE, COVERAGE_FILE

READ_CHUNK = 1 << 20


def active_cov_plugin(config: pytest.Config) -> Any:
    """pytest-cov's plugin when it measures this run, else None."""
    plugin = config.pluginmanager.get_plugin("_cov")
    if plugin is None or getattr(plugin, "_disabled", False):
        return None
    if getattr(plugin, "cov_controller", None) is None:
        return None
    return plugin


def forwarded_args(config: pytest.Config) -> list[str]:
    """pytest-cov's and pytest-benchmark's options that change what a worker measures.
    Paths are made absolute (the worker runs in the rootdir, maybe on another machine,
    where the remote executor maps them). Reports, thresholds and output files stay
    with the controller."""
    return _coverage_args(config) + _benchmark_args(config)


def _coverage_args(config: pytest.Config) -> list[str]:
    """Read from the options, not from pytest-cov's plugin: a warm-worker session is started
    before that plugin exists (``warm_start``)."""
    opt = config.option
    sources = getattr(opt, "cov_source", None)
    if not sources and sources is not None or getattr(opt, "no_cov", False):
        return []  # no --cov (or --no-cov): coverage is off
    args: list[str] = []
    if sources is None or True in sources:  # --cov alone: measure everything
        args.append("--cov")
    for source in sources or []:
        if isinstance(source, str):
            # coverage.py's own rule: an existing directory is a path, else a package name
            args.append(f"--cov={os.path.abspath(source) if os.path.isdir(source) else source}")
    cov_config = getattr(opt, "cov_config", None)
    if cov_config and os.path.isfile(cov_config):
        args.append(f"--cov-config={os.path.abspath(cov_config)}")
    if getattr(opt, "cov_branch", None):
        args.append("--cov-branch")
    if getattr(opt, "cov_context", None):
        args.append(f"--cov-context={opt.cov_context}")
    return args


# pytest-benchmark's options that change how (or whether) a benchmark runs
_BENCHMARK_VALUES = {
    "benchmark_min_time": "--benchmark-min-time",
    "benchmark_max_time": "--benchmark-max-time",
    "benchmark_min_rounds": "--benchmark-min-rounds",
    "benchmark_timer": "--benchmark-timer",
    "benchmark_calibration_precision": "--benchmark-calibration-precision",
    "benchmark_warmup_iterations": "--benchmark-warmup-iterations",
    "benchmark_cprofile": "--benchmark-cprofile",
    "benchmark_cprofile_loops": "--benchmark-cprofile-loops",
    "benchmark_cprofile_top": "--benchmark-cprofile-top",
}
_BENCHMARK_FLAGS = {
    "benchmark_skip": "--benchmark-skip",
    "benchmark_only": "--benchmark-only",
    "benchmark_disable": "--benchmark-disable",
    "benchmark_enable": "--benchmark-enable",
    "benchmark_disable_gc": "--benchmark-disable-gc",
}


def _benchmark_args(config: pytest.Config) -> list[str]:
    """Only what differs from pytest-benchmark's defaults: a run that does not use it sends
    nothing a worker without it could not parse."""
    if not hasattr(config.option, "benchmark_min_rounds"):
        return []  # pytest-benchmark is not installed here
    defaults = _option_defaults(config)
    args: list[str] = []
    for dest, flag in _BENCHMARK_VALUES.items():
        value = getattr(config.option, dest, None)
        if value is not None and str(value) != str(getattr(defaults, dest, None)):
            args.append(f"{flag}={value}")  # timers and seconds print as they were written
    for dest, flag in _BENCHMARK_FLAGS.items():
        if getattr(config.option, dest, False):
            args.append(flag)
    warmup = getattr(config.option, "benchmark_warmup", None)
    if warmup is not None and warmup != getattr(defaults, "benchmark_warmup", None):
        args.append(f"--benchmark-warmup={'yes' if warmup else 'no'}")
    return args


def _option_defaults(config: pytest.Config) -> object:
    """Every option's default value (the parse of an empty command line)."""
    real = getattr(config, "_config", config)  # warm_start's EarlyConfig wraps the config
    try:
        return real._parser.parse_known_args([])  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - then every set value counts as changed
        return object()


class ReturnedBenchmark:
    """One benchmark a worker ran, as pytest-benchmark's session uses its own results
    (``as_dict``, ``has_error``, ``fullname``, stats by key for ``--benchmark-compare-fail``)."""

    has_error = False

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.fullname = record.get("fullname", "")
        self.name = record.get("name", "")
        self.group = record.get("group")
        self.param = record.get("param")
        self.params = record.get("params")
        self.extra_info = record.get("extra_info", {})
        self.stats = dict(record.get("stats") or {})

    def __bool__(self) -> bool:
        return bool(self.stats.get("rounds"))

    def __getitem__(self, key: str) -> Any:
        if key in self.stats:
            return self.stats[key]
        return self.record[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def as_dict(self, include_data: bool = True, flat: bool = False, stats: bool = True,
                cprofile: Any = None) -> dict[str, Any]:
        result = {k: v for k, v in self.record.items() if k != "stats"}
        if stats:
            values = dict(self.stats)
            if not include_data:
                values.pop("data", None)
            if flat:
                result.update(values)
            else:
                result["stats"] = values
        return result


class ArtefactCollector:
    """Merges each ended batch's artefacts into this run's pytest-cov and pytest-benchmark."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.cov_plugin = active_cov_plugin(config)
        self.bench = getattr(config, "_benchmarksession", None)
        self.no_coverage: list[str] = []  # work dirs of batches that returned none

    def collect(self, shell: Shell, work_dir: str, map_path: Callable[[str], str]) -> None:
        """Read the batch's artefacts from ``work_dir`` (the target's path). A file that
        cannot be read (a dropped connection) is said, and the run goes on."""
        try:
            if self.cov_plugin is not None:
                data = read_whole(shell, f"{work_dir}/{COVERAGE_FILE}")
                if data:
                    self._merge_coverage(data, map_path)
                else:
                    self.no_coverage.append(work_dir)
            if self.bench is not None:
                raw = read_whole(shell, f"{work_dir}/{BENCHMARKS_FILE}")
                if raw:
                    self._merge_benchmarks(raw)
        except (OSError, ExecutionError) as exc:
            self._warn(f"the coverage or benchmark results in {work_dir} could not be read: "
                       f"{exc}")

    def _merge_coverage(self, data: bytes, map_path: Callable[[str], str]) -> None:
        from coverage import CoverageData
        from coverage.exceptions import CoverageException

        controller = self.cov_plugin.cov_controller
        data_file = os.path.join(controller.topdir, controller.cov.config.data_file)
        with tempfile.TemporaryDirectory(prefix="trtllm-cov-") as tmp:
            path = os.path.join(tmp, "batch.coverage")
            with open(path, "wb") as fh:
                fh.write(data)
            batch = CoverageData(basename=path)
            merged = CoverageData(basename=data_file, suffix=True)
            try:
                batch.read()
                merged.update(batch, map_path=map_path)
                merged.write()
            except CoverageException as exc:
                self._warn(f"coverage data of a dispatched batch could not be combined: {exc}")
            finally:
                for db in (batch, merged):
                    with contextlib.suppress(Exception):
                        db.close()

    def _merge_benchmarks(self, raw: bytes) -> None:
        assert self.bench is not None
        try:
            records = json.loads(raw)
        except ValueError as exc:
            self._warn(f"benchmark results of a dispatched batch are unreadable: {exc}")
            return
        self.bench.benchmarks.extend(ReturnedBenchmark(r) for r in records)

    def finish(self, order: list[str]) -> None:
        """Say once which batches' coverage is missing (as pytest-cov does for xdist
        workers); benchmarks in collection order, as a plain run lists them."""
        if self.no_coverage:
            shown = ", ".join(self.no_coverage[:3]) + (", ..." if len(self.no_coverage) > 3
                                                        else "")
            self._warn(f"coverage: {len(self.no_coverage)} dispatched batch(es) returned no "
                       "coverage data, so the coverage report leaves their tests out; "
                       "ensure pytest-cov is installed where they run and not disabled there "
                       f"(work dirs: {shown})")
        if self.bench is None or not self.bench.benchmarks:
            return
        index = {nodeid: i for i, nodeid in enumerate(order)}
        self.bench.benchmarks.sort(key=lambda b: index.get(b.fullname, len(index)))

    def _warn(self, message: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"trtllm-slurm: {message}", yellow=True)


def read_whole(shell: Shell, path: str) -> bytes:
    """A small artefact file, in chunks (b"" when absent)."""
    size = shell.size(path)
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = shell.read_from(path, offset, READ_CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def prefix_mapper(target_root: str, local_root: str) -> Callable[[str], str]:
    """Target path -> local path, for data measured under another rootdir (SSH targets)."""
    target_root = target_root.rstrip("/")
    local_root = local_root.rstrip("/")

    def map_path(path: str) -> str:
        if target_root != local_root and (path == target_root
                                          or path.startswith(target_root + "/")):
            return local_root + path[len(target_root):]
        return path

    return map_path
