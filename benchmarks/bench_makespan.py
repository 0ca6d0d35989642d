"""Workloads 1 and 3: the makespan of a realistic suite, and the scheduler load, per way
of running it on the dev cluster.

The suite: ``per_shape`` tests each needing 1, 2, 4 and 8 GPUs (8 = 2 nodes x 4, one MPI
rank per GPU through the plugin), each sleeping S seconds, under a conftest that sleeps C
seconds at import. That sleep stands in for the torch / tensorrt_llm imports of a real
TensorRT-LLM suite: every pytest process that collects the suite pays it once (the
controller's local collection included).

Ways (each run from nothing queued to every result known):

- ``plugin_persistent``: ``pytest --trtllm-remote`` (the default): a warm persistent
  allocation (created by an untimed warm-up run, which also fills the durations cache),
  batches packed into steps that run side by side;
- ``plugin_ssh``: the same as ``plugin_persistent`` over the dev cluster's sshd
  (``--slurm-cluster=devssh``: key login, one connection and its relay; ``sync = "none"``,
  the issue's setting: the login node sees the same files; ``--ssh-sync git`` clones the
  suite under a user_root_dir instead), its own warm-up run first;
- ``plugin_one_shot``: the same with ``--trtllm-one-shot`` (one sbatch job per batch; its
  own warm-up run first);
- ``naive``: one ``sbatch --wait`` per test, all submitted at once, each ``pytest <nodeid>``;
- ``submitit``: one submitit job per test (``submitit`` is installed for the benchmark only;
  it is not a dependency of the plugin);
- ``per_shape``: one ``sbatch --wait`` job per GPU shape, its tests in sequence;
- ``lower_bound``: C + sum(GPUs x S) / GPUs in the partition, or C + S if larger.

Scheduler load: ``sdiag --reset`` right before each timed run, the RPC counts by message
type right after it. sdiag counts every user's RPCs: the other users of the shared dev
cluster are estimated from an idle window and reported next to the raw figure. For the
plugin, the scheduler commands it issued itself (``SlurmJobs`` counters, see
bench_probe.py) and the batches (= steps or jobs) it made are counted exactly.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import (
    BENCH_DIR,
    PLUGIN,
    REPO,
    bench_env,
    cancel_jobs,
    check_passed,
    cpu_phases,
    devssh_table,
    jobs_ended_after,
    log,
    our_jobs,
    publish,
    ratio,
    release_allocation,
    sdiag_reset,
    sdiag_rpcs,
    summary,
    timed,
    wall_phases,
)

SHAPES = {1: (1, 1), 2: (2, 1), 4: (4, 1), 8: (4, 2)}  # GPUs -> (per node, nodes)
PREFIX = "bench-w1"

CONFTEST = '''import os
import time

# Stands in for the torch / tensorrt_llm imports of a real TensorRT-LLM suite:
# every pytest process that collects this suite pays it once. The default is written
# here: a run over SSH does not forward the controller's environment to the cluster.
time.sleep(float(os.environ.get("BENCH_IMPORT_SECONDS", "{c}")))
'''
INI = """[pytest]
markers =
    trtllm_slurm: resources (pytest-trtllm-slurm)
"""


def suite_module(per_shape: int, s: float = 0.0) -> str:
    lines = ["import os", "import time", "", "import pytest", "",
             f'S = float(os.environ.get("BENCH_TEST_SECONDS", "{s}"))', ""]
    for gpus, (_per_node, nodes) in SHAPES.items():
        marker = (f"@pytest.mark.trtllm_slurm(devices={gpus})" if nodes == 1 else
                  f'@pytest.mark.trtllm_slurm(devices={gpus}, nodes={nodes}, launch="mpi")')
        lines += ["", marker, f"@pytest.mark.parametrize(\"i\", range({per_shape}))",
                  f"def test_gpu{gpus}(i):", "    time.sleep(S)", ""]
    return "\n".join(lines)


def make_suite(root: Path, per_shape: int, s: float = 0.0, c: float = 0.0
               ) -> list[tuple[str, int]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(INI)
    (root / "conftest.py").write_text(CONFTEST.replace("{c}", str(c)))
    (root / "test_suite.py").write_text(suite_module(per_shape, s))
    return [(f"test_suite.py::test_gpu{g}[{i}]", g) for g in SHAPES for i in range(per_shape)]


def ssh_cluster(root: Path, suite: Path, ssh: dict[str, Any], partition: str,
                sync: str) -> Path:
    """A clusters file naming the dev cluster's sshd as ``devssh`` (key login), and the
    suite as a git repository with an origin (what ``sync = "git"`` clones)."""
    publish(suite, root, "makespan suite")
    config = root / "clusters.toml"
    config.write_text(
        # the controller's environment is not forwarded over SSH: the probe plugin (-p
        # bench_probe) and the plugin under test must be importable there too
        devssh_table(ssh, sync=sync, partition=partition, user_root_dir=root / "cluster_home",
                     env={"PYTHONPATH": f"{BENCH_DIR}:{REPO}"}))
    return config


def lower_bound(tests: list[tuple[str, int]], s: float, c: float, gpus: int) -> float:
    return max(c + sum(g for _, g in tests) * s / gpus, c + s)


class Runner:
    def __init__(self, root: Path, partition: str, gpu_type: str | None, gpus: int,
                 s: float, c: float, per_shape: int, background: float,
                 ssh: dict[str, Any] | None = None, ssh_sync: str = "none") -> None:
        self.root = root
        self.partition = partition
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.s, self.c = s, c
        self.suite = root / "suite"
        self.tests = make_suite(self.suite, per_shape, s, c)
        self.env = bench_env(BENCH_TEST_SECONDS=str(s), BENCH_IMPORT_SECONDS=str(c))
        self.background = background  # RPCs/s of the other users (estimate)
        self.seq = 0
        self.ssh_config = (ssh_cluster(root, self.suite, ssh, partition, ssh_sync)
                           if ssh else None)

    # -- helpers -------------------------------------------------------------------
    def gres(self, per_node: int) -> str:
        return f"--gres=gpu:{self.gpu_type}:{per_node}" if self.gpu_type else (
            f"--gres=gpu:{per_node}")

    def pytest_cmd(self, *targets: str) -> str:
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets]
        return f"cd {shlex.quote(str(self.suite))} && exec {shlex.join(argv)}"

    def sbatch_wait(self, name: str, per_node: int, nodes: int, command: str,
                    logs: Path) -> list[str]:
        self.seq += 1
        return ["sbatch", "--wait", "-J", f"{PREFIX}-{name}", "-p", self.partition,
                "-N", str(nodes), self.gres(per_node), "-o", str(logs / f"{self.seq}.out"),
                "--wrap", command]

    def wait_all(self, argvs: list[list[str]], what: str) -> list[str]:
        """Start every ``sbatch --wait`` at once, wait for all; the job ids."""
        procs = [subprocess.Popen(a, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for a in argvs]
        ids: list[str] = []
        try:
            failed = []
            for argv, proc in zip(argvs, procs, strict=True):
                out, _ = proc.communicate(timeout=3600)
                ids += re.findall(r"Submitted batch job (\d+)", out)
                if proc.returncode != 0:
                    failed.append(f"{shlex.join(argv[:12])} ... -> {proc.returncode}: {out}")
            if failed:
                raise RuntimeError(f"{what}: {len(failed)} job(s) failed:\n" +
                                   "\n".join(failed[:5]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            cancel_jobs(our_jobs(PREFIX))
        return ids

    # -- the ways ----------------------------------------------------------------------
    def plugin(self, one_shot: bool, over_ssh: bool = False) -> dict[str, Any]:
        probe = self.root / "probe.json"
        probe.unlink(missing_ok=True)
        env = {**self.env, "BENCH_PROBE_OUT": str(probe)}
        argv = [sys.executable, "-m", "pytest", "-q", *PLUGIN, "-p", "bench_probe",
                "--trtllm-remote", f"--slurm-partition={self.partition}"]
        argv += ["--trtllm-one-shot"] if one_shot else []
        # e.g. "--trtllm-timeline=PATH" (diagnostics: the controller's own arguments)
        argv += shlex.split(os.environ.get("BENCH_PLUGIN_ARGS", ""))
        if over_ssh:
            if self.ssh_config is None:
                raise RuntimeError("plugin_ssh: the dev cluster describes no sshd")
            argv += ["--slurm-cluster=devssh", f"--trtllm-config={self.ssh_config}"]
        epoch = time.time()
        seconds, proc = timed(argv, self.suite, env, timeout=3600)
        check_passed(proc, len(self.tests), "plugin " + ("over SSH" if over_ssh else
                                                          "one-shot" if one_shot else
                                                          "persistent"))
        data = json.loads(probe.read_text())
        phases = wall_phases(data.get("marks", {}), epoch, epoch + seconds)
        log("  wall seconds by phase: " + "; ".join(f"{what} {s:.2f}" for what, s in phases))
        log("  CPU seconds by phase (main thread / process): " + "; ".join(
            f"{what} {t:.2f}/{p:.2f}" for what, t, p in cpu_phases(data.get("cpu_marks", {}))))
        return {"seconds": seconds, "phases": phases,
                "plugin_commands": data["scheduler_commands_total"],
                "plugin_command_counts": data["scheduler_commands"],
                "batches": len(data["batches"]), "batch_sizes": data["batches"]}

    def naive(self) -> dict[str, Any]:
        logs = self.root / "naive_logs"
        logs.mkdir(exist_ok=True)
        argvs = [self.sbatch_wait(f"naive{g}", *SHAPES[g], self.pytest_cmd(nodeid), logs)
                 for nodeid, g in self.tests]
        start, epoch = time.perf_counter(), time.time()
        ids = self.wait_all(argvs, "naive")
        return {"seconds": time.perf_counter() - start, "jobs_ended": jobs_ended_after(ids, epoch)}

    def per_shape(self) -> dict[str, Any]:
        logs = self.root / "per_shape_logs"
        logs.mkdir(exist_ok=True)
        argvs = [self.sbatch_wait(f"shape{g}", per_node, nodes,
                                  self.pytest_cmd(f"test_suite.py::test_gpu{g}"), logs)
                 for g, (per_node, nodes) in sorted(SHAPES.items(), reverse=True)]
        start, epoch = time.perf_counter(), time.time()
        ids = self.wait_all(argvs, "per-shape")
        return {"seconds": time.perf_counter() - start, "jobs_ended": jobs_ended_after(ids, epoch)}

    def submitit(self) -> dict[str, Any]:
        import submitit  # benchmark only

        folder = self.root / "submitit_logs"
        # a job unpickles run_pytest by reference: it imports this module (sbatch exports
        # the submitting process's environment)
        os.environ["PYTHONPATH"] = self.env["PYTHONPATH"]
        executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
        start = time.perf_counter()
        jobs = []
        try:
            for nodeid, g in self.tests:
                per_node, nodes = SHAPES[g]
                executor.update_parameters(
                    name=f"{PREFIX}-submitit{g}", slurm_partition=self.partition, nodes=nodes,
                    tasks_per_node=1, timeout_min=60,
                    slurm_gres=f"gpu:{self.gpu_type}:{per_node}" if self.gpu_type else
                    f"gpu:{per_node}")
                jobs.append(executor.submit(run_pytest, str(self.suite), nodeid, self.env))
            try:
                codes = [job.results()[0] for job in jobs]  # 2-node jobs have 2 tasks
            except Exception as exc:  # submitit's own errors (FailedJobError, ...)
                raise RuntimeError(f"submitit: {exc}") from exc
        finally:
            cancel_jobs(our_jobs(PREFIX))
        seconds = time.perf_counter() - start
        bad = [c for c in codes if c != 0]
        if bad:
            raise RuntimeError(f"submitit: {len(bad)} test(s) failed: {bad[:5]}")
        return {"seconds": seconds}

    # -- one timed run with its scheduler load ---------------------------------------------
    def measure(self, name: str, way: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        sdiag_reset()
        result = way()
        rpcs = sdiag_rpcs()
        total = sum(rpcs.values())
        estimate = max(0.0, total - self.background * result["seconds"])
        result.update({"rpcs": total, "rpcs_minus_background": estimate,
                       "rpc_types": dict(sorted(rpcs.items(), key=lambda kv: -kv[1])[:12])})
        log(f"  {name}: {result['seconds']:.1f} s, {total} RPCs "
            f"(~{estimate:.0f} without the background)"
            + (f", {result['batches']} batches, {result['plugin_commands']} plugin commands"
               if "batches" in result else ""))
        return result


def run_pytest(suite: str, nodeid: str, env: dict[str, str]) -> int:
    """What a submitit job runs (module level: submitit pickles it by reference)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid]
    return subprocess.run(argv, cwd=suite, env=env, check=False).returncode


WAYS = ("plugin_persistent", "plugin_ssh", "plugin_one_shot", "naive", "submitit", "per_shape")


def run(partition: dict[str, Any], s: float, c: float, per_shape: int, reps: int,
        background: float, ways: tuple[str, ...] = WAYS,
        naive_reps: int | None = None, ssh: dict[str, Any] | None = None,
        ssh_sync: str = "none") -> dict[str, Any]:
    gpus = len(partition["nodes"]) * int(partition["gpus_per_node"])
    out: dict[str, Any] = {"partition": partition["name"], "gpus": gpus, "S": s, "C": c,
                           "tests": per_shape * len(SHAPES), "reps": reps, "ways": {}}
    with tempfile.TemporaryDirectory(prefix="bench_makespan_") as tmp:
        runner = Runner(Path(tmp), partition["name"], partition.get("gpu_type"), gpus, s, c,
                        per_shape, background, ssh=ssh if "plugin_ssh" in ways else None,
                        ssh_sync=ssh_sync)
        tests = len(runner.tests)
        out["lower_bound"] = lower_bound(runner.tests, s, c, gpus)
        log(f"makespan: {tests} tests, S={s} s, C={c} s, partition {partition['name']} "
            f"({gpus} GPUs), lower bound {out['lower_bound']:.1f} s")
        try:
            for way in ways:
                n = naive_reps if way in ("naive", "submitit") and naive_reps else reps
                if way == "submitit" and not _has_submitit():
                    out["ways"][way] = {"skipped": "submitit is not installed "
                                        "(pip install submitit)"}
                    continue
                if way == "plugin_ssh" and runner.ssh_config is None:
                    out["ways"][way] = {"skipped": "the dev cluster describes no sshd"}
                    continue
                func: Callable[[], dict[str, Any]]
                if way.startswith("plugin"):
                    func = functools.partial(runner.plugin, way == "plugin_one_shot",
                                             way == "plugin_ssh")
                    log(f"{way}: warm-up run (allocation, durations cache)")
                    runner.measure(f"{way} warm-up", func)
                else:
                    func = getattr(runner, way)
                results = []
                try:
                    for rep in range(n):
                        log(f"{way}: repetition {rep + 1}/{n}")
                        results.append(runner.measure(way, func))
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    if way.startswith("plugin"):
                        raise
                    log(f"{way} failed: {str(exc)[:2000]}")  # a baseline: the rest goes on
                    out["ways"][way] = {"skipped": f"failed: {str(exc)[:300]}"}
                    continue
                finally:
                    if way in ("plugin_persistent", "plugin_ssh"):
                        # the nodes are free for the others
                        release_allocation(runner.suite, runner.ssh_config)
                out["ways"][way] = aggregate(results, tests)
        finally:
            release_allocation(runner.suite, runner.ssh_config)
            cancel_jobs(our_jobs(PREFIX))
    bound = {"median": out["lower_bound"], "min": out["lower_bound"],
             "max": out["lower_bound"], "n": 1}
    for data in out["ways"].values():
        if "seconds" in data:
            data["ratio_to_lower_bound"] = ratio(data["seconds"], bound)
    persistent = out["ways"].get("plugin_persistent", {}).get("seconds")
    shape = out["ways"].get("per_shape", {}).get("seconds")
    out["persistent_vs_per_shape"] = ratio(persistent, shape)
    # the targets: over SSH at most 1.05x the bound and 1.03x the same run locally
    out["ssh_vs_persistent"] = ratio(out["ways"].get("plugin_ssh", {}).get("seconds"),
                                     persistent)
    return out


def aggregate(results: list[dict[str, Any]], tests: int) -> dict[str, Any]:
    agg: dict[str, Any] = {
        "seconds": summary([r["seconds"] for r in results]),
        "rpcs_per_test": summary([r["rpcs"] / tests for r in results]),
        "rpcs_per_test_minus_background": summary(
            [r["rpcs_minus_background"] / tests for r in results]),
        "rpc_types_last": results[-1]["rpc_types"] if results else {},
    }
    if results and "jobs_ended" in results[0]:
        agg["jobs_ended"] = summary([r["jobs_ended"] for r in results])
    if results and "plugin_commands" in results[0]:
        agg["plugin_commands"] = summary([r["plugin_commands"] for r in results])
        agg["plugin_commands_per_test"] = summary(
            [r["plugin_commands"] / tests for r in results])
        agg["batches"] = summary([r["batches"] for r in results])
        agg["plugin_command_counts_last"] = results[-1]["plugin_command_counts"]
        agg["batch_sizes_last"] = results[-1]["batch_sizes"]
    return agg


def _has_submitit() -> bool:
    try:
        import submitit  # noqa: F401
    except ImportError:
        return False
    return True
