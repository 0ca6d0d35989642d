"""100,000 items (issue 21, part 3): the controller's steps at 10k, 30k and 100k trivial tests.

For each size, in the same invocation, on the same generated suite (modules of 250
parametrized trivial tests), each way runs as its own pytest process:

- ``plain``: pytest runs the items here (the plugin loaded, not dispatching): the baseline.
  Its ``reporting`` is the time inside ``pytest_runtest_logstart/logreport/logfinish``:
  pytest's own reporting of the items (terminal, junit, cache, ...);
- ``replay``: ``--trtllm-dispatch=all --trtllm-scenario=local_direct`` with the instant
  executor of bench_probe.py (a batch's reports.jsonl is written at submit, synthetic
  setup/call/teardown reports): the controller alone; ``replay`` is the loop's reading,
  checking and replaying of every record, to compare with plain's ``reporting``;
- ``local_direct``: the same with the real executor (a worker pytest runs the batches);
- ``slurm_warm`` (``--slurm-sizes``): ``--trtllm-remote --trtllm-dispatch=all`` on the dev
  cluster, after a small run that warms the persistent allocation and its warm workers.

Steps (from bench_probe.py; the controller's CPU seconds, steady on a shared machine, or
wall seconds with ``--clock wall``):

- collect: pytest's collection, less ``location``;
- location: every item's ``location`` (pytest computes it from the test's source; both ways
  need it), made after collection in every way alike so that neither hides it;
- plan (plan_items), pack (make_batches);
- submit: the loop's ``_submit`` (specs, node-id files, the executor's submit; the instant
  executor's writing of reports.jsonl, a worker's work in a real run, left out);
- replay: the loop's pumps (read, check and replay every record: what the controller does
  in a real run, the hook calls included, timed from outside);
- replay_fake: the instant executor's writing inside the pumps, left out of ``replay``
  (0 while every batch is submitted before the first pump; ``replay + replay_fake`` is the
  pump as it was timed before);
- reporting: the time inside pytest's logstart/logreport/logfinish hooks (a wrapper in
  them; the figure of the earlier rounds);
- reporting_calls: the same hooks' calls timed from outside, as the replay's are: pluggy's
  dispatch of each call counted in both ways (``replay/plain reporting calls``). Plain
  only: that clock's own reads (about 2 us a call here, 1 s at 100,000 items) fall outside
  the window it times, but inside a dispatched way's pump, so a dispatched way runs without
  it (``--call-clock-in-pump``: with it, the yardstick until stop 42);
- runtestloop, summary (pytest_terminal_summary), cpu (the whole process), wall.

Per item: microseconds per item of each step; a step that grows faster than linearly
shows a per-item figure that rises with the size. Peak memory: the controller's
ru_maxrss, and the worker's (a local_direct worker is the controller's child; a Slurm
worker writes its own next to its reports, ``BENCH_PROBE_WORKER=1``).

    python3 benchmarks/bench_items.py                       # 10k, 30k, 100k; no Slurm
    python3 benchmarks/bench_items.py --slurm-sizes 10000,30000 --partition batch

Writes benchmarks/results/items.json and items.md. The machine is small and shared: the
figures that mean something are the ratios within one invocation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import (
    BENCH_DIR,
    PLUGIN,
    bench_env,
    check_passed,
    cluster,
    log,
    release_allocation,
    summary,
    timed,
)
from bench_controller import PER_MODULE, make_suite

RESULTS_DIR = BENCH_DIR / "results"
STEPS = ("collect", "location", "plan", "pack", "submit", "replay", "replay_fake", "reporting",
         "reporting_calls", "runtestloop", "summary", "cpu", "wall")
CLOCK = "cpu"  # the steps in the controller's CPU seconds (--clock)
CALL_CLOCK_IN_PUMP = False  # --call-clock-in-pump: the yardstick of stop 42 and before
PROBE_KEYS = {"collect": "collect", "location": "location", "plan": "planning",
              "pack": "packing", "submit": "submit", "replay": "pump", "replay_fake": "pump_fake",
              "reporting": "reporting", "reporting_calls": "reporting_calls",
              "runtestloop": "runtestloop", "summary": "summary"}
DISPATCH = ["--trtllm-dispatch=all"]


def run_way(suite: Path, count: int, way: str, partition: str | None,
            select: tuple[str, ...] = ()) -> dict[str, Any]:
    """One pytest process of ``way`` in ``suite`` (``select``: its arguments, default the
    whole suite): wall, steps, peak memory."""
    probe_out = suite / "probe.json"
    probe_out.unlink(missing_ok=True)
    extra = {"BENCH_PROBE_OUT": str(probe_out), "BENCH_PROBE_WORKER": "1"}
    args = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "-p", "bench_probe",
            "-p", "no:cacheprovider"]
    if way == "replay":
        extra["BENCH_FAKE_EXECUTOR"] = "1"
        # no warm session beside the controller: its executor is replaced (the instant one)
        args.append("--trtllm-no-warm-workers")
    if way != "plain" and not CALL_CLOCK_IN_PUMP:
        extra["BENCH_CALL_CLOCK"] = "0"  # the pump is timed without the per-call clock
    if way in ("replay", "local_direct"):
        args += ["--trtllm-remote", *DISPATCH, "--trtllm-scenario=local_direct"]
    elif way == "slurm_warm":
        args += ["--trtllm-remote", *DISPATCH, f"--slurm-partition={partition}"]
    args += list(select)
    seconds, proc = timed(args, suite, bench_env(**extra), timeout=3600)
    check_passed(proc, count, f"items {way}")
    probe = json.loads(probe_out.read_text())
    timings = probe["timings"]
    suffix = "_cpu" if CLOCK == "cpu" else ""
    steps = {step: timings.get(key + suffix) for step, key in PROBE_KEYS.items()}
    if steps["collect"] is not None and steps["location"] is not None:
        steps["collect"] -= steps["location"]  # shown on its own
    steps["wall"] = seconds
    steps["cpu"] = probe["cpu_seconds"]
    workers = [float(p.read_text()) for p in suite.glob("work_dirs/*/reports.jsonl.maxrss")]
    for batch_dir in suite.glob("work_dirs/*_*"):  # this run's batches (state stays)
        if batch_dir.is_dir() and not batch_dir.name.startswith("."):
            shutil.rmtree(batch_dir, ignore_errors=True)
    worker_rss = max(workers) if workers else None
    if way == "local_direct" and probe.get("maxrss_children_mib"):
        worker_rss = max(worker_rss or 0.0, probe["maxrss_children_mib"])
    return {"steps": steps, "maxrss_mib": probe["maxrss_mib"], "worker_maxrss_mib": worker_rss,
            "batches": len(probe["batches"])}


def measure(size: int, reps: int, ways: list[str], partition: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_items_") as tmp:
        suite = Path(tmp)
        count = make_suite(suite, size)
        if "slurm_warm" in ways:  # warm the allocation and its workers (not measured)
            # the same rootdir (the allocation is the rootdir's), one module of the suite
            log(f"items {count}: warming the persistent allocation on {partition}")
            run_way(suite, PER_MODULE, "slurm_warm", partition, select=("test_mod000.py",))
        runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
        try:
            for rep in range(reps):
                for way in ways:
                    result = run_way(suite, count, way, partition)
                    runs[way].append(result)
                    log(f"items {count} rep {rep + 1} {way}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in result["steps"].items()
                                    if v is not None)
                        + f"; rss {result['maxrss_mib']:.0f} MiB, worker "
                        f"{result['worker_maxrss_mib'] or 0:.0f} MiB")
        finally:
            if "slurm_warm" in ways:
                release_allocation(suite)
    out: dict[str, Any] = {"items": count, "reps": reps, "ways": {}}
    for way, results in runs.items():
        out["ways"][way] = {
            "steps": {s: summary([r["steps"][s] for r in results]) for s in STEPS},
            "maxrss_mib": summary([r["maxrss_mib"] for r in results]),
            "worker_maxrss_mib": summary([r["worker_maxrss_mib"] for r in results]),
            "batches": results[-1]["batches"],
        }
    return out


def med(result: dict[str, Any], way: str, step: str) -> float | None:
    stat = result["ways"].get(way, {}).get("steps", {}).get(step)
    return stat["median"] if stat else None


RATIOS = ("replay/plain reporting", "replay/plain reporting calls", "replay/plain loop",
          "ctl MiB/plain", "worker MiB/plain", "wall/plain")


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """The targets, per dispatched way: its replay against plain's reporting, timed inside
    the hooks (the figure of the earlier rounds) and as pytest's calls of them (pluggy's
    dispatch counted, as the replay counts it), and against plain's whole loop; its
    controller's and worker's peak memory and its wall time against plain."""
    ways = result["ways"]

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    if "plain" not in ways:
        return {}  # --ways without the baseline: the steps only
    plain_rss = ways["plain"]["maxrss_mib"]["median"]
    out = {}
    for way in ways:
        if way == "plain":
            continue
        replay = med(result, way, "replay")
        out[way] = dict(zip(RATIOS, (
            div(replay, med(result, "plain", "reporting")),
            div(replay, med(result, "plain", "reporting_calls")),
            div(replay, med(result, "plain", "runtestloop")),
            div(ways[way]["maxrss_mib"]["median"], plain_rss),
            div(ways[way]["worker_maxrss_mib"]["median"], plain_rss),
            div(med(result, way, "wall"), med(result, "plain", "wall"))), strict=True))
    return out


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per size and way, each step's seconds and microseconds per item."""
    lines = ["| items | way | " + " | ".join(STEPS) + " | ctl MiB | worker MiB |",
             "|---|---|" + "---|" * (len(STEPS) + 2)]
    for result in results:
        n = result["items"]
        for way, data in result["ways"].items():
            cells = []
            for step in STEPS:
                value = data["steps"][step]["median"]
                cells.append("-" if value is None else f"{value:.2f} s ({value / n * 1e6:.0f} µs)")
            worker = data["worker_maxrss_mib"]["median"]
            lines.append(f"| {n} | {way} | " + " | ".join(cells)
                         + f" | {data['maxrss_mib']['median']:.0f} | "
                         + ("-" if worker is None else f"{worker:.0f}") + " |")
    lines += ["", "| items | way | " + " | ".join(RATIOS) + " |",
              "|---|---|" + "---|" * len(RATIOS)]
    for result in results:
        for way, values in result["ratios"].items():
            lines.append(f"| {result['items']} | {way} | " + " | ".join(
                "-" if v is None else f"{v:.2f}" for v in values.values()) + " |")
    lines += ["", "Growth of the per-item cost (µs per item at this size / at the smallest):",
              "", "| items | way | " + " | ".join(STEPS) + " |",
              "|---|---|" + "---|" * len(STEPS)]
    base = results[0]
    for result in results[1:]:
        for way in result["ways"]:
            cells = []
            for step in STEPS:
                a, b = med(result, way, step), med(base, way, step)
                cells.append("-" if not a or not b else
                             f"{(a / result['items']) / (b / base['items']):.2f}")
            lines.append(f"| {result['items']} | {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--slurm-sizes", default="",
                        help="sizes also run on warm Slurm (e.g. 10000,30000)")
    parser.add_argument("--partition", default="batch")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--ways", default="plain,replay,local_direct")
    parser.add_argument("--out", default="items")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the steps in the controller's CPU seconds (default: steady on a "
                             "shared machine) or wall seconds")
    parser.add_argument("--call-clock-in-pump", action="store_true",
                        help="time each reporting hook call in the dispatched ways too (their "
                             "reporting_calls), its clock's reads then counted in the pump")
    args = parser.parse_args()
    global CLOCK, CALL_CLOCK_IN_PUMP
    CLOCK, CALL_CLOCK_IN_PUMP = args.clock, args.call_clock_in_pump
    sizes = [int(s) for s in args.sizes.split(",") if s]
    slurm = {int(s) for s in args.slurm_sizes.split(",") if s}
    if slurm:
        cluster()
    started = time.time()
    results = []
    for size in sizes:
        ways = args.ways.split(",") + (["slurm_warm"] if size in slurm else [])
        result = measure(size, args.reps, ways, args.partition)
        result["ratios"] = ratios(result)
        results.append(result)
    text = table(results)
    print(text)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{args.out}.json").write_text(json.dumps(
        {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
         "seconds": time.time() - started, "results": results}, indent=2))
    (RESULTS_DIR / f"{args.out}.md").write_text(text + "\n")
    log(f"wrote {RESULTS_DIR / (args.out + '.json')} and .md")


if __name__ == "__main__":
    main()
