"""SlurmExecutor + Monitor against the REAL dev cluster (no Slurm mocks).

Layout on the 4-node dev cluster, chosen so tests do not wait for each other:
gb200 (g1, g2): the module's persistent allocation (one whole node) and the
1-CPU TIMEOUT job submitted at module start (it needs ~60-150 s, so it runs
while the other tests do); batch (n1, n2): one-shot jobs, the 2-node jobs,
small non-exclusive allocations of the state-file tests, and NODE_FAIL.

The TIMEOUT job is watched from its submission on by a Monitor in a thread, and
test_timeout is marked ``last`` (tests/conftest.py): in a run of more than this
module it runs after every other test, so the later modules run while Slurm's
time-limit sweep comes round instead of the whole suite waiting for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.execution.monitor import Monitor
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.slurm.allocation import (
    AllocationManager,
    AllocationRequest,
    AllocationState,
)
from pytest_trtllm_slurm.execution.slurm.client import SlurmClient
from pytest_trtllm_slurm.execution.slurm.executor import (
    SlurmExecutor,
    SlurmSettings,
    WalltimePolicy,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.models import Launch, Scenario
from pytest_trtllm_slurm.transport.shell import LocalShell

pytestmark = [pytest.mark.devcluster, pytest.mark.xdist_group("slurm_executor")]

PREFIX = f"t6x{os.getpid()}"
REPO = Path(__file__).resolve().parent.parent
STATE_DIR = Path("/var/tmp/trtllm-devcluster")


# -- helpers ------------------------------------------------------------------------------
def make_spec(root: Path, name: str, body: str, **kw: Any) -> JobSpec:
    """A batch whose command is a small python script (``REPORTS`` and ``WORK`` are set)."""
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    script = work / "script.py"
    script.write_text(
        "import atexit, json, os, subprocess, sys, time\n"
        f"WORK = {str(work)!r}\nREPORTS = {str(work / 'reports.jsonl')!r}\n"
        "def report(**kw):\n"
        "    with open(REPORTS, 'a') as fh:\n"
        "        fh.write(json.dumps(kw) + '\\n')\n"
        # like the worker: the last line says the reports are complete (see report_wait)
        "atexit.register(lambda: report(type='session_finish'))\n"
        + textwrap.dedent(body),
        encoding="utf-8",
    )
    base: dict[str, Any] = dict(
        scenario=Scenario.LOCAL_SLURM, name=name, job_name=f"{PREFIX}.{name}",
        command=[sys.executable, str(script)], rootdir=str(root), invocation_dir=str(root),
        account="acct_a", partition="batch", time_limit="10", work_dir=str(work),
        log_path=str(work / "job.log"), reports_path=str(work / "reports.jsonl"),
    )
    base.update(kw)
    return JobSpec.model_validate(base)


def drive(executor: SlurmExecutor, handles: list[JobHandle], timeout: float,
          on_poll: Any = None) -> tuple[dict[str, JobState], dict[str, list[dict[str, Any]]], int]:
    """Run the Monitor until every handle ended; (finals, records, monitor rounds)."""
    monitor = Monitor(["hang detected"])
    for handle in handles:
        monitor.add(handle, executor)
    finals: dict[str, JobState] = {}
    records: dict[str, list[dict[str, Any]]] = {h.job_id: [] for h in handles}
    rounds = 0
    end = time.monotonic() + timeout
    while monitor.active:
        rounds += 1
        for event in monitor.poll():
            records[event.job.handle.job_id] += [
                r for r in event.records if r.get("type") != "session_finish"]
            if event.final is not None:
                finals[event.job.handle.job_id] = event.final
        if on_poll is not None:
            on_poll(monitor)
        if time.monotonic() > end:
            states = {j.handle.job_id: j.state for j in monitor.jobs.values()}
            monitor.cancel_all()
            raise AssertionError(f"jobs not finished after {timeout} s: {states}")
        time.sleep(monitor.poll_interval)
    return finals, records, rounds


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def our_jobs() -> list[str]:
    """``id|name`` of every queued job of this module (by name prefix)."""
    lines = sh("squeue", "-h", "-u", "root", "-o", "%i|%j").splitlines()
    return [ln for ln in lines if ln.split("|", 1)[-1].startswith(PREFIX)]


def alloc_request(**kw: Any) -> AllocationRequest:
    base: dict[str, Any] = dict(partition="gb200", account="acct_a", nodes=1, gpus_per_node=4,
                                gres_type="gb200", time_limit="30")
    base.update(kw)
    return AllocationRequest(**base)


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def slurm_env(devcluster: dict[str, Any]) -> SlurmEnv:
    return SlurmClient(LocalShell()).discover()


class _Stopped(Exception):
    """The session ended before the watched job did."""


class WatchedJob:
    """A submitted job that a Monitor watches in a thread (``drive``) until it ends."""

    def __init__(self, executor: SlurmExecutor, handle: JobHandle, timeout: float) -> None:
        self.executor, self.handle = executor, handle
        self._stop = threading.Event()
        self._outcome: tuple[dict[str, JobState], dict[str, list[dict[str, Any]]]] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, args=(timeout,), daemon=True,
                                        name=f"watch {handle.job_id}")
        self._thread.start()

    def _watch(self, timeout: float) -> None:
        def stop_early(monitor: Monitor) -> None:
            if self._stop.is_set():
                monitor.cancel_all()
                raise _Stopped

        try:
            finals, records, _ = drive(self.executor, [self.handle], timeout, stop_early)
            self._outcome = finals, records
        except BaseException as exc:  # noqa: BLE001 - handed to the test that checks it
            self._error = exc

    def result(self) -> tuple[dict[str, JobState], dict[str, list[dict[str, Any]]]]:
        """(finals, records) as ``drive`` returns them, once the job ended."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


@pytest.fixture(scope="session")
def timeout_job(slurm_env: SlurmEnv, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[WatchedJob]:
    """Submitted first, checked last: a 1-minute limit is enforced on a ~30 s sweep. Its
    Monitor runs from the submission on (the same rounds test_timeout once ran itself),
    for up to 600 s: on the shared dev cluster it may pend behind another run's
    allocation first (test_timeout used to allow 200 s after the module's other tests)."""
    root = tmp_path_factory.mktemp("timeout")
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env, persistent=False))
    spec = make_spec(root, "timeout", "report(started=True)\ntime.sleep(600)\n",
                     partition="gb200", time_limit="1")
    watched = WatchedJob(executor, executor.submit(spec), 600)
    yield watched
    watched.stop()
    executor.close()


@pytest.fixture(scope="module")
def alloc_root(slurm_env: SlurmEnv, tmp_path_factory: pytest.TempPathFactory,
               timeout_job: Any) -> Iterator[Path]:
    """rootdir of the module's persistent allocation (gb200, one node); released at the end."""
    root = tmp_path_factory.mktemp("alloc")
    yield root
    AllocationManager(LocalShell(), rootdir=root, request=alloc_request()).release()


def persistent_executor(root: Path, env: SlurmEnv, warnings: list[str] | None = None
                        ) -> SlurmExecutor:
    warn = (warnings.append if warnings is not None else None)
    manager = AllocationManager(LocalShell(), rootdir=root, request=alloc_request(), warn=warn)
    return SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=env, persistent=True), allocation_manager=manager, warn=warn)


# -- one-shot -----------------------------------------------------------------------------
def test_oneshot_completed_failed_oom_cancelled(slurm_env: SlurmEnv, tmp_path: Path,
                                                timeout_job: Any) -> None:
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env, persistent=False))
    specs = {
        "ok": make_spec(tmp_path, "ok", "report(cvd=os.environ.get('CUDA_VISIBLE_DEVICES'))\n",
                        total_devices=1, devices_per_node=1),
        "fail": make_spec(tmp_path, "fail", "report(x=1)\nsys.exit(3)\n"),
        "oom": make_spec(tmp_path, "oom", "x = bytearray(400 << 20)\ntime.sleep(5)\n",
                         mem_mb=50),
        "cancel": make_spec(tmp_path, "cancel", "report(started=True)\ntime.sleep(300)\n"),
    }
    handles = {k: executor.submit(s) for k, s in specs.items()}
    assert all(h.job_id.isdigit() for h in handles.values())
    script = Path(specs["ok"].work_dir) / "job.sbatch"
    assert "#SBATCH --gres=gpu:h200:1" in script.read_text()
    cancelled: list[str] = []

    def cancel_when_running(monitor: Monitor) -> None:
        job = monitor.jobs.get(handles["cancel"].job_id)
        if job is not None and not cancelled and job.state.status is JobStatus.RUNNING:
            executor.cancel(handles["cancel"])
            cancelled.append(job.handle.job_id)

    finals, records, rounds = drive(executor, list(handles.values()), 120, cancel_when_running)
    state = {k: finals[h.job_id] for k, h in handles.items()}
    assert state["ok"].status is JobStatus.COMPLETED and state["ok"].exit_code == 0
    (ok_record,) = records[handles["ok"].job_id]
    assert len(ok_record["cvd"].split(",")) == 1, ok_record
    assert state["fail"].status is JobStatus.FAILED and state["fail"].exit_code == 3
    assert state["oom"].status is JobStatus.OUT_OF_MEMORY, state["oom"]
    assert state["cancel"].status is JobStatus.CANCELLED, state["cancel"]
    # one squeue per round at most, for all four jobs together (how much the adaptive
    # interval saves depends on timing: tests/test_slurm_jobs.py checks it with a script)
    assert 1 <= executor.jobs.counts["squeue"] <= rounds, (executor.jobs.counts, rounds)
    assert executor.jobs.counts["sacct"] >= 1
    pytest_spec = specs["fail"].model_copy(update={"rerun_argv": [sys.executable, "-m", "pytest"]})
    rerun = executor.rerun_command(pytest_spec, "tests/t.py::test_x[a b]")
    assert rerun.startswith("sbatch ") and "'tests/t.py::test_x[a b]'" in rerun


def test_eight_devices_on_two_nodes_and_mpi_eight_ranks(slurm_env: SlurmEnv, tmp_path: Path,
                                                        timeout_job: Any) -> None:
    warnings: list[str] = []
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env, persistent=False), warn=warnings.append)
    single = make_spec(tmp_path, "eight", """
        # one pytest process on the first node; the test spans nodes itself (--mem=0: the
        # job's memory is held by the outer step, --overlap shares it)
        out = subprocess.run(["srun", "--overlap", "--mem=0", "-N2", "-n2", "--ntasks-per-node=1",
                              "bash",
                              "-c", 'echo "$SLURMD_NODENAME $(nvidia-smi -L | wc -l)"'],
                             capture_output=True, text=True)
        report(here=os.environ.get("CUDA_VISIBLE_DEVICES"),
               nnodes=os.environ["SLURM_JOB_NUM_NODES"],
               nodes=sorted(out.stdout.split("\\n")), err=out.stderr)
        """, node_count=2, total_devices=8, devices_per_node=4)
    # launch=mpi: the real worker pytest in 8 ranks; each rank marks itself, only rank 0 reports
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_rank.py").write_text(textwrap.dedent(f"""
        import os
        def test_rank():
            open(os.path.join({str(suite)!r}, "rank-" + os.environ["SLURM_PROCID"]), "w").close()
        """))
    ids = suite / "nodeids.json"
    ids.write_text(json.dumps(["test_rank.py::test_rank"]))
    mpi = make_spec(tmp_path, "mpi", "", node_count=2, total_devices=8, devices_per_node=4,
                    launch=Launch.MPI, invocation_dir=str(suite))
    reports = mpi.reports_path
    mpi = mpi.model_copy(update={"command": [
        sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker", "-p",
        "no:cacheprovider", "--trtllm-worker-reports", reports, "--trtllm-worker-nodeids",
        str(ids), "--rootdir", str(suite), "-q"]})
    handles = [executor.submit(single), executor.submit(mpi)]
    finals, records, _ = drive(executor, handles, 150)
    assert all(finals[h.job_id].status is JobStatus.COMPLETED for h in handles), finals
    (rec,) = records[handles[0].job_id]
    assert rec["here"] == "0,1,2,3" and rec["nnodes"] == "2", rec
    assert [n.split()[1] for n in rec["nodes"] if n] == ["4", "4"], rec
    assert sorted(p.name for p in suite.glob("rank-*")) == [f"rank-{i}" for i in range(8)]
    starts = [r for r in records[handles[1].job_id] if r.get("type") == "start"]
    assert len(starts) == 1, records[handles[1].job_id]
    assert (Path(mpi.work_dir) / "job.sbatch").read_text().count("--mpi=pmi2") == 1
    assert any("pmix_v4" in w for w in warnings)  # listed, but its library is missing here


# -- persistent ---------------------------------------------------------------------------
def test_persistent_concurrent_steps_and_reuse(slurm_env: SlurmEnv, alloc_root: Path,
                                               tmp_path: Path) -> None:
    executor = persistent_executor(alloc_root, slurm_env)
    body = """
        start = time.time()
        time.sleep(4)
        report(start=start, end=time.time(), cvd=os.environ.get("CUDA_VISIBLE_DEVICES"),
               step=os.environ.get("SLURM_STEP_ID"))
        """
    specs = [make_spec(tmp_path, f"step{i}", body, partition="gb200", total_devices=1,
                       devices_per_node=1) for i in range(4)]
    handles = [executor.submit(s) for s in specs]
    assert all("~" in h.job_id for h in handles)  # steps, not one-shot jobs
    finals, records, _ = drive(executor, handles, 90)
    assert all(f.status is JobStatus.COMPLETED for f in finals.values()), finals
    recs = [records[h.job_id][0] for h in handles]
    assert sorted(r["cvd"] for r in recs) == ["0", "1", "2", "3"]
    assert max(r["start"] for r in recs) < min(r["end"] for r in recs), recs  # side by side
    state = AllocationState.model_validate_json(
        (alloc_root / "work_dirs" / ".slurm_alloc.json").read_text())
    assert oct((alloc_root / "work_dirs" / ".slurm_alloc.json").stat().st_mode & 0o777) == "0o600"
    assert state.gpus_per_node == 4 and state.cpus_per_node == 4
    step_sh = (Path(specs[0].work_dir) / "step.sh").read_text()
    assert f"--jobid={state.job_id} -N 1" in step_sh and "--exact" in step_sh

    # a second executor (another pytest run) reuses the allocation: no salloc at all
    second = persistent_executor(alloc_root, slurm_env)
    handle = second.submit(make_spec(tmp_path, "again", "report(ok=True)\n", partition="gb200",
                                     total_devices=1, devices_per_node=1))
    finals, _, _ = drive(second, [handle], 60)
    assert finals[handle.job_id].status is JobStatus.COMPLETED
    assert handle.job_id.startswith(state.job_id + "~")
    assert second.jobs.counts["salloc"] == 0
    rerun = second.rerun_command(handle.spec, "t.py::x")
    assert rerun.startswith(f"cd {tmp_path} && srun --jobid={state.job_id} -N 1 ")


def test_step_failed_and_out_of_memory(slurm_env: SlurmEnv, alloc_root: Path,
                                       tmp_path: Path) -> None:
    executor = persistent_executor(alloc_root, slurm_env)
    fail = make_spec(tmp_path, "sfail", "sys.exit(3)\n", partition="gb200")
    oom = make_spec(tmp_path, "soom", "x = bytearray(400 << 20)\ntime.sleep(5)\n",
                    partition="gb200", mem_mb=50)
    handles = [executor.submit(fail), executor.submit(oom)]
    finals, _, _ = drive(executor, handles, 60)
    assert finals[handles[0].job_id].status is JobStatus.FAILED
    assert finals[handles[0].job_id].exit_code == 3
    assert finals[handles[1].job_id].status is JobStatus.OUT_OF_MEMORY, finals


def test_hang_cancels_only_its_step_and_close_keeps_allocation(
        slurm_env: SlurmEnv, alloc_root: Path, tmp_path: Path) -> None:
    executor = persistent_executor(alloc_root, slurm_env)
    hang = make_spec(tmp_path, "hang", "print('Hang detected after 5 seconds.', flush=True)\n"
                     "time.sleep(300)\n", partition="gb200", total_devices=1, devices_per_node=1)
    busy = make_spec(tmp_path, "busy", "report(started=True)\ntime.sleep(300)\n",
                     partition="gb200", total_devices=1, devices_per_node=1)
    h_hang, h_busy = executor.submit(hang), executor.submit(busy)
    finals, _, _ = drive(executor, [h_hang], 60)
    assert finals[h_hang.job_id].status is JobStatus.HANG_DETECTED
    alloc_id = h_hang.job_id.split("~")[0]
    step_id = f"{alloc_id}.{(Path(hang.work_dir) / 'stepid').read_text().strip()}"
    # the step was cancelled in Slurm; the allocation and the other step still run
    assert sh("squeue", "-h", "-j", alloc_id, "-o", "%T").strip() == "RUNNING"
    steps = sh("squeue", "-h", "-s", "-j", alloc_id, "-o", "%i|%j")
    assert step_id not in steps and f"{PREFIX}.busy" in steps, steps
    # Ctrl-C / end of run: close() cancels this run's steps, never the allocation
    executor.close()
    finals, _, _ = drive(executor, [h_busy], 60)
    assert finals[h_busy.job_id].status is JobStatus.CANCELLED, finals
    assert PREFIX not in sh("squeue", "-h", "-s", "-j", alloc_id, "-o", "%i|%j")
    assert sh("squeue", "-h", "-j", alloc_id, "-o", "%T").strip() == "RUNNING"
    acct = sh("sacct", "-n", "-P", "-j", step_id, "--format=JobID,State")
    assert "CANCELLED" in acct, acct


def test_two_runs_at_once_share_one_allocation(devcluster: dict[str, Any],
                                               tmp_path: Path) -> None:
    request = alloc_request(partition="batch", gpus_per_node=0, exclusive=False, time_limit="10")
    managers = [AllocationManager(LocalShell(), rootdir=tmp_path, request=request)
                for _ in range(2)]
    results: list[AllocationState | None] = [None, None]

    def ensure(i: int) -> None:
        results[i] = managers[i].ensure()

    threads = [threading.Thread(target=ensure, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results[0] is not None and results[1] is not None
        assert results[0].job_id == results[1].job_id
        assert sum(m.jobs.counts["salloc"] for m in managers) == 1
    finally:
        assert "released" in managers[0].release()
    assert not (tmp_path / "work_dirs" / ".slurm_alloc.json").exists()


def test_corrupt_stale_expiring_and_incompatible_state(devcluster: dict[str, Any],
                                                        tmp_path: Path) -> None:
    warnings: list[str] = []
    request = alloc_request(partition="batch", gpus_per_node=0, exclusive=False, time_limit="5")
    manager = AllocationManager(LocalShell(), rootdir=tmp_path, request=request,
                                warn=warnings.append)
    state_file = tmp_path / "work_dirs" / ".slurm_alloc.json"
    try:
        state_file.parent.mkdir(parents=True)
        state_file.write_text("{not json")
        first = manager.ensure()
        assert first is not None and any("corrupt" in w for w in warnings), warnings

        # a state file naming a finished job is stale; the live one (ours, no state) is an orphan
        state_file.write_text(first.model_copy(update={"job_id": "1"}).model_dump_json())
        warnings.clear()
        second = manager.ensure()
        assert second is not None and second.job_id != first.job_id
        assert any("stale" in w for w in warnings), warnings
        assert any(f"orphaned allocation {first.job_id}" in w for w in warnings), warnings
        assert sh("squeue", "-h", "-j", first.job_id, "-o", "%T").strip() in ("", "COMPLETING")

        # 5 minutes left (the request's own limit) is "expiring": released, allocated anew
        manager.request.time_limit = "10"
        warnings.clear()
        third = manager.ensure()
        assert third is not None and third.job_id != second.job_id
        assert any("expires" in w for w in warnings), warnings

        # a request for more nodes than the allocation has: released, allocated anew
        manager.request = alloc_request(partition="batch", gpus_per_node=0, exclusive=False,
                                        time_limit="10", nodes=2)
        warnings.clear()
        fourth = manager.ensure()
        assert fourth is not None and fourth.nodes == 2 and fourth.job_id != third.job_id
        assert any("does not fit" in w for w in warnings), warnings
        spec = make_spec(tmp_path, "long", "", time_limit="30")
        assert manager.check_time(fourth, spec) is not None  # 10 min left < 30 min
        assert sum(1 for ln in sh("squeue", "-h", "-u", "root", "-o", "%i|%j").splitlines()
                   if ln.endswith("|acct_a-trtllm.persistent")) >= 1
    finally:
        manager.release()


def test_refused_allocation_and_submission_become_error_states(slurm_env: SlurmEnv,
                                                                tmp_path: Path) -> None:
    warnings: list[str] = []
    manager = AllocationManager(LocalShell(), rootdir=tmp_path, warn=warnings.append,
                                request=alloc_request(partition="batch", account="nosuch",
                                                      gpus_per_node=0, exclusive=False))
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env), allocation_manager=manager, warn=warnings.append)
    handle = executor.submit(make_spec(tmp_path, "badacct", "", account="nosuch"))
    state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.ERROR and "Invalid account" in (state.reason or ""), state
    assert any("No persistent allocation" in w and "Invalid account" in w for w in warnings)
    assert not (tmp_path / "work_dirs" / ".slurm_alloc.json").exists()


def test_walltime_negotiation_shortens_a_long_wait(slurm_env: SlurmEnv, tmp_path: Path) -> None:
    # the holder takes every batch GPU (not the CPUs) for 2 hours; the waiter needs 4 GPUs
    holder = sh("sbatch", "--parsable", "-p", "batch", "-N2", "--gres=gpu:h200:4", "-t", "120",
                "-J", f"{PREFIX}.holder", "-o", "/dev/null", "--wrap", "sleep 600").strip()
    warnings: list[str] = []
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env, persistent=False, walltime=WalltimePolicy(pending_after=1, new_limit="30")), warn=warnings.append)
    try:
        end = time.monotonic() + 60
        while sh("squeue", "-h", "-j", holder, "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < end, "the holder job never started"
            time.sleep(0.5)
        handle = executor.submit(make_spec(tmp_path, "waiter", "", time_limit="4:00:00",
                                           total_devices=4, devices_per_node=4))
        end = time.monotonic() + 30
        while not warnings:
            state = executor.poll([handle])[handle.job_id]
            assert state.status is JobStatus.PENDING and time.monotonic() < end, state
            time.sleep(0.2)
        assert "from 4:00:00 to 30" in warnings[0], warnings
        assert sh("squeue", "-h", "-j", handle.job_id, "-o", "%l").strip() == "30:00"
        assert state.reason  # the pending reason is shown (Resources / Priority)
    finally:
        executor.close()
        sh("scancel", holder)


# -- node failure, timeout, leftovers (last: they wait longest or disturb the cluster) -------
def test_node_fail(slurm_env: SlurmEnv, tmp_path: Path, timeout_job: Any) -> None:
    executor = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=slurm_env, persistent=False))
    handle = executor.submit(make_spec(tmp_path, "nodefail", "report(started=True)\n"
                                       "time.sleep(300)\n"))
    killed = None
    try:
        def kill_node_when_running(monitor: Monitor) -> None:
            nonlocal killed
            job = monitor.jobs.get(handle.job_id)
            if killed is None and job is not None and job.state.status is JobStatus.RUNNING \
                    and job.state.nodelist:
                killed = job.state.nodelist
                pid = int((STATE_DIR / "run" / f"slurmd-{killed}.pid").read_text().split()[0])
                os.kill(pid, 15)
                # slurmctld notices a dead slurmd only after SlurmdTimeout (300 s): say it now
                sh("scontrol", "update", f"nodename={killed}", "state=down",
                   "reason=trtllm-slurm test: slurmd killed")

        finals, _, _ = drive(executor, [handle], 90, kill_node_when_running)
        assert finals[handle.job_id].status is JobStatus.NODE_FAIL, finals
    finally:
        executor.close()
        if killed is not None:
            subprocess.run([sys.executable, str(REPO / "tests" / "cluster" / "up")],
                           capture_output=True, timeout=300, check=True)


@pytest.mark.last
def test_timeout(timeout_job: WatchedJob) -> None:
    handle = timeout_job.handle
    finals, records = timeout_job.result()
    assert records[handle.job_id] == [{"started": True}]
    assert finals[handle.job_id].status is JobStatus.TIMEOUT, finals


def test_nothing_of_ours_left_behind(alloc_root: Path, timeout_job: WatchedJob) -> None:
    # the TIMEOUT job is not left behind: its monitor still watches it (test_timeout)
    def left() -> list[str]:
        return [j for j in our_jobs() if j.split("|", 1)[0] != timeout_job.handle.job_id]

    deadline = time.monotonic() + 20  # cancelled jobs may still be COMPLETING briefly
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []
    state = AllocationState.model_validate_json(
        (alloc_root / "work_dirs" / ".slurm_alloc.json").read_text())
    assert sh("squeue", "-h", "-j", state.job_id, "-o", "%T|%j").strip() == (
        "RUNNING|acct_a-trtllm.persistent")
    assert PREFIX not in sh("squeue", "-h", "-s", "-j", state.job_id, "-o", "%i|%j")


def test_cli_alloc_status_and_release(alloc_root: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    from pytest_trtllm_slurm.cli.main import main

    state_file = alloc_root / "work_dirs" / ".slurm_alloc.json"
    job_id = AllocationState.model_validate_json(state_file.read_text()).job_id
    assert main(["alloc", "status", "--rootdir", str(alloc_root)]) == 0
    out = capsys.readouterr().out
    assert f"Allocation {job_id} (acct_a-trtllm.persistent): RUNNING" in out
    assert main(["alloc", "release", "--rootdir", str(alloc_root)]) == 0
    assert f"Allocation {job_id} released." in capsys.readouterr().out
    assert not state_file.exists()
    assert sh("squeue", "-h", "-j", job_id, "-o", "%T").strip() in ("", "COMPLETING")
