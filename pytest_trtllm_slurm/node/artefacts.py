"""Plugin artefacts a batch hands back through its work dir (target side): pytest-cov's and
pytest-benchmark's data (``coverage.db``, ``benchmarks.json``), merged and judged once by
the controller's own plugins."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.node.files import publish, write_atomic
from pytest_trtllm_slurm.node.paths import COVERAGE_FILE, Batch


def point_coverage_at(work_dir: Path, rank: int) -> None:
    """pytest-cov's data files go into the work dir; ranks other than 0 apart."""
    name = ".coverage" if rank == 0 else f".coverage-rank{rank}"
    os.environ["COVERAGE_FILE"] = str(work_dir / name)


class BatchArtefacts:
    """Registered by the worker plugin; writes the artefacts of the batch being run."""

    def __init__(self, config: pytest.Config, work_dir: Path, *, enabled: bool) -> None:
        self.config = config
        self.work_dir = work_dir
        self.enabled = enabled  # rank 0 only, as the report writer

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        cov = self._cov_plugin()
        if cov is not None:
            cov.options.cov_report = {}  # no table in the job log
            cov.options.cov_fail_under = None  # a part of the run is not the run
        bench = getattr(self.config, "_benchmarksession", None)
        if bench is not None:
            bench.json = None  # the controller writes the one --benchmark-json
            bench.save = bench.autosave = None
            bench.histogram = False
            bench.compare = bench.compare_fail = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A batch run as its own pytest: pytest-cov has combined its data by now."""
        self.write(self.work_dir, running=False)

    def write(self, work_dir: Path, *, running: bool) -> None:
        """Write the artefacts into ``work_dir``; ``running``: coverage still measures."""
        if not self.enabled:
            return
        self._write_benchmarks(work_dir)
        self._write_coverage(work_dir, running=running)

    def _cov_plugin(self) -> Any:
        plugin = self.config.pluginmanager.get_plugin("_cov")
        if plugin is None or getattr(plugin, "_disabled", False):
            return None
        return plugin

    def _write_coverage(self, work_dir: Path, *, running: bool) -> None:
        plugin = self._cov_plugin()
        controller = getattr(plugin, "cov_controller", None) if plugin else None
        cov = getattr(controller, "cov", None)
        if cov is None:
            return
        from coverage import CoverageData

        if running:
            cov.stop()
        data = cov.get_data()
        target = Batch(work_dir).coverage
        # coverage creates its files by name: in a 0700 folder of an unpredictable name
        folder = Path(tempfile.mkdtemp(prefix=f".{COVERAGE_FILE}.", dir=work_dir))
        try:
            tmp = folder / COVERAGE_FILE
            out = CoverageData(basename=str(tmp))
            out.update(data)
            out.write()
            with contextlib.suppress(Exception):
                out.close()
            publish(tmp, target)  # complete or absent: the controller reads it once
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if running:  # the forked child's own data file (in the session's dir) is copied
            with contextlib.suppress(Exception):
                data.erase()

    def _write_benchmarks(self, work_dir: Path) -> None:
        bench = getattr(self.config, "_benchmarksession", None)
        if bench is None or not bench.benchmarks:
            return
        records = [b.as_dict(include_data=True) for b in bench.benchmarks
                   if b and not getattr(b, "has_error", False)]
        if not records:
            return
        write_atomic(Batch(work_dir).benchmarks, json.dumps(records, default=repr))
