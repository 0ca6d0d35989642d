"""Warm workers: the agent (one per allocation node) and its served sessions.

Without Slurm: the agent started by hand with two (fake) GPUs in CUDA_VISIBLE_DEVICES,
batches sent through its mailbox as the controller sends them: concurrent batches get
disjoint GPUs, a batch that does not fit waits, a cancel kills the test's process group.
On the dev cluster, through the plugin: a second run in a warm allocation creates no
Slurm step at all, and a hang kills the test's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from devcluster import example_suite
from devcluster import run as sh
from report_lines import reports_in

from pytest_trtllm_slurm.execution.news import NewsFolder
from pytest_trtllm_slurm.node.paths import NEWS, Batch

REPO = Path(__file__).resolve().parent.parent

SUITE = '''import os, time
from pathlib import Path

HERE = Path(__file__).parent


def _hold(name):
    (HERE / f"{name}.cvd").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "?"))
    (HERE / f"{name}.pid").write_text(str(os.getpid()))
    while not (HERE / "go").exists():
        time.sleep(0.01)


def test_a():
    _hold("a")


def test_b():
    _hold("b")


def test_c():
    _hold("c")


def test_forever():
    (HERE / "forever.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.05)
'''


def wait_for(pred, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def put(inbox: Path, name: str, request: dict) -> None:
    """As the controller writes: a temporary name, then a rename."""
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{name}.tmp"
    tmp.write_text(json.dumps(request))
    tmp.rename(inbox / f"{name}.json")


class Agent:
    """An agent process started by hand, as its Slurm step would start it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.suite = root / "suite"
        self.suite.mkdir()
        (self.suite / "test_hold.py").write_text(SUITE)
        (self.suite / "pytest.ini").write_text("[pytest]\n")
        self.mail = root / "mail"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRTLLM_"))}
        env.update(CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_ID=f"t{uuid.uuid4().hex[:8]}",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_trtllm_slurm.node.agent", "--dir", str(self.mail),
             "--node", "n1", "--idle-exit", "120"],
            env=env, stdout=open(root / "agent.log", "w"), stderr=subprocess.STDOUT)
        self.session = root / "session"

    def start_session(self) -> None:
        self.session.mkdir()
        ids = [f"test_hold.py::test_{n}" for n in ("a", "b", "c", "forever")]
        (self.session / "ids.json").write_text(json.dumps(ids))
        s = self.session
        put(self.mail / "inbox", "s1", {
            "argv": [sys.executable, "-m", "pytest", "--rootdir", str(self.suite),
                     "-p", "no:cacheprovider", "-p", "pytest_trtllm_slurm.node.worker",
                     "--trtllm-worker-reports", str(s / "reports.jsonl"),
                     "--trtllm-worker-nodeids", str(s / "ids.json"),
                     "--trtllm-worker-serve", str(s), "--capture=tee-sys", "test_hold.py"],
            "cwd": str(self.suite), "env": {"PATH": self.env["PATH"]},
            "log_path": str(s / "session.log"), "exit_path": str(s / "exit_code")})

    def batch(self, name: str, nodeids: list[str], gpus: int, *, notice: bool = False) -> Path:
        work = self.root / name
        work.mkdir()
        put(self.session / "inbox", name, {
            "nodeids": nodeids, "gpus": gpus, "gpus_total": 2,
            "reports_path": str(work / "reports.jsonl"), "log_path": str(work / "job.log"),
            "exit_path": str(work / "exit_code"), "pid_path": str(work / "batch.pid"),
            "notice_path": Batch(str(work)).notice if notice else None, "env": {}})
        return work

    def stop(self) -> None:
        (self.session / "inbox").mkdir(parents=True, exist_ok=True)
        (self.session / "inbox" / "stop").write_text("")
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


@pytest.fixture
def agent(tmp_path: Path):
    agent = Agent(tmp_path)
    agent.start_session()
    yield agent
    (agent.suite / "go").write_text("")
    agent.stop()


def outcomes(work: Path) -> list[tuple[str, str]]:
    out = []
    for line in (work / "reports.jsonl").read_text().splitlines():
        for data in reports_in(json.loads(line)):
            if data["when"] == "call":
                out.append((data["nodeid"], data["outcome"]))
    return out


def test_concurrent_batches_get_disjoint_gpus_and_a_bigger_one_waits(agent: Agent) -> None:
    a = agent.batch("ba", ["test_hold.py::test_a"], gpus=1)
    b = agent.batch("bb", ["test_hold.py::test_b"], gpus=1)
    wait_for(lambda: (agent.suite / "a.pid").exists() and (agent.suite / "b.pid").exists(),
             "both one-GPU batches to run")
    c = agent.batch("bc", ["test_hold.py::test_c"], gpus=2)
    time.sleep(0.5)  # a round of the session's loop has seen the request
    assert not (c / "batch.pid").exists(), "the two-GPU batch started while both GPUs were held"
    cvd_a, cvd_b = (agent.suite / "a.cvd").read_text(), (agent.suite / "b.cvd").read_text()
    assert {cvd_a, cvd_b} == {"0", "1"}
    (agent.suite / "go").write_text("")
    wait_for(lambda: all((w / "exit_code").exists() for w in (a, b, c)), "the batches to end")
    assert (agent.suite / "c.cvd").read_text() == "0,1"
    assert [(w / "exit_code").read_text().strip() for w in (a, b, c)] == ["0", "0", "0"]
    assert outcomes(c) == [("test_hold.py::test_c", "passed")]
    assert '"session_finish"' in (c / "reports.jsonl").read_text()
    assert "[trtllm-slurm] START test_hold.py::test_c" in (c / "job.log").read_text()


def test_cancel_kills_the_test_and_frees_its_gpu(agent: Agent) -> None:
    work = agent.batch("bf", ["test_hold.py::test_forever"], gpus=2)
    wait_for(lambda: (agent.suite / "forever.pid").exists(), "the endless test to start")
    pid = int((agent.suite / "forever.pid").read_text())
    put(agent.session / "inbox", "bf", {})  # noise: a malformed duplicate must not crash it
    (agent.session / "inbox" / "bf.cancel").write_text("")
    wait_for(lambda: (work / "exit_code").exists(), "the cancelled batch's exit code")
    assert (work / "exit_code").read_text().strip() == str(128 + signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the test process to be gone", 15)
    (agent.suite / "go").write_text("")
    after = agent.batch("ba", ["test_hold.py::test_a"], gpus=2)  # both GPUs free again
    wait_for(lambda: (after / "exit_code").exists(), "the next batch")
    assert (agent.suite / "a.cvd").read_text() == "0,1"


def test_a_served_batch_announces_its_changes_and_a_quiet_round_lists_nothing(
        agent: Agent) -> None:
    """What lets the controller's round skip the batches without news (execution/news.py):
    the session renames the batch's notice into the work root's news folder after its pid,
    its reports lines and its exit code; while nothing changes, a round is one stat of the
    folder (no listing, no batch read); a notice is never older than what it announces,
    and another run's notices in the folder are left alone."""
    folder = agent.root / NEWS
    news = NewsFolder(str(folder))
    work = agent.batch("bn", ["test_hold.py::test_a"], gpus=1, notice=True)
    wait_for(lambda: (agent.suite / "a.pid").exists(), "the test to run")
    wait_for(lambda: news.take({"bn"}) == {"bn"}, "the batch's notice", timeout=10)
    assert (work / "batch.pid").exists() and (work / "reports.jsonl").stat().st_size > 0
    (folder / "another-run").write_text("")  # not this run's batch: stays
    for _ in range(3):  # what came meanwhile, and the listing our own removals cause
        news.take({"bn"})
        time.sleep(0.1)
    listings = news.listings
    for _ in range(10):  # the test holds: nothing changes
        assert news.take({"bn"}) == set()
        time.sleep(0.02)
    assert news.listings == listings, "a round without news listed the folder"
    assert (folder / "another-run").exists()

    (agent.suite / "go").write_text("")
    wait_for(lambda: (work / "exit_code").exists(), "the batch's end")
    wait_for(lambda: (folder / "bn").exists() and (folder / "bn").stat().st_mtime_ns
             >= (work / "exit_code").stat().st_mtime_ns, "the notice of its exit code", 10)
    assert news.take({"bn"}) == {"bn"} and not (folder / "bn").exists()
    assert '"session_finish"' in (work / "reports.jsonl").read_text()
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


def test_a_batch_needing_more_gpus_than_the_node_fails_clearly(agent: Agent) -> None:
    work = agent.batch("bx", ["test_hold.py::test_a"], gpus=3)
    wait_for(lambda: (work / "exit_code").exists(), "the refused batch")
    assert (work / "exit_code").read_text().strip() == "2"
    assert "wants 3 GPUs, this node has 2" in (work / "job.log").read_text()


# -- through the plugin, on the dev cluster ---------------------------------------------

ONE_GPU = '''import os, pytest


@pytest.mark.skip_less_device(1)
def test_one_gpu():
    assert os.environ["SLURM_JOB_ID"]
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 1


@pytest.mark.skip_less_device(1)
def test_hangs():
    if not os.environ.get("HANG"):
        return
    from pathlib import Path
    Path(os.environ["HANG"]).write_text(str(os.getpid()))
    print("hang detected", flush=True)
    import time
    time.sleep(600)
'''


def _pytest(suite: Path, *args: str, env: dict[str, str] | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--slurm-partition=gb200", *args],
        cwd=suite, capture_output=True, text=True, timeout=300, env={**base, **(env or {})},
        check=False)


@pytest.fixture
def warm_suite(devcluster: dict, tmp_path: Path):
    with example_suite(tmp_path / "warm", ONE_GPU) as suite:
        yield suite


def _steps(job_id: str) -> list[str]:
    out = sh(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID"], check=False).stdout
    return [line for line in out.split() if "." in line]


def test_a_second_run_in_a_warm_allocation_starts_no_step(warm_suite: Path) -> None:
    first = _pytest(warm_suite, "-k", "one_gpu")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "PASSED test_warm.py::test_one_gpu" in first.stdout
    assert "Starting a warm worker on" in first.stdout
    job_id = json.loads((warm_suite / "work_dirs" / ".slurm_alloc.json").read_text())["job_id"]
    beat = next((warm_suite / "work_dirs" / ".agents" / job_id).glob("*/heartbeat.json"))
    agent_pid = json.loads(beat.read_text())["pid"]
    wait_for(lambda: len(_steps(job_id)) >= 1, "accounting to show the agent's step")
    steps = _steps(job_id)

    second = _pytest(warm_suite, "-k", "one_gpu")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "PASSED test_warm.py::test_one_gpu" in second.stdout
    assert "Starting a warm worker" not in second.stdout
    assert json.loads(beat.read_text())["pid"] == agent_pid
    time.sleep(1.0)  # accounting records a new step within a moment; there must be none
    assert _steps(job_id) == steps, "the second run started a Slurm step"


def test_a_hang_kills_the_test_process_and_the_worker_stays(warm_suite: Path,
                                                           tmp_path: Path) -> None:
    pid_file = tmp_path / "hang.pid"
    result = _pytest(warm_suite, "-k", "hangs", env={"HANG": str(pid_file)})
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "HANG_DETECTED" in out
    pid = int(pid_file.read_text())
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the hung test process to be gone", 15)
    again = _pytest(warm_suite, "-k", "one_gpu")  # the same warm worker serves the next run
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Starting a warm worker" not in again.stdout


MIXED = '''import os, pytest


@pytest.mark.trtllm_slurm(devices=8, nodes=2, launch="mpi")
def test_two_node_mpi():
    assert os.environ["SLURM_STEP_ID"]


@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("i", range(3))
def test_after(i):
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 1
'''


COUNT_ROUNDS = '''

import json as _json


def pytest_configure(config):
    """The controller's rounds and the batches they asked the executor about."""
    if config.getoption("trtllm_worker_reports", default=None):
        return
    from pytest_trtllm_slurm.execution.monitor import Monitor
    from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor

    counts = {"rounds": 0, "polled": 0}
    poll, executor_poll = Monitor.poll, SlurmExecutor.poll

    def counted(self):
        counts["rounds"] += 1 if self.jobs else 0
        return poll(self)

    def counted_executor(self, handles):
        counts["polled"] += len(handles)
        return executor_poll(self, handles)

    Monitor.poll, SlurmExecutor.poll = counted, counted_executor
    config.add_cleanup(lambda: (config.rootpath / "rounds.json").write_text(_json.dumps(counts)))
'''

SLOW = '''import time, pytest


@pytest.mark.skip_less_device(1)
def test_slow():
    time.sleep(8)
'''


def test_the_rounds_read_a_quiet_warm_batch_only_at_its_news_and_the_safety_net(
        warm_suite: Path) -> None:
    """One warm batch whose test sleeps 8 s: the monitor's rounds (every 0.02-0.2 s) ask
    the executor about it when its node side announced a change (start, pid, reports,
    exit code) and at the safety net, not at every round: the net's period starts at
    ``CADENCE.news_net`` (0.5 s) and doubles while it finds nothing new (up to 4 s), so
    a quiet batch costs a handful of reads, not two a second; the result is the same."""
    (warm_suite / "test_warm.py").unlink()
    (warm_suite / "test_slow.py").write_text(SLOW)
    with (warm_suite / "conftest.py").open("a") as fh:
        fh.write(COUNT_ROUNDS)
    proc = _pytest(warm_suite)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "PASSED test_slow.py::test_slow" in proc.stdout
    counts = json.loads((warm_suite / "rounds.json").read_text())
    assert counts["rounds"] >= 30, counts
    assert counts["polled"] <= 0.75 * counts["rounds"], counts  # every round: polled == rounds
    # a fixed 0.5 s net alone reads it 16 times in its 8 s of sleep
    assert counts["polled"] <= 14, counts


LOST_NOTICES = '''import time, pytest


@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("i", range(4))
def test_quiet(i):
    time.sleep(3)
'''


def test_every_result_arrives_when_the_node_side_cannot_announce(warm_suite: Path) -> None:
    """The news folder cannot be made (a file has its name, as a file system that refuses
    the renames would do): every notice is lost, the safety net reads the batches, and
    every test's result is reported as passed."""
    (warm_suite / "test_warm.py").write_text(LOST_NOTICES)
    (warm_suite / "work_dirs").mkdir(mode=0o700)
    (warm_suite / "work_dirs" / ".news").write_text("not a folder\n")
    proc = _pytest(warm_suite)
    out = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, out
    for i in range(4):
        assert f"PASSED test_warm.py::test_quiet[{i}]" in proc.stdout, out
    assert (warm_suite / "work_dirs" / ".news").is_file()


def test_a_multi_node_mpi_step_gets_whole_nodes_then_gives_them_back(warm_suite: Path) -> None:
    (warm_suite / "test_warm.py").write_text(MIXED)
    result = _pytest(warm_suite)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "PASSED test_warm.py::test_two_node_mpi" in out
    for i in range(3):
        assert f"PASSED test_warm.py::test_after[{i}]" in out
    job_id = json.loads((warm_suite / "work_dirs" / ".slurm_alloc.json").read_text())["job_id"]
    wait_for(lambda: len(_steps(job_id)) >= 3, "accounting of the steps")
    names = sh(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,JobName"], check=False).stdout
    steps = [line.split("|")[1] for line in names.split() if "." in line.split("|")[0]]
    # one warm worker per node, one MPI step; the 1-GPU tests started no step of their own
    assert sum(name.endswith(".agent") for name in steps) == 2, steps
    assert sum("8gpu" in name for name in steps) == 1, steps
    assert not [name for name in steps if "1gpu" in name], steps


GATED = '''import os, time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _ranks_collected():
    log = HERE / "collected.log"
    lines = log.read_text().split() if log.exists() else []
    return sum(1 for line in lines if line.endswith(":8"))


@pytest.mark.trtllm_slurm(devices=8, nodes=2, launch="mpi")
def test_two_node_mpi():
    (HERE / f"mpi_start.{os.environ['SLURM_PROCID']}").write_text(repr(time.time()))


@pytest.mark.skip_less_device(1)
def test_hold():
    deadline = time.time() + 60
    while _ranks_collected() < 8:
        assert time.time() < deadline, "the MPI ranks did not collect while this test ran"
        time.sleep(0.05)
    time.sleep(0.5)
    (HERE / "hold_end").write_text(repr(time.time()))
'''

GATED_CONFTEST = '''import os
from pathlib import Path

# which processes collected this suite: "<pid>:<SLURM_NTASKS>" (8 = a rank of the MPI step)
with open(Path(__file__).parent / "collected.log", "a") as log:
    log.write(f"{os.getpid()}:{os.environ.get('SLURM_NTASKS', '-')}\\n")
'''


def test_a_multi_node_step_collects_while_other_batches_run_then_waits_for_its_nodes(
        warm_suite: Path) -> None:
    """The MPI step is launched at once (gated): its 8 ranks import the suite while the
    1-GPU test runs on its nodes, and its test starts only after that test ended."""
    conftest = (warm_suite / "conftest.py").read_text()
    (warm_suite / "conftest.py").write_text(conftest + "\n" + GATED_CONFTEST)
    (warm_suite / "test_warm.py").write_text(GATED)
    result = _pytest(warm_suite)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "PASSED test_warm.py::test_two_node_mpi" in out
    assert "PASSED test_warm.py::test_hold" in out  # it saw all 8 ranks collect
    hold_end = float((warm_suite / "hold_end").read_text())
    starts = [float(p.read_text()) for p in warm_suite.glob("mpi_start.*")]
    assert len(starts) == 8, starts
    assert min(starts) >= hold_end, (starts, hold_end)  # the gate held every rank
    gate = next((warm_suite / "work_dirs").glob("*8gpu*/gate"))
    # every rank said it collected, and that it exited (the nodes were given back then)
    assert sorted(p.name for p in gate.iterdir()) == sorted(
        ["open", "ready", *(f"ready.{r}" for r in range(8)), *(f"done.{r}" for r in range(8))])
    assert (gate / "ready").read_text() == "8\n"


def test_the_gate_says_ready_once_every_rank_is_and_gives_up_after_its_wait(
        tmp_path: Path) -> None:
    from pytest_trtllm_slurm.node.gate import wait_at_gate

    gate = tmp_path / "gate"
    assert wait_at_gate(gate, rank=1, size=2, max_wait=0.1, poll=0.01) is False
    assert not (gate / "ready").exists()  # only rank 0 says so, once all are ready
    assert wait_at_gate(gate, rank=0, size=2, max_wait=0.1, poll=0.01) is False
    assert (gate / "ready").exists() and not (gate / "open").exists()
    (gate / "open").write_text("")
    assert wait_at_gate(gate, rank=0, size=2, max_wait=0.1, poll=0.01) is True


TIMED_CONFTEST = '''import os, time
from pathlib import Path

# who collected this suite and when: the controller, or a session on a node (in the job)
_start = time.time()
time.sleep(1.5)  # stands in for the imports of a real suite
with open(Path(__file__).parent / "collected.log", "a") as log:
    who = "target" if os.environ.get("SLURM_JOB_ID") else "controller"
    log.write(f"{who} {_start} {time.time()}\\n")
'''


def _sessions(suite: Path) -> list[Path]:
    return sorted((suite / "work_dirs" / ".agents").glob("*/*/sessions/*"),
                  key=lambda p: p.stat().st_mtime)


def test_a_warm_run_starts_its_sessions_before_it_collects(warm_suite: Path) -> None:
    """In a warm allocation the sessions collect while the controller does: the batch
    finds its session ready instead of waiting for a second import of the suite."""
    conftest = (warm_suite / "conftest.py").read_text()
    (warm_suite / "conftest.py").write_text(conftest + "\n" + TIMED_CONFTEST)
    first = _pytest(warm_suite, "-k", "one_gpu")  # the allocation and its agents
    assert first.returncode == 0, first.stdout + first.stderr
    before = set(_sessions(warm_suite))
    (warm_suite / "collected.log").unlink()
    second = _pytest(warm_suite, "-k", "one_gpu")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "PASSED test_warm.py::test_one_gpu" in second.stdout
    new = [p for p in _sessions(warm_suite) if p not in before]
    assert new and all(p.name.startswith("early-") for p in new), new  # no other session
    rows = [line.split() for line in (warm_suite / "collected.log").read_text().splitlines()]
    controller = [(float(a), float(b)) for who, a, b in rows if who == "controller"]
    targets = [(float(a), float(b)) for who, a, b in rows if who == "target"]
    assert len(controller) == 1 and targets, rows
    # a session started collecting before the controller had finished its own collection
    assert min(a for a, _ in targets) < controller[0][1], rows


def test_a_test_the_early_session_did_not_collect_runs_in_a_session_by_node_id(
        warm_suite: Path) -> None:
    """Collection that depends on the environment: the session (in the job) ignores
    test_late.py when it collects the run's directory, the controller does not. The batch
    is handed to a session that collects its node ids, and the test runs."""
    conftest = (warm_suite / "conftest.py").read_text()
    (warm_suite / "conftest.py").write_text(
        conftest + '\ncollect_ignore = ["test_late.py"] if os.environ.get("SLURM_JOB_ID") '
        'else []\n')
    (warm_suite / "test_late.py").write_text(
        "import pytest\n\n\n@pytest.mark.skip_less_device(1)\ndef test_late():\n    pass\n")
    first = _pytest(warm_suite, "-k", "one_gpu")
    assert first.returncode == 0, first.stdout + first.stderr
    second = _pytest(warm_suite, "-k", "late")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "PASSED test_late.py::test_late" in out
    assert "collecting again by node id" in out


SECRET_TEST = '''import os, pytest
from pathlib import Path


@pytest.mark.skip_less_device(1)
def test_secret():
    seen = [os.environ.get(k) for k in ("HF_TOKEN", "PIP_INDEX_URL", "TRTLLM_SLURM_OTP")]
    Path(os.environ["SEEN"]).write_text(repr(seen))
'''


def _files_holding(top: Path, needles: list[str]) -> list[str]:
    found = []
    for path in top.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_secrets_reach_the_warm_session_through_its_agent_and_no_file(warm_suite: Path,
                                                                     tmp_path: Path) -> None:
    """HF_TOKEN (a secret name), a URL password and TRTLLM_SLURM_OTP in the controller's
    environment: the served test sees the first two, never the code, and no file of the
    run holds any of them. A run with another token gets an agent that has that token."""
    (warm_suite / "test_secret.py").write_text(SECRET_TEST)
    seen_file, otp = tmp_path / "seen", "615243"
    secrets = []
    for _ in range(2):
        token, password = f"hf_{uuid.uuid4().hex}", f"pw{uuid.uuid4().hex[:12]}"
        secrets += [token, password]
        url = f"https://alice:{password}@pypi.invalid/simple"
        result = _pytest(warm_suite, "-k", "secret", env={
            "HF_TOKEN": token, "PIP_INDEX_URL": url, "TRTLLM_SLURM_OTP": otp,
            "SEEN": str(seen_file)})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "PASSED test_secret.py::test_secret" in result.stdout
        assert "Starting a warm worker on" in result.stdout  # each set of secrets: its agent
        assert seen_file.read_text() == repr([token, url, None])
    job_id = json.loads((warm_suite / "work_dirs" / ".slurm_alloc.json").read_text())["job_id"]
    assert list((warm_suite / "work_dirs" / ".agents" / job_id).glob("*/sessions/*"))
    assert _files_holding(warm_suite / "work_dirs", [*secrets, otp]) == []
