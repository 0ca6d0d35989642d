"""Collection cost of the plugin: ``pytest --collect-only -q`` on N marked, parametrized items.

Compares, interleaved round by round so drift hits every variant alike:
  off   -p no:trtllm_slurm (the plugin not loaded)
  on    the plugin loaded with default options (dispatch off)
  plan  the plugin with --trtllm-plan (requirements derived for every item; informational)
With --isolated, other auto-loaded plugins are disabled (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1)
so their import time does not dilute the ratio. Target: on/off < 1.05.

    python benchmarks/bench_collection.py [--items 10000] [--reps 5] [--isolated]
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

PER_FUNCTION = 250
MODULE = '''import pytest


@pytest.mark.skip_less_device(4)
@pytest.mark.parametrize("i", range({n}))
def test_four(i):
    pass


@pytest.mark.skip_less_mpi_world_size(8)
@pytest.mark.skip_less_device_memory(80000)
@pytest.mark.parametrize("i", range({n}))
def test_mpi(i):
    pass


@pytest.mark.parametrize("i", range({n}))
def test_cpu(i):
    pass


@pytest.mark.skip_less_device(1)
class TestClass:
    @pytest.mark.trtllm_slurm(devices=8, nodes=2, time_limit="30m")
    @pytest.mark.parametrize("i", range({n}))
    def test_method(self, i):
        pass
'''
INI = """[pytest]
markers =
    skip_less_device(n): n GPUs
    skip_less_device_memory(mib): device memory
    skip_less_host_memory(mib): host memory
    skip_less_mpi_world_size(n): n ranks
    skip_device_not_contain(keywords): device name
    trtllm_slurm: per-test resources
"""


def make_suite(root: Path, items: int) -> int:
    """Write modules of 4 x PER_FUNCTION items until ``items`` are covered; returns the count."""
    per_module = 4 * PER_FUNCTION
    modules = max(1, -(-items // per_module))
    (root / "pytest.ini").write_text(INI)
    for index in range(modules):
        (root / f"test_mod{index:03d}.py").write_text(MODULE.format(n=PER_FUNCTION))
    return modules * per_module


def run(root: Path, args: list[str], env: dict[str, str]) -> float:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                         f"\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--isolated", action="store_true",
                        help="disable other auto-loaded plugins (hypothesis, benchmark, ...)")
    parser.add_argument("--no-plan", action="store_true", help="skip the --trtllm-plan variant")
    opts = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    on = ["-p", "pytest_trtllm_slurm.plugin"] if opts.isolated else []
    if opts.isolated:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    variants = {"off": ["-p", "no:trtllm_slurm"], "on": on}
    if not opts.no_plan:
        variants["plan"] = [*on, "--trtllm-plan"]
    with tempfile.TemporaryDirectory(prefix="bench_collection_") as tmp:
        root = Path(tmp)
        count = make_suite(root, opts.items)
        for args in variants.values():  # warm-up: bytecode and page caches
            run(root, args, env)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(opts.reps):
            for name, args in variants.items():
                times[name].append(run(root, args, env))
    mode = "isolated (no other plugins)" if opts.isolated else "default plugin set"
    print(f"{count} items, {opts.reps} interleaved repetitions, {mode}")
    print(f"{'variant':8} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in times.items():
        print(f"{name:8} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")
    off = statistics.median(times["off"])
    for name in variants:
        if name != "off":
            print(f"ratio {name}/off (median): {statistics.median(times[name]) / off:.3f}")


if __name__ == "__main__":
    main()
