"""Workload 4: the controller's own cost at scale (no cluster needed).

10,000 collected items (trivial CPU tests), each way timed end to end:

- ``plain``: pytest runs them here, the plugin loaded but not dispatching;
- ``replay``: ``--trtllm-remote --trtllm-dispatch=all --trtllm-scenario=local_direct`` with
  the executor replaced (``BENCH_FAKE_EXECUTOR=1``, see bench_probe.py) by one that
  "runs" a batch instantly by writing a synthetic reports.jsonl (setup/call/teardown per
  test, serialized like the worker does), so the figures are the controller's alone:
  planning (requirements + routing of 10,000 items), packing, and replaying 10,000
  tests' reports through the Monitor and Replayer into the items' hooks (terminal,
  junit, cache).

Peak memory is the controller process's ru_maxrss (MiB).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import PLUGIN, bench_env, check_passed, log, ratio, summary, timed

PER_MODULE = 250
MODULE = '''import pytest


@pytest.mark.parametrize("i", range({n}))
def test_item(i):
    pass
'''


def make_suite(root: Path, items: int) -> int:
    modules = max(1, -(-items // PER_MODULE))
    (root / "pytest.ini").write_text("[pytest]\n")
    for index in range(modules):
        (root / f"test_mod{index:03d}.py").write_text(MODULE.format(n=PER_MODULE))
    return modules * PER_MODULE


def run_once(suite: Path, count: int, dispatch: bool) -> dict[str, Any]:
    probe_out = suite / "probe.json"
    probe_out.unlink(missing_ok=True)
    extra = {"BENCH_PROBE_OUT": str(probe_out)}
    args = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "-p", "bench_probe",
            "-p", "no:cacheprovider"]
    if dispatch:
        extra["BENCH_FAKE_EXECUTOR"] = "1"
        args += ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
    seconds, proc = timed(args, suite, bench_env(**extra), timeout=1800)
    check_passed(proc, count, "controller " + ("replay" if dispatch else "plain"))
    probe = json.loads(probe_out.read_text())
    return {"wall": seconds, **probe}


def run(items: int, reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_controller_") as tmp:
        suite = Path(tmp)
        count = make_suite(suite, items)
        log(f"controller: {count} items, {reps} repetition(s), interleaved")
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "replay": []}
        for rep in range(reps):
            for name in runs:
                result = run_once(suite, count, dispatch=name == "replay")
                runs[name].append(result)
                log(f"  rep {rep + 1} {name}: {result['wall']:.2f} s, "
                    f"{result['maxrss_mib']:.0f} MiB, timings {result['timings']}")
    out: dict[str, Any] = {"items": count, "reps": reps}
    for name, results in runs.items():
        out[name] = {
            "wall": summary([r["wall"] for r in results]),
            "maxrss_mib": summary([r["maxrss_mib"] for r in results]),
        }
    replay = runs["replay"]
    for key in ("planning", "packing", "replay", "dispatch_loop"):
        out["replay"][key] = summary([r["timings"].get(key) for r in replay])
    out["replay"]["batches"] = replay[-1]["batches"] if replay else []
    out["wall_ratio"] = ratio(out["replay"]["wall"], out["plain"]["wall"])
    out["rss_ratio"] = ratio(out["replay"]["maxrss_mib"], out["plain"]["maxrss_mib"])
    return out
