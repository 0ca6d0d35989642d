"""The --trtllm-plan / --trtllm-plan-json plugin: print the plan, run nothing (registered
only when a plan is asked for)."""

from __future__ import annotations

import sys

import pytest

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.plan_table import (
    BatchRow,
    PlanRow,
    format_batch_lines,
    format_plan_lines,
    plan_row,
    write_plan_json,
)
from pytest_trtllm_slurm.planning.settings import Settings


class PlanPlugin:
    """Builds the plan after collection (deselection included) and replaces the test loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.rows: list[PlanRow] = []
        self.batches: list[BatchRow] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_trtllm_slurm.controller.batches import (
            batch_rows,
            planned_pools,
            run_batches,
        )
        from pytest_trtllm_slurm.controller.history import History
        from pytest_trtllm_slurm.controller.item_routes import plan_items
        from pytest_trtllm_slurm.controller.session import planning_context
        from pytest_trtllm_slurm.planning.perf_sanity import perf_id

        try:
            ctx = planning_context(session.config)
            planned = plan_items(session.items, ctx)
            dispatched = [(p.item.nodeid, p.plan.key) for p in planned if p.plan.key]
            # the same packer, pools and estimates as the run (controller.batches)
            pools = planned_pools(ctx, [key for _, key in dispatched])
            batches, _ = run_batches(
                session.config, [p.item for p in planned if p.plan.key], dispatched, pools,
                # earlier runs' durations, as the run reads them (History, not registered)
                History(session.config, [n for n, _ in dispatched], pools).estimates())
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.batches = batch_rows(batches, pools)
        label = {nodeid: batch.label for batch in batches for nodeid in batch.nodeids}
        self.rows = [
            plan_row(p.item.nodeid, p.requirement, p.decision, batch=label.get(p.item.nodeid),
                     name=perf_id(p.item)[1], error=p.plan.error)
            for p in planned
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        lines = format_plan_lines(self.rows)
        if self.batches:
            lines += ["", "batches (submission order; seconds expected from earlier runs):",
                      *format_batch_lines(self.batches)]
        served = sum(row.scenario is not None for row in self.rows)
        errors = sum(row.error is not None for row in self.rows)
        summary = (f"{len(self.rows)} test(s): {served} routed, "
                   f"{len(self.rows) - served - errors} not served"
                   + (f", {errors} error(s)" if errors else ""))
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
            path = write_plan_json(self.rows, self.settings.plan_json, self.batches)
            if reporter is not None:
                reporter.write_line(f"trtllm-slurm plan written to {path}")
        # a test that cannot be planned fails the plan run (exit 1), after the whole plan
        session.testsfailed += errors
        return True
