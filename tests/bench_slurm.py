"""Benchmark of the Slurm executor on the dev cluster (not collected by pytest).

    python tests/bench_slurm.py [--window 60]

1. Time from submit to the first test start (the worker's "start" record) for a
   tiny real worker pytest: one-shot, persistent with a new allocation,
   persistent reusing it.
2. Scheduler commands per minute while 20 batches are active (one-shot on
   ``batch``, persistent steps in one ``gb200`` node), measured in parallel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_trtllm_slurm.execution.monitor import Monitor  # noqa: E402
from pytest_trtllm_slurm.execution.slurm.allocation import (  # noqa: E402
    AllocationManager,
    AllocationRequest,
)
from pytest_trtllm_slurm.execution.slurm.client import SlurmClient  # noqa: E402
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings  # noqa: E402
from pytest_trtllm_slurm.planning.jobspec import JobSpec  # noqa: E402
from pytest_trtllm_slurm.planning.models import Scenario  # noqa: E402
from pytest_trtllm_slurm.transport.shell import LocalShell  # noqa: E402

PREFIX = "bench6"


def worker_spec(root: Path, name: str, partition: str, sleep: float = 0) -> JobSpec:
    work = root / name
    work.mkdir(parents=True)
    (work / "test_b.py").write_text(f"import time\ndef test_b():\n    time.sleep({sleep})\n")
    (work / "pytest.ini").write_text("[pytest]\n")
    ids = work / "nodeids.json"
    ids.write_text(json.dumps(["test_b.py::test_b"]))
    reports = work / "reports.jsonl"
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker", "-p",
           "no:cacheprovider", "--trtllm-worker-reports", str(reports),
           "--trtllm-worker-nodeids", str(ids), "--rootdir", str(work), "-q"]
    return JobSpec(scenario=Scenario.LOCAL_SLURM, name=name, job_name=f"{PREFIX}.{name}",
                   command=cmd, rootdir=str(work), invocation_dir=str(work), account="acct_a",
                   partition=partition, time_limit="10", total_devices=1, devices_per_node=1,
                   work_dir=str(work), log_path=str(work / "job.log"), reports_path=str(reports))


def time_to_first_start(executor: SlurmExecutor, spec: JobSpec) -> float:
    t0 = time.monotonic()
    monitor = Monitor([])
    monitor.add(executor.submit(spec), executor)
    first = None
    while monitor.active:
        for event in monitor.poll():
            if first is None and any(r.get("type") == "start" for r in event.records):
                first = time.monotonic() - t0
        time.sleep(monitor.poll_interval)
    assert first is not None, spec.log_path
    return first


def commands_per_minute(executor: SlurmExecutor, specs: list[JobSpec], window: float,
                        out: dict[str, float], key: str) -> None:
    monitor = Monitor([])
    for spec in specs:
        monitor.add(executor.submit(spec), executor)
    start_total, t0 = executor.jobs.total, time.monotonic()
    while time.monotonic() - t0 < window:
        list(monitor.poll())
        time.sleep(monitor.poll_interval)
    out[key] = (executor.jobs.total - start_total) * 60 / window
    out[key + "_active"] = len(monitor.jobs)
    monitor.cancel_all()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = SlurmClient(LocalShell()).discover()
    root = Path(tempfile.mkdtemp(prefix="bench6-"))
    request = AllocationRequest(partition="gb200", account="acct_a", nodes=1, gpus_per_node=4,
                                gres_type="gb200", time_limit="30")
    oneshot = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=env, persistent=False))
    try:
        shots = [time_to_first_start(oneshot, worker_spec(root, f"o{i}", "batch"))
                 for i in range(args.repeat)]
        manager = AllocationManager(LocalShell(), rootdir=root, request=request)
        fresh = time_to_first_start(
            SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=env), allocation_manager=manager),
            worker_spec(root, "p-new", "gb200"))
        reuse = []
        for i in range(args.repeat):
            again = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=env), allocation_manager=AllocationManager(
                LocalShell(), rootdir=root, request=request))
            reuse.append(time_to_first_start(again, worker_spec(root, f"p{i}", "gb200")))
        print("submit -> first test start, one-shot:            median "
              f"{statistics.median(shots):.2f} s {[round(s, 2) for s in shots]}")
        print(f"submit -> first test start, persistent (new):    {fresh:.2f} s (includes salloc)")
        print(f"submit -> first test start, persistent (reused): median "
              f"{statistics.median(reuse):.2f} s {[round(s, 2) for s in reuse]}")

        rates: dict[str, float] = {}
        persistent = SlurmExecutor(LocalShell(), SlurmSettings(slurm_env=env), allocation_manager=AllocationManager(
                                       LocalShell(), rootdir=root, request=request))
        runs = [
            threading.Thread(target=commands_per_minute, args=(
                oneshot, [worker_spec(root, f"many-o{i}", "batch", 600) for i in range(20)],
                args.window, rates, "oneshot")),
            threading.Thread(target=commands_per_minute, args=(
                persistent, [worker_spec(root, f"many-p{i}", "gb200", 600) for i in range(20)],
                args.window, rates, "persistent")),
        ]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        for key in ("oneshot", "persistent"):
            print(f"scheduler commands per minute, 20 {key} batches active: {rates[key]:.1f} "
                  f"({int(rates[key + '_active'])} still active at the end)")
        print(f"counts one-shot: {dict(oneshot.jobs.counts)}; persistent: "
              f"{dict(persistent.jobs.counts)}")
    finally:
        oneshot.close()
        AllocationManager(LocalShell(), rootdir=root, request=request).release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
