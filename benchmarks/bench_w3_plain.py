"""Plain pytest's CPU on W3's 2,000 tests made empty (the same marks and ids): what pytest
itself costs per test on this machine, to set against the controller's CPU per test
(bench_w3.py). Three ways, three repetitions: the whole run, collection alone, the run with
a junit file; CPU seconds (user + system) of the pytest process.

    python benchmarks/bench_w3_plain.py
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_w3  # noqa: E402

TESTS = 2000


def cpu_of(argv: list[str], cwd: Path) -> tuple[float, float, int, str]:
    """CPU and wall seconds of one run, its exit code and its last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, "BENCH_IMPORT_SECONDS": "0"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall, proc.returncode, (proc.stdout.splitlines() or [""])[-1]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "suite"
        bench_w3.make_suite(root, [0.0] * TESTS, "single")
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-p", "no:trtllm_slurm"]
        ways = (("plain run", []), ("collect only", ["--collect-only"]),
                ("plain + junit", [f"--junitxml={tmp}/junit.xml"]))
        for rep in range(3):
            for name, extra in ways:
                cpu, wall, code, last = cpu_of(base + extra, root)
                print(f"rep {rep + 1} {name:14s} cpu {cpu:.2f} s "
                      f"({cpu / TESTS * 1000:.2f} ms/test) wall {wall:.2f} s exit {code} {last}")


if __name__ == "__main__":
    main()
