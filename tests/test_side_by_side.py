"""The pieces a run spanning several clusters is made of, without a cluster: set-up steps
side by side (execution.concurrent), job ids that name their cluster (execution.factory.ClusterJobIds,
around a real local executor), one executor per target (planning.models.target_of)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.concurrent import Background, side_by_side
from pytest_trtllm_slurm.execution.factory import ClusterJobIds
from pytest_trtllm_slurm.execution.local.direct import DirectExecutor
from pytest_trtllm_slurm.execution.protocol import Executor
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario, target_name, target_of
from pytest_trtllm_slurm.planning.packing import pools_from_capacities


def test_steps_run_at_the_same_time() -> None:
    """Each step waits for the other at a barrier: run one after the other, both would
    break it (BrokenBarrierError) instead of returning."""
    meet = threading.Barrier(2, timeout=30)

    def step(name: str) -> str:
        meet.wait()
        return name

    assert side_by_side({"a": lambda: step("a"), "b": lambda: step("b")}) == {"a": "a", "b": "b"}


def test_a_failing_step_is_raised_after_the_others_ended() -> None:
    ended: list[str] = []

    def slow() -> str:
        time.sleep(0.3)
        ended.append("slow")
        return "slow"

    def broken() -> str:
        raise RuntimeError("cluster b is down")

    with pytest.raises(RuntimeError, match="cluster b is down"):
        side_by_side({"a": slow, "b": broken})
    assert ended == ["slow"]  # not left running behind the caller
    assert side_by_side({"only": lambda: threading.current_thread().name}) == {
        "only": threading.main_thread().name}  # one step: no thread


def _spec(tmp_path: Path, name: str, code: str) -> JobSpec:
    work = tmp_path / name
    work.mkdir()
    return JobSpec(scenario=Scenario.LOCAL_DIRECT, name=name, job_name=f"t.{name}",
                   command=[sys.executable, "-c", code], rootdir=str(tmp_path),
                   work_dir=str(work), log_path=str(work / "job.log"),
                   reports_path=str(work / "reports.jsonl"))


def test_job_ids_name_their_cluster_and_reach_the_real_jobs(tmp_path: Path) -> None:
    """Two executors that number their jobs alike: wrapped, their ids differ, and poll
    and cancel still reach each one's own job."""
    a = ClusterJobIds(DirectExecutor(gpu_ids=[0, 1]), "east")
    b = ClusterJobIds(DirectExecutor(gpu_ids=[]), "west")
    quick = a.submit(_spec(tmp_path, "quick", "pass"))
    slow = b.submit(_spec(tmp_path, "slow", "import time; time.sleep(60)"))
    try:
        assert quick.job_id.startswith("east:local-") and slow.job_id.startswith("west:local-")
        assert quick.job_id.split(":", 1)[1] == slow.job_id.split(":", 1)[1]  # alike inside
        for _ in range(200):
            states = a.poll([quick])
            if states[quick.job_id].status.finished:
                break
            time.sleep(0.05)
        assert states[quick.job_id].status.value == "COMPLETED"
        b.cancel(slow)
        for _ in range(200):
            state = b.poll([slow])[slow.job_id]
            if state.status.finished:
                break
            time.sleep(0.05)
        assert state.status.value == "CANCELLED"
        # what the controller reads of an executor is the wrapped one's
        assert a.capacity().local_gpus == 2  # what the packer reads of it
        assert a.shell is a.wrapped.shell
    finally:
        a.close()
        b.close()


def test_each_remote_cluster_is_a_target_and_a_pool_of_its_own() -> None:
    far = BatchKey(scenario=Scenario.REMOTE_SLURM, cluster="far", partition="batch",
                   total_devices=4, devices_per_node=4)
    near = far.model_copy(update={"cluster": "near"})
    local = BatchKey(scenario=Scenario.LOCAL_SLURM, cluster="devcluster", partition="batch")
    assert target_of(far) == (Scenario.REMOTE_SLURM, "far") != target_of(near)
    assert target_of(local) is Scenario.LOCAL_SLURM  # the local Slurm: one executor, as before
    assert target_name(target_of(far)) == "remote_slurm:far"
    assert target_name(Scenario.LOCAL_SLURM) == "local_slurm"
    pools = pools_from_capacities({})
    assert pools(far).name == "remote_slurm/far/batch/one-shot"
    assert pools(near).name == "remote_slurm/near/batch/one-shot"


def test_a_background_step_says_when_it_is_done_and_what_it_raised() -> None:
    """The run loop submits a cluster's batches once its step is done, and does not wait
    for it before then."""
    gate = threading.Event()
    job = Background(lambda: "ready" if gate.wait(30) else "never")
    assert not job.done  # still waiting at the gate: the caller goes on meanwhile
    gate.set()
    assert job.result() == "ready" and job.done

    def broken() -> None:
        raise RuntimeError("queue refused the allocation")

    failed = Background(broken)
    with pytest.raises(RuntimeError, match="queue refused"):
        failed.result()


def test_a_wrapped_cluster_answers_all_of_the_executor_contract_as_its_executor() -> None:
    """Every member of ``Executor`` (methods, properties, attributes the controller reads)
    is the wrapped executor's: a default the wrapper inherits instead would make the run
    treat a cluster of several differently (e.g. read every warm batch each round)."""
    wrapped = DirectExecutor(gpu_ids=[0])
    wrapper = ClusterJobIds(wrapped, "east")
    members = {name for klass in Executor.__mro__ if klass is not object
               for name in vars(klass) if not name.startswith("_")}
    members |= set(Executor.__annotations__)
    inherited = sorted(name for name in members
                       if name not in vars(ClusterJobIds) and name not in vars(wrapper))
    assert not inherited, f"ClusterJobIds inherits the defaults of {inherited}"
    assert wrapper.vouched == wrapped.vouched and wrapper.quiet([]) == set()
