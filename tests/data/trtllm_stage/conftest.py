"""A stage suite shaped like TensorRT-LLM's ``tests/integration/defs`` conftest (its
conventions, not its code): the stage prefix put on every node id in a tryfirst
hookwrapper (taken off before its ``yield``, put back after), empty parameter ids
dropped from node ids (``CallSpec2.id``), a test list that filters and reorders (with
``TIMEOUT (minutes)`` suffixes), ``--regexp``, waives (SKIP/XFAIL, ``full:<prefix>/``)."""

from __future__ import annotations

import re

import pytest
from _pytest.python import CallSpec2

# as TensorRT-LLM does: an empty parameter id leaves no trace in the node id
CallSpec2.id = property(lambda self: "-".join(map(str, filter(None, self._idlist))))


def _set_nodeid(item, nodeid):
    """``item._nodeid = nodeid`` as TensorRT-LLM writes it (pytest 8, 9.0, 9.1); pytest keeps the
    id in ``item._id`` from 9.2."""
    if hasattr(item, "_nodeid"):  # a slot of Node before pytest 9.2
        item._nodeid = nodeid
    else:
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)


def pytest_addoption(parser):
    parser.addoption("--test-list", "-F", default=None)
    parser.addoption("--waives-file", "-S", default=None)
    parser.addoption("--test-prefix", "-P", default=None)
    parser.addoption("--regexp", "-R", default=None)
    parser.addoption("--output-dir", "-O", default=None)


def _lines(path):
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.split("#", 1)[0].strip()
            if line:
                yield line


def _unprefixed(nodeid, prefix):
    return nodeid[len(prefix) + 1:] if prefix and nodeid.startswith(prefix + "/") else nodeid


def _by_test_list(path, items, config, prefix):
    order = {}
    timeouts = {}
    for line in _lines(path):
        name, _, rest = line.partition(" TIMEOUT ")
        order.setdefault(name.strip(), len(order))
        found = re.search(r"(\d+)", rest)
        if found:
            timeouts[name.strip()] = int(found.group(1)) * 60
    kept = [i for i in items if _unprefixed(i.nodeid, prefix) in order]
    dropped = [i for i in items if _unprefixed(i.nodeid, prefix) not in order]
    for item in kept:
        seconds = timeouts.get(_unprefixed(item.nodeid, prefix))
        if seconds:
            item.add_marker(pytest.mark.timeout(seconds))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = sorted(kept, key=lambda i: order[_unprefixed(i.nodeid, prefix)])


def _by_regexp(regexp, items, config):
    pattern = re.compile(regexp)
    kept = [i for i in items if pattern.search(i.nodeid)]
    dropped = [i for i in items if not pattern.search(i.nodeid)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _waives(path, items, prefix):
    stage = (prefix or "").split("-")[0]
    for line in _lines(path):
        found = re.match(r"(\S+)\s+(SKIP|XFAIL)\s*(?:\((.*)\))?", line)
        if not found:
            continue
        name, kind, reason = found.group(1), found.group(2), found.group(3) or "waived"
        full = name.startswith("full:")
        if full:
            head, _, name = name[len("full:"):].partition("/")
            if head != stage:
                continue
        mark = pytest.mark.skip(reason=reason) if kind == "SKIP" else pytest.mark.xfail(
            reason=reason, strict=False)
        for item in items:
            if _unprefixed(item.nodeid, prefix) == name:
                item.add_marker(mark)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    prefix = config.getoption("--test-prefix")
    if prefix:  # junit buckets the tests per stage by this prefix
        for item in items:
            _set_nodeid(item, f"{prefix}/{item.nodeid}")
    if config.getoption("--test-list"):
        _by_test_list(config.getoption("--test-list"), items, config, prefix)
    if config.getoption("--regexp") is not None:
        _by_regexp(config.getoption("--regexp"), items, config)
    if config.getoption("--waives-file"):
        _waives(config.getoption("--waives-file"), items, prefix)
    for item in items:  # the prefix is off while other plugins (pytest-split) see the ids
        if prefix and item.nodeid.startswith(f"{prefix}/"):
            _set_nodeid(item, item.nodeid[len(prefix) + 1:])
    yield
    for item in items:
        if prefix:
            _set_nodeid(item, f"{prefix}/{item.nodeid}")


@pytest.fixture(autouse=True)
def _trace(request):
    """Each test that runs appends its node id to $ORDER_FILE: the order tests ran in."""
    import os

    path = os.environ.get("ORDER_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(request.node.nodeid + "\n")
    yield


def pytest_collection_finish(session):
    """$VANISH_FILE: the controller deletes that file once it collected it (never a worker:
    the plugin sets TRTLLM_SLURM_WORKER there), so the target lacks it."""
    import os

    path = os.environ.get("VANISH_FILE")
    if path and not os.environ.get("TRTLLM_SLURM_WORKER") and os.path.exists(path):
        os.remove(path)
