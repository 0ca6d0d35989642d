"""Overhead of dispatching a 100-test suite through local_direct vs running it plainly.

Both are timed end to end (pytest start to exit) in the same run, interleaved, several
repetitions; the figure that matters is the ratio of the medians. Each test is trivial,
so the ratio is the worst case: pure dispatch cost (one worker pytest start, reports
written, read and replayed) with nothing to hide it behind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = '''
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_item(i):
    assert i >= 0
'''


def run(suite: Path, extra: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
        cwd=suite, capture_output=True, text=True, env=env, check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({extra}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        suite = Path(tmp)
        (suite / "pytest.ini").write_text("[pytest]\n")
        (suite / "test_many.py").write_text(SUITE.format(n=args.tests))
        dispatched = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
        times: dict[str, list[float]] = {"plain": [], "local_direct": []}
        run(suite, [])  # warm the file system and bytecode caches
        for _ in range(args.reps):
            times["plain"].append(run(suite, []))
            times["local_direct"].append(run(suite, dispatched))
    print(f"{args.tests} trivial tests, {args.reps} interleaved repetitions (wall seconds)")
    for name, values in times.items():
        print(f"  {name:13s} median {statistics.median(values):6.2f}  "
              f"min {min(values):6.2f}  max {max(values):6.2f}")
    ratio = statistics.median(times["local_direct"]) / statistics.median(times["plain"])
    print(f"  ratio local_direct / plain (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
