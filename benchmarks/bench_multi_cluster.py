#!/usr/bin/env python3
"""Several clusters in one run: do they overlap? The dev cluster stands for two clusters
(``devcluster``: this machine's Slurm, its batch partition, H200; ``gbssh``: the same Slurm
over the dev sshd, its gb200 partition, GB200). The suite has ``--tests`` H200 and as many
GB200 tests of ``--seconds`` each (1 GPU). Wall time of pytest, warm allocations, for

- ``h200``: only the H200 tests (devcluster alone);
- ``gb200``: only the GB200 tests (gbssh alone);
- ``both``: the whole suite in one run (both clusters).

Rounds interleave the three, so drift hits all alike. ``both / max(alone)`` is 1.0 when
the clusters overlap perfectly; ``both / (h200 + gb200)`` is 1.0 when they ran one after
the other. The machine is small and shared: compare within one run only.

    python3 benchmarks/bench_multi_cluster.py [--tests 4] [--seconds 3] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    PLUGIN,
    bench_env,
    check_passed,
    cluster,
    fmt,
    log,
    release_allocation,
    summary,
    timed,
)

TEST = '''import time
import pytest


@pytest.mark.trtllm_slurm(device_type="{kind}")
@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("n", range({tests}))
def test_{name}(n):
    time.sleep({seconds})
'''
INI = """[pytest]
markers =
    trtllm_slurm: resources (pytest-trtllm-slurm)
    skip_less_device: GPUs on one node
"""


def make_suite(base: Path, ssh: dict[str, Any], tests: int, seconds: float) -> Path:
    suite = base / "multi"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    for kind, name in (("H200", "h200"), ("GB200", "gb200")):
        (suite / f"test_{name}.py").write_text(
            TEST.format(kind=kind, name=name, tests=tests, seconds=seconds))
    (suite / "trtllm-slurm.toml").write_text(
        '[clusters.devcluster]\npartition = "batch"\n\n[clusters.gbssh]\n'
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "none"\npython = "{sys.executable}"\npartition = "gb200"\n')
    return suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=4, help="tests per device type")
    parser.add_argument("--seconds", type=float, default=3.0, help="each test's length")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    info = cluster()
    env = bench_env()
    with tempfile.TemporaryDirectory(prefix="bench_multi_") as tmp:
        suite = make_suite(Path(tmp), info["ssh"], args.tests, args.seconds)
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGIN,
                "--trtllm-remote"]
        ways = {"h200": ([*base, "test_h200.py"], args.tests),
                "gb200": ([*base, "test_gb200.py"], args.tests),
                "both": (base, 2 * args.tests)}
        times: dict[str, list[float]] = {name: [] for name in ways}

        def once(name: str) -> float:
            argv, count = ways[name]
            seconds, proc = timed(argv, suite, env, timeout=900)
            check_passed(proc, count, f"multi {name}")
            return seconds

        try:
            log("multi: warm-up run (both allocations)")
            once("both")
            for rep in range(args.reps):
                for name in ways:
                    times[name].append(once(name))
                log(f"  round {rep + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s"
                                                      for n in ways))
        finally:
            release_allocation(suite)
    stats = {name: summary(values) for name, values in times.items()}
    both = stats["both"]["median"]
    alone = [stats["h200"]["median"], stats["gb200"]["median"]]
    out = {"tests_per_type": args.tests, "seconds": args.seconds, "reps": args.reps,
           "ways": stats, "both_over_max_alone": both / max(alone),
           "both_over_sum_alone": both / sum(alone)}
    for name in ways:
        print(f"{name:6s} {fmt(stats[name])}")
    print(f"both / max(alone) = {out['both_over_max_alone']:.2f} (1.00: fully overlapped)")
    print(f"both / (h200 + gb200) = {out['both_over_sum_alone']:.2f} (1.00: one after the "
          "other)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
