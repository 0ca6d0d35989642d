"""Which tests a worker runs, and under which ids (stdlib only): ``[nodeid, key]`` pairs,
the controller's node id (after what a conftest did to it) and the test's ``item_key``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

Assignment = list[tuple[str, str]]  # (the controller's node id, the item's key), in order


def pairs(nodeids: Iterable[str], keys: Mapping[str, str]) -> Assignment:
    """``nodeids`` with their keys (a node id without one is its own key)."""
    return [(nodeid, keys.get(nodeid, nodeid)) for nodeid in nodeids]


def dumps(assignment: Iterable[tuple[str, str]]) -> str:
    return json.dumps([[nodeid, key] for nodeid, key in assignment])


def parse(data: Any) -> Assignment:
    """What ``dumps`` wrote (parsed JSON); a bare string is a node id that is its own key."""
    out: Assignment = []
    for entry in data:
        if isinstance(entry, str):
            out.append((entry, entry))
        else:
            nodeid, key = entry
            out.append((str(nodeid), str(key)))
    return out


def loads(text: str) -> Assignment:
    return parse(json.loads(text))


def key_path(key: str) -> str:
    """The file part of a key: rootdir-relative, as the worker collects it."""
    return key.split("::", 1)[0]
