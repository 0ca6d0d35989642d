"""Shared pieces of the benchmarks: statistics, the dev cluster, sdiag, the suites, cleanup.

Figures are medians of several repetitions with min and max; comparisons are ratios of
medians measured in the same invocation (the dev cluster is shared and noisy).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
CLUSTER_UP = REPO / "tests" / "cluster" / "up"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- statistics ---------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, Any]:
    """median / min / max / n / the values themselves (None when nothing was measured)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals), "values": [round(v, 4) for v in vals]}


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """median(a) / median(b) when both exist."""
    if not a or not b or not a.get("median") or not b.get("median"):
        return None
    return float(a["median"]) / float(b["median"])


def fmt(stat: dict[str, Any] | None, unit: str = "s", digits: int = 2) -> str:
    """``12.34 s (11.9-13.1)`` for a summary; ``-`` when there is none."""
    if not stat or stat.get("median") is None:
        return "-"
    med, lo, hi = stat["median"], stat["min"], stat["max"]
    spread = f" ({lo:.{digits}f}-{hi:.{digits}f}, n={stat['n']})" if stat.get("n", 0) > 1 else ""
    return f"{med:.{digits}f}{(' ' + unit) if unit else ''}{spread}"


# -- the dev cluster ------------------------------------------------------------------------
def cluster() -> dict[str, Any]:
    """tests/cluster/up (idempotent, fast when the cluster is up): its JSON."""
    proc = subprocess.run([sys.executable, str(CLUSTER_UP)], capture_output=True, text=True,
                          timeout=1800, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the dev cluster did not come up:\n{proc.stdout[-3000:]}"
                         f"\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def partition_info(info: dict[str, Any], name: str) -> dict[str, Any]:
    for part in info["partitions"]:
        if part["name"] == name:
            return part
    raise SystemExit(f"no partition {name!r} on the dev cluster: "
                     f"{[p['name'] for p in info['partitions']]}")


def sh(argv: Sequence[str], timeout: float = 120, check: bool = False,
       **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n"
                           f"{proc.stderr}")
    return proc


# -- sdiag: slurmctld RPCs ----------------------------------------------------------------------
_RPC_LINE = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)")


def sdiag_reset() -> None:
    sh(["sdiag", "--reset"], check=True)


def sdiag_rpcs() -> dict[str, int]:
    """slurmctld RPC counts by message type since the last reset (all users together)."""
    out = sh(["sdiag"], check=True).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    counts: dict[str, int] = {}
    for line in section.splitlines():
        m = _RPC_LINE.match(line)
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


def background_rpc_rate(seconds: float, windows: int = 3) -> float:
    """RPCs per second slurmctld serves while this benchmark does nothing: the other users
    of the shared dev cluster. The lowest of ``windows`` idle windows (their bursts come
    and go); subtracted from each run's count as a rough estimate."""
    rates = []
    for _ in range(windows):
        sdiag_reset()
        time.sleep(seconds / windows)
        rates.append(sum(sdiag_rpcs().values()) / (seconds / windows))
    return min(rates)


def jobs_ended_after(job_ids: Sequence[str], start_epoch: float) -> float | None:
    """Seconds from ``start_epoch`` to the last End time sacct has for ``job_ids`` (whole
    seconds): when the jobs really ended, as opposed to when ``sbatch --wait`` noticed."""
    if not job_ids:
        return None
    out = sh(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "--format=JobID,End"]).stdout
    ends = []
    for line in out.splitlines():
        _, _, end = line.partition("|")
        try:
            ends.append(datetime.fromisoformat(end.strip()).timestamp())
        except ValueError:
            continue
    return max(0.0, max(ends) - start_epoch) if ends else None


# -- jobs and allocations ------------------------------------------------------------------------
def our_jobs(prefix: str) -> list[str]:
    """Ids of this benchmark's jobs still queued (named ``prefix...``)."""
    out = sh(["squeue", "-h", "-u", os.environ.get("USER") or "root", "-o", "%i %j"]).stdout
    return [line.split()[0] for line in out.splitlines()
            if len(line.split()) > 1 and line.split()[1].startswith(prefix)]


def cancel_jobs(ids: Sequence[str]) -> None:
    if ids:
        sh(["scancel", *ids])


def release_allocation(rootdir: Path, config: Path | None = None) -> None:
    """``trtllm-slurm alloc release`` for ``rootdir`` (with ``config``: also every cluster
    that clusters file names, whose state lives on the cluster); also a remote one kept
    under ``work_dirs/.remote-*/``. Never leaves an allocation behind on the shared
    cluster."""
    sh([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc", "release",
        "--rootdir", str(rootdir), *(["--config", str(config)] if config else [])],
       timeout=120)
    for state in rootdir.glob("work_dirs/.remote-*/work_dirs/.slurm_alloc.json"):
        try:
            job = json.loads(state.read_text())["job_id"]
        except (OSError, ValueError, KeyError):
            continue
        sh(["scancel", str(job)])
        state.unlink(missing_ok=True)


# -- a suite reached over the dev cluster's sshd ------------------------------------------------
GITIGNORE = "__pycache__/\n.pytest_cache/\nwork_dirs/\n"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=bench", "-c",
                    "user.email=bench@localhost", *args], check=True, capture_output=True,
                   text=True)


def publish(suite: Path, base: Path, message: str) -> None:
    """``suite`` as a git repository (work dirs ignored) pushed to a bare origin in ``base``
    (what ``sync = "git"`` clones; a run also needs a repository to find its root)."""
    (suite / ".gitignore").write_text(GITIGNORE)
    origin = base / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git(suite, "init", "-q", "-b", "main")
    git(suite, "add", "-A")
    git(suite, "commit", "-q", "-m", message)
    git(suite, "remote", "add", "origin", str(origin))
    git(suite, "push", "-q", "origin", "main")


def devssh_table(ssh: dict[str, Any], *, sync: str, partition: str,
                 user_root_dir: Path | None = None, name: str = "devssh",
                 env: dict[str, str] | None = None) -> str:
    """A clusters-file table naming the dev cluster's sshd (key login) as cluster ``name``.

    Its ``env`` table (every test's environment there) turns pytest's plugin autoloading
    off, as ``bench_env`` does for the local ways: the controller's environment is not
    forwarded over SSH, and a remote worker that loads every plugin installed here starts
    ~1 s slower (0.2 s of a warm one-test run's critical path, measured in
    docs/benchmarks-performance.md), which is this machine's, not the plugin's."""
    values = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})}
    return (f"[clusters.{name}]\n"
            f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
            f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
            f'mfa = false\nsync = "{sync}"\npython = "{sys.executable}"\n'
            f'partition = "{partition}"\n'
            + (f'user_root_dir = "{user_root_dir}"\n' if user_root_dir else "")
            + f"\n[clusters.{name}.env]\n"
            + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items()))


# -- environment of every run ---------------------------------------------------------------------
def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every pytest a benchmark starts (controller, workers, jobs).

    Plugin autoloading is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1), so pytest itself starts
    in about half a second whatever else is installed here, the same for every way of
    running; the plugin is loaded explicitly with ``-p trtllm_slurm``. Python's bytecode
    cache is on (PYTHONDONTWRITEBYTECODE removed): a pip-installed plugin is precompiled,
    and without the cache every run would recompile the plugin's sources (~0.1 s) while
    pytest's own, installed precompiled, would not.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k not in ("PYTEST_ADDOPTS",
                                                              "PYTHONDONTWRITEBYTECODE")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(BENCH_DIR), str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


PLUGIN = ["-p", "trtllm_slurm"]  # the entry point name: works with autoloading on or off


def timed(argv: Sequence[str], cwd: Path, env: dict[str, str],
          timeout: float = 1200) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start, proc


def check_passed(proc: subprocess.CompletedProcess[str], count: int, what: str) -> None:
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or f"{count} passed" not in out:
        raise RuntimeError(f"{what}: expected {count} passed (exit {proc.returncode}):\n"
                           f"{out[-4000:]}")


#: the controller's steps in order (bench_probe's marks), each phase named by where it ends
PHASES = (("loaded", "interpreter, pytest and the plugins"),
          ("early_start", "the plugin's imports"),
          ("early_start_end", "the early start (the warm sessions asked for)"),
          ("configure", "the suite's conftests (C)"),
          ("collect_start", "configure and session start (the early starts)"),
          ("collect_end", "collection"),
          ("runtestloop_start", "collection's hooks"),
          ("dispatch_loop_start", "planning, packing, the executors"),
          ("dispatch_loop_end", "the dispatch loop (every result known)"),
          ("runtestloop_end", "after the loop"),
          ("unconfigure", "summary, junit XML, session end"))


def cpu_phases(cpu_marks: dict[str, list[float]]) -> list[tuple[str, float, float]]:
    """(phase, the main thread's CPU seconds, the process's) between bench_probe's marks,
    from its import on: set beside ``wall_phases``, a phase that waited shows."""
    out, at = [], cpu_marks.get("loaded")
    for mark, what in PHASES[1:]:
        if mark in cpu_marks and at is not None:
            thread, process = cpu_marks[mark]
            out.append((what, thread - at[0], process - at[1]))
            at = cpu_marks[mark]
    return out


def wall_phases(marks: dict[str, float], start: float, end: float) -> list[tuple[str, float]]:
    """The run's wall seconds cut at bench_probe's marks (a missing mark is skipped), from
    the process's start to its exit: where the time beyond the dispatch loop goes."""
    out, at = [], start
    for mark, what in PHASES:
        if mark in marks:
            out.append((what, marks[mark] - at))
            at = marks[mark]
    out.append(("the process's exit", end - at))
    return out
