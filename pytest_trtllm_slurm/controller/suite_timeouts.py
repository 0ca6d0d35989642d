"""Each test's own time limit, as pytest-timeout reads it (the pytest face), so a batch's
walltime counts exactly what stops the test on the target. Without pytest-timeout, None.
"""

from __future__ import annotations

import pytest


def item_timeout(item: pytest.Item) -> float | None:
    """Seconds ``item`` may run before pytest-timeout stops it, or None."""
    plugin = item.config.pluginmanager.get_plugin("timeout")
    read = getattr(plugin, "_get_item_settings", None)
    if read is None:
        return None
    try:
        timeout = read(item).timeout
    except Exception:  # noqa: BLE001 - a bad marker is pytest-timeout's to report
        return None
    return float(timeout) if timeout and timeout > 0 else None
