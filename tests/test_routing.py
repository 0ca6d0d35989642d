"""Table test of routing.route: one row per rule (and per edge of a rule), each with an id."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.planning.models import DeviceRequirement, LocalEnv, RouteDecision, Scenario
from pytest_trtllm_slurm.planning.routing import route
from pytest_trtllm_slurm.planning.settings import ClusterConfig, ClustersFile, Settings

D, K, S, R = (
    Scenario.LOCAL_DIRECT,
    Scenario.LOCAL_DOCKER,
    Scenario.LOCAL_SLURM,
    Scenario.REMOTE_SLURM,
)

# ----------------------------------------------------------------------------- environments

LAPTOP = LocalEnv(notes=["gpu: nvidia-smi not found on PATH", "slurm: scontrol not found"])
H200_BOX = LocalEnv(gpu_count=8, device_type="H200", gpu_memory_mib=143771)
H200_BOX_DOCKER = H200_BOX.model_copy(update={"container_engine": "docker"})
H200_BOX_NOTES = H200_BOX.model_copy(update={"notes": ["container: docker not found on PATH"]})
LOGIN = LocalEnv(slurm_available=True, cluster_name="devcluster")  # dev cluster login node

DEV_ENV = SlurmEnv(
    cluster_name="devcluster",
    default_partition="batch",
    accounts=["acct_a", "acct_b"],
    default_account="acct_a",
    partitions=[
        PartitionInfo(name="batch", nodes=["n1", "n2"], arch="x86_64", gres="gpu:h200:4",
                      gpu_type="h200", gpus_per_node=4, requires_gres=True, default=True),
        PartitionInfo(name="gb200", nodes=["g1", "g2"], arch="aarch64", gres="gpu:gb200:4",
                      gpu_type="gb200", gpus_per_node=4, requires_gres=True),
    ],
)
CPU_ONLY_ENV = SlurmEnv(
    cluster_name="devcluster",
    default_partition="cpu",
    partitions=[PartitionInfo(name="cpu", nodes=["c1"], gpus_per_node=0)],
)


def clusters(**tables: dict[str, Any]) -> ClustersFile:
    return ClustersFile(
        path="/x/trtllm-slurm.toml",
        clusters={n: ClusterConfig(name=n, **t) for n, t in tables.items()},
    )


EOS = {"ssh_host": "eos", "device_type": "H100", "gpus_per_node": 8, "partition": "batch"}
GBX = {"ssh_host": "gbx", "device_type": "GB200", "gpus_per_node": 4, "account": "acct_x"}
H200_A = {"ssh_host": "a", "device_type": "H200", "gpus_per_node": 8}
H200_B = {"ssh_host": "b", "device_type": "H200", "gpus_per_node": 8}
NO_CLUSTERS = ClustersFile()
TWO_REMOTE = clusters(eos=EOS, gbx=GBX)


def need(total: int, per_node: int | None = None, **kw: Any) -> DeviceRequirement:
    if per_node is None and "spans" not in kw:
        per_node = total or None
    kw.pop("spans", None)
    return DeviceRequirement(total=total, per_node=per_node, **kw)


@dataclass
class Row:
    id: str
    req: DeviceRequirement
    local: LocalEnv
    settings: dict[str, Any] = field(default_factory=dict)
    clusters: ClustersFile = field(default_factory=ClustersFile)
    slurm_env: SlurmEnv | None = None
    pinned_local: bool = False
    partition: str | None = None
    # expectations: either ``expect`` fields, ``error`` (regex), or ``reason`` (substrings)
    expect: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reason: tuple[str, ...] = ()


ROWS = [
    # -- rule 1: pinned local -------------------------------------------------------------
    Row("pinned-local-runs-here-even-if-too-big", need(8), LAPTOP, pinned_local=True,
        expect={"scenario": D, "dispatched": False}),
    Row("pinned-local-beats-forced-scenario", need(1), LOGIN, pinned_local=True,
        settings={"scenario": "local_slurm"}, slurm_env=DEV_ENV,
        expect={"scenario": D, "dispatched": False}),
    # -- rule 2: forced scenario ----------------------------------------------------------
    Row("forced-direct-allowed-when-too-big", need(8), LAPTOP,
        settings={"scenario": "local_direct"}, expect={"scenario": D, "dispatched": False}),
    Row("forced-direct-dispatch-all-subprocess", need(1), H200_BOX,
        settings={"scenario": "local_direct", "dispatch": "all"},
        expect={"scenario": D, "dispatched": True}),
    Row("forced-docker-needs-engine", need(1), H200_BOX_NOTES,
        settings={"scenario": "local_docker"},
        error=r"local_docker: no container engine.*docker not found"),
    Row("forced-docker-with-engine", need(1), H200_BOX_DOCKER,
        settings={"scenario": "local_docker"}, expect={"scenario": K, "dispatched": True}),
    Row("forced-slurm-needs-slurm", need(1), LAPTOP, settings={"scenario": "local_slurm"},
        error=r"local_slurm: no local Slurm.*scontrol not found"),
    Row("forced-slurm-even-if-satisfied-here", need(1), H200_BOX.model_copy(
        update={"slurm_available": True, "cluster_name": "devcluster"}),
        settings={"scenario": "local_slurm"}, slurm_env=DEV_ENV,
        expect={"scenario": S, "partition": "batch", "target_gpus_per_node": 4}),
    Row("forced-slurm-conflicting-cluster", need(1), LOGIN, slurm_env=DEV_ENV,
        settings={"scenario": "local_slurm", "slurm_cluster": "eos"},
        clusters=TWO_REMOTE, error=r"conflicts with --slurm-cluster eos"),
    Row("forced-remote-named", need(1), H200_BOX,
        settings={"scenario": "remote_slurm", "slurm_cluster": "gbx"}, clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "gbx", "account": "acct_x"}),
    Row("forced-remote-only-one-configured", need(1), H200_BOX,
        settings={"scenario": "remote_slurm"}, clusters=clusters(eos=EOS),
        expect={"scenario": R, "cluster": "eos"}),
    Row("forced-remote-ambiguous", need(1), H200_BOX, settings={"scenario": "remote_slurm"},
        clusters=TWO_REMOTE, error=r"needs a cluster: pass --slurm-cluster.*eos.*gbx"),
    # -- rule 3: CPU-only tests -----------------------------------------------------------
    Row("cpu-test-runs-here-despite-cluster", need(0), LAPTOP,
        settings={"slurm_cluster": "eos"}, clusters=TWO_REMOTE,
        expect={"scenario": D, "dispatched": False}),
    Row("cpu-test-runs-here-despite-device-type", need(0), LAPTOP,
        settings={"device_type": "GB200"}, expect={"scenario": D, "dispatched": False}),
    Row("cpu-test-dispatch-all-goes-to-cluster", need(0), LAPTOP,
        settings={"slurm_cluster": "eos", "dispatch": "all"}, clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "eos", "partition": "batch"}),
    Row("cpu-test-dispatch-all-local-slurm-default-partition", need(0), LOGIN,
        settings={"slurm_cluster": "devcluster", "dispatch": "all"}, slurm_env=DEV_ENV,
        expect={"scenario": S, "partition": "batch"}),
    # -- rule 4: --slurm-cluster ----------------------------------------------------------
    Row("cluster-is-local-case-insensitive", need(2), LOGIN,
        settings={"slurm_cluster": "DevCluster"}, slurm_env=DEV_ENV,
        expect={"scenario": S, "cluster": "devcluster", "partition": "batch",
                "target_gpus_per_node": 4}),
    Row("cluster-is-local-even-when-satisfied-here", need(1), H200_BOX.model_copy(
        update={"slurm_available": True, "cluster_name": "devcluster"}),
        settings={"slurm_cluster": "devcluster"}, slurm_env=DEV_ENV,
        expect={"scenario": S, "partition": "batch"}),
    Row("cluster-named-remote", need(4), H200_BOX, settings={"slurm_cluster": "eos"},
        clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "eos", "partition": "batch",
                "target_gpus_per_node": 8, "dispatched": True}),
    Row("cluster-named-remote-case-insensitive", need(4), LAPTOP,
        settings={"slurm_cluster": "EOS"}, clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "eos"}),
    Row("cluster-named-remote-explicit-partition", need(4), LAPTOP,
        settings={"slurm_cluster": "eos"}, partition="interactive", clusters=TWO_REMOTE,
        expect={"scenario": R, "partition": "interactive"}),
    Row("cluster-unknown-lists-known", need(1), LAPTOP, settings={"slurm_cluster": "nope"},
        clusters=TWO_REMOTE, error=r"unknown cluster 'nope'.*eos, gbx"),
    Row("cluster-named-remote-too-few-per-node", need(16, 16), LAPTOP,
        settings={"slurm_cluster": "eos"}, clusters=TWO_REMOTE,
        reason=("needs 16 GPUs", "cluster 'eos'", "--slurm-cluster NAME")),
    Row("cluster-named-remote-spanning-fits", need(16, spans=True), LAPTOP,
        settings={"slurm_cluster": "eos"}, clusters=TWO_REMOTE,
        expect={"scenario": R, "target_gpus_per_node": 8}),
    # -- rule 5: satisfied here -----------------------------------------------------------
    Row("here-direct-in-process", need(4), H200_BOX, expect={"scenario": D, "dispatched": False}),
    Row("here-direct-dispatch-all", need(4), H200_BOX, settings={"dispatch": "all"},
        expect={"scenario": D, "dispatched": True}),
    Row("here-docker-when-image-and-engine", need(4), H200_BOX_DOCKER,
        settings={"container_image": "reg.example/ns/img:1"},
        expect={"scenario": K, "dispatched": True}),
    Row("here-direct-when-image-but-no-engine", need(4), H200_BOX,
        settings={"container_image": "reg.example/ns/img:1"},
        expect={"scenario": D, "dispatched": False}),
    Row("here-direct-when-engine-but-no-image", need(4), H200_BOX_DOCKER,
        expect={"scenario": D, "dispatched": False}),
    Row("here-device-type-matches-option", need(8), H200_BOX, settings={"device_type": "h200"},
        expect={"scenario": D}),
    Row("here-device-type-matches-marker", need(8, device_type="NVIDIA H200"), H200_BOX,
        expect={"scenario": D}),
    Row("here-spanning-test-fits-one-node", need(8, spans=True), H200_BOX,
        expect={"scenario": D, "dispatched": False}),
    Row("here-too-few-gpus-nothing-else", need(16, spans=True), H200_BOX,
        reason=("needs 16 GPUs", "8 H200 GPUs here", "no local Slurm",
                "configured clusters: none", "--slurm-cluster NAME / --slurm-partition")),
    Row("here-too-little-memory", need(1, device_memory_mib=200_000), H200_BOX,
        reason=(">= 200000 MiB", "nothing configured can serve it")),
    # -- rule 6: local Slurm --------------------------------------------------------------
    Row("slurm-default-partition", need(2), LOGIN, slurm_env=DEV_ENV,
        expect={"scenario": S, "cluster": "devcluster", "partition": "batch",
                "target_gpus_per_node": 4, "dispatched": True}),
    Row("slurm-marker-partition", need(2), LOGIN, slurm_env=DEV_ENV, partition="gb200",
        expect={"scenario": S, "partition": "gb200"}),
    Row("slurm-option-partition", need(2), LOGIN, slurm_env=DEV_ENV,
        settings={"partition": "gb200"}, expect={"scenario": S, "partition": "gb200"}),
    Row("slurm-marker-partition-beats-option", need(2), LOGIN, slurm_env=DEV_ENV,
        settings={"partition": "batch"}, partition="gb200",
        expect={"scenario": S, "partition": "gb200"}),
    Row("slurm-cluster-file-partition", need(2), LOGIN, slurm_env=DEV_ENV,
        clusters=clusters(devcluster={"partition": "gb200", "account": "acct_b"}),
        expect={"scenario": S, "partition": "gb200", "account": "acct_b"}),
    Row("slurm-explicit-beats-cluster-file", need(2), LOGIN, slurm_env=DEV_ENV,
        partition="batch", clusters=clusters(devcluster={"partition": "gb200"}),
        expect={"scenario": S, "partition": "batch"}),
    Row("slurm-gpu-type-picks-partition", need(4, device_type="GB200"), LOGIN,
        slurm_env=DEV_ENV, expect={"scenario": S, "partition": "gb200"}),
    Row("slurm-option-device-type-picks-partition", need(4), LOGIN, slurm_env=DEV_ENV,
        settings={"device_type": "gb200"}, clusters=TWO_REMOTE,
        expect={"scenario": S, "partition": "gb200"}),
    Row("slurm-spanning-two-nodes", need(8, spans=True), LOGIN, slurm_env=DEV_ENV,
        expect={"scenario": S, "partition": "batch", "target_gpus_per_node": 4}),
    Row("slurm-skip-less-device-too-big", need(8, 8), LOGIN, slurm_env=DEV_ENV,
        reason=("needs 8 GPUs (8 per node", "no partition of the local Slurm",
                "batch (4x h200 per node, 2 nodes)", "gb200 (4x gb200 per node, 2 nodes)",
                "--slurm-cluster NAME")),
    Row("slurm-spanning-more-nodes-than-exist", need(16, spans=True), LOGIN,
        slurm_env=DEV_ENV, reason=("needs 16 GPUs", "no partition of the local Slurm")),
    Row("slurm-explicit-partition-too-small", need(8, 8), LOGIN, slurm_env=DEV_ENV,
        partition="gb200", clusters=clusters(eos=EOS),
        reason=("partition 'gb200' cannot serve it",)),
    Row("slurm-explicit-partition-wrong-type", need(4, device_type="H200"), LOGIN,
        slurm_env=DEV_ENV, partition="gb200", reason=("partition 'gb200' cannot",)),
    Row("slurm-unknown-partition-lists-valid", need(1), LOGIN, slurm_env=DEV_ENV,
        partition="nosuch", error=r"'nosuch'.*valid partitions: batch, gb200"),
    Row("slurm-cpu-only-cluster", need(1), LOGIN, slurm_env=CPU_ONLY_ENV,
        reason=("needs 1 GPU ", "cpu (0x GPU per node, 1 nodes)")),
    Row("slurm-not-discovered-uses-explicit", need(2), LOGIN, partition="batch",
        expect={"scenario": S, "partition": "batch", "target_gpus_per_node": None}),
    Row("slurm-miss-then-one-remote-fits", need(8, 8), LOGIN, slurm_env=DEV_ENV,
        clusters=clusters(eos=EOS), expect={"scenario": R, "cluster": "eos"}),
    Row("slurm-local-cluster-entry-not-a-remote-candidate", need(8, 8), LOGIN,
        slurm_env=DEV_ENV, clusters=clusters(devcluster={"gpus_per_node": 8}),
        reason=("no partition of the local Slurm",)),
    # -- rule 7: device type not here -----------------------------------------------------
    Row("type-auto-selects-remote", need(4), H200_BOX, settings={"device_type": "GB200"},
        clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "gbx", "target_gpus_per_node": 4,
                "account": "acct_x"}),
    Row("type-marker-auto-selects-remote", need(4, device_type="H100"), LAPTOP,
        clusters=TWO_REMOTE, expect={"scenario": R, "cluster": "eos"}),
    Row("type-no-cluster-offers-it", need(4), H200_BOX, settings={"device_type": "B200"},
        clusters=TWO_REMOTE,
        error=r"device type B200.*eos \(H100, 8 GPUs per node\).*--slurm-cluster NAME"),
    Row("type-no-clusters-at-all", need(4), LAPTOP, settings={"device_type": "B200"},
        error=r"no configured cluster has device_type = 'B200'; clusters: none"),
    Row("type-several-clusters", need(4), LAPTOP, settings={"device_type": "H200"},
        clusters=clusters(a=H200_A, b=H200_B),
        error=r"several configured clusters.*a \(H200.*b \(H200.*--slurm-cluster NAME"),
    Row("type-only-one-fits-per-node", need(8, 8), LAPTOP, settings={"device_type": "H200"},
        clusters=clusters(a=H200_A, small={**H200_B, "gpus_per_node": 4}),
        expect={"scenario": R, "cluster": "a"}),
    Row("type-clusters-too-small", need(16, 16), LAPTOP, settings={"device_type": "GB200"},
        clusters=TWO_REMOTE, reason=("needs 16 GPUs", "no GB200 cluster", "gbx")),
    Row("type-login-node-without-that-type", need(4), LOGIN, slurm_env=DEV_ENV,
        settings={"device_type": "H100"}, clusters=TWO_REMOTE,
        expect={"scenario": R, "cluster": "eos"}),
    Row("type-in-local-slurm-but-too-big-stays-unsatisfied", need(8, 8), LOGIN,
        slurm_env=DEV_ENV, settings={"device_type": "GB200"},
        reason=("no partition of the local Slurm",)),
    # -- rule 8: remote auto / unsatisfied ------------------------------------------------
    Row("auto-one-remote-cluster", need(2), LAPTOP,
        clusters=clusters(only={"ssh_host": "only"}),
        expect={"scenario": R, "cluster": "only", "target_gpus_per_node": None}),
    Row("auto-several-remote-clusters", need(2), LAPTOP, clusters=TWO_REMOTE,
        reason=("several configured clusters could", "eos", "gbx")),
    Row("auto-nothing", need(2), LAPTOP,
        reason=("needs 2 GPUs (2 per node, from default)", "available: 0 GPUs here",
                "no local Slurm", "--slurm-cluster NAME / --slurm-partition")),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_route(row: Row) -> None:
    call = lambda: route(  # noqa: E731
        row.req,
        settings=Settings(**row.settings),
        local=row.local,
        clusters=row.clusters,
        slurm_env=row.slurm_env,
        pinned_local=row.pinned_local,
        partition=row.partition,
    )
    if row.error:
        with pytest.raises(ConfigError, match=row.error):
            call()
        return
    decision = call()
    if row.reason:
        assert decision.scenario is None, decision
        for text in row.reason:
            assert text in (decision.reason or ""), (text, decision.reason)
        return
    assert row.expect, "a row needs an expectation"
    assert decision.reason is None
    for key, value in row.expect.items():
        assert getattr(decision, key) == value, (key, decision)


def test_row_ids_unique() -> None:
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))


# ----------------------------------------------------------------------------- properties

_parts = st.builds(
    lambda i, gpus, n, t: PartitionInfo(
        name=f"p{i}", gpus_per_node=gpus, nodes=[f"x{i}-{k}" for k in range(n)],
        gpu_type=t if gpus else None,
    ),
    st.integers(0, 5), st.sampled_from([0, 1, 2, 4, 8]), st.integers(1, 4),
    st.sampled_from(["h200", "gb200", None]),
)


@settings(max_examples=300, deadline=None, database=None)
@given(
    total=st.integers(0, 40),
    fixed=st.booleans(),
    dtype=st.sampled_from([None, "H200", "GB200"]),
    parts=st.lists(_parts, min_size=1, max_size=4, unique_by=lambda p: p.name),
)
def test_local_slurm_decision_always_fits(
    total: int, fixed: bool, dtype: str | None, parts: list[PartitionInfo]
) -> None:
    """Whatever the partitions, a local_slurm decision names a partition that can serve it."""
    per_node = min(total, 8) if (fixed and total) else None
    req = DeviceRequirement(total=total, per_node=per_node, device_type=dtype)
    env = SlurmEnv(partitions=parts, default_partition=parts[0].name)
    try:
        d: RouteDecision = route(req, settings=Settings(dispatch="all"), local=LOGIN,
                                 clusters=NO_CLUSTERS, slurm_env=env)
    except ConfigError as exc:  # a wanted type that no partition and no cluster offers
        assert dtype and "no configured cluster has device_type" in str(exc)
        assert not any((p.gpu_type or "").upper() == dtype for p in parts)
        return
    if total == 0:  # a CPU test: this machine serves it (in a subprocess: dispatch=all)
        assert (d.scenario, d.dispatched) == (D, True)
        return
    if d.scenario is None:
        assert d.reason and "--slurm-cluster" in d.reason
        return
    assert d.scenario is S
    part = env.partition_named(d.partition)
    assert part is not None
    if total:
        assert part.gpus_per_node >= req.resolve_per_node(part.gpus_per_node)
        assert req.nodes(part.gpus_per_node) <= len(part.nodes)
        if dtype and part.gpu_type:
            assert part.gpu_type.upper() == dtype
