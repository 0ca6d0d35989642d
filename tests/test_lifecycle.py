"""A batch's one lifecycle (execution/slurm/lifecycle.py): the moves each backend makes,
the ones refused, and the phase the executor's and the pool's view of a batch share."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.scripts import SlurmOptions
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.lifecycle import (
    ALLOWED,
    IllegalTransition,
    Lifecycle,
    Phase,
)
from pytest_trtllm_slurm.execution.slurm.tracking import TrackedJob, visible_state
from pytest_trtllm_slurm.execution.slurm.warm_pool import AgentPool
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.transport.shell import LocalShell

P = Phase


def walk(life: Lifecycle, *statuses: JobStatus) -> list[Phase]:
    seen = []
    for status in statuses:
        life.saw(status)
        seen.append(life.phase)
    return seen


def test_a_one_shot_job_or_step_goes_submitted_running_ended_settled() -> None:
    life = Lifecycle()
    assert life.phase is P.SUBMITTED
    assert walk(life, JobStatus.PENDING, JobStatus.RUNNING, JobStatus.RUNNING,
                JobStatus.FAILED, JobStatus.FAILED) == [
        P.SUBMITTED, P.RUNNING, P.RUNNING, P.ENDED, P.ENDED]
    life.settle()
    assert life.settled and life.ended
    life.saw(JobStatus.NODE_FAIL)  # a final word after settling changes nothing shown
    assert life.phase is P.SETTLED


def test_a_served_batch_waits_for_gpus_and_a_resent_one_is_submitted_again() -> None:
    life = Lifecycle(P.WAITING)
    life.saw(JobStatus.PENDING)  # "waiting for GPUs in the allocation"
    assert life.waiting
    life.to(P.SUBMITTED)  # placed, its request written
    assert walk(life, JobStatus.RUNNING, JobStatus.PENDING, JobStatus.RUNNING,
                JobStatus.COMPLETED) == [P.RUNNING, P.SUBMITTED, P.RUNNING, P.ENDED]


def test_a_gated_step_launches_early_and_may_end_before_its_gate_opens() -> None:
    life = Lifecycle(P.WAITING)
    life.to(P.EARLY)
    life.saw(JobStatus.PENDING)  # "launched early: its ranks collect ..."
    assert life.phase is P.EARLY
    life.saw(JobStatus.RUNNING)  # it ended at the gate, the accounting lags behind srun
    assert life.phase is P.EARLY  # still holding its nodes back until its end is known
    life.saw(JobStatus.FAILED)
    assert life.phase is P.ENDED
    opened = Lifecycle(P.EARLY)
    opened.to(P.SUBMITTED)  # ranks ready, nodes free: the gate opens
    opened.saw(JobStatus.RUNNING)
    assert opened.phase is P.RUNNING


@pytest.mark.parametrize("phase", [P.WAITING, P.EARLY, P.SUBMITTED, P.RUNNING])
def test_any_phase_before_the_end_may_end_at_once(phase: Phase) -> None:
    life = Lifecycle(phase)  # a refused submission, a cancel, the allocation's end
    life.saw(JobStatus.CANCELLED)
    assert life.phase is P.ENDED and not life.settled


@pytest.mark.parametrize(("start", "move"), [
    (P.SUBMITTED, P.SETTLED),  # shown before its end was known
    (P.SUBMITTED, P.WAITING),  # the scheduler has it: the pool cannot hold it back
    (P.RUNNING, P.EARLY),
    (P.EARLY, P.RUNNING),  # only through its gate
    (P.WAITING, P.RUNNING),  # nothing runs that was never placed
    (P.ENDED, P.RUNNING),
    (P.SETTLED, P.ENDED),
])
def test_moves_the_table_does_not_allow_are_refused(start: Phase, move: Phase) -> None:
    life = Lifecycle(start)
    with pytest.raises(IllegalTransition, match=f"{start.name} to {move.name}"):
        life.to(move)
    assert life.phase is start


def test_an_ended_batch_never_runs_again() -> None:
    for phase in (P.ENDED, P.SETTLED):
        with pytest.raises(IllegalTransition):
            Lifecycle(phase).saw(JobStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        Lifecycle(P.WAITING).saw(JobStatus.RUNNING)


def test_the_table_covers_every_phase_and_only_settled_is_terminal() -> None:
    assert set(ALLOWED) == set(Phase)
    assert [p for p, nxt in ALLOWED.items() if not nxt] == [P.SETTLED]
    assert all(P.ENDED in ALLOWED[p] for p in (P.WAITING, P.EARLY, P.SUBMITTED, P.RUNNING))


def make_spec(root: Path, name: str, *, nodes: int = 1, gpus: int = 4) -> JobSpec:
    work = root / name
    work.mkdir()
    return JobSpec.model_validate(dict(
        scenario=Scenario.LOCAL_SLURM, name=name, job_name=f"acct.{name}",
        nodeids=[f"test_x.py::test_{name}"], command=["python3", "-m", "pytest"],
        rootdir=str(root), node_count=nodes, total_devices=gpus * nodes,
        devices_per_node=gpus, work_dir=str(work), log_path=str(work / "job.log"),
        reports_path=str(work / "reports.jsonl")))


def test_the_executor_and_the_pool_share_one_phase_per_batch(tmp_path: Path) -> None:
    alloc = AllocationState(job_id="7", nodelist="a1", nodes=1, gpus_per_node=4)
    pool = AgentPool(LocalShell(), alloc)
    spec = make_spec(tmp_path, "s1")
    job = TrackedJob(JobHandle(job_id="7~w1", spec=spec, submitted_at=0.0),
                     SlurmOptions("gres", None, None, (), None), alloc=alloc,
                     life=Lifecycle(P.WAITING))
    first = pool.add("7~w0", make_spec(tmp_path, "s0"), warm=False)
    job.warm = pool.add("7~w1", spec, warm=False, life=job.life)
    launched: list[str] = []
    pool.place_waiting(lambda job_id, _: launched.append(job_id))
    assert launched == ["7~w0"] and first.life.phase is P.SUBMITTED
    assert job.life.waiting and job.warm.life is job.life  # the node is taken: it waits
    pool.release(first)
    pool.place_waiting(lambda job_id, _: launched.append(job_id))
    assert launched == ["7~w0", "7~w1"] and job.life.phase is P.SUBMITTED and not job.life.waiting
    job.state = JobState(status=JobStatus.COMPLETED, exit_code=0)
    assert job.warm.life.phase is P.ENDED
    assert visible_state(job).status is JobStatus.RUNNING  # not shown before it settled
    job.life.settle()
    assert visible_state(job).status is JobStatus.COMPLETED


def test_a_refused_submission_is_ended_from_the_start(tmp_path: Path) -> None:
    job = TrackedJob(JobHandle(job_id="unsubmitted-1", spec=make_spec(tmp_path, "b"),
                               submitted_at=0.0), SlurmOptions("gres", None, None, (), None),
                     state=JobState(status=JobStatus.ERROR, reason="sbatch: error"))
    assert job.life.phase is P.ENDED and not job.life.settled
