"""execution.factory: the one place executors are built, for the plugin and for cases.

Real executors (nothing is submitted: building one runs no scheduler command); both
contexts -- the plugin's RunContext and ``trtllm-slurm run``'s CaseContext (a RunContext too) -- go
through the same builders and get the same executors.
"""

from __future__ import annotations

from pathlib import Path

from pytest_trtllm_slurm.cases.run import CaseContext, close_executors, executor_for
from pytest_trtllm_slurm.execution.context import RunContext
from pytest_trtllm_slurm.execution.factory import (
    build_executor,
    build_executors,
    build_targets,
)
from pytest_trtllm_slurm.execution.local.direct import DirectExecutor
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor
from pytest_trtllm_slurm.planning.batching import BatchKey
from pytest_trtllm_slurm.planning.jobspec import JobSpec, PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import LocalEnv, Scenario
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings

LOCAL = LocalEnv(gpu_count=2, cluster_name="devcluster", slurm_available=True)
ENV = SlurmEnv(user="me", partitions=[PartitionInfo(name="batch", gpu_type="h200",
                                                     gpus_per_node=4)])


def clusters() -> ClustersFile:
    return ClustersFile(clusters={
        "DevCluster": ClusterConfig.model_validate(
            {"name": "DevCluster", "container_runtime": "podman", "build_project": True}),
        "far": ClusterConfig.model_validate({"name": "far", "ssh_host": "far.example"}),
        "other": ClusterConfig.model_validate({"name": "other", "ssh_host": "o.example"}),
    })


def contexts(tmp_path: Path, **settings: object) -> list[RunContext | CaseContext]:
    common = {"settings": Settings.model_validate(settings), "local": LOCAL,
              "clusters": clusters(), "slurm_env": ENV, "rootdir": tmp_path}
    return [RunContext(**common), CaseContext(**common)]  # type: ignore[arg-type]


def spec(tmp_path: Path, scenario: Scenario) -> JobSpec:
    return JobSpec(scenario=scenario, name="c", job_name="trtllm.c", rootdir=str(tmp_path),
                   work_dir=str(tmp_path / "w"), log_path=str(tmp_path / "w" / "c.log"),
                   reports_path=str(tmp_path / "w" / "reports.jsonl"), partition="batch",
                   total_devices=1, devices_per_node=1)


def test_both_callers_get_the_same_executors(tmp_path: Path) -> None:
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", total_devices=4,
                     devices_per_node=4)]
    for ctx in contexts(tmp_path, persistent=False, negotiate_walltime=True):
        executors = build_executors(ctx, keys, warn=print)
        assert sorted(executors, key=str) == [Scenario.LOCAL_DIRECT, Scenario.LOCAL_SLURM]
        direct = executors[Scenario.LOCAL_DIRECT]
        assert isinstance(direct, DirectExecutor) and direct._all_gpus == [0, 1]  # the probe's
        slurm = executors[Scenario.LOCAL_SLURM]
        assert isinstance(slurm, SlurmExecutor)
        # one-shot; the local cluster's table (found by ClusterName, any case) gives podman
        assert not slurm.persistent and slurm.allocations is None
        assert slurm.launch.container_runtime == "podman" and slurm.settings.walltime is not None
        assert slurm.runs is not None and slurm.runs.folder == str(tmp_path / "work_dirs" / ".runs")


def test_a_persistent_local_slurm_gets_an_allocation_sized_for_the_batches(
        tmp_path: Path) -> None:
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", total_devices=8,
                     devices_per_node=4, node_count=2)]
    for ctx in contexts(tmp_path, warm_workers=False):
        slurm = build_executor(Scenario.LOCAL_SLURM, ctx, keys, warn=print)
        assert isinstance(slurm, SlurmExecutor) and slurm.persistent
        assert slurm.allocations is not None and slurm.allocations.request.nodes == 2
        assert slurm.allocations.agents_dir == str(tmp_path / "work_dirs" / ".agents")


def test_one_local_slurm_cluster_keeps_its_own_job_ids(tmp_path: Path) -> None:
    """Job ids are prefixed with the cluster only when a run spans several clusters
    (tests/test_multi_cluster.py); one cluster's ids stay as Slurm gives them."""
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM, partition="batch", total_devices=1,
                     devices_per_node=1)]
    for ctx in contexts(tmp_path, persistent=False):
        assert isinstance(build_executors(ctx, keys, warn=print)[Scenario.LOCAL_SLURM],
                          SlurmExecutor)


def test_build_targets_are_the_clusters_that_build(tmp_path: Path) -> None:
    keys = [BatchKey(scenario=Scenario.LOCAL_SLURM), BatchKey(scenario=Scenario.LOCAL_DIRECT),
            BatchKey(scenario=Scenario.REMOTE_SLURM, cluster="far")]
    for ctx in contexts(tmp_path):
        targets = build_targets(ctx, keys)
        assert list(targets) == [Scenario.LOCAL_SLURM]
        assert targets[Scenario.LOCAL_SLURM].name == "DevCluster"
    # a remote cluster that builds is a target of its own, keyed by its name
    builds = ClustersFile(clusters={**clusters().clusters, "far": ClusterConfig.model_validate(
        {"name": "far", "ssh_host": "far.example", "build_project": True})})
    ctx = RunContext(settings=Settings(), local=LOCAL, clusters=builds, slurm_env=ENV,
                     rootdir=tmp_path)
    assert list(build_targets(ctx, keys)) == [Scenario.LOCAL_SLURM,
                                              (Scenario.REMOTE_SLURM, "far")]


def test_a_case_builds_each_scenario_once_through_the_factory(tmp_path: Path) -> None:
    ctx = contexts(tmp_path, persistent=False)[1]
    assert isinstance(ctx, CaseContext)
    direct = executor_for(spec(tmp_path, Scenario.LOCAL_DIRECT), ctx)
    slurm = executor_for(spec(tmp_path, Scenario.LOCAL_SLURM), ctx)
    assert isinstance(direct, DirectExecutor) and isinstance(slurm, SlurmExecutor)
    assert executor_for(spec(tmp_path, Scenario.LOCAL_SLURM), ctx) is slurm
    assert set(ctx.executors) == {"local_direct", "local_slurm"}
    close_executors(ctx)
    assert ctx.executors == {}
