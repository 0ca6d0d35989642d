#!/usr/bin/env python3
"""The timeline picture and the GPU-use summary of the 64-test benchmark suite (issue 19).

    python benchmarks/bench_timeline.py [--partition gb200] [-S 1] [-C 2] [--per-shape 16]
                                        [--alloc-time-limit 20m]

The suite of ``bench_makespan`` (16 tests each of 1, 2, 4, 8 GPUs; each test S seconds,
a conftest costing C seconds to import), run by the plugin as ``plugin_persistent`` does:
a warm-up run (the allocation, the durations cache), then the measured run with
``--trtllm-timeline`` and ``--trtllm-summary-json``. Writes
``benchmarks/results/timeline_64.json`` (Chrome trace), ``timeline_64.svg`` (the picture)
and ``timeline_64.summary.json``, and prints the summary the run printed. The allocation
is released at the end. The dev cluster is shared: the figures are of one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import PLUGIN, bench_env, check_passed, log, release_allocation, timed  # noqa: E402
from bench_makespan import lower_bound, make_suite  # noqa: E402

RESULTS = HERE / "results"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partition", default="gb200")
    p.add_argument("-S", "--test-seconds", type=float, default=1.0)
    p.add_argument("-C", "--import-seconds", type=float, default=2.0)
    p.add_argument("--per-shape", type=int, default=16)
    p.add_argument("--alloc-time-limit", default="20m",
                   help="of the persistent allocation (short: the scheduler can backfill it)")
    args = p.parse_args()
    env = bench_env(BENCH_TEST_SECONDS=str(args.test_seconds),
                    BENCH_IMPORT_SECONDS=str(args.import_seconds),
                    TRTLLM_SLURM_ALLOC_TIME_LIMIT=args.alloc_time_limit)
    with tempfile.TemporaryDirectory(prefix="bench_timeline_") as tmp:
        suite = Path(tmp) / "suite"
        tests = make_suite(suite, args.per_shape)
        name = f"timeline_{len(tests)}"
        argv = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "--trtllm-remote",
                f"--slurm-partition={args.partition}"]
        try:
            log(f"{len(tests)} tests, S={args.test_seconds} s, C={args.import_seconds} s: "
                "warm-up run (allocation, durations cache)")
            seconds, proc = timed(argv, suite, env, timeout=3600)
            check_passed(proc, len(tests), "warm-up")
            log(f"warm-up: {seconds:.1f} s; the measured run")
            out = suite / "out"
            seconds, proc = timed([*argv, f"--trtllm-timeline={out / name}.json",
                                   f"--trtllm-summary-json={out / name}.summary.json"],
                                  suite, env, timeout=3600)
            check_passed(proc, len(tests), "measured run")
        finally:
            release_allocation(suite)
        RESULTS.mkdir(exist_ok=True)
        for suffix in (".json", ".svg", ".summary.json"):
            shutil.copyfile(out / f"{name}{suffix}", RESULTS / f"{name}{suffix}")
        summary = json.loads((out / f"{name}.summary.json").read_text())["efficiency"]
        section = proc.stdout.split("trtllm-slurm: GPU use", 1)[-1].splitlines()[1:6]
    gpus = 8  # both dev partitions: 2 nodes x 4 GPUs
    bound = lower_bound(tests, args.test_seconds, args.import_seconds, gpus)
    log(f"measured run: {seconds:.1f} s wall (pytest start to end); "
        f"bench_makespan's lower bound {bound:.1f} s")
    for line in section:
        print(line)
    print(json.dumps(summary, indent=2))
    log(f"written: {RESULTS / name}.json, .svg, .summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
