"""The test reports in a line of reports.jsonl, for tests that read a worker's file
themselves: a ``report`` line holds one, an ``item`` line (a test's reports and its end)
several."""

from __future__ import annotations

from typing import Any


def reports_in(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The serialized TestReports of one record (none for other record types)."""
    if record.get("type") == "report":
        return [record.get("data", {})]
    if record.get("type") == "item":
        return list(record.get("reports", []))
    return []
