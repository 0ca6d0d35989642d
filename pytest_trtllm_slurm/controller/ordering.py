"""Suites whose tests rely on one another: pytest-order and pytest-dependency.

Batches run side by side, each its own session, so with either plugin each shape's tests
stay in one batch, and the run says once what is still not kept between batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

ORDER_NOTE = (
    "pytest-order: ordered tests keep their order within each target and device shape, "
    "which now runs as one batch (not split to run side by side); batches of different "
    "shapes still run at the same time, and tests that run on this machine do not wait "
    "for dispatched ones (--trtllm-keep-order makes them)"
)
DEPENDENCY_NOTE = (
    "pytest-dependency: a test sees the outcome of the tests it depends on only within "
    "its target and device shape, which now runs as one batch (not split to run side by "
    "side); a dependency on a test of another shape, or on one that runs on this machine, "
    "is not seen, and the test is skipped as if that test had not run"
)


def asks_for_order(config: pytest.Config, items: Iterable[pytest.Item]) -> bool:
    """pytest-order is active and the run sorts something with it."""
    if not config.pluginmanager.has_plugin("pytest_order"):
        return False
    opt = config.option
    if getattr(opt, "order_dependencies", False) or getattr(opt, "order_marker_prefix", None):
        return True
    return any(item.get_closest_marker("order") is not None for item in items)


def asks_for_dependencies(config: pytest.Config, items: Iterable[pytest.Item]) -> bool:
    """pytest-dependency is active and a test depends on another."""
    if not config.pluginmanager.has_plugin("dependency"):
        return False
    return any(mark.kwargs.get("depends") or len(mark.args) > 1
               for item in items for mark in item.iter_markers("dependency"))


def kept_together(config: pytest.Config, items: Sequence[pytest.Item]) -> list[str]:
    """What keeps each shape's tests in one batch, as the notes the run says once
    (none: batches are split freely)."""
    if len(items) < 2:
        return []
    notes = [ORDER_NOTE] if asks_for_order(config, items) else []
    return notes + ([DEPENDENCY_NOTE] if asks_for_dependencies(config, items) else [])
