"""Workload 3 (issue 21 part 2): a big suite on a big simulated cluster.

    python benchmarks/bench_w3.py                       # N = 32 nodes, 2,000 tests
    python benchmarks/bench_w3.py --nodes 8 --tests 200 # the scaled-down run

The cluster: ``tests/cluster/up --nodes N --name NAME`` (default ``big``), a SEPARATE
Slurm instance beside the default dev cluster (its own slurmctld, so ``sdiag`` counts
this benchmark's RPCs and nobody else's): N slurmd with 8 fake GPUs each, partition
``batch`` = every node. Everything here talks to it through ``SLURM_CONF``.

The suite: ``--tests`` tests, needs of 1, 2, 4, 8 and 16 GPUs in equal numbers (16 = 2
nodes x 8: one process, or with ``--launch mpi`` one rank per GPU), each sleeping a
heavy-tailed time (lognormal, median ``--median`` s, sigma ``--sigma``, capped at ``--max``:
a few near the cap), under a conftest that sleeps ``--import-seconds`` at import (torch /
tensorrt_llm stand-in). Tests are sleeps: the machine has 2 CPUs.

Ways (each timed from start to every result known):

- ``plugin``: ``pytest --trtllm-remote --trtllm-alloc-nodes N``: the persistent allocation
  of the whole cluster with warm workers; an untimed warm-up run first creates the
  allocation and fills the durations cache (``--no-warmup`` skips it: a cold first run);
- ``per_shape``: the baseline, one ``sbatch --wait`` job per GPU shape running its tests
  in sequence, all five submitted at once.

Per way: makespan and its ratio to the lower bound, slurmctld RPCs per test (``sdiag
--reset`` before, counts after; the instance is this benchmark's alone), controller CPU
seconds per test (plugin: the pytest controller's own user+system time plus that of the
commands it ran, from bench_probe; per_shape: the ``sbatch --wait`` processes'), peak
controller memory (ru_maxrss), and the outcome count (junit XML: every test exactly once,
all passed: nothing lost or doubled).

Lower bound: C + max(sum over tests of GPUs x seconds / GPUs of the cluster, the longest
test). It ignores that a 2-node test needs two whole free nodes, and it charges the
import once (the controller's own collection, which also pays it, is not in it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_common import (
    BENCH_DIR,
    CLUSTER_UP,
    PLUGIN,
    bench_env,
    cancel_jobs,
    jobs_ended_after,
    log,
    our_jobs,
    release_allocation,
    sdiag_reset,
    sdiag_rpcs,
    timed,
    wall_phases,
)

NEEDS = {1: (1, 1), 2: (2, 1), 4: (4, 1), 8: (8, 1), 16: (8, 2)}  # GPUs -> (per node, nodes)
PREFIX = "bench-w3"
RESULTS = BENCH_DIR / "results"

CONFTEST = '''import os
import time

# Stands in for the torch / tensorrt_llm imports of a real TensorRT-LLM suite.
time.sleep(float(os.environ.get("BENCH_IMPORT_SECONDS", "0")))
'''
INI = """[pytest]
markers =
    trtllm_slurm: resources (pytest-trtllm-slurm)
"""


# -- the suite ------------------------------------------------------------------------------
def durations(count: int, median: float, sigma: float, cap: float, seed: int) -> list[float]:
    """Heavy-tailed test durations: lognormal around ``median``, capped at ``cap``."""
    rng = random.Random(seed)
    return [round(min(cap, rng.lognormvariate(math.log(median), sigma)), 2)
            for _ in range(count)]


def make_suite(root: Path, secs: list[float], launch: str) -> list[tuple[str, int, float]]:
    """The suite's files; (node id, GPUs, seconds) per test. Needs go round-robin."""
    by_need: dict[int, list[float]] = {g: [] for g in NEEDS}
    for k, s in enumerate(secs):
        by_need[list(NEEDS)[k % len(NEEDS)]].append(s)
    lines = ["import time", "", "import pytest", "",
             f"SECONDS = {json.dumps({str(g): v for g, v in by_need.items()})}", ""]
    for g, (_per_node, nodes) in NEEDS.items():
        marker = (f"@pytest.mark.trtllm_slurm(devices={g})" if nodes == 1 else
                  f"@pytest.mark.trtllm_slurm(devices={g}, nodes={nodes}, launch={launch!r})")
        lines += ["", marker, f"@pytest.mark.parametrize(\"i\", range({len(by_need[g])}))",
                  f"def test_gpu{g}(i):", f"    time.sleep(SECONDS[\"{g}\"][i])", ""]
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(INI)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_w3.py").write_text("\n".join(lines))
    return [(f"test_w3.py::test_gpu{g}[{i}]", g, s)
            for g, vals in by_need.items() for i, s in enumerate(vals)]


def lower_bound(tests: list[tuple[str, int, float]], c: float, gpus: int) -> dict[str, float]:
    work = sum(g * s for _, g, s in tests)
    return {"seconds": c + max(work / gpus, max(s for _, _, s in tests)),
            "gpu_seconds": work, "longest_test": max(s for _, _, s in tests)}


@dataclass(frozen=True)
class _Shape:
    devices_per_node: int
    node_count: int


def packer_plan(tests: list[tuple[str, int, float]], c: float, nodes: int) -> dict[str, Any]:
    """The plugin's packer on the exact durations: the makespan its simulation of the
    allocation (whole nodes for the 2-node tests, best fit, no reservations) expects,
    plus the import C paid once by the warm workers. What the run could reach with
    perfect estimates and no overhead: the reference the run is measured against besides
    the area bound (which lets a 2-node test use any 16 free GPUs)."""
    from pytest_trtllm_slurm.planning.packing import WARM_STARTUP, Estimates, Pool, pack

    pool = Pool("w3/allocation/warm", nodes=nodes, gpus_per_node=8, fixed_startup=WARM_STARTUP)
    planned = [(n, _Shape(*NEEDS[g])) for n, g, _ in tests]
    started = time.process_time()
    chunks = pack(planned, lambda _key: pool, Estimates(durations={n: s for n, _, s in tests}))
    return {"seconds": c + max(ch.start + ch.expected for ch in chunks), "chunks": len(chunks),
            "packing_cpu_seconds": time.process_time() - started}


def outcomes(xml_paths: list[Path], expected: list[str]) -> dict[str, Any]:
    """Every expected test exactly once and passed? (junit XML testcase elements)"""
    seen: Counter[str] = Counter()
    bad: list[str] = []
    for path in xml_paths:
        for case in ET.parse(path).iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            seen[name] += 1
            if any(child.tag in ("failure", "error", "skipped") for child in case):
                bad.append(name)
    want = Counter(f"test_w3::{n.split('::', 1)[1]}" for n in expected)
    lost = sorted(set(want) - set(seen))
    doubled = sorted(n for n, k in seen.items() if k > 1)
    extra = sorted(set(seen) - set(want))
    return {"expected": len(expected), "outcomes": sum(seen.values()), "lost": len(lost),
            "doubled": len(doubled), "unexpected": len(extra), "not_passed": len(bad),
            "examples": (lost + doubled + extra + bad)[:5],
            "ok": not (lost or doubled or extra or bad)}


# -- the ways ---------------------------------------------------------------------------------
class Runner:
    def __init__(self, root: Path, nodes: int, c: float, tests: list[tuple[str, int, float]]):
        self.root, self.suite, self.nodes, self.tests = root, root / "suite", nodes, tests
        self.env = bench_env(BENCH_IMPORT_SECONDS=str(c))
        self.runs = 0

    def plugin(self, extra: list[str], profile: str | None = None) -> dict[str, Any]:
        self.runs += 1
        probe, junit = self.root / f"probe{self.runs}.json", self.root / f"plugin{self.runs}.xml"
        env = {**self.env, "BENCH_PROBE_OUT": str(probe)}
        if profile:  # the dispatch loop profiled (bench_probe): the timed run only
            env["BENCH_SAMPLE" if profile.endswith(".txt") else "BENCH_PROFILE"] = profile
        argv = [sys.executable, "-m", "pytest", "-q", *PLUGIN,
                "-p", "bench_probe", "--trtllm-remote", "--slurm-partition=batch",
                f"--trtllm-alloc-nodes={self.nodes}", f"--junitxml={junit}", *extra]
        epoch = time.time()
        seconds, proc = timed(argv, self.suite, env, timeout=7200)
        tail = (proc.stdout + proc.stderr)[-3000:]
        if not probe.exists():
            raise RuntimeError(f"plugin run wrote no probe (exit {proc.returncode}):\n{tail}")
        data = json.loads(probe.read_text())
        phases = wall_phases(data.get("marks", {}), epoch, epoch + seconds)
        cpu = data["cpu"]["end"]
        return {"seconds": seconds, "exit": proc.returncode, "tail": tail[-800:],
                "outcomes": outcomes([junit], [n for n, _, _ in self.tests]) if junit.exists()
                else {"ok": False, "examples": ["no junit xml"]},
                "cpu_self": cpu["self"], "cpu_children": cpu["children"],
                "cpu_after_collection": data["cpu"].get("after_collection", {}).get("self"),
                "maxrss_mib": data["maxrss_mib"], "timings": data["timings"],
                "plugin_commands": data["scheduler_commands"], "batches": len(data["batches"]),
                "counts": data.get("counts", {}), "phases": phases,
                "reads_by_name": data.get("reads_by_name", {}),
                "threads_at_end": data.get("threads_at_end", [])}

    def per_shape(self) -> dict[str, Any]:
        logs = self.root / "per_shape_logs"
        logs.mkdir(exist_ok=True)
        argvs, xmls = [], []
        for g, (per_node, nodes) in sorted(NEEDS.items(), reverse=True):
            xml = logs / f"shape{g}.xml"
            xmls.append(xml)
            cmd = (f"cd {shlex.quote(str(self.suite))} && exec " + shlex.join(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={xml}", f"test_w3.py::test_gpu{g}"]))
            argvs.append(["sbatch", "--wait", "-J", f"{PREFIX}-shape{g}", "-p", "batch",
                          "-N", str(nodes), f"--gres=gpu:h200:{per_node}",
                          "-o", str(logs / f"shape{g}.out"), "--wrap", cmd])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start, epoch = time.perf_counter(), time.time()
        procs = [subprocess.Popen(a, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for a in argvs]
        ids: list[str] = []
        try:
            for proc in procs:
                out, _ = proc.communicate(timeout=7200)
                ids += [w for w in out.split() if w.isdigit()]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            cancel_jobs(our_jobs(PREFIX))
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        present = [x for x in xmls if x.exists()]
        return {"seconds": seconds, "jobs_ended": jobs_ended_after(ids, epoch),
                "outcomes": outcomes(present, [n for n, _, _ in self.tests]),
                "cpu_self": cpu, "cpu_children": 0.0,
                "maxrss_mib": after.ru_maxrss / 1024, "jobs": len(argvs)}

    def measure(self, name: str, func: Any) -> dict[str, Any]:
        sdiag_reset()
        result = func()
        rpcs = sdiag_rpcs()
        n = len(self.tests)
        result.update({
            "rpcs": sum(rpcs.values()), "rpcs_per_test": sum(rpcs.values()) / n,
            "rpc_types": dict(sorted(rpcs.items(), key=lambda kv: -kv[1])[:12]),
            "cpu_ms_per_test": 1000 * (result["cpu_self"] + result["cpu_children"]) / n,
        })
        log(f"{name}: {result['seconds']:.1f} s, {result['rpcs']} RPCs "
            f"({result['rpcs_per_test']:.3f}/test), CPU {result['cpu_ms_per_test']:.2f} ms/test, "
            f"peak {result['maxrss_mib']:.0f} MiB, outcomes ok={result['outcomes']['ok']}")
        if result.get("phases"):
            log(f"{name}, wall seconds by phase: " + "; ".join(
                f"{what} {secs:.2f}" for what, secs in result["phases"]))
        return result


# -- main -------------------------------------------------------------------------------------
def bring_up(nodes: int, name: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(CLUSTER_UP), "--nodes", str(nodes), "--name", name],
                          capture_output=True, text=True, timeout=1800,
                          stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} instance did not come up:\n{proc.stderr[-3000:]}")
    info: dict[str, Any] = json.loads(proc.stdout)
    if len(info["nodes"]) != nodes:
        raise SystemExit(f"the {name} instance has {len(info['nodes'])} nodes, not {nodes}: "
                         f"tests/cluster/down --name {name} first")
    return info


def write_results(out: dict[str, Any], stem: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2) + "\n")
    packer = out.get("packer", {}).get("seconds")
    rows = ["| way | makespan s | / bound | / packer's plan | RPCs/test | CPU ms/test (own + "
            "commands) | peak MiB | outcomes |", "|---|---|---|---|---|---|---|---|"]
    for way, r in out["ways"].items():
        o = r["outcomes"]
        vs_packer = f"{r['seconds'] / packer:.2f}x" if packer else "-"
        rows.append(f"| {way} | {r['seconds']:.1f} | {r['seconds'] / out['bound']['seconds']:.2f}x"
                    f" | {vs_packer} | {r['rpcs_per_test']:.3f} | {r['cpu_ms_per_test']:.2f} "
                    f"({1000 * r['cpu_self'] / out['tests']:.2f} + "
                    f"{1000 * r['cpu_children'] / out['tests']:.2f}) | {r['maxrss_mib']:.0f} | "
                    f"{o['outcomes']}/{o['expected']}, lost {o['lost']}, doubled {o['doubled']}"
                    f", not passed {o['not_passed']} |")
    text = (f"W3: {out['tests']} tests on {out['nodes']} nodes x 8 GPUs ({out['started']}), "
            f"C = {out['C']} s, durations lognormal median {out['median']} s sigma "
            f"{out['sigma']} cap {out['max']} s (sum {out['sum_seconds']:.0f} s, longest "
            f"{out['bound']['longest_test']:.1f} s), lower bound "
            f"{out['bound']['seconds']:.1f} s"
            + (f"; the packer's plan on the exact durations {packer:.1f} s" if packer else "")
            + "\n\n"
            + "\n".join(rows) + "\n")
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)
    return RESULTS / f"{stem}.md"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--name", default="big", help="the named dev cluster instance")
    ap.add_argument("-C", "--import-seconds", type=float, default=10.0)
    ap.add_argument("--median", type=float, default=2.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--max", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--launch", default="single", choices=("mpi", "single"),
                    help="how 16-GPU (2-node) tests start (mpi: 16 pytest ranks per batch, "
                    "more than a 2-CPU machine starts in time)")
    ap.add_argument("--ways", default="plugin,per_shape")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--repeat", type=int, default=1,
                    help="timed plugin runs after the one warm-up (plugin, plugin_2, ...)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds to wait before each timed run (the last run's sessions "
                    "end on the same 2 CPUs: with 0 the next run's start shares them)")
    ap.add_argument("--plugin-args", default="", help="extra pytest arguments (shlex)")
    ap.add_argument("--profile", default=None,
                    help="profile the timed plugin run's dispatch loop into this file: "
                    "a CPU-time sampler's table (*.txt) or cProfile's stats (else)")
    ap.add_argument("--out", default=None, help="results file stem (default w3_<nodes>x<tests>)")
    args = ap.parse_args()

    info = bring_up(args.nodes, args.name)
    os.environ["SLURM_CONF"] = info["slurm_conf"]  # sdiag, squeue, scancel, sbatch, the plugin
    gpus = args.nodes * 8
    secs = durations(args.tests, args.median, args.sigma, args.max, args.seed)
    out: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "nodes": args.nodes, "gpus": gpus, "tests": args.tests,
                           "C": args.import_seconds, "median": args.median, "sigma": args.sigma,
                           "max": args.max, "seed": args.seed, "launch": args.launch,
                           "sum_seconds": sum(secs), "ways": {}}
    with tempfile.TemporaryDirectory(prefix="bench_w3_") as tmp:
        root = Path(tmp)
        tests = make_suite(root / "suite", secs, args.launch)
        out["bound"] = lower_bound(tests, args.import_seconds, gpus)
        out["packer"] = packer_plan(tests, args.import_seconds, args.nodes)
        runner = Runner(root, args.nodes, args.import_seconds, tests)
        log(f"W3: {len(tests)} tests, {args.nodes} nodes ({gpus} GPUs), lower bound "
            f"{out['bound']['seconds']:.1f} s")
        extra = shlex.split(args.plugin_args)
        try:
            for way in args.ways.split(","):
                if way == "plugin":
                    if not args.no_warmup:
                        log("plugin: warm-up run (allocation, warm workers, durations cache)")
                        out["plugin_warmup"] = runner.measure("plugin warm-up",
                                                              lambda: runner.plugin(extra))
                    for rep in range(args.repeat):
                        name = "plugin" if rep == 0 else f"plugin_{rep + 1}"
                        time.sleep(args.pause)
                        out["ways"][name] = runner.measure(
                            name, lambda: runner.plugin(extra, args.profile))
                elif way == "per_shape":
                    release_allocation(runner.suite)  # the baseline gets every node
                    out["ways"]["per_shape"] = runner.measure("per_shape", runner.per_shape)
                else:
                    raise SystemExit(f"unknown way {way!r}")
        finally:
            release_allocation(runner.suite)
            cancel_jobs(our_jobs(PREFIX))
    write_results(out, args.out or f"w3_{args.nodes}x{args.tests}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
