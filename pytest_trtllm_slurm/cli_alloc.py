"""``trtllm-slurm alloc status|release``: look at or give back the persistent allocation.

The allocation outlives pytest runs on purpose (no queue wait next time), so
releasing it is an explicit act: this command or ``--trtllm-release-allocation``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .execution.allocation import STATE_NAME, AllocationManager, AllocationRequest
from .execution.shell import LocalShell, Shell


def add_alloc_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``alloc status`` and ``alloc release`` on a ``add_subparsers()`` object.

    Each sets ``handler`` (``args.handler(args) -> exit code``), as cli.main expects.
    """
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
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="print JSON")
        cmd.set_defaults(handler=run_alloc)
    return parser


def manager_for(rootdir: str | Path, account: str | None = None,
                shell: Shell | None = None) -> AllocationManager:
    """An AllocationManager for status/release (the request only names the allocation)."""
    shell = shell or LocalShell()
    manager = AllocationManager(shell, rootdir=rootdir, request=AllocationRequest(account=account))
    if account is None:
        state = manager.read_state()
        if state is not None and state.account:
            manager.request.account = state.account
    return manager


def run_alloc(args: argparse.Namespace, shell: Shell | None = None) -> int:
    """Run ``alloc status`` / ``alloc release``; returns the exit code."""
    manager = manager_for(args.rootdir, args.account, shell)
    if args.alloc_command == "release":
        print(manager.release())
        return 0
    info = manager.status()
    if getattr(args, "json", False):
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(format_status(info))
    return 0


def format_status(info: dict[str, Any]) -> str:
    """Human-readable lines for ``alloc status``."""
    alloc = info.get("allocation")
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
