"""The collect-only record (``--trtllm-collect=target``): ``collection.json``, what the target
collected (selected and deselected items, failed collectors, where it ran), for a
controller that cannot import the suite."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, TypedDict

import pytest

from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.item_key import item_key

COLLECTION_VERSION = 1


class MarkerEntry(TypedDict):
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


class ItemEntry(TypedDict):
    key: str
    nodeid: str
    location: list[Any]  # [path relative to the rootdir, line (0-based) or None, domain]
    markers: list[MarkerEntry]  # closest first (``iter_markers`` order)
    keywords: list[str]  # extra names ``-k`` matches beyond the chain of names and markers


class ReportEntry(TypedDict):
    """A collector that failed or skipped (a module skipping itself at import)."""

    nodeid: str
    data: dict[str, Any]  # the CollectReport, as ``pytest_report_to_serializable`` made it


class CollectionRecord(TypedDict):
    v: int
    rootdir: str
    items: list[ItemEntry]
    deselected: list[ItemEntry]  # what the suite deselected at collection (test lists)
    reports: list[ReportEntry]
    host: dict[str, str]


def rel_path(path: Path, rootpath: Path) -> str:
    try:
        return path.relative_to(rootpath).as_posix()
    except ValueError:
        return path.as_posix()


def _json_safe(value: Any) -> Any:
    """A marker argument as JSON (anything else as its repr: it is never run)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_safe(v) for k, v in value.items()}
    return repr(value)


def _keywords(item: pytest.Item) -> list[str]:
    names = set(item.listextrakeywords())
    function = getattr(item, "function", None)
    if function is not None:
        names.update(getattr(function, "__dict__", {}))
    return sorted(str(n) for n in names)


def _host() -> dict[str, str]:
    """Where this collection ran: node, job, GPU name (first GPU nvidia-smi lists)."""
    host = {"hostname": socket.gethostname()}
    for key, env in (("node", "SLURMD_NODENAME"), ("job", "SLURM_JOB_ID"),
                     ("step", "SLURM_STEP_ID")):
        if os.environ.get(env):
            host[key] = os.environ[env]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False)
            first = out.stdout.strip().splitlines()
            if out.returncode == 0 and first:
                host["gpu"] = first[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return host


def item_entry(item: pytest.Item) -> ItemEntry:
    path, line, domain = item.location
    return ItemEntry(
        key=item_key(item),
        nodeid=item.nodeid,
        location=[path, line, domain],
        markers=[MarkerEntry(name=m.name, args=_json_safe(list(m.args)),
                             kwargs=_json_safe(dict(m.kwargs)))
                 for m in item.iter_markers()],
        keywords=_keywords(item),
    )


class CollectionWriter:
    """Registered by the worker with ``--trtllm-worker-collect PATH``."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.deselected: list[ItemEntry] = []
        self.reports: list[ReportEntry] = []

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += [item_entry(i) for i in items]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.passed:
            return
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.reports.append(ReportEntry(nodeid=report.nodeid, data=data))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        items = [item_entry(item) for item in session.items]
        record = CollectionRecord(v=COLLECTION_VERSION, rootdir=str(self.config.rootpath),
                                  items=items,
                                  deselected=self.deselected, reports=self.reports,
                                  host=_host())
        write_atomic(self.path, json.dumps(record, default=repr) + "\n")
