"""``trtllm-slurm alloc status|release``: the persistent allocation outlives runs on
purpose, so releasing it is an explicit act; ``--cluster`` picks a target's own."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationRequest
from pytest_trtllm_slurm.node.paths import STATE_NAME, StateDir, work_root
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

if TYPE_CHECKING:
    from pytest_trtllm_slurm.transport.ssh.otp_env import HeldCode


def add_alloc_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``alloc status`` and ``alloc release``, each with its ``handler``."""
    parser = subparsers.add_parser("alloc", help="show or release the persistent Slurm allocation")
    sub = parser.add_subparsers(dest="alloc_command", metavar="{status,release}")
    sub.required = True
    for name, help_text in (("status", "show the allocation of the state file"),
                            ("release", "scancel the allocation and delete its state file")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--rootdir", default=".",
                         help=f"the repo root holding work_dirs/{STATE_NAME} (default: .)")
        cmd.add_argument("--account", default=None,
                         help="account in the allocation's name <account>-trtllm.persistent "
                              "(default: the state file's)")
        cmd.add_argument("--cluster", action="append", default=None, metavar="NAME",
                         help="a cluster of the clusters file, or 'local' (repeatable; "
                              "default: every cluster with a state file, and the local one)")
        cmd.add_argument("--config", default=None, metavar="PATH",
                         help="the clusters file (default: the usual locations)")
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="print JSON")
        cmd.set_defaults(handler=run_alloc)
    return parser


def _manager(shell: Shell, rootdir: Path, account: str | None, **parts: Any) -> AllocationManager:
    """An AllocationManager for status/release (the request only names the allocation);
    without --account, the allocation the state file names (looking changes nothing)."""
    manager = AllocationManager(shell, rootdir=rootdir, request=AllocationRequest(account=account),
                                **parts)
    if account is None:
        state = manager.peek_state()
        if state is not None and state.account:
            manager.request.account = state.account
    return manager


LOCAL = "local"


def targets(rootdir: Path, wanted: list[str] | None, config: str | None) -> dict[str, Path]:
    """target name -> this checkout's folder for it (a remote cluster's once a run used it);
    ConfigError for a name neither ``local`` nor in the clusters file."""
    from pytest_trtllm_slurm.planning.settings import load_clusters_file

    clusters = load_clusters_file(Path(config) if config else None, rootdir).clusters
    root = work_root(None, rootdir)
    found = {LOCAL: rootdir, **{name: root.remote_dir(name) for name in clusters}}
    if not wanted:
        return found
    unknown = [w for w in wanted if w not in found]
    if unknown:
        raise ConfigError(f"--cluster {', '.join(unknown)}: not 'local' and not in the clusters "
                          f"file (known: {', '.join(sorted(found))})")
    return {w: found[w] for w in wanted}


def remote_manager(rootdir: Path, name: str, folder: Path, account: str | None,
                   config: str | None, held: HeldCode | None = None) -> AllocationManager:
    """A manager over SSH for a remote cluster's allocation, whose state is on the
    cluster (the folder every machine of the user shares)."""
    from pytest_trtllm_slurm.execution.remote.workspace import remote_paths, shared_state_dir
    from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
    from pytest_trtllm_slurm.execution.slurm.state_store import StateStore
    from pytest_trtllm_slurm.planning.settings import load_clusters_file
    from pytest_trtllm_slurm.transport.ssh.auth import otp_provider
    from pytest_trtllm_slurm.transport.ssh.shells import shell_for_cluster

    cluster = load_clusters_file(Path(config) if config else None, rootdir).get(name)
    shell = shell_for_cluster(cluster, otp_provider=otp_provider(held))
    shell.connect()
    state_dir = shared_state_dir(cluster, remote_paths(cluster, rootdir))
    return _manager(shell, folder, account, store=StateStore(shell, state_dir, STATE_NAME),
                    runs=RunRegistry(shell, StateDir(state_dir).runs.dir))


def run_alloc(args: argparse.Namespace) -> int:
    """Run ``alloc status`` / ``alloc release``; returns the exit code."""
    rootdir = Path(args.rootdir).resolve()
    try:
        chosen = targets(rootdir, getattr(args, "cluster", None), getattr(args, "config", None))
    except ConfigError as exc:
        print(f"trtllm-slurm alloc: {exc}", file=sys.stderr)
        return 4
    infos: dict[str, dict[str, Any]] = {}
    explicit = bool(getattr(args, "cluster", None))
    for name, folder in chosen.items():
        if name != LOCAL and not explicit and not folder.is_dir():
            if args.alloc_command == "status":  # never run there from here: not connected
                infos[name] = {"state_file": None, "allocation": None, "not_looked": True}
            continue
        try:
            manager = (_manager(LocalShell(), folder, args.account) if name == LOCAL else
                       remote_manager(rootdir, name, folder, args.account, args.config,
                                      getattr(args, "held_code", None)))
        except (ConfigError, ExecutionError, OSError) as exc:
            print(f"trtllm-slurm alloc: cluster {name}: {exc}", file=sys.stderr)
            return 1
        if args.alloc_command == "release":
            print(f"[{name}] {manager.release()}")
            continue
        infos[name] = manager.status()
    if args.alloc_command == "status":
        print(json.dumps(infos, indent=2, default=str) if getattr(args, "json", False) else
              "\n".join(f"[{name}] {format_status(info)}" for name, info in infos.items()))
    return 0


def format_status(info: dict[str, Any]) -> str:
    """Human-readable lines for ``alloc status``."""
    alloc = info.get("allocation")
    if info.get("not_looked"):
        return ("not looked at: this checkout has not run there (--cluster NAME looks on the "
                "cluster, where every machine's runs share the allocation)")
    if not alloc and info.get("unreadable"):
        return (f"No persistent allocation: {info['state_file']} is unreadable (the next run "
                "moves it aside).")
    if not alloc:
        return f"No persistent allocation ({info['state_file']} absent)."
    lines = [
        f"Allocation {alloc['job_id']} ({alloc.get('job_name') or '?'}): "
        f"{info.get('scheduler_state')}, {info.get('time_left') or 'no'} time left",
        f"  partition {alloc.get('partition')}, account {alloc.get('account')}, "
        f"{alloc.get('nodes')} node(s) {alloc.get('nodelist')}, "
        f"{alloc.get('gpus_per_node')} GPU(s) per node",
        f"  allocated at {alloc.get('allocated_at')}, limit {alloc.get('time_limit')}, "
        f"image {alloc.get('docker_image') or '-'}",
        f"  running steps: {', '.join(info.get('steps') or []) or 'none'}",
        f"  state file: {info['state_file']}",
    ]
    if info.get("scheduler_state") == "GONE":
        lines.append("  (the allocation is gone; the next run allocates anew)")
    return "\n".join(lines)
