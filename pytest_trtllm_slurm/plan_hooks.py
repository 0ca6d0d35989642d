"""The --trtllm-plan / --trtllm-plan-json plugin: print the plan, run nothing.

Registered by ``options.register_markers`` only when a plan is asked for, so a
normal run has none of these hooks.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from .config import Settings
from .errors import ConfigError
from .models import DeviceRequirement, RouteDecision, Scenario
from .plan import PlanRow, build_plan, format_plan_lines, write_plan_json


def placeholder_route(item: Any, req: DeviceRequirement) -> RouteDecision:
    """CPU tests run here; everything else is unrouted for now."""
    # TODO(lead): real routing
    if req.total == 0:
        return RouteDecision(scenario=Scenario.LOCAL_DIRECT, dispatched=False)
    return RouteDecision(scenario=None, reason="routing not wired yet")


class PlanPlugin:
    """Builds the plan after collection (deselection included) and replaces the test loop."""

    route_fn = staticmethod(placeholder_route)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.rows: list[PlanRow] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        try:
            self.rows = build_plan(session.items, self.settings, self.route_fn)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        lines = format_plan_lines(self.rows)
        served = sum(row.scenario is not None for row in self.rows)
        summary = f"{len(self.rows)} test(s): {served} routed, {len(self.rows) - served} not served"
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if self.settings.plan or not self.settings.plan_json:
            if reporter is not None:
                reporter.write_sep("=", "trtllm-slurm plan")
                for line in lines:
                    reporter.write_line(line)
                reporter.write_line(summary)
            else:
                sys.stdout.write("\n".join([*lines, summary]) + "\n")
        if self.settings.plan_json:
            path = write_plan_json(self.rows, self.settings.plan_json)
            if reporter is not None:
                reporter.write_line(f"trtllm-slurm plan written to {path}")
        return True
