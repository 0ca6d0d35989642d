"""What identifies a test on any side, whatever a hook did to its node id: its file relative
to the rootdir plus the names below it (``accuracy/test_a.py::TestX::test_y[fp8]``)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from pytest_trtllm_slurm.node.assignment import Assignment

_KEY = pytest.StashKey[str]()
_PREFIX = pytest.StashKey["str | None"]()  # a collector's key (None: under no file)


def item_key(item: pytest.Item) -> str:
    """The item's key: precomputed, else its file (rootdir-relative) and names below it."""
    given = item.stash.get(_KEY, None)
    if given is not None:
        return given
    prefix = _collector_key(item.parent) if item.parent is not None else None
    if prefix is None:  # an item under no file (a plugin's own): its node id is all there is
        return item.nodeid
    return f"{prefix}::{item.name}"


def _collector_key(node: pytest.Collector | pytest.Session) -> str | None:
    """A collector's key, kept on it: its items share it (100,000 items, a few files)."""
    known = node.stash.get(_PREFIX, "")
    if known != "":
        return known
    if isinstance(node, pytest.File):
        key: str | None = os.path.relpath(node.path, node.config.rootpath).replace(os.sep, "/")
    elif node.parent is None:
        key = None
    else:
        above = _collector_key(node.parent)
        key = None if above is None else f"{above}::{node.name}"
    node.stash[_PREFIX] = key
    return key


def set_item_key(item: pytest.Item, key: str) -> None:
    """Give ``item`` its key (an item that stands for a test collected elsewhere)."""
    item.stash[_KEY] = key


def set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """Show ``item`` under ``nodeid`` (pytest 8 keeps it in ``_nodeid``, pytest 9 in ``_id``)."""
    if hasattr(item, "_nodeid"):  # a slot of Node before pytest 9.2
        item._nodeid = nodeid  # type: ignore[attr-defined]
        return
    from _pytest.nodeid import NodeId  # type: ignore[import-not-found]  # pytest >= 9

    item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]


def index(items: Iterable[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """key -> the items with that key, in collection order."""
    found: dict[str, list[pytest.Item]] = {}
    for item in items:
        found.setdefault(item_key(item), []).append(item)
    return found


def pick(assignment: Assignment, by_key: dict[str, list[pytest.Item]]
         ) -> tuple[list[pytest.Item], list[str]]:
    """The assigned items in order under the controller's ids, and the ids not found."""
    taken: dict[str, int] = {}
    items: list[pytest.Item] = []
    missing: list[str] = []
    for nodeid, key in assignment:
        candidates = by_key.get(key, [])
        n = taken.get(key, 0)
        if n >= len(candidates):
            missing.append(nodeid)
            continue
        taken[key] = n + 1
        item = candidates[n]
        if item.nodeid != nodeid:
            set_nodeid(item, nodeid)
        items.append(item)
    return items, missing
