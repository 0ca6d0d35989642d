"""Helpers of the fault drills (tests/test_faults.py): a suite whose tests fault on demand,
runs of it through the plugin on the real dev cluster, and what a user checks afterwards
(one junit outcome per collected test, the status named, nothing of ours left queued).

The suite needs 4 GPUs per test, so a node runs one batch at a time and a fault leaves
tests of its batch unstarted. ``FAULT`` picks the fault; ``FAULT_DIR`` is where the tests
leave their marks (``<name>.started``, ``fault_at``) and where the controller's conftest
writes the moment it replays a faulted test (``seen``), so detection times are measured
from the user's side without a timed assertion.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devcluster import run as sh

REPO = Path(__file__).resolve().parent.parent
# the drills' partition (both of the dev cluster's have two 4-GPU nodes); another engineer's
# jobs may hold one: DRILL_PARTITION=gb200 picks the other
PARTITION = os.environ.get("DRILL_PARTITION", "batch")
MODES = {"warm": [], "no-warm": ["--trtllm-no-warm-workers"], "one-shot": ["--trtllm-one-shot"]}

SUITE = '''import os, signal, time
from pathlib import Path

import pytest

MARKS = Path(os.environ.get("FAULT_DIR", "."))


def _started(name):
    (MARKS / f"{name}.started").write_text(os.environ.get("SLURMD_NODENAME", "?"))


def _fault():
    fault = os.environ.get("FAULT", "")
    if fault == "segv":
        (MARKS / "fault_at").write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        print("hang detected", flush=True)
        time.sleep(120)
    if fault == "fill":  # the disk under work_dirs fills up while the batch runs
        with open(os.environ["FAULT_FILL"], "wb", buffering=0) as out:
            for chunk in (65536, 4096, 1):  # to the last byte
                try:
                    while True:
                        out.write(b"x" * chunk)
                except OSError:
                    pass
    if fault == "wait":  # until the drill has done its fault from outside
        (MARKS / "waiting").write_text(os.environ.get("SLURMD_NODENAME", "?"))
        deadline = time.time() + 120
        while not (MARKS / "release").exists() and time.time() < deadline:
            time.sleep(0.1)


@pytest.mark.skip_less_device(4)
def test_1_first():
    _started("test_1_first")


@pytest.mark.skip_less_device(4)
def test_2_fault():
    _started("test_2_fault")
    _fault()


@pytest.mark.skip_less_device(4)
def test_3_after():
    _started("test_3_after")


@pytest.mark.skip_less_device(4)
def test_4_after():
    _started("test_4_after")
'''

# the controller (not the worker) notes when it replays a test's failure
SEEN_HOOK = '''

def pytest_runtest_logreport(report):
    seen = os.environ.get("FAULT_SEEN")
    if seen and not os.environ.get("TRTLLM_SLURM_WORKER") and report.failed:
        import time
        with open(seen, "a") as out:
            out.write(f"{time.time()} {report.nodeid}\\n")
'''

COLLECTED = ["test_fault.py::test_1_first", "test_fault.py::test_2_fault",
             "test_fault.py::test_3_after", "test_fault.py::test_4_after"]


def make_suite(root: Path, *, gpus: bool = True) -> Path:
    """The fault suite (``gpus=False``: without its GPU markers, for local_direct)."""
    suite = root / "faults"
    suite.mkdir()
    conftest = (REPO / "conftest_examples" / "conftest.py").read_text()
    (suite / "conftest.py").write_text(conftest + SEEN_HOOK)
    (suite / "pytest.ini").write_text((REPO / "conftest_examples" / "pytest.ini").read_text())
    (suite / "test_fault.py").write_text(
        SUITE if gpus else SUITE.replace("@pytest.mark.skip_less_device(4)\n", ""))
    (suite / "marks").mkdir()
    return suite


@contextlib.contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A real, small file system (tmpfs of ``size``) mounted at ``path``: a disk that fills."""
    path.mkdir(parents=True, exist_ok=True)
    res = sh(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False)
    if res.returncode != 0:
        raise AssertionError(f"could not mount a {size} tmpfs at {path} (needs root): "
                             f"{res.stderr.strip()}")
    try:
        yield path
    finally:
        sh(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> None:
    """Fill the file system of ``path`` to the last byte."""
    with open(path / "fill", "wb", buffering=0) as out:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    out.write(b"x" * chunk)
            except OSError:
                pass


@dataclass
class DrillRun:
    returncode: int
    out: str
    outcomes: dict[str, list[str]]  # junit: name -> outcomes (one each, if all is well)
    wall: float

    def status_of(self, name: str) -> str:
        return self.outcomes[name][0]


def start(suite: Path, mode: str, *args: str, fault: str = "", partition: str = PARTITION,
          tag: str = "run") -> tuple[subprocess.Popen, Path]:
    """Start a dispatched run of the suite (returns at once; see ``finish``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    marks = suite / "marks"
    env.update(FAULT=fault, FAULT_DIR=str(marks), FAULT_SEEN=str(marks / "seen"),
               FAULT_FILL=str(suite / "work_dirs" / "fill"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    junit = suite / f"{tag}.junit.xml"
    where = (["--trtllm-dispatch=all", "--trtllm-scenario=local_direct"] if mode == "local"
             else [f"--slurm-partition={partition}", *MODES[mode]])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         f"--junitxml={junit}", *where, *args],
        cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, junit


def finish(proc: subprocess.Popen, junit: Path, started: float, timeout: float = 420) -> DrillRun:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the run did not end within {timeout} s:\n{out}") from None
    junit.with_suffix(".out").write_text(out)  # the whole output, for a failed drill
    return DrillRun(proc.returncode, out, junit_outcomes(junit), time.monotonic() - started)


def run(suite: Path, mode: str, *args: str, fault: str = "", tag: str = "run",
        partition: str = PARTITION) -> DrillRun:
    started = time.monotonic()
    proc, junit = start(suite, mode, *args, fault=fault, tag=tag, partition=partition)
    return finish(proc, junit, started)


def junit_outcomes(path: Path) -> dict[str, list[str]]:
    """testcase name -> the outcomes recorded for it (passed / failed / error / skipped)."""
    result: dict[str, list[str]] = {}
    if not path.exists():
        return result
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        for kind in kinds or ["passed"]:
            result.setdefault(name, []).append(kind)
    return result


def assert_one_outcome_each(run: DrillRun) -> None:
    """Every collected test is in the junit exactly once (nothing lost, nothing twice)."""
    assert sorted(run.outcomes) == sorted(COLLECTED), run.out
    for name, kinds in run.outcomes.items():
        assert len(kinds) == 1, (name, kinds, run.out)


def detection_seconds(suite: Path, since: float) -> float | None:
    """From ``since`` (epoch) to the first failure the controller replayed."""
    seen = suite / "marks" / "seen"
    if not seen.exists():
        return None
    times = [float(line.split()[0]) for line in seen.read_text().splitlines() if line.strip()]
    return min(times) - since if times else None


def alloc_id(suite: Path) -> str | None:
    path = suite / "work_dirs" / ".slurm_alloc.json"
    return json.loads(path.read_text())["job_id"] if path.exists() else None


def our_steps(job_id: str) -> list[str]:
    """Steps of the allocation other than the warm-worker agents."""
    out = sh(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], check=False).stdout
    return [line for line in out.splitlines() if line.strip() and not line.endswith(".agent")]


def our_jobs(suite: Path) -> list[str]:
    """Jobs submitted from the suite's directory (one-shot batches, allocations, requests)."""
    out = sh(["squeue", "-h", "-o", "%i|%j|%Z"], check=False).stdout
    return [line for line in out.splitlines() if str(suite) in line]


def wait_until(pred, what: str, timeout: float = 60.0, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


UP = REPO / "tests" / "cluster" / "up"
RUN_DIR = Path("/var/tmp/trtllm-devcluster/run")


def fail_node(node: str, *, kill_slurmd: bool) -> None:
    """Fail ``node`` as a dead machine does (its slurmd killed, the node set DOWN) or as
    an administrator does (DOWN, its processes left running). ``restore_node`` undoes it:
    other engineers share the cluster, keep the window short."""
    if kill_slurmd:
        pid = int((RUN_DIR / f"slurmd-{node}.pid").read_text().strip())
        os.kill(pid, 9)
    sh(["scontrol", "update", f"nodename={node}", "state=down", "reason=fault-drill"])


def restore_node(node: str) -> None:
    """The node back in service: its slurmd restarted (tests/cluster/up) and resumed."""
    sh(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    sh([sys.executable, str(UP)], timeout=300)
    wait_until(lambda: "idle" in node_state(node) or "mix" in node_state(node)
               or "alloc" in node_state(node), f"node {node} back in service", 60, 0.5)


def node_state(node: str) -> str:
    return sh(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout.strip()


def job_gone(job_id: str) -> bool:
    out = sh(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
    return out in ("", "COMPLETING") or "NODE_FAIL" in out


ENV_SUITE = '''import json, os
from pathlib import Path

import pytest

MARKS = Path(os.environ.get("FAULT_DIR", "."))
KEYS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
        "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES",
        "SLURMD_NODENAME")


def _dump(name):
    rank = os.environ.get("SLURM_PROCID", "0")
    (MARKS / f"{name}.{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in KEYS}))


@pytest.mark.skip_less_device(2)
def test_two_gpus():
    _dump("two_gpus")


@pytest.mark.skip_less_mpi_world_size(8)
@pytest.mark.trtllm_slurm(launch="mpi")
def test_eight_ranks():
    _dump("eight_ranks")
'''


def make_env_suite(root: Path) -> Path:
    """A suite whose tests write the Slurm variables they see (``marks/<test>.<rank>.json``)."""
    suite = make_suite(root)
    (suite / "test_fault.py").unlink()
    (suite / "test_env.py").write_text(ENV_SUITE)
    return suite


def seen_env(suite: Path, name: str) -> list[dict]:
    """What each rank of ``name`` saw, in rank order."""
    found = sorted((suite / "marks").glob(f"{name}.*.json"),
                   key=lambda p: int(p.name.split(".")[1]))
    return [json.loads(p.read_text()) for p in found]
