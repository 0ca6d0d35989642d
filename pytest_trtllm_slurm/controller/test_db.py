"""A test-db stage in one command (``--trtllm-test-db``): each test a chosen block lists
gets that block's size and target as its ``trtllm_slurm`` marker (its TIMEOUT as
``pytest.mark.timeout``); the others are deselected."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

import pytest_trtllm_slurm.planning.testdb as testdb
from pytest_trtllm_slurm.controller.session import planning_context
from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv
from pytest_trtllm_slurm.planning.resolve import normalize_device_type
from pytest_trtllm_slurm.planning.settings import ClusterConfig, Settings

Match = tuple[testdb.Selection, testdb.Entry]


def targets_of(ctx: RunContext) -> list[testdb.Target]:
    """Where blocks can run, preferred first: the local Slurm's GPU partitions, then each
    remote cluster; with --slurm-cluster, that one only."""
    named = (ctx.settings.slurm_cluster or "").lower()
    local_name = ctx.local.cluster_name
    out: list[testdb.Target] = []
    if ctx.slurm_env is not None and local_name and named in ("", local_name.lower()):
        out += _partitions(local_name, ctx.slurm_env, ctx.clusters.find(local_name))
    for key, cfg in ctx.clusters.clusters.items():
        if not cfg.is_remote or (local_name and key.lower() == local_name.lower()):
            continue
        if named and key.lower() != named:
            continue
        if cfg.device_type and cfg.gpus_per_node:
            out.append(testdb.Target(key, cfg.partition, cfg.device_type, cfg.gpus_per_node))
        elif ctx.remote_env is not None:
            try:
                env = ctx.remote_env(cfg)
            except ConfigError:
                continue  # unreachable: it offers nothing to this run
            out += _partitions(key, env, cfg) if env is not None else []
    return out


def _partitions(cluster: str, env: SlurmEnv, cfg: ClusterConfig | None) -> list[testdb.Target]:
    """The GPU partitions of a discovered cluster (its table's partition only, if named)."""
    only = cfg.partition if cfg is not None else None
    return [testdb.Target(cluster, p.name, p.gpu_type, p.gpus_per_node, len(p.nodes) or None,
                          p.arch)
            for p in env.partitions
            if p.gpu_type and p.gpus_per_node and (only is None or p.name == only)]


def _candidates(nodeid: str) -> list[str]:
    """What an entry may name to select ``nodeid``, most specific first: the id, the id
    without its parameters, each ``::`` parent, the file, each folder above it."""
    out = [nodeid]
    base = nodeid.split("[", 1)[0]
    parts = base.split("::")
    out += ["::".join(parts[:i]) for i in range(len(parts), 0, -1)]
    folders = parts[0].split("/")
    out += ["/".join(folders[:i]) for i in range(len(folders) - 1, 0, -1)]
    return list(dict.fromkeys(out))


@dataclass(eq=False)  # a registered plugin: pytest keeps it in sets
class TestDbStage:
    """The session's test-db selection (registered when --trtllm-test-db is given)."""

    __test__ = False  # not a test class

    settings: Settings
    lines: list[str] = field(default_factory=list)

    def _rendering(self, config: pytest.Config) -> testdb.Rendering:
        settings = self.settings
        contexts = [c for item in settings.test_db_contexts for c in item.split(",") if c]
        if not contexts:
            raise ConfigError("--trtllm-test-db needs --trtllm-test-db-context NAME "
                              "(a top-level key of the test-db files, e.g. l0_dgx_h200)")
        assert settings.test_db is not None
        blocks = testdb.load_test_db(Path(settings.test_db), contexts)
        terms = testdb.parse_terms(settings.test_db_terms)
        targets = targets_of(planning_context(config))
        rendering = testdb.render(blocks, terms, targets)
        asked = " ".join(f"{k}={v}" for k, v in terms.items()) or "no terms"
        self.lines.append(
            f"trtllm-slurm test-db: {', '.join(contexts)} ({asked}): {len(blocks)} blocks, "
            f"{rendering.considered} with these terms, {len(rendering.selections)} placed; "
            f"targets: {', '.join(t.describe() for t in targets) or 'none'}")
        return rendering

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        try:
            rendering = self._rendering(config)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        index: dict[str, list[Match]] = {}
        for sel in rendering.selections:
            for entry in sel.block.entries:
                index.setdefault(entry.test, []).append((sel, entry))
        counts: dict[str, int] = {}
        kept, dropped, twice = [], [], []
        used: set[tuple[str, str]] = set()
        for item in items:
            matches = [m for c in _candidates(item.nodeid) for m in index.get(c, [])]
            if not matches:
                dropped.append(item)
                continue
            sel, entry = matches[0]
            used.add((sel.block.name, entry.test))
            if any(other.block.name != sel.block.name for other, _ in matches[1:]):
                twice.append(item.nodeid)
            self._apply(config, item, sel, entry)
            counts[sel.block.name] = counts.get(sel.block.name, 0) + 1
            kept.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
        self._report(rendering, counts, used, twice)

    @staticmethod
    def _apply(config: pytest.Config, item: pytest.Item, sel: testdb.Selection,
               entry: testdb.Entry) -> None:
        own = item.get_closest_marker("trtllm_slurm")
        kwargs = dict(own.kwargs) if own is not None else {}
        if own is not None and own.args:
            kwargs["devices"] = own.args[0]
        target = sel.target
        kwargs.update(devices=sel.devices, devices_per_node=sel.per_node or None,
                      nodes=sel.nodes, device_type=normalize_device_type(target.gpu_type),
                      cluster=target.cluster, partition=target.partition)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        item.add_marker(pytest.mark.trtllm_slurm(**kwargs), append=False)
        if entry.timeout_minutes and config.pluginmanager.hasplugin("timeout"):
            item.add_marker(pytest.mark.timeout(entry.timeout_minutes * 60), append=False)

    def _report(self, rendering: testdb.Rendering, counts: dict[str, int],
                used: set[tuple[str, str]], twice: list[str]) -> None:
        for sel in rendering.selections:
            block = sel.block
            self.lines.append(
                f"  {block.describe()} -> {sel.target.describe()}: {sel.devices} "
                f"GPU{'s' if sel.devices != 1 else ''} on "
                f"{sel.nodes} node{'s' if sel.nodes != 1 else ''}, "
                f"{counts.get(block.name, 0)} tests")
            if block.unchecked:
                self.lines.append(f"    not checked: {', '.join(block.unchecked)}")
            for entry in block.entries:
                if entry.unsupported:
                    self.lines.append(f"    not run: {entry.text!r}: {entry.unsupported}")
                elif (block.name, entry.test) not in used:
                    self.lines.append(f"    not collected here: {entry.test}")
        for block in rendering.unplaced:
            self.lines.append(f"  {block.describe()}: no configured cluster meets it")
        for nodeid in twice:
            self.lines.append(f"  {nodeid}: listed by several placed blocks; runs once, on "
                              "the first (run the other context on its own)")

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        return self.lines


def register_if_wanted(config: pytest.Config, settings: Settings) -> None:
    """Register the stage selection, never in a dispatched batch (it runs what it was sent)."""
    if config.getoption("trtllm_worker_reports", default=None):
        return
    config.pluginmanager.register(TestDbStage(settings), "trtllm-slurm-test-db")
