"""The target's collection as local pytest items, never imported here: pytest's own
collection and selection still run on children built from ``collection.json``."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark.structures import Mark

from pytest_trtllm_slurm.controller.target_collection import (
    CollectedItem,
    TargetCollection,
)
from pytest_trtllm_slurm.node.collection import rel_path
from pytest_trtllm_slurm.node.item_key import item_key, set_item_key, set_nodeid


class PlaceholderItem(pytest.Item):
    """A test collected on the target: it is dispatched, never run here."""

    entry: CollectedItem

    def setup_placeholder(self, entry: CollectedItem) -> None:
        self.entry = entry
        set_item_key(self, entry.key)  # what the worker finds it by (node.item_key)
        self.own_markers.extend(Mark(m.name, tuple(m.args), dict(m.kwargs), _ispytest=True)
                                for m in entry.markers)
        for marker in entry.markers:
            self.keywords[marker.name] = marker
        self.extra_keyword_matches.update(entry.keywords)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        path, line, domain = self.entry.location
        return self.config.rootpath / path, line, domain

    def runtest(self) -> None:
        raise RuntimeError(
            f"{self.nodeid} was collected on the target (--trtllm-collect=target) and cannot "
            "run here: it is dispatched (check --trtllm-scenario / trtllm_slurm(local=True))")


Entries = list[tuple[list[str], CollectedItem]]  # (names below the collector, item)


class _FromEntries:
    """A collector whose children are built from the target's entries below it."""

    entries: Entries

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        return _build(self, self.entries)  # type: ignore[arg-type]


class PlaceholderCollector(_FromEntries, pytest.Collector):
    """A class (or any collector between the file and its tests) of the target."""


class PlaceholderModule(_FromEntries, pytest.Module):
    """A test file as the target collected it: nothing is imported here."""

    def _getobj(self) -> Any:
        raise RuntimeError("a placeholder module is never imported")

    # a placeholder module has no fixtures, setup or teardown of its own
    def _register_setup_module_fixture(self) -> None: ...

    def _register_setup_function_fixture(self) -> None: ...


class PlaceholderFile(_FromEntries, pytest.File):
    """A non-Python file the target's conftest collected (YAML cases and the like)."""


def _build(parent: pytest.Collector, entries: Entries) -> list[pytest.Item | pytest.Collector]:
    """Children of ``parent`` in the target's order: a test where one name is left, else a
    collector holding the entries below that name."""
    out: list[pytest.Item | pytest.Collector] = []
    groups: dict[str, PlaceholderCollector] = {}
    for names, entry in entries:
        if len(names) == 1:
            item = PlaceholderItem.from_parent(parent, name=names[0])
            item.setup_placeholder(entry)
            out.append(item)
            continue
        group = groups.get(names[0])
        if group is None:
            group = PlaceholderCollector.from_parent(parent, name=names[0])
            group.entries = []
            groups[names[0]] = group
            out.append(group)
        group.entries.append((names[1:], entry))
    return out


class PlaceholderPlugin:
    """Registered when the run collects on the target; holds the target's collection."""

    def __init__(self, collected: TargetCollection) -> None:
        self.collected = collected

    def _entries(self, path: Path, rootpath: Path) -> Entries:
        rel = rel_path(path, rootpath)
        return [(e.names, e) for e in self.collected.all_items if e.file == rel]

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(self, module_path: Path,
                                    parent: pytest.Collector) -> pytest.Module:
        module = PlaceholderModule.from_parent(parent, path=module_path)
        module.entries = self._entries(module_path, parent.config.rootpath)
        return module

    @pytest.hookimpl(tryfirst=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Any:
        """The target's report for a collector that failed or skipped there."""
        data = self.collected.reports.get(collector.nodeid)
        if data is None:
            return None
        if isinstance(data.get("longrepr"), list):
            # a skip's (path, lineno, reason) tuple came back from JSON as a list
            data = {**data, "longrepr": tuple(data["longrepr"])}
        config = collector.config
        return config.hook.pytest_report_from_serializable(config=config, data=data)

    def pytest_collect_file(self, file_path: Path,
                            parent: pytest.Collector) -> pytest.Collector | None:
        if file_path.suffix == ".py":
            return None  # pytest_pycollect_makemodule
        entries = self._entries(file_path, parent.config.rootpath)
        if not entries:
            return None
        placeholder = PlaceholderFile.from_parent(parent, path=file_path)
        placeholder.entries = entries
        return placeholder

    @pytest.hookimpl(tryfirst=True, wrapper=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> Generator[None]:
        """The target's selection and order first; its display ids once every plugin ran."""
        order = self.collected.order
        dropped = [i for i in items if item_key(i) not in order]
        kept = sorted((i for i in items if item_key(i) in order), key=lambda i: order[item_key(i)])
        items[:] = kept
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        result = yield
        for item in items:
            if isinstance(item, PlaceholderItem) and item.entry.nodeid != item.nodeid:
                set_nodeid(item, item.entry.nodeid)
        return result

