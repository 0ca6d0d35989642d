"""A big suite of small tests: plain pytest vs dispatched through local_direct.

Generates N trivial parametrized tests (default 50,000, the size of packaging's
tests/test_version.py) and times, in the same run, end to end (pytest start to exit):

- ``plain``: ``pytest`` as the user runs it;
- ``worker``: the same with the node's report writer (``-p pytest_trtllm_slurm.node.worker``),
  what the target's pytest pays for writing reports.jsonl;
- ``local_direct``: ``--trtllm-remote --trtllm-dispatch=all --trtllm-scenario=local_direct``,
  the worker plus the controller reading and replaying every report.

The figure that matters is the ratio of the medians (the machine may be shared). With
``--profile DIR`` the dispatched run also runs once under cProfile (the controller's
process; the worker's own time is the ``worker`` row) and the top functions are printed.
It measures the checkout it lives in (its root goes first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import cProfile  # noqa: F401  (python -m cProfile below)
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = '''
import pytest


@pytest.mark.parametrize("i", range({n}))
def test_item(i):
    assert i >= 0
'''
DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k not in ("PYTEST_ADDOPTS",
                                                                "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(suite: Path, extra: list[str], prefix: list[str] | None = None) -> float:
    """Wall seconds of one pytest run in ``suite`` (which must pass)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [*(prefix or [sys.executable]), "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
        cwd=suite, capture_output=True, text=True, env=_env(), check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({extra}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def make_suite(root: Path, tests: int) -> None:
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_big.py").write_text(SUITE.format(n=tests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None,
                        help="also profile one dispatched run; the .prof file goes here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        suite = Path(tmp)
        make_suite(suite, args.tests)
        reports = suite / "worker" / "reports.jsonl"
        ways = {
            "plain": [],
            "worker": ["-p", "pytest_trtllm_slurm.node.worker",
                       "--trtllm-worker-reports", str(reports)],
            "local_direct": DISPATCH,
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        run(suite, [])  # warm the file system and bytecode caches
        for rep in range(args.reps):
            for name, extra in ways.items():
                reports.unlink(missing_ok=True)
                times[name].append(run(suite, extra))
                print(f"  rep {rep + 1} {name:13s} {times[name][-1]:7.2f} s", flush=True)
        if args.profile is not None:
            args.profile.parent.mkdir(parents=True, exist_ok=True)
            run(suite, DISPATCH, prefix=[sys.executable, "-m", "cProfile", "-o",
                                          str(args.profile.resolve())])
    print(f"{args.tests} trivial tests, {args.reps} interleaved repetitions (wall seconds)")
    plain = statistics.median(times["plain"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:13s} median {med:7.2f}  min {min(values):7.2f}  "
              f"max {max(values):7.2f}  ratio to plain {med / plain:5.2f}")
    if args.profile is not None:
        print(f"\ncontroller profile ({args.profile}), top 25 by cumulative time:")
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
