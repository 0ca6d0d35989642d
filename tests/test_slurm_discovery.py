"""Slurm discovery: the pure parsers on captured output, then discovery and
``trtllm-slurm env`` against the REAL dev cluster (tests/cluster/up; never mocked)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import pytest_trtllm_slurm.cli.main as cli
from pytest_trtllm_slurm.execution.slurm.client import SlurmClient
from pytest_trtllm_slurm.execution.slurm.parse import (
    expand_hostlist,
    parse_accounts,
    parse_gres,
    parse_key_values,
    parse_mpi_list,
    parse_nodes,
    parse_records,
    parse_scontrol_config,
    parse_version,
    partitions_from_records,
)
from pytest_trtllm_slurm.transport.shell import CommandResult, LocalShell

# --------------------------------------------------------------------------- captured output
# Captured from the dev cluster (Slurm 22.05.8); trimmed to the fields that matter.

PARTITIONS_OUT = """\
PartitionName=batch AllowGroups=ALL Default=YES QoS=N/A MaxTime=UNLIMITED Nodes=n[1-2] State=UP TotalNodes=2 TRES=cpu=8,mem=8000M,node=2,billing=8,gres/gpu=8,gres/gpu:h200=8
PartitionName=gb200 AllowGroups=ALL Default=NO QoS=N/A MaxTime=08:00:00 Nodes=g[1-2] State=UP TotalNodes=2 TRES=cpu=8,mem=8000M,node=2,billing=8,gres/gpu=8,gres/gpu:gb200=8
PartitionName=cpu AllowGroups=ALL Default=NO MaxTime=1-00:00:00 Nodes=c1 State=DOWN TotalNodes=1
"""  # noqa: E501
NODES_OUT = """\
NodeName=g1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 AvailableFeatures=aarch64 ActiveFeatures=aarch64 Gres=gpu:gb200:4 NodeAddr=127.0.0.1 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000 State=IDLE Partitions=gb200  CfgTRES=cpu=4,mem=4000M,gres/gpu=4 AllocTRES= CapWatts=n/a
NodeName=g2 Arch=x86_64 AvailableFeatures=aarch64 ActiveFeatures=aarch64 Gres=gpu:gb200:4 State=IDLE Partitions=gb200
NodeName=n1 Arch=x86_64 AvailableFeatures=x86_64 ActiveFeatures=x86_64 Gres=gpu:h200:4(S:0-1) State=MIXED Partitions=batch,debug
NodeName=n2 Arch=x86_64 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h200:4 State=IDLE+DRAIN Partitions=batch
NodeName=c1 Arch=aarch64 AvailableFeatures=(null) Gres=(null) State=DOWN* Partitions=cpu
"""  # noqa: E501
MPI_22 = """\
MPI plugin types are...
\tpmix
\tnone
\tcray_shasta
\tpmi2
specific pmix plugin versions available: pmix_v4
"""
MPI_OLD = "srun: MPI types are...\nsrun: none\nsrun: pmi2\nsrun: pmix\nsrun: pmix_v3\n"
MPI_MANY = MPI_22.replace("pmix_v4", "pmix_v3,pmix_v5")
MPI_NO_PMIX = "MPI plugin types are...\n\tnone\n\tpmi2\n"


def test_parse_key_values_keeps_spaces_and_inner_equals() -> None:
    rec = parse_key_values(NODES_OUT.splitlines()[0])
    assert rec["OS"] == "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["CfgTRES"] == "cpu=4,mem=4000M,gres/gpu=4"
    assert rec["AllocTRES"] == ""
    assert rec["Gres"] == "gpu:gb200:4"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("n[1-2]", ["n1", "n2"]),
        ("n[1-2],g1", ["n1", "n2", "g1"]),
        ("x[01-03,7]", ["x01", "x02", "x03", "x7"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("node009", ["node009"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(expr: str, expected: list[str]) -> None:
    assert expand_hostlist(expr) == expected


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:h200:4", ("h200", 4)),
        ("gpu:h200:4(S:0-1)", ("h200", 4)),
        ("gpu:8", (None, 8)),
        ("gpu:a100:4(S:0),gpu:a30:2(S:1),nic:2", ("a100", 6)),
        ("nic:2", (None, 0)),
        ("gpu:h100", ("h100", 1)),
        ("(null)", (None, 0)),
        (None, (None, 0)),
    ],
)
def test_parse_gres(gres: str | None, expected: tuple[str | None, int]) -> None:
    assert parse_gres(gres) == expected


def test_parse_nodes() -> None:
    nodes = {n.name: n for n in parse_nodes(NODES_OUT)}
    assert nodes["g1"].arch == "aarch64"  # the Feature wins over Arch (dev cluster labels)
    assert nodes["n1"].arch == "x86_64"
    assert nodes["n2"].arch == "x86_64"  # no arch Feature: the node's Arch
    assert nodes["c1"].arch == "aarch64"
    assert (nodes["n1"].gpu_type, nodes["n1"].gpus) == ("h200", 4)
    assert nodes["n1"].partitions == ["batch", "debug"]
    assert (nodes["c1"].gres, nodes["c1"].gpus, nodes["c1"].features) == (None, 0, [])


def test_parse_partitions() -> None:
    parts = {p.name: p for p in partitions_from_records(parse_records(PARTITIONS_OUT), parse_nodes(NODES_OUT))}
    batch, gb, cpu = parts["batch"], parts["gb200"], parts["cpu"]
    assert (batch.default, batch.state, batch.time_limit) == (True, "up", "UNLIMITED")
    assert batch.nodes == ["n1", "n2"]
    assert (batch.arch, batch.gres, batch.gpu_type, batch.gpus_per_node) == (
        "x86_64", "gpu:h200:4(S:0-1)", "h200", 4)
    assert batch.requires_gres is True
    assert (gb.arch, gb.gpu_type, gb.gpus_per_node, gb.time_limit) == (
        "aarch64", "gb200", 4, "08:00:00")
    assert (cpu.state, cpu.gpus_per_node, cpu.requires_gres, cpu.gres, cpu.arch) == (
        "down", 0, False, None, "aarch64")


def test_parse_partitions_without_node_info() -> None:
    batch = partitions_from_records(parse_records(PARTITIONS_OUT))[0]
    assert (batch.nodes, batch.gpus_per_node, batch.arch) == (["n1", "n2"], 0, None)


@pytest.mark.parametrize(
    ("text", "available", "preferred"),
    [
        (MPI_22, ["pmix", "none", "cray_shasta", "pmi2", "pmix_v4"], "pmix_v4"),
        (MPI_OLD, ["none", "pmi2", "pmix", "pmix_v3"], "pmix_v3"),
        (MPI_MANY, ["pmix", "none", "cray_shasta", "pmi2", "pmix_v3", "pmix_v5"], "pmix_v5"),
        (MPI_NO_PMIX, ["none", "pmi2"], "pmi2"),
        ("MPI plugin types are...\n\tnone\n", ["none"], None),
        ("", [], None),
    ],
)
def test_parse_mpi_list(text: str, available: list[str], preferred: str | None) -> None:
    info = parse_mpi_list(text)
    assert (info.available, info.preferred) == (available, preferred)


def test_parse_accounts() -> None:
    out = "root|acct_a|devcluster|acct_a\nroot|acct_a|devcluster|acct_b\nroot|acct_a|other|acct_z\n"
    assert parse_accounts(out, "devcluster") == ("acct_a", ["acct_a", "acct_b"])
    assert parse_accounts(out, None) == ("acct_a", ["acct_a", "acct_b", "acct_z"])
    assert parse_accounts("", "devcluster") == (None, [])


def test_parse_config_and_version() -> None:
    conf = "Configuration data as of 2026-11-29T11:03:59\nClusterName             = devcluster\n"
    assert parse_scontrol_config(conf)["ClusterName"] == "devcluster"
    assert parse_version("slurm-wlm 22.05.8\n") == "22.05.8"
    assert parse_version("slurm 23.11.4-1\n") == "23.11.4-1"
    assert parse_version("") is None


# --------------------------------------------------------------------------- the real cluster


def test_discover_dev_cluster(devcluster: dict) -> None:
    env = SlurmClient(LocalShell()).discover()
    assert env.errors == []
    assert env.cluster_name == devcluster["cluster_name"] == "devcluster"
    assert env.user == "root"
    assert env.default_account == "acct_a"
    assert {"acct_a", "acct_b"} <= set(env.accounts)
    assert env.slurm_version and env.slurm_version.startswith("22.05")
    assert env.default_partition == "batch"
    names = [p.name for p in env.partitions]
    assert {"batch", "gb200"} <= set(names)
    for want in devcluster["partitions"]:
        part = env.partition_named(want["name"])
        assert part is not None, names
        assert part.nodes == want["nodes"]
        assert part.arch == want["arch"]
        assert part.gpu_type == want["gpu_type"]
        assert part.gpus_per_node == want["gpus_per_node"] == 4
        assert part.gres == f"gpu:{want['gpu_type']}:4"
        assert part.requires_gres is True
        assert part.state == "up"
        assert part.default is want["default"]
    assert (env.partition_named("batch").arch, env.partition_named("gb200").arch) == ("x86_64", "aarch64")
    assert "pmi2" in env.pmix.available
    assert env.pmix.preferred is not None
    assert env.pmix.preferred.startswith("pmix") or env.pmix.preferred == "pmi2"
    if any(a.startswith("pmix") for a in env.pmix.available):
        assert env.pmix.preferred.startswith("pmix")


def test_discover_only_some_partitions(devcluster: dict) -> None:
    env = SlurmClient(LocalShell()).discover(["gb200"])
    assert env.errors == []
    assert [p.name for p in env.partitions] == ["gb200"]
    assert env.partitions[0].gpus_per_node == 4
    assert env.default_partition == "batch"  # still reported: it is the cluster's default


def test_discover_unknown_partition_is_a_partial_result(devcluster: dict) -> None:
    env = SlurmClient(LocalShell()).discover(["gb200", "nosuch"])
    assert [p.name for p in env.partitions] == ["gb200"]
    assert len(env.errors) == 1
    assert "nosuch not found" in env.errors[0] and "batch" in env.errors[0]


def test_parsers_match_scontrol_on_the_real_cluster(devcluster: dict) -> None:
    """expand_hostlist agrees with `scontrol show hostnames`; parse_nodes sees every node."""
    for expr in ("n[1-2],g[1-2]", "x[01-03,7]", "r[1-2]-n[1-2]", "gpu[098-101]"):
        real = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True,
                              text=True, check=True, timeout=30).stdout.split()
        assert expand_hostlist(expr) == real, expr
    out = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    nodes = {n.name: n for n in parse_nodes(out)}
    for part in devcluster["partitions"]:
        for name in part["nodes"]:
            assert nodes[name].gpus == part["gpus_per_node"]
            assert nodes[name].partitions == [part["name"]]


@dataclass
class RunAsShell:
    """A Shell that runs every command as another Unix user (like an SSH login would)."""

    user: str
    name: str = "runuser"

    def run(self, argv: list[str], *, timeout: float | None = 60, **kw: object) -> CommandResult:
        res = LocalShell().run(["runuser", "-u", self.user, "--", *argv], timeout=timeout)
        return CommandResult(tuple(argv), res.returncode, res.stdout, res.stderr, res.timed_out)


def test_discover_through_another_shell_as_another_user(devcluster: dict) -> None:
    """Discovery only uses the Shell: as testuser it sees testuser's associations."""
    assert "testuser" in devcluster["users"]
    env = SlurmClient(RunAsShell("testuser")).discover()  # type: ignore[arg-type]
    assert env.errors == []
    assert env.user == "testuser"
    assert env.accounts == devcluster["users"]["testuser"]["accounts"] == ["acct_b"]
    assert env.default_account == "acct_b"


def test_client_cluster_name_and_tools(devcluster: dict) -> None:
    client = SlurmClient(LocalShell())
    assert client.tools_found() is True
    assert client.cluster_name() == "devcluster"


# --------------------------------------------------------------------------- the CLI


def test_cli_env_json(devcluster: dict) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "env", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert doc["local"]["slurm_available"] is True
    assert doc["local"]["cluster_name"] == "devcluster"
    slurm = doc["slurm"]
    assert slurm["errors"] == []
    assert slurm["default_account"] == "acct_a"
    parts = {p["name"]: p for p in slurm["partitions"]}
    assert parts["gb200"]["arch"] == "aarch64" and parts["gb200"]["gpus_per_node"] == 4
    assert parts["batch"]["gpu_type"] == "h200"
    assert slurm["pmix"]["preferred"]


def test_cli_env_text_and_partitions(devcluster: dict, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["env", "--partitions", "gb200", "--cluster", "DEVCLUSTER"]) == 0
    out = capsys.readouterr().out
    assert "gb200" in out and "4 x gb200 per node" in out and "arch aarch64" in out
    assert "accounts: acct_a" in out


def test_cli_env_partial_exit_2(devcluster: dict, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["env", "--format", "json", "--partitions", "nosuch"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert any("nosuch not found" in e for e in doc["slurm"]["errors"])


def test_cli_env_unknown_cluster(devcluster: dict, capsys: pytest.CaptureFixture,
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["env", "--cluster", "eos"]) == 4
    err = capsys.readouterr().err
    assert "--cluster eos: not the local Slurm cluster (devcluster)" in err
    assert "unknown cluster 'eos'" in err


def test_cli_env_remote_cluster_over_ssh(devcluster: dict, capsys: pytest.CaptureFixture,
                                         tmp_path: Path) -> None:
    """A [clusters.NAME] with ssh_host: the same discovery, over SSH (the dev cluster's sshd)."""
    ssh = devcluster["ssh"]
    config = tmp_path / "clusters.toml"
    config.write_text(
        "[clusters.far]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        "mfa = false\n"
    )
    assert cli.main(["env", "--cluster", "far", "--config", str(config), "--format",
                     "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    parts = {p["name"]: p for p in doc["slurm"]["partitions"]}
    assert (parts["batch"]["gpus_per_node"], parts["batch"]["gpu_type"]) == (4, "h200")
    assert doc["slurm"]["cluster_name"] == "devcluster" and doc["slurm"]["accounts"]
    assert cli.main(["env", "--cluster", "far", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Cluster far over SSH (127.0.0.1):")
    assert "4 x gb200 per node" in out and "This machine" not in out


def test_cli_env_no_slurm_tools_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no sinfo, no scontrol
    assert cli.main(["env", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["slurm"] is None
    assert doc["local"]["slurm_available"] is False
