"""A pytest plugin the benchmarks load into the controller (``-p bench_probe``): it
counts and times what the plugin does and writes it to ``$BENCH_PROBE_OUT`` (JSON).

- scheduler commands the plugin issued (every ``SlurmJobs`` instance's ``counts``);
- the batches it made (sizes, expected seconds);
- seconds spent in planning (``plan_items``), packing (``make_batches``) and the dispatch
  loop (``DispatchLoop.run``), and the process's peak RSS (``ru_maxrss``);
- the steps of any run (plain or dispatched), for bench_items.py: ``collect``
  (``pytest_collection``), ``location`` (every item's ``location``, made once after
  collection in every way alike), ``runtestloop``, ``summary`` (``pytest_terminal_summary``),
  ``reporting`` (the time inside ``pytest_runtest_logstart/logreport/logfinish``: pytest's
  own reporting of the items, whoever calls those hooks), ``reporting_calls`` (the same
  hooks' calls timed from outside: pluggy's dispatch of each call counted, as the replay's
  ``pump`` counts it), ``submit`` (the dispatch loop's
  ``_submit``: specs, node id files, the executor's submit) and ``pump`` (the loop reading
  and replaying records; any time the instant executor below spends inside it is taken out,
  as ``pump_fake``, and ``pump_with_fake`` is the pump with it); ``maxrss_children_mib`` is
  the largest waited-for child (the
  local_direct worker);
- in a worker (``--trtllm-worker-reports``) with ``BENCH_PROBE_WORKER=1``: its own peak RSS,
  written next to its reports.jsonl (``reports.jsonl.maxrss``);
- the controller's CPU seconds (user + system, its own and its finished children's:
  squeue, sacct ...) at the end of collection and at the end of the run;
- with ``BENCH_FAKE_EXECUTOR=1``: local_direct batches are "run" by an executor that
  writes a pre-built reports.jsonl at once (synthetic reports), so ``DispatchLoop.run``
  measures replaying them (submission time excluded).

Benchmark-only: nothing here is part of the package.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

STATE: dict[str, Any] = {"timings": {}, "batches": [], "jobs": [], "submit_seconds": 0.0,
                         "submit_cpu": 0.0,
                         "cpu": {},
                         # epoch seconds of the run's steps, first time each is reached
                         # (``loaded``: this module imported, before the suite's conftests)
                         "marks": {"loaded": time.time()},
                         # at each mark: the main thread's and the process's CPU seconds (a
                         # phase whose wall time is far above them waited: for a CPU, a lock,
                         # the network)
                         "cpu_marks": {"loaded": (time.thread_time(), time.process_time())}}


def _mark(name: str, *, last: bool = False) -> None:
    """``name``'s first time reached (``last``: its latest)."""
    if last or name not in STATE["marks"]:
        STATE["marks"][name] = time.time()
        STATE["cpu_marks"][name] = (time.thread_time(), time.process_time())


def _mark_early_start() -> None:
    """``early_start`` / ``early_start_end``: the controller's early start (its warm sessions
    asked for before the suite's conftests), within the conftests' phase."""
    import pytest_trtllm_slurm.controller.warm_start as warm_start

    begin = warm_start.begin

    @functools.wraps(begin)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _mark("early_start")
        try:
            return begin(*args, **kwargs)
        finally:
            _mark("early_start_end")

    warm_start.begin = marked  # type: ignore[assignment]


if os.environ.get("BENCH_PROBE_OUT"):
    _mark_early_start()


def _add(name: str, wall: float, cpu: float) -> None:
    """Wall seconds under ``name``, this process's CPU seconds under ``name_cpu`` (what a
    step costs the controller whatever else the shared machine runs)."""
    timings = STATE["timings"]
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - wall
    timings[name + "_cpu"] = timings.get(name + "_cpu", 0.0) + time.process_time() - cpu


def _cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process and of its waited-for children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("BENCH_PROBE_OUT"):
        STATE["cpu"]["after_collection"] = _cpu()


def _timed(name: str, func: Any, *, marked: bool = False) -> Any:
    """``func`` timed under ``name``; ``marked``: its first start and last end in the marks
    (only for a step called a few times: a clock read per call costs the hot ones)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        if marked:
            _mark(f"{name}_start")
        try:
            return func(*args, **kwargs)
        finally:
            _add(name, wall, cpu)
            if marked:
                _mark(f"{name}_end", last=True)
    return wrapper


def _pump_timed(func: Any) -> Any:
    """The loop's pump, timed as ``pump``: the controller's reading, checking and replaying.
    Any time the benchmark's instant executor spends inside it (writing a batch's
    reports.jsonl, the worker's work in a real run, when a batch is submitted from the
    pump) is taken out of ``pump`` and kept as ``pump_fake``; ``pump_with_fake`` is the
    pump as timed before (both are the same when no batch is submitted from the pump)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        fake_wall, fake_cpu = STATE["submit_seconds"], STATE["submit_cpu"]
        try:
            return func(*args, **kwargs)
        finally:
            _add("pump_with_fake", wall, cpu)
            timings = STATE["timings"]
            spent_wall = STATE["submit_seconds"] - fake_wall
            spent_cpu = STATE["submit_cpu"] - fake_cpu
            timings["pump_fake"] = timings.get("pump_fake", 0.0) + spent_wall
            timings["pump_fake_cpu"] = timings.get("pump_fake_cpu", 0.0) + spent_cpu
            timings["pump"] = timings["pump_with_fake"] - timings["pump_fake"]
            timings["pump_cpu"] = timings["pump_with_fake_cpu"] - timings["pump_fake_cpu"]
    return wrapper


def _profiled(path: str, func: Any) -> Any:
    """``func`` under cProfile, its stats dumped to ``path`` (``BENCH_PROFILE``): where the
    dispatch loop's CPU goes (cProfile slows what it watches: read the shares, not the
    seconds)."""
    import cProfile

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        profile = cProfile.Profile()
        profile.enable()
        try:
            return func(*args, **kwargs)
        finally:
            profile.disable()
            profile.dump_stats(path)
    return wrapper


def _sample_waits(path: str, *, until: str, every: float = 0.005) -> None:
    """The main thread's innermost frames every ``every`` s of wall time, from now until the
    mark ``until`` (planning: where a phase whose wall time is above its CPU time waits),
    appended to ``path`` as counts of stacks."""
    import collections
    import sys
    import threading

    main = threading.main_thread().ident
    stacks: collections.Counter[str] = collections.Counter()

    def tail(frame: Any) -> str:
        names = []
        while frame is not None and len(names) < 8:
            code = frame.f_code
            where = code.co_filename.rsplit("/", 1)[-1]
            names.append(f"{where}:{frame.f_lineno}({code.co_name})")
            frame = frame.f_back
        return " < ".join(names)

    def sample() -> None:
        begin = time.monotonic()
        while until not in STATE["marks"] and time.monotonic() - begin < 30:
            frame = sys._current_frames().get(main)  # noqa: SLF001
            if frame is not None:
                stacks[tail(frame)] += 1
            time.sleep(every)
        with open(path, "a") as out:
            out.write(f"--- {time.monotonic() - begin:.3f} s, {sum(stacks.values())} samples\n")
            out.writelines(f"{n:5d} {stack}\n" for stack, n in stacks.most_common(15))

    threading.Thread(target=sample, daemon=True, name="bench-wait-sampler").start()


def _sampled(path: str, func: Any, every: float = 0.002) -> Any:
    """``func`` under a CPU-time sampler (SIGPROF every ``every`` CPU seconds of this
    process: where the CPU goes, with no cost per call, unlike cProfile, which inflates
    code made of many small calls). Writes the functions by samples, inclusive (anywhere
    on the stack) and exclusive (the innermost Python frame), to ``path``."""
    import collections
    import signal

    inclusive: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    total = [0]

    def name(frame: Any) -> str:
        code = frame.f_code
        where = code.co_filename.rsplit("/site-packages/", 1)[-1].rsplit("/wt-", 1)[-1]
        return f"{where}:{code.co_firstlineno}({code.co_name})"

    def sample(_signum: int, frame: Any) -> None:
        total[0] += 1
        if frame is None:
            return
        exclusive[name(frame)] += 1
        seen = set()
        while frame is not None:
            key = name(frame)
            if key not in seen:
                seen.add(key)
                inclusive[key] += 1
            frame = frame.f_back

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = signal.signal(signal.SIGPROF, sample)
        signal.setitimer(signal.ITIMER_PROF, every, every)
        try:
            return func(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, before)
            lines = [f"{total[0]} samples, one per {every * 1000:.0f} ms of the process's CPU",
                     "", "inclusive (on the stack):"]
            lines += [f"{n:7d} {100 * n / max(1, total[0]):5.1f}%  {k}"
                      for k, n in inclusive.most_common(80)]
            lines += ["", "exclusive (innermost Python frame):"]
            lines += [f"{n:7d} {100 * n / max(1, total[0]):5.1f}%  {k}"
                      for k, n in exclusive.most_common(50)]
            Path(path).write_text("\n".join(lines) + "\n")
    return wrapper


class _Clock:
    """Hook wrappers that add the time spent inside a hook to ``STATE["timings"]``."""

    def _spent(self, name: str, *, marked: bool = False) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        if marked:
            _mark(f"{name}_start")
        try:
            return (yield)
        finally:
            _add(name, wall, cpu)
            if marked:
                _mark(f"{name}_end", last=True)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> Any:
        return (yield from self._spent("collect", marked=True))

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Every item's ``location`` (a cached property pytest computes from the test's
        source: ~0.1 ms an item) made here, in every way alike, so that neither the plain
        run's loop nor the replay hides it (both need it: logstart's ``location``)."""
        wall, cpu = time.perf_counter(), time.process_time()
        for item in session.items:
            item.location  # noqa: B018 - the cached property is the point
        _add("location", wall, cpu)
        STATE["items"] = {item.nodeid: item for item in session.items}

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        if os.environ.get("BENCH_WAIT_SAMPLE"):
            _sample_waits(os.environ["BENCH_WAIT_SAMPLE"], until="dispatch_loop_start")
        return (yield from self._spent("runtestloop", marked=True))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Any:
        return (yield from self._spent("summary", marked=True))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> Any:
        return (yield from self._spent("reporting"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> Any:
        return (yield from self._spent("reporting"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> Any:
        return (yield from self._spent("reporting"))


_LOG_HOOKS = frozenset({"pytest_runtest_logstart", "pytest_runtest_logreport",
                        "pytest_runtest_logfinish"})


def _time_collections() -> None:
    """``BENCH_GC=1``: the cyclic garbage collector's passes and seconds per generation
    (``gc``), from configure to pytest's last hook: what holding many objects costs a way
    (opt-in: a callback per pass slows a run of many small collections)."""
    import gc

    if os.environ.get("BENCH_GC") != "1":
        return
    totals: dict[str, float] = {}
    STATE["gc"] = totals
    began: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        gen = str(info["generation"])
        totals[f"gen{gen}_passes"] = totals.get(f"gen{gen}_passes", 0) + 1
        totals[f"gen{gen}_seconds"] = (totals.get(f"gen{gen}_seconds", 0.0)
                                       + time.perf_counter() - began[0])

    gc.callbacks.append(callback)


def _time_hook_calls() -> None:
    """``reporting_calls``: the time of each call of the three reporting hooks as its
    caller sees it, pluggy's dispatch included, in every way alike (pytest's runner calls
    them in a plain run, the replay calls them in a dispatched one). ``reporting`` (a
    wrapper inside the hooks) leaves pluggy's part of each call out, which the replay's
    figure (the pump, timed from outside) counts. Off with ``BENCH_CALL_CLOCK=0``: this
    clock's own reads (about 2 us a call here) fall inside a pump that calls the hooks, but
    mostly outside the window each call is timed in, so a pump is timed without it."""
    import pluggy

    call = pluggy.HookCaller.__call__

    def timed_call(self: Any, **kwargs: Any) -> Any:
        if self.name not in _LOG_HOOKS:
            return call(self, **kwargs)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return call(self, **kwargs)
        finally:
            _add("reporting_calls", wall, cpu)

    pluggy.HookCaller.__call__ = timed_call  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    worker_reports = config.getoption("trtllm_worker_reports", default=None)
    if worker_reports and os.environ.get("BENCH_PROBE_WORKER") == "1":
        STATE["worker_reports"] = worker_reports
        return
    if worker_reports or not os.environ.get("BENCH_PROBE_OUT"):
        return  # only the controller of a benchmark run
    _mark("configure")
    _spy_whole_run()
    config.pluginmanager.register(_Clock(), "bench_probe_clock")
    if os.environ.get("BENCH_CALL_CLOCK") != "0":  # bench_items: off where the pump is timed
        _time_hook_calls()
    _time_collections()
    import pytest_trtllm_slurm.controller.batches as batch_plan
    import pytest_trtllm_slurm.controller.item_routes as planning
    import pytest_trtllm_slurm.controller.run_loop as dispatch
    import pytest_trtllm_slurm.execution.slurm.jobs as slurm_jobs

    init = slurm_jobs.SlurmJobs.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        STATE["jobs"].append(self)

    slurm_jobs.SlurmJobs.__init__ = counting_init  # type: ignore[method-assign]
    planning.plan_items = _timed("planning", planning.plan_items)
    make_batches = batch_plan.make_batches  # the packer, as the run (and the plan) call it

    def recording_make_batches(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("BENCH_PACK_DUMP"):  # the packer's inputs, to replay it alone
            # ("{pid}" in the path: one file per run)
            import pickle

            planned, pools, estimates = args[0], kwargs.get("pools"), kwargs.get("estimates")
            keys = {key for _, key in planned}
            dump = os.environ["BENCH_PACK_DUMP"].replace("{pid}", str(os.getpid()))
            Path(dump).write_bytes(pickle.dumps({
                "planned": planned, "pools": {key: pools(key) for key in keys} if pools else None,
                "estimates": estimates, "parallel": args[1] if len(args) > 1 else None}))
        wall, cpu = time.perf_counter(), time.process_time()
        batches = make_batches(*args, **kwargs)
        _add("packing", wall, cpu)
        STATE["batches"] = [{"label": b.label, "tests": len(b.nodeids),
                             "expected_seconds": b.expected_seconds} for b in batches]
        return batches

    batch_plan.make_batches = recording_make_batches  # type: ignore[assignment]
    _count_rounds()
    run = _timed("dispatch_loop", dispatch.DispatchLoop.run, marked=True)
    if os.environ.get("BENCH_PROFILE"):
        run = _profiled(os.environ["BENCH_PROFILE"], run)
    if os.environ.get("BENCH_SAMPLE"):
        run = _sampled(os.environ["BENCH_SAMPLE"], run)
    dispatch.DispatchLoop.run = run  # type: ignore[method-assign]
    dispatch.DispatchLoop._submit = _timed("submit", dispatch.DispatchLoop._submit)  # type: ignore[method-assign]
    dispatch.DispatchLoop._pump = _pump_timed(dispatch.DispatchLoop._pump)  # type: ignore[method-assign]
    if os.environ.get("BENCH_FAKE_EXECUTOR") == "1":
        import pytest_trtllm_slurm.controller.session as context

        def fake_executors(ctx: Any, cfg: Any, keys: Any, *a: Any, **kw: Any) -> Any:
            from pytest_trtllm_slurm.planning.models import Scenario

            return {Scenario.LOCAL_DIRECT: InstantExecutor(cfg)}

        context.make_executors = fake_executors  # type: ignore[assignment]


def _count_rounds() -> None:
    """Counts in ``STATE["counts"]``: monitor rounds, the batches the executors were asked
    about (``Executor.poll`` handles) and the files read here (``LocalShell.read_from``):
    what a round touches, whatever the code's version."""
    from pytest_trtllm_slurm.execution.monitor import Monitor
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor
    from pytest_trtllm_slurm.transport.shell import LocalShell

    counts = STATE.setdefault("counts", {"rounds": 0, "batch_polls": 0, "file_reads": 0})
    poll, executor_poll, read_from = Monitor.poll, SlurmExecutor.poll, LocalShell.read_from

    def counted_poll(self: Any) -> Any:
        counts["rounds"] += 1
        return poll(self)

    def counted_executor_poll(self: Any, handles: Any) -> Any:
        counts["batch_polls"] += len(handles)
        return executor_poll(self, handles)

    by_name = STATE.setdefault("reads_by_name", {})

    def counted_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["file_reads"] += 1
        name = os.path.basename(str(args[0] if args else kwargs.get("path", "")))
        by_name[name] = by_name.get(name, 0) + 1
        return read_from(self, *args, **kwargs)

    Monitor.poll = counted_poll  # type: ignore[method-assign]
    SlurmExecutor.poll = counted_executor_poll  # type: ignore[method-assign]
    LocalShell.read_from = counted_read  # type: ignore[method-assign]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if STATE.get("worker_reports"):
        Path(str(STATE["worker_reports"]) + ".maxrss").write_text(
            str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        return
    out = os.environ.get("BENCH_PROBE_OUT")
    if not out or config.getoption("trtllm_worker_reports", default=None):
        return
    _mark("unconfigure")
    _time_exit_steps(out)
    counts: dict[str, int] = {}
    for jobs in STATE["jobs"]:
        for command, n in jobs.counts.items():
            counts[command] = counts.get(command, 0) + n
    timings = dict(STATE["timings"])
    if "dispatch_loop" in timings:
        timings["replay"] = timings["dispatch_loop"] - STATE["submit_seconds"]
    if "submit" in timings:  # the plugin's part: the instant executor's writing excluded
        timings["submit"] -= STATE["submit_seconds"]
        timings["submit_cpu"] -= STATE["submit_cpu"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({
        "scheduler_commands": counts,
        "scheduler_commands_total": sum(counts.values()),
        "batches": STATE["batches"],
        "timings": timings,
        "maxrss_mib": usage.ru_maxrss / 1024,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "maxrss_children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "cpu": {**STATE["cpu"], "end": _cpu()},
        "counts": STATE.get("counts", {}),
        "reads_by_name": STATE.get("reads_by_name", {}),
        "gc": STATE.get("gc", {}),
        "marks": STATE["marks"],
        "cpu_marks": STATE["cpu_marks"],
        # what the interpreter's exit waits for: threads that are not daemons (joined
        # before exit) and the pools' workers (joined by concurrent.futures at exit)
        "threads_at_end": sorted(f"{t.name}{'' if t.daemon else ' (not daemon)'}"
                                 for t in threading.enumerate()
                                 if t is not threading.main_thread()),
    }, indent=2))
    _trace_exit()


def _time_exit_steps(out: str) -> None:
    """After pytest's last hook: how long pytest's unraisable-exception cleanup collects
    (its ``gc_collect_harder``), how many objects are frozen then, and when
    the interpreter's exit handlers start, into ``$BENCH_EXIT_MARKS`` or ``out + ".exit"``
    (JSON, epoch seconds)."""
    import atexit
    import gc

    import _pytest.unraisableexception as unraisable

    marks: dict[str, Any] = {"frozen": gc.get_freeze_count()}
    collect = unraisable.gc_collect_harder

    def timed(iterations: int) -> None:
        marks["cleanup_gc_start"] = time.time()
        collect(iterations)
        marks["cleanup_gc_end"] = time.time()

    unraisable.gc_collect_harder = timed  # type: ignore[assignment]

    def at_exit() -> None:
        marks["atexit"] = time.time()
        Path(os.environ.get("BENCH_EXIT_MARKS") or out + ".exit").write_text(json.dumps(marks))

    atexit.register(at_exit)


#: py-spy beside this interpreter (``pip install py-spy``; the diagnostics below only)
_PY_SPY = Path(sys.executable).with_name("py-spy")


def _spy_whole_run() -> None:
    """``BENCH_PYSPY=file``: py-spy samples every thread of the controller 100 times a
    second until it exits: ``*.raw``, busy samples only (where the CPU goes, every thread);
    else idle ones too (speedscope's JSON, samples in time order: where the wall time goes,
    waits included). Diagnostic only."""
    out = os.environ.get("BENCH_PYSPY")
    if out and _PY_SPY.exists():
        # ``*.raw``: the CPU only (busy samples, folded stacks); else the whole wall time
        kind = (["--format", "raw"] if out.endswith(".raw") else
                ["--idle", "--format", "speedscope"])
        subprocess.Popen([str(_PY_SPY), "record", *kind, "--threads", "--nonblocking",
                          "--rate", "100", "-o", out, "-p", str(os.getpid())],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)


def _trace_exit() -> None:
    """``BENCH_EXIT_TRACE=stem``: from pytest's last hook to the process's end, record its
    Python and native stacks (``stem.pyspy``; or, with ``BENCH_EXIT_STRACE=1``, its system
    calls, ``stem.strace``: the two tracers cannot attach together), to
    see what the exit waits for. Diagnostic only: both tracers slow the exit down."""
    import shutil

    stem = os.environ.get("BENCH_EXIT_TRACE")
    if not stem:
        return
    pid = str(os.getpid())
    if os.environ.get("BENCH_EXIT_STRACE") and shutil.which("strace"):  # (not with py-spy)
        subprocess.Popen(["strace", "-f", "-tt", "-T", "-p", pid, "-o", f"{stem}.strace"])
        time.sleep(1.0)
        _mark("exit_trace_attached")
        return
    if _PY_SPY.exists():
        subprocess.Popen([str(_PY_SPY), "record", "--native", "--rate", "500", "--format",
                          "raw", "-o", f"{stem}.pyspy", "-p", pid],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the exit starts
    _mark("exit_trace_attached")


def _executor_base() -> type:
    from pytest_trtllm_slurm.execution.protocol import Executor

    return Executor


class InstantExecutor(_executor_base()):  # type: ignore[misc]
    """local_direct stand-in: a batch "ran" the moment it is submitted; its reports.jsonl
    holds a passed setup/call/teardown per test, serialized like the worker does (the
    item's location and keywords, as the worker's item has them), in the records the
    installed worker writes (``node.records``: one line per test, or a line per event)."""

    poll_hint: float | None = None  # the loop's default cadence (``Executor.poll_hint``)

    def __init__(self, config: pytest.Config) -> None:
        from pytest_trtllm_slurm.transport.shell import LocalShell

        self.config = config
        self.shell = LocalShell()
        self.polls: dict[str, int] = {}

    def submit(self, spec: Any) -> Any:
        from pytest_trtllm_slurm.execution.protocol import JobHandle
        from pytest_trtllm_slurm.node import records as node_records

        _encode = json.JSONEncoder(default=repr).encode
        start, cpu = time.perf_counter(), time.process_time()
        template: dict[str, dict[str, Any]] = {}
        lines = 0
        # written line by line: the benchmark's own copy of 100,000 tests' reports must not
        # count in the controller's peak memory
        with open(spec.reports_path, "w") as out:
            items = STATE.get("items", {})
            for nodeid in spec.nodeids:
                item = items.get(nodeid)  # its location and keywords, as a worker writes them
                location = list(item.location) if item else [nodeid.split("::", 1)[0], 1,
                                                              nodeid.split("::")[-1]]
                keywords = {k: 1 for k in item.keywords} if item else {}
                out.write(_encode(node_records.start(nodeid, tuple(location))) + "\n")
                reports = []
                for when in ("setup", "call", "teardown"):
                    if when not in template:
                        report = pytest.TestReport(nodeid=nodeid, location=tuple(location),  # type: ignore[arg-type]
                                                   keywords={}, outcome="passed", longrepr=None,
                                                   when=when, duration=0.001)  # type: ignore[arg-type]
                        template[when] = self.config.hook.pytest_report_to_serializable(
                            config=self.config, report=report)
                    reports.append({**template[when], "nodeid": nodeid, "location": location,
                                    "keywords": keywords})
                # what the installed worker writes: one line per test where it has one
                if hasattr(node_records, "item"):
                    out.write(_encode(node_records.item(nodeid, reports, finish=True,
                                                        done=True)) + "\n")
                    lines += 2
                else:
                    for data in reports:
                        out.write(_encode(node_records.report(data)) + "\n")
                    out.write(_encode(node_records.finish(nodeid)) + "\n")
                    out.write(_encode(node_records.done(nodeid)) + "\n")
                    lines += 6
            out.write(_encode(node_records.session_finish(0)) + "\n")
            lines += 1
        Path(spec.log_path).write_text("")
        STATE["submit_seconds"] += time.perf_counter() - start
        STATE["submit_cpu"] += time.process_time() - cpu
        return JobHandle(job_id=f"instant-{lines}-{time.time_ns()}", spec=spec,
                         submitted_at=time.time(), nodelist="localhost")

    def poll(self, handles: list[Any]) -> dict[str, Any]:
        """RUNNING until the monitor had time to read the whole file (it reads at most
        1 MiB per poll, and only two reads after a job ended), then COMPLETED."""
        from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus

        states = {}
        for h in handles:
            self.polls[h.job_id] = self.polls.get(h.job_id, 0) + 1
            size = self.shell.size(h.spec.reports_path)
            done = self.polls[h.job_id] > size // (1 << 20) + 2
            states[h.job_id] = JobState(status=JobStatus.COMPLETED if done else JobStatus.RUNNING,
                                        exit_code=0 if done else None)
        return states

    def cancel(self, handle: Any) -> None:
        pass

    def rerun_command(self, spec: Any, nodeid: str) -> str:
        return f"pytest {nodeid}"

    def close(self) -> None:
        pass
