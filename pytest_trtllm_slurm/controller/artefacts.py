"""Dispatched batches' coverage data becomes one more parallel data file and their
benchmark results join this run's BenchmarkSession, as pytest-xdist does with workers'."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.records import MAX_ARTEFACT, BadRecord, parse_benchmarks
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.transport.shell import Shell

READ_CHUNK = 1 << 20


class ReturnedBenchmark:
    """One benchmark a worker ran, shaped as pytest-benchmark's session uses its own results."""

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
        return self.stats[key] if key in self.stats else self.record[key]

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
        cov = config.pluginmanager.get_plugin("_cov")  # pytest-cov's, if it measures this run
        self.cov_plugin = (cov if cov is not None and not getattr(cov, "_disabled", False)
                           and getattr(cov, "cov_controller", None) is not None else None)
        self.bench = getattr(config, "_benchmarksession", None)
        self.no_coverage: list[str] = []  # work dirs of batches that returned none

    def collect(self, shell: Shell, work_dir: str, map_path: Callable[[str], str]) -> None:
        """Read the batch's artefacts from ``work_dir``; a bad one is said and left out."""
        try:
            if self.cov_plugin is not None:
                data = read_whole(shell, Batch(work_dir).coverage)
                if data:
                    self._merge_coverage(data, map_path)
                else:
                    self.no_coverage.append(work_dir)
            if self.bench is not None:
                raw = read_whole(shell, Batch(work_dir).benchmarks)
                if raw:
                    self._merge_benchmarks(raw)
        except (OSError, ExecutionError, BadRecord) as exc:
            self._warn(f"the coverage or benchmark results in {work_dir} could not be read: "
                       f"{exc}")

    def _merge_coverage(self, data: bytes, map_path: Callable[[str], str]) -> None:
        from coverage import CoverageData

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
            except Exception as exc:  # noqa: BLE001 - a target's file: never an INTERNALERROR
                self._warn(f"coverage data of a dispatched batch could not be combined: "
                           f"{type(exc).__name__}: {str(exc)[:500]}")
            finally:
                for db in (batch, merged):
                    with contextlib.suppress(Exception):
                        db.close()

    def _merge_benchmarks(self, raw: bytes) -> None:
        assert self.bench is not None
        try:
            records = parse_benchmarks(raw)
        except BadRecord as exc:
            self._warn(f"benchmark results of a dispatched batch are refused: {exc}")
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


def read_whole(shell: Shell, path: str, limit: int = MAX_ARTEFACT) -> bytes:
    """A small artefact file, in chunks (b"" when absent); BadRecord past ``limit``."""
    size = shell.size(path)
    if size > limit:
        raise BadRecord(f"{path} has {size} bytes, more than the {limit} an artefact may",
                        "")
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
