"""Suites that fix their tests' order (the pytest face).

pytest-order (``@pytest.mark.order``, ``--order-dependencies``, ``--order-marker-prefix``)
sorts the collected items, and the controller sends them in that order. But batches run
side by side: a shape split into several batches would run its ordered tests in parallel,
in no particular order. So when the run asks for an order, each shape's tests stay in one
batch (in collection order), and the run says once what is still not kept: the order
between batches of different shapes or targets, and between them and this machine's tests.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

ORDER_NOTE = (
    "pytest-order: ordered tests keep their order within each target and device shape, "
    "which now runs as one batch (not split to run side by side); batches of different "
    "shapes still run at the same time, and tests that run on this machine do not wait "
    "for dispatched ones (--trtllm-keep-order makes them)"
)


def asks_for_order(config: pytest.Config, items: Iterable[pytest.Item]) -> bool:
    """pytest-order is active and the run sorts something with it."""
    if not config.pluginmanager.has_plugin("pytest_order"):
        return False
    opt = config.option
    if getattr(opt, "order_dependencies", False) or getattr(opt, "order_marker_prefix", None):
        return True
    return any(item.get_closest_marker("order") is not None for item in items)
