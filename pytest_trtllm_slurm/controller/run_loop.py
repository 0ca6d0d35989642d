"""The controller's run loop: submit every batch, run local tests meanwhile, replay what the
jobs report, give every dispatched test one outcome (executing only through the Executor)."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.controller.artefacts import ArtefactCollector, prefix_mapper
from pytest_trtllm_slurm.controller.batches import run_batches
from pytest_trtllm_slurm.controller.forwarding import forwarded_addopts, forwarding_plan
from pytest_trtllm_slurm.controller.gc_pace import held_for_a_pump, own_pace, replay_pace
from pytest_trtllm_slurm.controller.history import History
from pytest_trtllm_slurm.controller.item_routes import ItemPlan
from pytest_trtllm_slurm.controller.output_dirs import OutputCollector, worker_tokens
from pytest_trtllm_slurm.controller.record_handlers import Arrival, RecordHandlers
from pytest_trtllm_slurm.controller.replay import JobContext, Replayer
from pytest_trtllm_slurm.controller.run_view import RunView
from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.build import (
    BUILD_LOG_LINES,
    build_command,
    build_failed,
    run_build,
)
from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.concurrent import Background, side_by_side
from pytest_trtllm_slurm.execution.disk import is_disk_full, space_problem
from pytest_trtllm_slurm.execution.monitor import (
    JobEvent,
    Monitor,
    WatchedJob,
    log_tail,
)
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, signal_name
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.execution.records import (
    BadRecord,
    RefusedLine,
    UnreadableLine,
)
from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node import assignment, paths
from pytest_trtllm_slurm.node.assignment import key_path
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.node.item_key import item_key
from pytest_trtllm_slurm.planning.batching import Batch, BatchKey
from pytest_trtllm_slurm.planning.durations import format_slurm_time, parse_duration
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Target, target_name, target_of
from pytest_trtllm_slurm.planning.packing import pools_from_capacities
from pytest_trtllm_slurm.planning.resolve import build_arch
from pytest_trtllm_slurm.planning.settings import ClusterConfig, Settings
from pytest_trtllm_slurm.planning.walltime import Walltime, batch_walltime

# statuses after which the tests that had not started yet run again in a new job
# (the test that was running when it happened takes the status; the others did nothing wrong)
RETRYABLE = {
    JobStatus.CRASHED,
    JobStatus.TIMEOUT,
    JobStatus.OUT_OF_MEMORY,
    JobStatus.HANG_DETECTED,
    JobStatus.NODE_FAIL,
    JobStatus.PREEMPTED,
}


@dataclass
class RunningBatch:
    batch: Batch
    spec: JobSpec
    handle: JobHandle
    executor: Executor
    attempt: int = 0
    collect_errors: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # nodeid -> worker rootdir
    session_finished: bool = False
    records_seen: int = 0
    refused: BadRecord | None = None  # the first record the controller refused

    @cached_property
    def nodeids(self) -> frozenset[str]:
        """Made once: every record of the batch is checked against it."""
        return frozenset(self.batch.nodeids)

    def rerun(self, nodeid: str) -> str | None:
        """A test's re-run line, made when a report shows it (not all at every poll)."""
        return self.executor.rerun_command(self.spec, nodeid) if nodeid in self.nodeids else None

    @property
    def context(self) -> JobContext:
        return JobContext(
            job_id=self.handle.job_id,
            scenario=self.spec.scenario.value,
            work_dir=self.spec.work_dir,
            log_path=self.spec.log_path,
            nodelist=self.handle.nodelist,
            rerun=self.rerun,
        )

    def status_at_end(self, state: JobState) -> JobStatus:
        """Why the job left tests unreported: the monitor's verdict, else the scheduler's."""
        if self.refused is not None or (not self.records_seen
                                        and state.exit_code == USAGE_ERROR):
            return JobStatus.ERROR  # a refused record, or a refused command line: no retry helps
        if state.status in (JobStatus.COMPLETED, JobStatus.FAILED) and not self.session_finished:
            return JobStatus.CRASHED
        if state.status is JobStatus.COMPLETED:
            return JobStatus.ERROR
        return state.status

    def explain(self, state: JobState, status: JobStatus, tail: str) -> str:
        """What the tests the job left unreported fail with."""
        lines = [
            f"{status.value}: job {self.handle.job_id} ({self.spec.scenario.value}) ended "
            f"with state {state.status.value}"
            + (f", killed by {signal_name(state.signal)}" if state.signal
               else f", exit code {state.exit_code}" if state.exit_code is not None else "")
            + (f" ({state.reason})" if state.reason else ""),
            f"log: {self.spec.log_path}",
            f"work dir: {self.spec.work_dir}",
        ]
        full = space_problem(self.spec.work_dir)  # why the batch could not write
        lines += [full] if full else []
        if self.refused is not None:
            lines.append("the job wrote a record the controller refuses (line kept in "
                         f"{self.spec.reports_path}): {self.refused}")
        elif not self.records_seen and state.exit_code == USAGE_ERROR:
            lines.append("pytest on the target refused its command line (exit code 4, a "
                         "usage error): an option the target's pytest or its plugins do not "
                         "know? pytest's message is in the log below")
        lines += self.collect_errors
        lines += ["--- last lines of the job log ---", tail]
        return "\n".join(lines)


class DispatchLoop:
    """Runs one session's planned items: local ones here, the rest as jobs."""

    def __init__(
        self,
        session: pytest.Session,
        settings: Settings,
        plans: list[ItemPlan],
        executors: dict[Target, Executor],
        work_root: Path,
        builds: dict[Target, ClusterConfig] | None = None,
    ) -> None:
        self.session = session
        self.config = session.config
        self.settings = settings
        self.plans = plans
        self.executors = executors
        self.work_root = work_root
        self.builds = builds or {}  # targets whose cluster wants a build before the tests
        self.stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
        self.replayer = Replayer(self.config, {p.item.nodeid: p.item for p in plans if p.key})
        # node id -> what the worker finds the test by, whatever hooks did to the node id
        self.keys = {p.item.nodeid: item_key(p.item) for p in plans if p.key}
        self.handlers = RecordHandlers(self.replayer, after_test=self._check_stop)
        hints = [e.poll_hint for e in executors.values() if e.poll_hint]
        self.monitor = Monitor(settings.hang_patterns, on_change=self._show_state,
                               poll_interval=min([CADENCE.monitor, *hints]))
        self.running: dict[str, RunningBatch] = {}
        self._queue: list[Batch] = []  # batches whose cluster is not ready yet
        self._preparing: dict[Target, Background[None]] = {}  # clusters getting ready
        self._history: History | None = None
        self._test_pace: tuple[int, int, int] | None = None  # the GC's, for tests run here
        self.artefacts = ArtefactCollector(self.config)  # coverage, benchmarks
        self.view = RunView(self.config, settings)  # status line, summary, timeline
        self.worker_options, refused, outputs = forwarding_plan(self.config, with_ini=False)
        self.outputs = OutputCollector(outputs, self._say)  # the suite's own output files
        # the ini's addopts written out, and the user's output paths
        self.rerun_options = forwarding_plan(self.config)[0] + [
            f"{out.flag}={out.local}" for out in outputs]
        # pytest-timeout's limit of each dispatched test: they add up to a batch's walltime
        self.timeouts = {p.item.nodeid: item_timeout(p.item) for p in plans if p.key}
        self._capped: set[str] = set()  # partitions whose limit was said once
        if refused:
            self._say(f"{', '.join(refused)}: dispatched tests cannot stop in a debugger (a "
                      "target has no terminal); they run without it, tests run here stop")

    # -- the loop ----------------------------------------------------------
    def run(self) -> None:
        with replay_pace() as self._test_pace:
            self._run()

    def _run(self) -> None:
        dispatched = [(p.item.nodeid, p.key) for p in self.plans if p.key is not None]
        history = History.start(self.config, dispatched, pools_from_capacities(
            {target: e.capacity() for target, e in self.executors.items()}))
        try:
            broken = self._run_builds(dispatched)
            self._announce(dispatched)
            batches, notes = run_batches(
                self.config, [p.item for p in self.plans if p.key is not None], dispatched,
                history.pools, history.estimates())
            for note in notes:
                self._say(note)
            self.view.planned(batches, dispatched, history.pools, history.estimates())
            self._history = history
            self._prepare({target_of(b.key) for b in batches if target_of(b.key) not in broken})
            for batch in batches:
                if target_of(batch.key) in broken:
                    self._fail_batch(batch, JobStatus.BUILD_FAILED, broken[target_of(batch.key)])
                else:
                    self._queue.append(batch)
            self._submit_ready()
            local = [p for p in self.plans if p.key is None]
            if self.settings.keep_order:
                self._run_in_order(local)
            else:
                self._run_local(local)
            base = self.monitor.poll_interval
            wait = base
            while self._busy:
                self._check_stop()
                found = self._pump()
                least = CADENCE.round_wait(base, len(self.monitor.jobs))
                if found:  # look again at once, unless so many batches make a round costly
                    wait = least
                    if least > base:
                        self.monitor.wait(least)
                else:
                    wait = max(wait, least)
                    self.monitor.wait(wait)  # (ends early when a pushed report lands)
                    wait = CADENCE.next_idle_wait(wait, base=base)
            self._check_stop()
        finally:
            if self.monitor.active:
                self.monitor.cancel_all()
            history.finish()
            self.view.finish()
            self.artefacts.finish([p.item.nodeid for p in self.plans])

    def _announce(self, dispatched: list[tuple[str, BatchKey]]) -> None:
        """Tell each executor that wants it (warm workers) all node ids it will get."""
        by_target: dict[Target, dict[str, str]] = {}
        for nodeid, key in dispatched:
            by_target.setdefault(target_of(key), {})[nodeid] = self.keys[nodeid]
        for target, tests in by_target.items():
            self.executors[target].expect(tests)

    def _prepare(self, targets: set[Target]) -> None:
        """Several clusters: each gets its allocation now, side by side, so none waits for
        another's queue; a failure is said and left to its batches' submission."""
        steps = {t: self.executors[t].prepare for t in targets if self.executors[t].prepares}
        if len(steps) < 2:
            return  # one target: its first submission prepares it, as always

        def guarded(target: Target, prepare: Callable[[], None]) -> None:
            try:
                prepare()
            except (ExecutionError, OSError) as exc:
                self._say(f"{target_name(target)}: could not prepare ({exc}); its batches "
                          "try again when submitted")

        self._preparing = {t: Background(partial(guarded, t, p)) for t, p in steps.items()}

    def _submit_ready(self) -> None:
        """Submit, in the packer's order, the queued batches whose target is ready."""
        if not self._queue:
            return
        waiting = []
        for batch in self._queue:
            preparing = self._preparing.get(target_of(batch.key))
            if preparing is not None and not preparing.done:
                waiting.append(batch)
                continue
            self._submit(batch, attempt=0)
            if self._history is not None:
                self._history.submitted(batch)
        self._queue = waiting

    @property
    def _busy(self) -> bool:
        """Jobs to watch, or batches waiting for their cluster to be ready."""
        return self.monitor.active or bool(self._queue)

    def _run_local(self, plans: list[ItemPlan]) -> None:
        runnable = [p for p in plans if p.skip_reason is None and p.error is None]
        for plan in plans:
            if plan.error is not None:
                self.replayer.planning_error(plan.item, plan.error)
            elif plan.skip_reason is not None:
                self.replayer.skip_unsatisfied(
                    plan.item, plan.skip_reason or "no target can serve this test",
                    fail=self.settings.unsatisfied == "fail")
        for index, plan in enumerate(runnable):
            nextitem = runnable[index + 1].item if index + 1 < len(runnable) else None
            with own_pace(self._test_pace):
                self.config.hook.pytest_runtest_protocol(item=plan.item, nextitem=nextitem)
            self._check_stop()
            self._pump()

    def _run_in_order(self, plans: list[ItemPlan]) -> None:
        """--trtllm-keep-order: local tests wait for the dispatched ones collected before them."""
        order = {p.item.nodeid: i for i, p in enumerate(self.plans)}
        for plan in plans:
            before = [n for n in self.replayer.progress if order[n] < order[plan.item.nodeid]]
            while any(not self.replayer.is_finished(n) for n in before) and self._busy:
                self._check_stop()
                if not self._pump():
                    self.monitor.wait()
            self._run_local([plan])

    def _check_stop(self) -> None:
        if self.session.shouldfail or self.session.shouldstop:
            self.monitor.cancel_all()
            if self.session.shouldfail:
                raise self.session.Failed(self.session.shouldfail)
            raise self.session.Interrupted(self.session.shouldstop)

    def _pump(self) -> bool:
        """Replay whatever the jobs wrote since the last call; True if anything happened."""
        with held_for_a_pump():
            self._submit_ready()
            found = self._replay(list(self.monitor.poll()))  # its records gone with the call
            self.view.tick()
        return found

    def _replay(self, events: list[JobEvent]) -> bool:
        for event in events:
            self._on_event(event)
        return bool(events)

    def _run_builds(self, dispatched: list[tuple[str, BatchKey]]) -> dict[Target, str]:
        """Build once per target that asks for it, side by side, before any batch; the failed
        ones, with the log's last lines."""
        first = {target_of(key): key for _, key in reversed(dispatched)}  # each target's first
        specs = {target: self._build_spec(first[target], cluster)
                 for target, cluster in self.builds.items() if target in first}
        ended = side_by_side({target: partial(run_build, self.executors[target], spec,
                                              progress=self._say)
                              for target, spec in specs.items()})
        broken: dict[Target, str] = {}
        for target, (state, tail, log) in ended.items():
            spec = specs[target]
            if build_failed(state):
                broken[target] = (
                    f"the build job ({spec.name}) ended {state.status.value}"
                    + (f" with exit code {state.exit_code}" if state.exit_code is not None else "")
                    + f"; nothing was dispatched.\nlog: {log}\n"
                    + f"--- last {BUILD_LOG_LINES} lines of the build log ---\n{tail}"
                )
            else:
                self._say(f"build {spec.name} finished")
        return broken

    def _build_spec(self, key: BatchKey, cluster: ClusterConfig) -> JobSpec:
        work_dir = new_work_dir(self.work_root, "build", self.stamp)
        env = self.executors[target_of(key)].slurm_env
        part = env.partition_named(key.partition) if env else None
        arch = build_arch(key.device_type or (part.gpu_type if part else None))
        spec = key_spec(
            key, self.config.rootpath, work_dir, "build",
            workflow="build",
            name=work_dir.name,
            command=build_command(cluster.build_cmd, arch),
            invocation_dir=str(self.config.rootpath),
            time_limit=self.settings.time_limit,
            log_path=str(paths.Batch(work_dir).build_log),
            monitor_timeout_seconds=self.settings.monitor_timeout_seconds,
            build_arch=arch,
        )
        spec.write()
        return spec

    def _fail_batch(self, batch: Batch, status: JobStatus, text: str,
                    ctx: JobContext | None = None) -> None:
        ctx = ctx or JobContext("-", batch.key.scenario.value, "-", "-")
        for nodeid in batch.nodeids:
            self.replayer.fail_unreported(nodeid, status.value, text, ctx)

    def _say(self, message: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"trtllm-slurm: {message}")

    def _show_state(self, job: WatchedJob) -> None:
        """A line when a job waits (and why) or starts: a pending job is never silent."""
        self.view.record.changed(job.handle.job_id, job.state)
        state = job.state
        if state.status.finished or state.status is JobStatus.RUNNING and job.started:
            return
        why = f" ({state.reason})" if state.reason else ""
        where = job.handle.spec.partition or job.handle.spec.scenario.value
        self._say(f"job {job.handle.job_id} [{job.handle.spec.name}] on {where}: "
                  f"{state.status.value}{why}")

    # -- submission --------------------------------------------------------
    def _submit(self, batch: Batch, attempt: int) -> None:
        executor = self.executors[target_of(batch.key)]
        full = space_problem(str(self.work_root))
        if full is not None:  # a full disk is named, not an INTERNALERROR in a write
            self._fail_batch(batch, JobStatus.ERROR, f"the batch was not started: {full}")
            return
        try:
            spec = self._spec_for(batch, attempt)
        except OSError as exc:
            why = space_problem(str(self.work_root), failed=True) if is_disk_full(exc) else None
            self._fail_batch(batch, JobStatus.ERROR, f"the batch was not started: {why or exc}")
            return
        try:
            handle = executor.submit(spec)
        except (ExecutionError, OSError) as exc:  # e.g. the connection dropped meanwhile
            why = space_problem(spec.work_dir, failed=True) if is_disk_full(exc) else None
            self._fail_batch(batch, JobStatus.ERROR, f"the batch could not be submitted: "
                             f"{why or exc}", JobContext("-", spec.scenario.value,
                                                          spec.work_dir, spec.log_path))
            return
        # the executor's view of the spec: remote executors map its paths to the cluster's
        running = RunningBatch(batch, handle.spec, handle, executor, attempt)
        self.running[handle.job_id] = running
        self.view.record.submitted(handle.job_id, batch, attempt)
        self.monitor.add(handle, executor, batch=running.nodeids)

    def _spec_for(self, batch: Batch, attempt: int) -> JobSpec:
        key = batch.key
        name = f"{batch.label}" + (f"-retry{attempt}" if attempt else "")
        work_dir = new_work_dir(self.work_root, name, self.stamp)
        files = paths.Batch(work_dir)
        tests = assignment.pairs(batch.nodeids, self.keys)
        write_atomic(files.nodeids, assignment.dumps(tests))
        wall = self._walltime(batch)
        spec = key_spec(
            key, self.config.rootpath, work_dir, name,
            name=name,
            nodeids=batch.nodeids,
            item_keys=dict(tests),
            nodeids_file=str(files.nodeids),
            command=worker_command(
                self.config, [k for _, k in tests], files.nodeids, files.reports, work_dir,
                options=self.worker_options + worker_tokens(self.outputs.outputs,
                                                            str(work_dir))),
            rerun_argv=pytest_base_argv(self.config, options=self.rerun_options),
            invocation_dir=str(worker_cwd(self.config)),
            node_count=key.node_count,
            total_devices=key.total_devices,
            devices_per_node=key.devices_per_node,
            device_type=key.device_type,
            launch=key.launch,
            launcher_prefix=list(key.launcher),
            time_limit=(format_slurm_time(wall.time_limit) if wall.time_limit
                        else key.time_limit or self.settings.time_limit),
            mem_mb=key.mem_mb,
            mounts=list(key.mounts),
            # unbuffered: what a test prints reaches the job log at once (hang patterns)
            env={**worker_env(self.config), **dict(key.env)},
            monitor_timeout_seconds=wall.monitor_seconds,
            hang_patterns=self.settings.hang_patterns,
            build_arch=build_arch(key.device_type) if key.total_devices else None,
            slurm_env=self.executors[target_of(key)].slurm_env,
        )
        spec.write()
        return spec

    def _walltime(self, batch: Batch) -> Walltime:
        """The batch's walltime and monitor timeout with its tests' own time limits."""
        key = batch.key
        asked = key.time_limit or self.settings.time_limit
        env = self.executors[target_of(key)].slurm_env
        name = key.partition or (env.default_partition if env else None)
        part = env.partition_named(name) if env else None
        limit = parse_duration(part.time_limit) if part else None
        wall = batch_walltime([self.timeouts.get(n) for n in batch.nodeids],
                              time_limit=parse_duration(asked) if asked else None,
                              monitor_seconds=self.settings.monitor_timeout_seconds,
                              partition_limit=limit)
        if wall.capped_at is not None and name not in self._capped:
            self._capped.add(name or "")
            self._say(f"batch {batch.label}: its tests' timeouts add up to "
                      f"{format_slurm_time(wall.needed or 0)}, above partition {name}'s limit "
                      f"{format_slurm_time(wall.capped_at)}; it gets that limit")
        return wall

    # -- events ------------------------------------------------------------
    def _on_event(self, event: JobEvent) -> None:
        running = self.running[event.job.handle.job_id]
        came = Arrival(running, running.context)  # the same for each record of the event
        for raw in event.records:
            if running.refused is not None:
                break  # nothing more of this batch is trusted
            running.records_seen += 1
            try:
                if type(raw) is not dict:  # the reader's verdict on a line it refused
                    if isinstance(raw, RefusedLine):
                        raise raw.bad
                    if isinstance(raw, UnreadableLine):
                        raise BadRecord(raw.why, raw.line)
                # a plain dict: a record of the batch, checked as the reader read it
                self.handlers.dispatch(raw, came)
            except BadRecord as exc:
                self._refuse(running, exc)
            except Exception as exc:  # noqa: BLE001 - pytest could not rebuild the report
                self._refuse(running, BadRecord(
                    f"pytest could not rebuild the report ({type(exc).__name__}: {exc})",
                    json.dumps(raw, default=repr)))
        if event.final is not None:
            self._on_job_end(running, event.final)

    def _refuse(self, running: RunningBatch, bad: BadRecord) -> None:
        """A record the controller cannot accept: the batch's unfinished tests fail with it, its
        job is stopped, the run goes on."""
        if running.refused is not None:
            return
        running.refused = bad
        self._say(f"job {running.handle.job_id} [{running.spec.name}] wrote a record the "
                  f"controller refuses: {bad}; its remaining tests fail "
                  f"(reports: {running.spec.reports_path})")
        self.monitor.stop(running.handle.job_id, JobStatus.ERROR,
                          f"it wrote a record the controller refuses: {bad.why}")

    def _on_job_end(self, running: RunningBatch, state: JobState) -> None:
        del self.running[running.handle.job_id]
        self.view.record.ended(running.handle.job_id, state)
        ctx = running.context
        self.artefacts.collect(running.executor.shell, running.spec.work_dir,
                               prefix_mapper(running.spec.rootdir, str(self.config.rootpath)))
        self.outputs.collect(running.executor.shell, running.spec.work_dir, running.spec.name)
        for nodeid, worker_root in running.missing.items():
            self.replayer.fail_unreported(
                nodeid,
                JobStatus.ERROR.value,
                f"the target could not collect {nodeid} (the code differs?): "
                f"controller rootdir {self.config.rootpath}, target rootdir {worker_root}"
                + "".join(f"\n{e}" for e in running.collect_errors),
                ctx,
            )
        self.replayer.settle(running.batch.nodeids)
        unfinished = [n for n in running.batch.nodeids if not self.replayer.is_finished(n)]
        if not unfinished:
            return
        status = running.status_at_end(state)
        tail = log_tail(running.executor, running.spec.log_path)
        crashed_in = self.replayer.running_test(unfinished)
        if crashed_in is not None:
            self.replayer.fail_unreported(
                crashed_in, status.value, running.explain(state, status, tail), ctx
            )
        rest = [n for n in unfinished if n != crashed_in]
        if not rest:
            return
        # a worker that ended between two tests after finishing some (pytest-timeout's
        # thread method reports the test, then ends the process): the rest run again,
        # without using up a retry (each such job finished a test, so this ends)
        between = (status is JobStatus.CRASHED and crashed_in is None
                   and len(rest) < len(running.batch.nodeids))
        if status in RETRYABLE and (running.attempt < self.settings.max_retries or between):
            retry = Batch(key=running.batch.key, index=running.batch.index, nodeids=rest)
            self._submit(retry, running.attempt + 1)
            return
        text = running.explain(state, status, tail)
        for nodeid in rest:
            self.replayer.fail_unreported(nodeid, status.value, text, ctx)


USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)


def new_work_dir(work_root: Path, name: str, stamp: str) -> Path:
    """Unique even across xdist workers and concurrent runs started in the same second."""
    ensure_work_root(work_root)
    return Path(tempfile.mkdtemp(prefix=f"{name}_{stamp}_", dir=work_root))


def key_spec(key: BatchKey, rootdir: Path, work_dir: Path, job: str, **fields: Any) -> JobSpec:
    """A JobSpec with what every job of a run takes from its key and work dir."""
    files = paths.Batch(work_dir)
    return JobSpec(**{
        "scenario": key.scenario, "job_name": f"{key.account or 'trtllm'}.{job}",
        "rootdir": str(rootdir), "cluster": key.cluster, "account": key.account,
        "partition": key.partition, "container_image": key.container_image,
        "work_dir": str(work_dir), "log_path": str(files.log),
        "reports_path": str(files.reports), **fields})


def item_timeout(item: pytest.Item) -> float | None:
    """Seconds pytest-timeout lets ``item`` run (None: no limit): a batch's walltime adds them."""
    plugin = item.config.pluginmanager.get_plugin("timeout")
    read = getattr(plugin, "_get_item_settings", None)
    if read is None:
        return None
    try:
        timeout = read(item).timeout
    except Exception:  # noqa: BLE001 - a bad marker is pytest-timeout's to report
        return None
    return float(timeout) if timeout and timeout > 0 else None


def worker_cwd(config: pytest.Config) -> Path:
    """Where the user ran pytest, unless outside the rootdir (a cluster has only its copy)."""
    here = Path(config.invocation_params.dir)
    return here if here.is_relative_to(config.rootpath) else config.rootpath


def worker_env(config: pytest.Config) -> dict[str, str]:
    """Every worker's environment: unbuffered output (hang patterns read the log at once),
    PYTEST_ADDOPTS less what the controller owns (never argv), and the dispatching xdist
    worker's PYTEST_XDIST_* identity."""
    env = {"PYTHONUNBUFFERED": "1", "PYTEST_ADDOPTS": forwarded_addopts(config)}
    workerinput = getattr(config, "workerinput", None)
    if workerinput:
        env["PYTEST_XDIST_WORKER"] = str(workerinput.get("workerid", ""))
        env["PYTEST_XDIST_TESTRUNUID"] = str(workerinput.get("testrunuid", ""))
        env["PYTEST_XDIST_WORKER_COUNT"] = str(workerinput.get("workercount", ""))
    return env


def worker_command(config: pytest.Config, keys: list[str], ids_file: Path, reports: Path,
                   work_dir: Path, options: list[str]) -> list[str]:
    """argv (never a shell string) of the worker pytest."""
    argv = pytest_base_argv(config, options=options)
    argv += ["-p", "pytest_trtllm_slurm.node.worker"]
    argv += ["--trtllm-worker-reports", str(reports), "--trtllm-worker-nodeids", str(ids_file)]
    if config.pluginmanager.has_plugin("cacheprovider"):
        # the worker must not write the controller's cache (--lf is the controller's)
        argv += ["-o", f"cache_dir={paths.Batch(work_dir).pytest_cache}"]
    basetemp = getattr(config.option, "basetemp", None)
    if basetemp:  # pytest empties a --basetemp: each batch gets its own below the user's
        argv.append(f"--basetemp={Path(config.invocation_params.dir, basetemp) / work_dir.name}")
    argv += ["--junitxml", str(paths.Batch(work_dir).junit), "--continue-on-collection-errors"]
    opt = config.option
    argv += ["--capture=no" if getattr(opt, "capture", "fd") == "no" else "--capture=tee-sys"]
    # a key's file is relative to the rootdir: as it is when the worker runs there
    root = config.rootpath
    relative = worker_cwd(config) == root
    return argv + sorted({key_path(k) if relative else str(root / key_path(k)) for k in keys})


def pytest_base_argv(config: pytest.Config, options: list[str] | None = None) -> list[str]:
    """``python -m pytest`` with the same rootdir and ini file and the user's invocation less
    what the controller owns; the ini's addopts go in PYTEST_ADDOPTS (``worker_env``)."""
    argv = [sys.executable, "-m", "pytest", "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    argv += ["-o", "addopts="]
    if options is None:
        options = forwarding_plan(config, with_ini=False)[0]
    return argv + options

