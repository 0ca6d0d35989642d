"""SlurmClient: discovery and the cluster's name through a Shell (local or over SSH); what
fails is recorded in ``SlurmEnv.errors`` (a partial result), never raised (parsing: ``parse``).
``cached_discovery``: a ``ttl``-second cache of it (about 0.2 s a run), never of one with
errors; keyed by cluster, user and SLURM_CONF (``work_dirs/.cache/slurm_env.json`` locally)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pytest_trtllm_slurm.execution.slurm.parse import (
    NodeInfo,
    parse_accounts,
    parse_mpi_list,
    parse_nodes,
    parse_records,
    parse_scontrol_config,
    parse_version,
    partitions_from_records,
)
from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.planning.jobspec import PartitionInfo, SlurmEnv
from pytest_trtllm_slurm.transport.shell import CommandResult, Shell

SLURM_TOOLS_MISSING = "Slurm client tools not found"


def tools_missing(result: CommandResult) -> bool:
    """True when the command itself is absent (127), not when it merely failed."""
    return result.returncode == 127 and not result.timed_out


def discover(shell: Shell, partitions: list[str] | None = None, *, timeout: float = 30) -> SlurmEnv:
    """Run the discovery commands through ``shell``; failures land in ``errors``."""
    errors: list[str] = []
    ready = _prefetch(shell, partitions, timeout)

    def call(argv: list[str]) -> CommandResult:
        return ready.pop(tuple(argv), None) or shell.run(argv, timeout=timeout)

    def run(argv: list[str], what: str) -> CommandResult | None:
        res = call(argv)
        if res.ok:
            return res
        errors.append(f"{what}: {res.describe()}")
        return None

    version_res = call(["sinfo", "--version"])
    if tools_missing(version_res):
        return SlurmEnv(errors=[f"{SLURM_TOOLS_MISSING} on {shell.name}: {version_res.describe()}"])
    version = parse_version(version_res.stdout) if version_res.ok else None
    if not version_res.ok:
        errors.append(f"slurm version: {version_res.describe()}")

    user_res = run(["id", "-un"], "user")
    user = user_res.stdout.strip() if user_res else None

    config_res = run(["scontrol", "show", "config"], "cluster name")
    cluster_name = parse_scontrol_config(config_res.stdout).get("ClusterName") if (
        config_res) else None

    default_account: str | None = None
    accounts: list[str] = []
    if user:
        acct_res = run(_accounts_argv(user), "accounts")
        if acct_res:
            default_account, accounts = parse_accounts(acct_res.stdout, cluster_name)
            if not accounts:
                errors.append(f"accounts: no Slurm association found for user {user!r}")

    part_infos, default_partition = _discover_partitions(run, partitions, errors)

    mpi_res = call(["srun", "--mpi=list"])
    pmix = parse_mpi_list(mpi_res.stdout + "\n" + mpi_res.stderr)
    if not mpi_res.ok and not pmix.available:
        errors.append(f"pmix: {mpi_res.describe()}")

    return SlurmEnv(cluster_name=cluster_name, user=user, default_account=default_account,
                    accounts=accounts, default_partition=default_partition,
                    partitions=part_infos, pmix=pmix, slurm_version=version, errors=errors)


def _accounts_argv(user: str) -> list[str]:
    return ["sacctmgr", "-nP", "show", "user", user, "withassoc",
            "format=User,DefaultAccount,Cluster,Account"]


def _prefetch(shell: Shell, partitions: list[str] | None,
              timeout: float) -> dict[tuple[str, ...], CommandResult]:
    """The independent discovery commands at once (a local shell only: each is a
    client start and a controller round trip, about 0.2 s one after another)."""
    if not getattr(shell, "parallel_safe", False):
        return {}
    from concurrent.futures import ThreadPoolExecutor

    user = shell.run(["id", "-un"], timeout=timeout)
    argvs = [["sinfo", "--version"], ["scontrol", "show", "config"], ["srun", "--mpi=list"],
             ["scontrol", "show", "partition", "-o"]]
    if not partitions:
        argvs.append(["scontrol", "show", "node", "-o"])
    if user.ok and user.stdout.strip():
        argvs.append(_accounts_argv(user.stdout.strip()))
    with ThreadPoolExecutor(max_workers=len(argvs)) as pool:
        results = list(pool.map(lambda argv: shell.run(argv, timeout=timeout), argvs))
    out = {tuple(argv): res for argv, res in zip(argvs, results, strict=True)}
    out[("id", "-un")] = user
    return out


def _discover_partitions(run: Callable[[list[str], str], CommandResult | None],
                         wanted: list[str] | None,
                         errors: list[str]) -> tuple[list[PartitionInfo], str | None]:
    part_res = run(["scontrol", "show", "partition", "-o"], "partitions")
    if not part_res:
        return [], None
    records = parse_records(part_res.stdout)
    default = next((r["PartitionName"] for r in records
                    if r.get("Default", "").upper() == "YES"), None)
    if wanted:
        known = [r.get("PartitionName", "") for r in records]
        missing = [w for w in wanted if w not in known]
        if missing:
            errors.append(f"partitions: {', '.join(missing)} not found; "
                          f"available: {', '.join(known)}")
        records = [r for r in records if r.get("PartitionName") in wanted]
    node_exprs = [r["Nodes"] for r in records if r.get("Nodes") and r["Nodes"] != "(null)"]
    nodes: list[NodeInfo] = []
    if node_exprs:
        argv = ["scontrol", "show", "node", "-o"]
        if wanted:  # only the nodes of the asked partitions (big clusters)
            argv.append(",".join(node_exprs))
        node_res = run(argv, "nodes")
        nodes = parse_nodes(node_res.stdout) if node_res else []
    return partitions_from_records(records, nodes), default


class SlurmClient:
    """Slurm commands on one host (login node), through ``shell``."""

    def __init__(self, shell: Shell, *, timeout: float = 30) -> None:
        self.shell = shell
        self.timeout = timeout

    def tools_found(self) -> bool:
        """True when the Slurm client commands exist on the host (they may still fail)."""
        res = self.shell.run(["sinfo", "--version"], timeout=self.timeout)
        return not tools_missing(res)

    def cluster_name(self) -> str | None:
        """ClusterName from ``scontrol show config``; None when Slurm does not answer."""
        res = self.shell.run(["scontrol", "show", "config"], timeout=self.timeout)
        return parse_scontrol_config(res.stdout).get("ClusterName") if res.ok else None

    def discover(self, partitions: list[str] | None = None) -> SlurmEnv:
        """Accounts, partitions (arch, GPUs, gres), pmix and version; failures in ``errors``."""
        return discover(self.shell, partitions, timeout=self.timeout)


DEFAULT_TTL = 300.0


def cache_key(cluster_name: str | None) -> str:
    return f"{cluster_name}|{os.getuid()}|{os.environ.get('SLURM_CONF', '')}"


def cached_discovery(path: Path, key: str, discover: Callable[[], SlurmEnv],
                     ttl: float = DEFAULT_TTL) -> SlurmEnv:
    """The cached SlurmEnv when fresh and for the same key, else ``discover()`` (saved)."""
    if ttl > 0:
        try:
            data = json.loads(path.read_text("utf-8"))
            if data.get("key") == key and time.time() - float(data.get("at", 0)) < ttl:
                return SlurmEnv.model_validate(data["env"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    env = discover()
    if not env.errors and ttl > 0:
        try:
            ensure_work_root(path.parent.parent)  # <work_dirs>/.cache/<file>
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, json.dumps(
                {"key": key, "at": time.time(), "env": env.model_dump(mode="json")}), parents=True)
        except OSError:
            pass  # a read-only checkout still runs, it just discovers every time
    return env
