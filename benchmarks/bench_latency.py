"""Workload 2: dispatch latency. One 1-GPU test (no import cost, an empty body): the wall
time of ``pytest`` from its start to its exit (the result), for

- ``local``: plain pytest here (the plugin loaded, nothing dispatched);
- ``persistent``: ``--trtllm-remote``, a warm worker in a warm persistent allocation (created by
  an untimed warm-up run);
- ``ssh``: ``--slurm-cluster=devssh``, the dev cluster's sshd as the login node, code synced
  with git, a warm worker in a warm persistent allocation over SSH (commands, file reads
  and writes through the login-node relay, reports pushed);
- ``ssh_no_relay``: the same with ``TRTLLM_SLURM_SSH_RELAY=0`` (a channel per command, SFTP
  for files, reports polled: the wire before the relay), the same allocation;
- ``one_shot``: ``--trtllm-remote --trtllm-one-shot``, a new sbatch job.

Rounds interleave the ways (local, persistent, ssh, ssh_no_relay; then, once both allocations are
released, local and one-shot), so drift hits all alike; ratios are to the local median.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import (
    GITIGNORE,
    PLUGIN,
    bench_env,
    check_passed,
    devssh_table,
    log,
    publish,
    ratio,
    release_allocation,
    summary,
    timed,
)

TEST = '''import pytest


@pytest.mark.trtllm_slurm(devices=1)
def test_one_gpu():
    pass
'''
INI = """[pytest]
markers =
    trtllm_slurm: resources (pytest-trtllm-slurm)
"""


def make_suite(base: Path, ssh: dict[str, Any] | None, partition: str) -> Path:
    suite = base / "latency"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "test_one.py").write_text(TEST)
    if ssh:
        (suite / "trtllm-slurm.toml").write_text(devssh_table(
            ssh, sync="git", partition=partition, user_root_dir=base / "cluster_home"))
        publish(suite, base, "latency suite")
    else:
        (suite / ".gitignore").write_text(GITIGNORE)
    return suite


def run(partition: str, ssh: dict[str, Any] | None, reps: int) -> dict[str, Any]:
    env = bench_env()
    with tempfile.TemporaryDirectory(prefix="bench_latency_") as tmp:
        suite = make_suite(Path(tmp), ssh, partition)
        base = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "test_one.py"]
        ways = {
            "local": base,
            "persistent": [*base, "--trtllm-remote", f"--slurm-partition={partition}"],
            "ssh": [*base, "--slurm-cluster=devssh"],
            "ssh_no_relay": [*base, "--slurm-cluster=devssh"],
            "one_shot": [*base, "--trtllm-remote", f"--slurm-partition={partition}",
                         "--trtllm-one-shot"],
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        skipped: dict[str, str] = {}

        envs = {name: env for name in ways}
        envs["ssh_no_relay"] = {**env, "TRTLLM_SLURM_SSH_RELAY": "0"}
        warm = ("local", "persistent", "ssh", "ssh_no_relay")

        def once(name: str) -> float | None:
            seconds, proc = timed(ways[name], suite, envs[name], timeout=900)
            try:
                check_passed(proc, 1, f"latency {name}")
            except RuntimeError as exc:
                if not name.startswith("ssh"):
                    raise
                skipped[name] = str(exc)[-1500:]
                return None
            return seconds

        try:
            if ssh is None:
                skipped["ssh"] = skipped["ssh_no_relay"] = "the dev cluster describes no sshd"
            log("latency: warm-up runs (allocations)")
            for name in warm:
                if name not in skipped:
                    once(name)
            for rep in range(reps):
                for name in warm:
                    if name not in skipped:
                        value = once(name)
                        if value is not None:
                            times[name].append(value)
                log(f"  round {rep + 1}: " + ", ".join(
                    f"{n} {times[n][-1]:.2f} s" for n in warm if times[n]))
            release_allocation(suite)  # the persistent ones hold whole nodes
            once("one_shot")  # warm-up: the partition's nodes are known to be free again
            for rep in range(reps):
                for name in ("local", "one_shot"):
                    times[name].append(once(name) or 0.0)
                log(f"  round {rep + 1}: one_shot {times['one_shot'][-1]:.2f} s")
        finally:
            release_allocation(suite)
    out: dict[str, Any] = {"reps": reps, "ways": {}, "skipped": skipped}
    for name, values in times.items():
        out["ways"][name] = summary(values)
    for name in ("persistent", "ssh", "ssh_no_relay", "one_shot"):
        local = out["ways"]["local"]
        out["ways"][name]["minus_local"] = (
            out["ways"][name]["median"] - local["median"]
            if out["ways"][name]["median"] is not None and local["median"] is not None else None)
        out["ways"][name]["ratio_to_local"] = ratio(out["ways"][name], local)
    persistent = out["ways"]["persistent"]
    for name in ("ssh", "ssh_no_relay"):  # the target: at most persistent + 0.5 s
        out["ways"][name]["minus_persistent"] = (
            out["ways"][name]["median"] - persistent["median"]
            if out["ways"][name]["median"] is not None and persistent["median"] is not None
            else None)
    return out
