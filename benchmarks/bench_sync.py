#!/usr/bin/env python3
"""Code sync over the dev cluster's sshd (127.0.0.1:2222): a first full sync, then a sync
with no change, one with one tracked file changed and one with one untracked file changed,
measured in the same run against the same remote checkout (issue 20: "a sync with no change
under 1 s").

    python3 benchmarks/bench_sync.py [--files N] [--reps R] [--out PATH]

The repository is this one's tracked files (``git archive HEAD``) plus ``--files`` generated
4 KiB source files (default 2000, a mid-size project) and 5 untracked files. Each figure is
the median (min-max) of ``--reps`` syncs, each followed by its ratio to the first full
sync; the bytes sent and the SSH commands run are printed beside it. The machine is small
and shared, so compare within one run only. Writes the figures as JSON to ``--out``
(default benchmarks/results/sync.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import REPO, cluster, fmt, log, ratio, summary  # noqa: E402

from pytest_trtllm_slurm.execution.remote.sync import SyncResult, sync_workspace  # noqa: E402
from pytest_trtllm_slurm.execution.remote.workspace import (  # noqa: E402
    remote_paths,
    shared_state_dir,
    sync_cluster,
)
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry  # noqa: E402
from pytest_trtllm_slurm.node.paths import StateDir  # noqa: E402
from pytest_trtllm_slurm.planning.settings import ClusterConfig  # noqa: E402
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell, SSHTarget  # noqa: E402


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                           *args], capture_output=True, text=True, check=True,
                          stdin=subprocess.DEVNULL)
    return proc.stdout


def make_repo(base: Path, files: int) -> Path:
    """This repository's tracked files plus ``files`` generated ones, committed; 5 untracked."""
    repo = base / "proj"
    repo.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    for i in range(files):
        folder = repo / "gen" / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i:05d}.py").write_text(f"# generated {i}\n" + "x = 1\n" * 680)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    for i in range(5):
        (repo / f"scratch_{i}.py").write_text(f"value = {i}\n" * 50)
    return repo


def shell_for(ssh: dict[str, Any]) -> SSHShell:
    cluster_cfg = ClusterConfig.model_validate({
        "name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
        "user": ssh["user"], "identity_file": ssh["identity_file"],
        "known_hosts": ssh["known_hosts"], "sync": "git"})
    shell = SSHShell(SSHTarget.from_cluster(cluster_cfg, ssh_config_path=os.devnull))
    shell.connect()
    return shell


def one(repo: Path, shell: SSHShell, remote: str) -> tuple[float, SyncResult, int]:
    """Seconds of one sync (what a run waits for), its result and the SSH commands it ran."""
    before = _commands()
    start = time.perf_counter()
    result = sync_workspace(repo, shell, remote, user="bench", name="sync")
    return time.perf_counter() - start, result, _commands() - before


_COUNT = [0]


def floor(shell: SSHShell) -> tuple[float, SyncResult, int]:
    """One command over the connection: what every round trip costs here."""
    start = time.perf_counter()
    shell.run(["true"])
    return time.perf_counter() - start, SyncResult(branch="", commit="", remote_repo=""), 1


def guarded(repo: Path, shell: SSHShell, ssh: dict[str, Any],
            remote: str) -> tuple[float, SyncResult, int]:
    """A sync as a run makes it: the checkout claimed in the cluster's run registry (lock,
    this run's lease, the registry read with the probe); the run's end is not timed."""
    cluster_cfg = ClusterConfig.model_validate({
        "name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
        "user": ssh["user"], "identity_file": ssh["identity_file"],
        "known_hosts": ssh["known_hosts"], "sync": "git",
        "user_root_dir": remote.rsplit("/", 1)[0]})
    paths = remote_paths(cluster_cfg, repo)
    assert paths.remote_repo == remote, (paths.remote_repo, remote)
    runs = RunRegistry(shell, StateDir(shared_state_dir(cluster_cfg, paths)).runs.dir)
    before = _commands()
    start = time.perf_counter()
    result = sync_cluster(cluster_cfg, repo, shell, name="sync", user="bench", runs=runs)
    took = time.perf_counter() - start
    ops = _commands() - before
    runs.finish()
    assert result is not None
    return took, result, ops


def _commands() -> int:
    return _COUNT[0]


def _count_commands(shell: SSHShell) -> None:
    """Count the SSH commands (channels) and SFTP operations the sync makes."""
    exec_once, sftp = shell._exec_once, shell._sftp  # noqa: SLF001

    def counted_exec(*a: Any, **k: Any) -> Any:
        _COUNT[0] += 1
        return exec_once(*a, **k)

    def counted_sftp(*a: Any, **k: Any) -> Any:
        _COUNT[0] += 1
        return sftp(*a, **k)

    shell._exec_once = counted_exec  # type: ignore[method-assign]  # noqa: SLF001
    shell._sftp = counted_sftp  # type: ignore[method-assign]  # noqa: SLF001


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sync.json")
    args = parser.parse_args()
    info = cluster()
    ssh = info["ssh"]
    shell = shell_for(ssh)
    _count_commands(shell)
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        base = Path(tmp)
        repo = make_repo(base, args.files)
        tracked = len(git(repo, "ls-files").splitlines())
        log(f"repository: {tracked} tracked files, 5 untracked; remote {ssh['host']}:"
            f"{ssh['port_key']}")
        figures: dict[str, Any] = {"tracked_files": tracked, "untracked_files": 5,
                                   "reps": args.reps, "ways": {}}
        rows: dict[str, list[tuple[float, SyncResult, int]]] = {
            "first full sync": [], "no change": [], "one tracked file changed": [],
            "one untracked file changed": [], "no change, as a run syncs (guarded)": [],
            "one ssh command (`true`): the floor": []}
        for rep in range(args.reps):
            remote = str(base / f"remote_{rep}" / "proj")
            rows["first full sync"].append(one(repo, shell, remote))
            rows["no change"].append(one(repo, shell, remote))
            (repo / "README.md").write_text(f"changed {rep}\n")
            rows["one tracked file changed"].append(one(repo, shell, remote))
            (repo / "scratch_0.py").write_text(f"value = {rep}\n")
            rows["one untracked file changed"].append(one(repo, shell, remote))
            rows["no change, as a run syncs (guarded)"].append(guarded(repo, shell, ssh, remote))
            rows["one ssh command (`true`): the floor"].append(floor(shell))
            git(repo, "checkout", "-q", "--", "README.md")
            log(f"rep {rep + 1}/{args.reps}: " + ", ".join(
                f"{name} {found[-1][0]:.3f} s" for name, found in rows.items()))
        first = summary([r[0] for r in rows["first full sync"]])
        print(f"\ncode sync over ssh {ssh['host']}:{ssh['port_key']} ({tracked} tracked files, "
              f"5 untracked; median (min-max) of {args.reps}; shared 2-CPU machine: compare "
              "within this run)\n")
        print(f"{'sync':36} {'seconds':>28} {'x first':>8} {'bytes sent':>11} {'ssh ops':>8}")
        for name, found in rows.items():
            stat = summary([r[0] for r in found])
            sent = summary([r[1].sent_bytes for r in found])
            ops = summary([r[2] for r in found])
            x = ratio(stat, first)
            figures["ways"][name] = {"seconds": stat, "ratio_to_first": x, "sent_bytes": sent,
                                     "ssh_operations": ops,
                                     "unchanged": [r[1].unchanged for r in found]}
            print(f"{name:36} {fmt(stat, 's', 3):>28} {x or 0:>8.3f} "
                  f"{int(sent['median']):>11} {int(ops['median']):>8}")
    shell.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    log(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
