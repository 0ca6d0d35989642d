"""The allocation's scheduler for gated steps (AgentPool), with its real gate files.

No Slurm here: ``launch_step`` is the executor's hook, recorded instead of starting srun;
the gate files are written as the ranks would write them (see ``gate``).
"""

from __future__ import annotations

from pathlib import Path

from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.parse import expand_hostlist
from pytest_trtllm_slurm.execution.slurm.warm_pool import AgentPool, WarmJob
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.transport.shell import LocalShell


def make_spec(root: Path, name: str, nodes: int) -> JobSpec:
    work = root / name
    work.mkdir()
    return JobSpec.model_validate(dict(
        scenario=Scenario.LOCAL_SLURM, name=name, job_name=f"acct.{name}",
        nodeids=[f"test_x.py::test_{name}"], command=["python3", "-m", "pytest"],
        rootdir=str(root), node_count=nodes, total_devices=4 * nodes, devices_per_node=4,
        work_dir=str(work), log_path=str(work / "job.log"),
        reports_path=str(work / "reports.jsonl")))


def test_a_gated_step_launches_at_once_drains_its_nodes_when_ready_and_frees_them_early(
        tmp_path: Path) -> None:
    alloc = AllocationState(job_id="7", nodelist="a[1-2]", nodes=2, gpus_per_node=4)
    pool = AgentPool(LocalShell(), alloc)
    launched: list[str] = []

    def launch(job_id: str, job: WarmJob) -> None:
        launched.append(job_id)

    gated = pool.add("mpi", make_spec(tmp_path, "mpi", 2), warm=False, gated=True)
    pool.place_waiting(launch)
    assert launched == ["mpi"] and gated.placement is None  # launched, no GPUs yet
    assert [n.name for n in gated.reserved] == ["a1", "a2"]

    first = pool.add("s1", make_spec(tmp_path, "s1", 1), warm=False)
    pool.place_waiting(launch)
    assert launched == ["mpi", "s1"]  # its ranks are not ready: the nodes are used meanwhile

    gate = Path(gated.gate_dir)
    gate.mkdir()
    (gate / "ready").write_text("2\n")
    pool.add("s2", make_spec(tmp_path, "s2", 1), warm=False)
    pool.place_waiting(launch)
    assert launched == ["mpi", "s1"]  # ready: nothing new on its nodes, a2 stays free
    assert gated.placement is None and not (gate / "open").exists()
    assert "ranks ready" in (gated.state.reason or "")

    pool.release(first)
    assert pool.place_waiting(launch)
    assert (gate / "open").exists() and gated.placement is not None
    assert launched == ["mpi", "s1"]  # s2 waits for the gated step

    (gate / "done.0").write_text("4242\n")  # as a rank writes it: its pid (node/gate.py)
    assert not pool.ranks_exited(gated)  # rank 1 still exiting
    (gate / "done.1").write_text("4243\n")
    assert pool.ranks_exited(gated)
    pool.release(gated)
    pool.place_waiting(launch)
    assert launched == ["mpi", "s1", "s2"]


def test_a_gated_step_that_ends_before_its_gate_opens_gives_its_nodes_back(
        tmp_path: Path) -> None:
    alloc = AllocationState(job_id="7", nodelist="a[1-2]", nodes=2, gpus_per_node=4)
    pool = AgentPool(LocalShell(), alloc)
    launched: list[str] = []
    gated = pool.add("mpi", make_spec(tmp_path, "mpi", 2), warm=False, gated=True)
    other = pool.add("mpi2", make_spec(tmp_path, "mpi2", 2), warm=False, gated=True)
    pool.place_waiting(lambda job_id, job: launched.append(job_id))
    assert launched == ["mpi"]  # one early launch per node: its ranks hold memory there
    pool.drop(gated)
    pool.place_waiting(lambda job_id, job: launched.append(job_id))
    assert launched == ["mpi", "mpi2"] and other.reserved


def test_a_batch_that_held_two_nodes_ends_naming_both(tmp_path: Path) -> None:
    """A 2-node batch run as one process (``launch=single``) holds both nodes' GPUs: its
    state names both (the timeline lays it on both nodes' tracks, the GPU-use summary counts
    them), and the reason names the node its process ran on."""
    alloc = AllocationState(job_id="7", nodelist="a[1-2]", nodes=2, gpus_per_node=4)
    pool = AgentPool(LocalShell(), alloc)
    job = pool.add("wide", make_spec(tmp_path, "wide", 2), warm=False)
    pool.place_waiting(lambda job_id, job: None)
    assert job.placement is not None and len(job.placement.nodes) == 2
    ran_on = job.placement.nodes[0]
    done = pool._end_state(job, 0, ran_on)
    assert expand_hostlist(done.nodelist or "") == ["a1", "a2"]
    crashed = pool._end_state(job, 128 + 11, ran_on)
    assert expand_hostlist(crashed.nodelist or "") == ["a1", "a2"]
    assert f"on {ran_on.name}" in (crashed.reason or "")
