"""The pytest face: options, markers, planning and dispatch hooks (thin). With dispatch off
(the default) it only registers options and markers: installing the plugin changes nothing."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Generator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import pytest_trtllm_slurm.controller.options as options
import pytest_trtllm_slurm.transport.ssh.otp_env as otp_env
from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.node import paths

if TYPE_CHECKING:
    from pytest_trtllm_slurm.execution.protocol import Executor


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_trtllm_slurm.cases.items import add_options as add_case_options
    from pytest_trtllm_slurm.controller.output_dirs import add_ini as add_output_ini

    options.register(parser)
    add_case_options(parser)
    add_output_ini(parser)


_FROZEN = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    # added before pytest's own unraisable-exception cleanup (this hook runs before that
    # plugin's), so it runs after that cleanup's gc.collect() calls: see _freeze_gc
    config.add_cleanup(lambda: _unfreeze_gc(config))
    settings = options.register_markers(config)
    if settings is not None and (settings.plan or settings.plan_json) and not hasattr(
            config, "workerinput"):
        from pytest_trtllm_slurm.controller.plan_report import PlanPlugin

        config.pluginmanager.register(PlanPlugin(settings), "trtllm-slurm-plan")
    if settings is not None and settings.test_db:
        from pytest_trtllm_slurm.controller.test_db import register_if_wanted

        register_if_wanted(config, settings)
    held = options.held_code(config).take_from_environ()
    held.hold(getattr(config, "workerinput", {}).get(otp_env.WORKERINPUT_KEY))
    from pytest_trtllm_slurm.cases.items import (
        register_if_wanted,  # YAML case files; a no-op unless asked for
    )

    register_if_wanted(config)
    if settings is not None and settings.collect == "target" and dispatch_enabled(config):
        config.pluginmanager.register(TargetCollect(), "trtllm-slurm-target-collect")


class TargetCollect:
    """--trtllm-collect=target: before pytest collects, the target collects (one job);
    pytest then builds placeholder items from that collection (``placeholders``)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        from pytest_trtllm_slurm.controller.placeholders import PlaceholderPlugin
        from pytest_trtllm_slurm.controller.session import planning_context, terminal_warning
        from pytest_trtllm_slurm.controller.target_collection import collect_on_target

        config = session.config
        try:
            collected = collect_on_target(config, planning_context(config),
                                          terminal_warning(config))
        except (ConfigError, ExecutionError) as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(PlaceholderPlugin(collected),
                                      "trtllm-slurm-placeholders")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """pytest-xdist controller: hand the one-time code to each worker in its workerinput."""
    code = options.held_code(node.config).current()  # type: ignore[attr-defined]
    if code:
        node.workerinput[otp_env.WORKERINPUT_KEY] = code  # type: ignore[attr-defined]


def dispatch_enabled(config: pytest.Config) -> bool:
    if (config.getoption("trtllm_worker_reports", default=None)  # a worker never dispatches
            or config.getoption("trtllm_worker_collect", default=None)
            or config.pluginmanager.hasplugin("dsession")):
        return False
    # the cheap check first: a plain run imports no pydantic and reads no file
    return options.remote_requested(config) and options.resolve_settings(config).remote


_WORKER_FLAGS = ("trtllm_worker_reports", "trtllm_worker_collect", "trtllm_worker_serve")


def _early_worker(early_config: pytest.Config) -> bool:
    ns = early_config.known_args_namespace
    return any(getattr(ns, flag, None) for flag in _WORKER_FLAGS) or bool(
        os.environ.get("PYTEST_XDIST_WORKER"))


def _skip_conftests(early_config: pytest.Config) -> bool:
    """--trtllm-collect=target: True, and the conftests' options read from their source."""
    if _early_worker(early_config):
        return False
    from pytest_trtllm_slurm.controller.warm_start import EarlyConfig, run_targets

    try:
        if not options.collect_on_target(EarlyConfig(early_config)):  # type: ignore[arg-type]
            return False
    except ConfigError:
        return False  # the run says so once configured
    from pytest_trtllm_slurm.controller.static_options import static_plugin

    early_config.known_args_namespace.noconftest = True
    early_config.pluginmanager.register(
        static_plugin(early_config.rootpath, run_targets(early_config),
                      Path(early_config.invocation_params.dir)),
        "trtllm-slurm-static-options")
    return True


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Generator[None]:
    """A conftest that cannot be imported here on a dispatching run: say to collect remotely."""
    try:
        return (yield)
    except Exception as exc:
        if type(exc).__name__ == "ConftestImportFailure" and not _early_worker(early_config):
            from pytest_trtllm_slurm.controller.warm_start import EarlyConfig

            _hint_collect_on_target(EarlyConfig(early_config),  # type: ignore[arg-type]
                                    "the suite's conftest")
        raise


def _hint_collect_on_target(config: pytest.Config, what: str, write: Any = None) -> None:
    try:
        if not options.remote_requested(config):
            return
    except ConfigError:
        return
    text = (f"trtllm-slurm: {what} cannot be imported here (a GPU, torch or model paths "
            "needed at import?); collect the tests on the target instead: "
            "--trtllm-collect=target (ini trtllm_collect = target, env "
            "TRTLLM_SLURM_COLLECT=target); see docs/collect-on-target.md")
    (write or partial(print, file=sys.stderr))(text)


@pytest.hookimpl(tryfirst=True, specname="pytest_load_initial_conftests")
def pytest_load_initial_conftests_first(early_config: pytest.Config) -> None:
    """Before the suite's conftests are imported: take TRTLLM_SLURM_OTP out of the environment,
    skip the conftests when the target collects, start warm sessions (imports overlap)."""
    options.held_code(early_config).take_from_environ()
    _skip_conftests(early_config)
    ns = early_config.known_args_namespace
    if (getattr(ns, "trtllm_worker_reports", None) or getattr(ns, "collectonly", False)
            or getattr(ns, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER")
            or any(getattr(ns, options.BY_NAME[n].ini, None) for n in ("plan", "plan_json"))):
        return
    from pytest_trtllm_slurm.controller.warm_start import begin

    begin(early_config)  # this run's EarlyStart, in its stash until pytest_unconfigure


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    warm_start = sys.modules.get("pytest_trtllm_slurm.controller.warm_start")
    early = warm_start.early_start(config) if warm_start is not None else None
    if early is not None:  # (loaded only by a run that may have started early)
        early.close()
    _freeze_replayed(config)
    _freeze_worker(config)


def _freeze_replayed(config: pytest.Config) -> None:
    """pytest's unraisable-exception cleanup, next, collects five times over every object
    not frozen: here the run's replayed reports and junit tree, not the tests' objects (they
    ran in workers). Frozen too, as the items were at the loop's start: W3's 2,000 tests
    exit ~1 s sooner. A finalizer among them that raises is not reported; the cleanup
    added in pytest_configure thaws them for an in-process pytest.main()."""
    if config.stash.get(_FROZEN, False):
        gc.freeze()


def _freeze_worker(config: pytest.Config) -> None:
    """A worker's end (a batch, an MPI rank): pytest's cleanup, next, collects five times over
    the whole heap (the suite's imports: torch alone is hundreds of thousands of objects)
    while the batch's GPUs wait for the process to exit. One collection here runs the
    finalizers those would (pytest's unraisable hook still reports what they raise); the
    survivors are frozen, so the five go over what the finalizers leave. Thawed by the
    cleanup added in pytest_configure."""
    if (gc.isenabled() and not config.stash.get(_FROZEN, False)
            and any(config.getoption(flag, default=None) for flag in _WORKER_FLAGS)):
        gc.collect()
        gc.freeze()
        config.stash[_FROZEN] = True


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_terminal_summary(terminalreporter: Any) -> Generator[None]:
    """Inside pytest's recording of the summary's warnings (trylast: the innermost
    wrapper): a warning a worker reported already is not raised a second time."""
    if not dispatch_enabled(terminalreporter.config):
        return (yield)
    from pytest_trtllm_slurm.controller.echoed_warnings import without_echoes

    with without_echoes(terminalreporter.config):
        return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    config = session.config
    if hasattr(config, "workerinput") or not dispatch_enabled(config):
        return None  # xdist workers dispatch item by item in pytest_runtest_protocol
    if session.testsfailed and not config.option.continue_on_collection_errors:
        plural = "s" if session.testsfailed != 1 else ""
        if options.resolve_settings(config).collect == "here":
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            _hint_collect_on_target(config, f"{session.testsfailed} test file{plural}",
                                    getattr(reporter, "write_line", None))
        raise session.Interrupted(f"{session.testsfailed} error{plural} during collection")
    if config.option.collectonly:
        return True
    _run(session, session.items)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Under pytest-xdist each worker dispatches its own items, one batch per item."""
    config = item.config
    if not hasattr(config, "workerinput") or not dispatch_enabled(config):
        return None
    from pytest_trtllm_slurm.controller.item_routes import errored_item, plan_items
    from pytest_trtllm_slurm.controller.session import planning_context

    try:
        planned = plan_items([item], planning_context(config))
    except ConfigError as exc:
        # a worker's usage error would read as a crash (xdist): the item errors instead
        planned = [errored_item(item, str(exc))]
    plan = planned[0].plan
    if plan.key is None and plan.skip_reason is None and plan.error is None:
        return None  # runs right here, as usual
    _run(item.session, [item], planned)
    return True


def _run(session: pytest.Session, items: list[pytest.Item], planned: list | None = None) -> None:
    from pytest_trtllm_slurm.controller.interrupts import signals_as_interrupt
    from pytest_trtllm_slurm.controller.item_routes import plan_items
    from pytest_trtllm_slurm.controller.run_loop import DispatchLoop
    from pytest_trtllm_slurm.controller.session import make_executors, planning_context
    from pytest_trtllm_slurm.execution.factory import build_targets

    with signals_as_interrupt():  # SIGTERM / SIGHUP take Ctrl-C's path below
        config = session.config
        settings = options.resolve_settings(config)
        _freeze_gc(config)
        try:
            ctx = planning_context(config)
            planned = planned if planned is not None else plan_items(items, ctx)
            keys = [p.plan.key for p in planned if p.plan.key is not None]
            executors = make_executors(ctx, config, keys)
        except (ConfigError, ExecutionError) as exc:
            # nothing was dispatched yet: a bad setting, or a target that cannot be reached
            raise pytest.UsageError(str(exc)) from None
        work_root = paths.work_root(settings.work_dir, config.rootpath).dir
        loop = DispatchLoop(session, settings, [p.plan for p in planned], executors, work_root,
                            builds=build_targets(ctx, keys))
        # the loop needs the plans only: requirements and route decisions are not held
        del planned, keys
        try:
            loop.run()
        except KeyboardInterrupt:
            loop.monitor.cancel_all()  # Ctrl-C: this run's jobs go, allocations stay
            raise
        finally:
            for executor in executors.values():
                executor.close()
            if settings.release_allocation:
                release_allocation(ctx, config, executors)


def _freeze_gc(config: pytest.Config) -> None:
    """Collect once, then freeze the survivors until cleanup: later collections skip them."""
    if config.stash.get(_FROZEN, False) or gc.get_freeze_count() or not gc.isenabled():
        return
    gc.collect()
    gc.freeze()
    config.stash[_FROZEN] = True
    # again at exit, so the interpreter's final collections do not rescan them (an
    # in-process pytest.main() is thawed by the cleanup above); once per process
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def _unfreeze_gc(config: pytest.Config) -> None:
    if config.stash.get(_FROZEN, False):
        gc.unfreeze()
        config.stash[_FROZEN] = False


def release_allocation(ctx, config: pytest.Config,  # type: ignore[no-untyped-def]
                       executors: dict[Any, Executor] | None = None) -> None:
    """--trtllm-release-allocation: free each used Slurm target's allocation, else the local one."""
    from pytest_trtllm_slurm.controller.session import terminal_warning
    from pytest_trtllm_slurm.execution.factory import allocation_manager

    warn = terminal_warning(config)
    managers = [e.allocations for e in (executors or {}).values() if e.allocations is not None]
    if not managers and ctx.slurm_env is None:
        warn("no local Slurm: there is no allocation to release")
        return
    for manager in managers or [allocation_manager(ctx, warn=warn)]:
        warn(manager.release())
