"""Dispatch latency with a suite that costs C seconds to import (a conftest that sleeps C
s in every process, standing in for torch/tensorrt_llm): one warm 1-GPU test, pytest
start to result, for

- ``persistent``: ``--trtllm-remote``, a warm worker in the local persistent allocation
  (its session starts while the controller imports: ``controller.warm_start``);
- ``ssh``: ``--slurm-cluster=devssh`` (the dev cluster's sshd, git sync, warm allocation);
- ``ssh_base``: the same with the plugin's code from ``--base PATH`` (a copy of an older
  commit on PYTHONPATH): the baseline of the same run.

Why: the plain latency benchmark's suite imports in no time, so whatever the run does
over SSH before its first batch is on the critical path there; a real suite's import
hides what overlaps it (the early connection, sync and sessions), and only this shows it.
Rounds interleave the ways. Usage (from the repository root):

    PYTHONPATH=$PWD python3 benchmarks/bench_latency_import.py [-C 2] [--reps 3]
        [--partition gb200] [--base /path/to/old/checkout] [--stale]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import PLUGIN, bench_env, check_passed, cluster, log, release_allocation, timed
from bench_latency import make_suite

CONFTEST = "import time\n\ntime.sleep({seconds})  # the suite's imports\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-C", "--import-seconds", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--partition", default="gb200")
    parser.add_argument("--base", help="an older checkout of the plugin (the baseline)")
    parser.add_argument("--stale", action="store_true",
                        help="delete the Slurm discovery caches before every run, as a run more "
                             "than five minutes after the last finds them (with --base: the "
                             "local way's baseline too, persistent_base)")
    args = parser.parse_args()
    ssh = cluster().get("ssh")
    if not ssh:
        sys.exit("the dev cluster describes no sshd")
    env = bench_env()
    envs = {"persistent": env, "ssh": env}
    if args.base:
        envs["ssh_base"] = {**env, "PYTHONPATH": os.pathsep.join(
            [str(Path(args.base).resolve()), *[p for p in [env.get("PYTHONPATH")] if p]])}
    with tempfile.TemporaryDirectory(prefix="bench_latency_import_",
                                     ignore_cleanup_errors=True) as tmp:
        suite = make_suite(Path(tmp), ssh, args.partition)
        (suite / "conftest.py").write_text(CONFTEST.format(seconds=args.import_seconds))
        subprocess.run(["git", "-C", str(suite), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(suite), "-c", "user.name=b", "-c", "user.email=b@b",
                        "commit", "-q", "-m", "conftest"], check=True)
        base = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "test_one.py"]
        ways = {"persistent": [*base, "--trtllm-remote", f"--slurm-partition={args.partition}"],
                "ssh": [*base, "--slurm-cluster=devssh"],
                "ssh_base": [*base, "--slurm-cluster=devssh"]}
        if args.stale and args.base:
            envs["persistent_base"] = envs["ssh_base"]
            ways["persistent_base"] = ways["persistent"]
        names = list(envs)

        def timed_run(name: str) -> tuple[float, subprocess.CompletedProcess[str]]:
            if args.stale:
                for cache in (suite / "work_dirs" / ".cache").glob("slurm_env*.json"):
                    cache.unlink()
            return timed(ways[name], suite, envs[name], 900)
        times: dict[str, list[float]] = {n: [] for n in names}
        try:
            log(f"latency with a {args.import_seconds} s import: warm-up runs")
            for name in names:
                check_passed(timed_run(name)[1], 1, name)
            for rep in range(args.reps):
                for name in names:
                    seconds, proc = timed_run(name)
                    check_passed(proc, 1, name)
                    times[name].append(seconds)
                log(f"  round {rep + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s"
                                                       for n in names))
        finally:
            release_allocation(suite)
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"\nmedian of {args.reps} rounds, C = {args.import_seconds} s:")
    for name in names:
        print(f"  {name:10s} {med[name]:.2f} s ({min(times[name]):.2f}-{max(times[name]):.2f})"
              f"  minus persistent {med[name] - med['persistent']:+.2f} s")


if __name__ == "__main__":
    main()
