"""Pure parsers of the scheduler commands (job ids, squeue, sacct, scontrol, durations)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.outcome import JobStatus, map_slurm_state
from pytest_trtllm_slurm.execution.slurm.allocation import parse_gpu_processes, parse_tres
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings
from pytest_trtllm_slurm.execution.slurm.jobs import (
    chunks,
    parse_duration,
    parse_exit_code,
    parse_sacct,
    parse_sbatch_id,
    parse_scontrol_job,
    parse_squeue_jobs,
    parse_squeue_steps,
    split_job_id,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.transport.shell import CommandResult


@pytest.mark.parametrize(("raw", "expected"), [
    ("123", ("123", None)),
    ("123+0", ("123", None)),
    ("123+1", ("123", None)),
    ("123_4", ("123_4", None)),
    ("123_[1-5]", ("123_[1-5]", None)),
    ("123.7", ("123", "7")),
    ("123.batch", ("123", "batch")),
    ("123+0.extern", ("123", "extern")),
    (" 9 ", ("9", None)),
])
def test_split_job_id(raw: str, expected: tuple[str, str | None]) -> None:
    assert split_job_id(raw) == expected


def test_sbatch_id() -> None:
    assert parse_sbatch_id("42\n") == "42"
    assert parse_sbatch_id("42;devcluster\n") == "42"
    with pytest.raises(ValueError):
        parse_sbatch_id("sbatch: error: nope")


def test_squeue_rows_fold_het_components_and_keep_arrays() -> None:
    out = ("10|PENDING|Resources|||\n10+1|PENDING|Resources||\n11_3|RUNNING|None|n[1-2]|9:58\n"
           "12|PENDING|ReqNodeNotAvail, UnavailableNodes:n2||\n")
    rows = parse_squeue_jobs(out)
    assert set(rows) == {"10", "11_3", "12"}
    assert rows["10"].reason == "Resources" and rows["10"].nodelist is None
    assert rows["11_3"].nodelist == "n[1-2]" and rows["11_3"].reason is None
    assert rows["11_3"].time_left == "9:58"
    assert rows["12"].reason is not None and rows["12"].reason.startswith("ReqNodeNotAvail")


def test_squeue_steps() -> None:
    rows = parse_squeue_steps("59.0|step1|n1\n59.3|acct_a.b 1|n1\n")
    assert set(rows) == {"59.0", "59.3"} and rows["59.3"].name == "acct_a.b 1"


def test_sacct_jobs_and_steps() -> None:
    out = ("31|COMPLETED|0:0|n1|None\n31.batch|COMPLETED|0:0|n1|\n"
           "32|FAILED|3:0|n1|NonZeroExitCode\n"
           "33|CANCELLED by 0|0:15|n2|\n34+0|OUT_OF_MEMORY|0:125|n1|\n34+1|COMPLETED|0:0|n2|\n"
           "74.0|OUT_OF_MEMORY|0:125|n2|\n")
    jobs = parse_sacct(out)
    assert set(jobs) == {"31", "32", "33", "34"}
    assert (jobs["32"].state, jobs["32"].exit_code) == ("FAILED", 3)
    assert map_slurm_state(jobs["33"].state) is JobStatus.CANCELLED
    assert jobs["34"].state == "OUT_OF_MEMORY"
    steps = parse_sacct(out, steps=True)
    assert set(steps) == {"31.batch", "74.0"}
    assert (steps["74.0"].exit_code, steps["74.0"].signal) == (0, 125)


def test_scontrol_job() -> None:
    text = ("JobId=5 JobName=x UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
            "ExitCode=0:15 NodeList=n1 BatchHost=n1\n")
    row = parse_scontrol_job(text)
    assert row is not None and (row.state, row.exit_code, row.signal) == ("TIMEOUT", 0, 15)
    assert row.reason == "TimeLimit" and row.nodelist == "n1"


@pytest.mark.parametrize(("text", "seconds"), [
    ("5", 300), ("0:30", 30), ("10:00", 600), ("1:00:00", 3600), ("2-00", 172800),
    ("1-02:03", 93780), ("1-02:03:04", 93784), ("UNLIMITED", 10**9), ("INVALID", None),
    ("", None), ("NOT_SET", None),
])
def test_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


def test_misc() -> None:
    assert parse_exit_code("3:0") == (3, 0) and parse_exit_code("") == (None, None)
    assert [len(c) for c in chunks(map(str, range(250)), 100)] == [100, 100, 50]
    assert parse_tres("cpu=8,mem=8000M,node=2,gres/gpu=8")["mem"] == "8000M"
    assert parse_gpu_processes("0: 1234, python, 1000 MiB\n1: \n") == ["0: 1234, python, 1000 MiB"]


# -- executor logic that a live cluster cannot show on demand (scripted command output) ----
class ScriptedShell:
    """A Shell answering scheduler commands from a table (argv[0] -> list of results)."""

    name = "scripted"

    def __init__(self, answers: dict[str, list[tuple[int, str, str]]],
                 files: dict[str, bytes] | None = None) -> None:
        self.answers = answers
        self.files = files or {}
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> CommandResult:
        self.calls.append(argv)
        queue = self.answers.get(argv[0]) or [(0, "", "")]
        code, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return CommandResult(tuple(argv), code, out, err)

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        return self.files.get(path, b"")[offset:offset + limit]

    def size(self, path: str) -> int:
        return len(self.files.get(path, b""))

    def write_file(self, path: str, data: str, mode: int = 0o600) -> None:
        pass

    def mkdir(self, path: str, *, private: bool = False) -> None:
        pass

    def exists(self, path: str) -> bool:
        return False


def _spec(tmp_path: Path) -> JobSpec:
    return JobSpec(scenario=Scenario.LOCAL_SLURM, name="b", job_name="a.b", command=["true"],
                   rootdir=str(tmp_path), work_dir=str(tmp_path), log_path=str(tmp_path / "l"),
                   reports_path=str(tmp_path / "r"))


def test_accounting_disabled_falls_back_to_scontrol(tmp_path: Path) -> None:
    shell = ScriptedShell({
        "sbatch": [(0, "7\n", "")],
        "squeue": [(0, "", "")],
        "sacct": [(1, "", "sacct: error: Slurm accounting storage is disabled\n")],
        "scontrol": [(0, "JobId=7 JobName=a.b JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 "
                         "NodeList=n1\n", "")],
    })
    executor = SlurmExecutor(shell, SlurmSettings(persistent=False))
    handle = executor.submit(_spec(tmp_path))
    state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.TIMEOUT and state.nodelist == "n1"
    assert executor.jobs.accounting is False
    assert [c[0] for c in shell.calls] == ["sbatch", "squeue", "sacct", "scontrol"]


def test_transient_failures_tolerated_then_error(tmp_path: Path) -> None:
    down = (1, "", "squeue: error: Socket timed out on send/recv operation\n")
    shell = ScriptedShell({"sbatch": [(0, "8\n", "")], "squeue": [down]})
    executor = SlurmExecutor(shell, SlurmSettings(persistent=False, min_interval=0, max_interval=0, max_failures=3, fail_grace=0))
    handle = executor.submit(_spec(tmp_path))
    assert executor.poll([handle])[handle.job_id].status is JobStatus.PENDING
    assert executor.poll([handle])[handle.job_id].status is JobStatus.PENDING
    state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.ERROR and "Socket timed out" in (state.reason or "")


def test_adaptive_interval_skips_scheduler_queries(tmp_path: Path) -> None:
    shell = ScriptedShell({"sbatch": [(0, "9\n", "")],
                           "squeue": [(0, "9|PENDING|Priority|||\n", "")]})
    executor = SlurmExecutor(shell, SlurmSettings(persistent=False, min_interval=0.5, max_interval=5))
    handle = executor.submit(_spec(tmp_path))
    for _ in range(10):  # the monitor calls every 0.2 s; here back to back
        state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.PENDING and state.reason == "Priority"
    assert sum(1 for c in shell.calls if c[0] == "squeue") == 1
    assert executor.jobs.counts == {"sbatch": 1, "squeue": 1}


def test_refused_submission_is_an_error_state(tmp_path: Path) -> None:
    shell = ScriptedShell({"sbatch": [(1, "", "sbatch: error: Invalid account or account/"
                                             "partition combination specified\n")]})
    executor = SlurmExecutor(shell, SlurmSettings(persistent=False))
    handle = executor.submit(_spec(tmp_path))
    state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.ERROR and "Invalid account" in (state.reason or "")
    executor.close()  # nothing to scancel for an unsubmitted batch
    assert [c[0] for c in shell.calls] == ["sbatch"]


def test_allocation_request_covering_batches() -> None:
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationRequest
    from pytest_trtllm_slurm.planning.batching import BatchKey
    from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv

    env = SlurmEnv(partitions=[PartitionInfo(name="batch", gpu_type="h200", gpus_per_node=4,
                                             requires_gres=True)])
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", account="acct_a",
                     total_devices=n * 4, devices_per_node=4, node_count=n) for n in (1, 2, 1)]
    keys.append(BatchKey(scenario=Scenario.LOCAL_SLURM, partition="gb200", node_count=4))
    req = AllocationRequest.covering(keys, env, time_limit="2:00:00")
    assert (req.partition, req.account, req.nodes, req.gpus_per_node) == ("batch", "acct_a", 2, 4)
    assert (req.gres_style, req.gres_type, req.time_limit) == ("gres", "h200", "2:00:00")
    assert req.job_name == "acct_a-trtllm.persistent"


def test_allocation_request_takes_at_least_the_nodes_the_user_asks_for() -> None:
    from pytest_trtllm_slurm.errors import ConfigError
    from pytest_trtllm_slurm.execution.slurm.allocation import AllocationRequest
    from pytest_trtllm_slurm.planning.batching import BatchKey
    from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv

    env = SlurmEnv(partitions=[PartitionInfo(name="batch", gpus_per_node=4, nodes=["n1", "n2"])])
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", total_devices=1,
                     devices_per_node=1, node_count=1)]
    assert AllocationRequest.covering(keys, env).nodes == 1
    assert AllocationRequest.covering(keys, env, nodes=2).nodes == 2
    with pytest.raises(ConfigError, match="--trtllm-alloc-nodes 3: partition batch has 2"):
        AllocationRequest.covering(keys, env, nodes=3)


def test_finished_job_waits_a_bounded_time_for_its_reports(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    shell = ScriptedShell({"sbatch": [(0, "11\n", "")], "squeue": [(0, "", "")],
                           "sacct": [(0, "11|COMPLETED|0:0|n1|None\n", "")]},
                          files={spec.reports_path: b'{"type": "start"}\n'})
    executor = SlurmExecutor(shell, SlurmSettings(persistent=False, min_interval=0, max_interval=0, report_wait=0.3))
    handle = executor.submit(spec)
    state = executor.poll([handle])[handle.job_id]
    assert state.status is JobStatus.RUNNING and "shared file system" in (state.reason or "")
    assert ["ls", "-a", spec.work_dir] in shell.calls  # attribute cache refresh
    shell.files[spec.reports_path] += b'{"type": "session_finish", "exitstatus": 0}\n'
    assert executor.poll([handle])[handle.job_id].status is JobStatus.COMPLETED
    # without the last line it gives up after report_wait
    spec2 = _spec(tmp_path / "b")
    shell.answers["sbatch"] = [(0, "12\n", "")]
    shell.answers["sacct"] = [(0, "12|COMPLETED|0:0|n1|None\n", "")]
    handle = executor.submit(spec2)
    assert executor.poll([handle])[handle.job_id].status is JobStatus.RUNNING
    time.sleep(0.35)
    assert executor.poll([handle])[handle.job_id].status is JobStatus.COMPLETED
    # a build job writes no reports: its end is shown at once, with no wait for a last line
    build = _spec(tmp_path / "c").model_copy(update={"workflow": "build"})
    shell.answers["sbatch"] = [(0, "13\n", "")]
    shell.answers["sacct"] = [(0, "13|COMPLETED|0:0|n1|None\n", "")]
    waiting = SlurmExecutor(shell, SlurmSettings(persistent=False, min_interval=0, max_interval=0, report_wait=600))
    handle = waiting.submit(build)
    assert waiting.poll([handle])[handle.job_id].status is JobStatus.COMPLETED
