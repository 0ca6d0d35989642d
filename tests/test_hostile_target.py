"""A hostile target: every reader of what comes back from a cluster fed nested, huge,
malformed and foreign data (issue 29, items 3, 4 and 6).

What a target writes is not trusted: its reports file, its artefacts (benchmarks.json),
its warm workers' heartbeat files, a lock's holder file, the relay's answers and pushes.
Each case checks what a user would: the run ends with an outcome for every test and the
bad line quoted (short), never an INTERNALERROR, a broken summary, a forged junit
testcase, or memory and time that grow with what the target wrote. The runs are real:
pytest dispatching to a local subprocess (local_direct), the relay over the dev cluster's
sshd, a real tmpfs that fills (mounted as root, as CI runs).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import tracemalloc
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devcluster import run as sh
from fault_drill import alloc_id, make_suite, our_jobs, small_disk
from fault_drill import run as drill_run

from pytest_trtllm_slurm.controller.artefacts import ArtefactCollector
from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.local.direct import DirectExecutor
from pytest_trtllm_slurm.execution.monitor import Monitor
from pytest_trtllm_slurm.execution.records import MAX_LINE, UnreadableLine
from pytest_trtllm_slurm.execution.slurm.shell_lock import ShellLock
from pytest_trtllm_slurm.execution.slurm.warm_pool import agent_alive, heartbeat_of
from pytest_trtllm_slurm.node import relay as relay_source
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import LocalShell
from pytest_trtllm_slurm.transport.ssh.commands import remote_command
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell, SSHTarget
from pytest_trtllm_slurm.transport.ssh.relay_client import RelayChannel

REPO = Path(__file__).resolve().parent.parent
NESTED = b"[" * 200_000  # json.loads raises RecursionError on it

# -------------------------------------------------------------- the reports file, end to end

# a test that, run as the batch's worker, appends what PAYLOAD (a file) holds to its own
# reports file: anything a process on the target can write there
HOSTILE_SUITE = '''import os


def test_a_first(request):
    pass


def test_b_hostile(request, record_xml_attribute):
    reports = request.config.getoption("--trtllm-worker-reports", default=None)
    if os.environ.get("XML_NAME"):
        record_xml_attribute(os.environ["XML_NAME"], "x")
    if reports and os.environ.get("PAYLOAD"):
        with open(os.environ["PAYLOAD"], "rb") as src, open(reports, "ab") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)


def test_c_after():
    pass
'''
TESTS = ["test_hostile.py::test_a_first", "test_hostile.py::test_b_hostile",
         "test_hostile.py::test_c_after"]


def forged_report(**longrepr_crash: Any) -> bytes:
    """A failed call report for test_b_hostile whose crash location has ``longrepr_crash``."""
    crash = {"path": "test_hostile.py", "lineno": 7, "message": "boom", **longrepr_crash}
    data = {
        "$report_type": "TestReport", "nodeid": TESTS[1], "when": "call", "outcome": "failed",
        "location": ["test_hostile.py", 6, "test_b_hostile"], "keywords": {"test_b_hostile": 1},
        "sections": [], "user_properties": [], "duration": 0.1, "start": 1.0, "stop": 1.1,
        "longrepr": {"reprcrash": crash, "sections": [], "chain": None, "reprtraceback": {
            "reprentries": [{"type": "ReprEntryNative", "data": {"lines": ["boom\n"]}}],
            "extraline": None, "style": "native"}},
    }
    return (json.dumps({"v": 1, "type": "report", "data": data}) + "\n").encode()


def long_warning() -> bytes:
    """A well-formed record longer than the longest line the controller reads."""
    record = {"v": 1, "type": "warning", "when": "runtest", "nodeid": TESTS[1],
              "message": "x" * MAX_LINE, "category": "builtins.UserWarning",
              "filename": "test_hostile.py", "lineno": 8}
    return (json.dumps(record) + "\n").encode()


def run_hostile(tmp_path: Path, payload: bytes = b"", **env: str) -> tuple[int, str, Path]:
    """The suite dispatched to a local subprocess with ``payload`` appended by the hostile
    test; (exit code, output, junit file)."""
    (tmp_path / "test_hostile.py").write_text(HOSTILE_SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "payload").write_bytes(payload)
    junit = tmp_path / "junit.xml"
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRTLLM_SLURM_", "PYTEST_"))}
    environ.update(PAYLOAD=str(tmp_path / "payload") if payload else "",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            environ.get("PYTHONPATH")])),
                   **env)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--trtllm-dispatch=all", "--trtllm-scenario=local_direct", f"--junitxml={junit}",
         "test_hostile.py"], cwd=tmp_path, env=environ, capture_output=True, text=True,
        timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr, junit


def junit_cases(junit: Path) -> dict[str, list[str]]:
    """testcase (file::name) -> outcomes, from the junit file as any CI reads it."""
    found: dict[str, list[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        key = f"{case.get('classname')}.py::{case.get('name')}"
        found.setdefault(key, []).extend(kinds or ["passed"])
    return found


def assert_refused_cleanly(code: int, out: str, junit: Path, shown: str) -> None:
    """The run ended as a run with failures does; each test has exactly one outcome; the
    refusal names what was wrong and quotes the line, shortened."""
    assert code == 1, out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-5000:]
    assert "wrote a record the controller refuses" in out, out[-5000:]
    assert shown in out, out[-5000:]
    assert max(len(line) for line in out.splitlines()) < 20_000  # quoted, not dumped
    cases = junit_cases(junit)
    assert sorted(cases) == sorted(TESTS), cases
    assert all(len(kinds) == 1 for kinds in cases.values()), cases
    assert cases[TESTS[0]] == ["passed"], cases
    assert cases[TESTS[1]] == ["failure"], cases
    assert cases[TESTS[2]] == ["failure"], cases  # the rest of a refused batch fails
    assert "= 2 failed, 1 passed in " in out, out[-2000:]  # the summary, whole


@pytest.mark.parametrize("payload, shown", [
    pytest.param(NESTED + b"\n", "JSON nested too deep; the line: [[[[", id="nested"),
    pytest.param(forged_report(message=123), "reprcrash.message", id="message-not-a-string"),
    pytest.param(forged_report(lineno="7"), "reprcrash.lineno", id="lineno-not-a-number"),
    pytest.param(long_warning(), f"a line longer than {MAX_LINE} bytes", id="line-too-long"),
    pytest.param(b"\xff\xfe{}\n", "not UTF-8", id="not-utf8"),
])
def test_a_hostile_reports_line_fails_its_batch_with_the_line_quoted(
        tmp_path: Path, payload: bytes, shown: str) -> None:
    code, out, junit = run_hostile(tmp_path, payload)
    assert_refused_cleanly(code, out, junit, shown)


def test_an_xml_attribute_name_cannot_forge_a_junit_testcase(tmp_path: Path) -> None:
    name = 'x"/><testcase classname="forged" name="forged'
    code, out, junit = run_hostile(tmp_path, XML_NAME=name)
    assert "forged.py::forged" not in junit_cases(junit)
    assert_refused_cleanly(code, out, junit, "xml_attribute")


# -------------------------------------------------------------- the reports file, the reader


def watch_file(tmp_path: Path, writer: str) -> tuple[Monitor, list[list[dict]], float]:
    """A real local job (``sh -c writer`` writes its reports file) watched by a Monitor
    until it ends; the records of each event, and how long it took."""
    reports = tmp_path / "reports.jsonl"
    spec = JobSpec(scenario=Scenario.LOCAL_DIRECT, name="b", job_name="b",
                   command=["sh", "-c", writer, "sh", str(reports)], rootdir=str(tmp_path),
                   work_dir=str(tmp_path), log_path=str(tmp_path / "job.log"),
                   reports_path=str(reports))
    executor = DirectExecutor()
    monitor = Monitor([], poll_interval=0.05)
    monitor.add(executor.submit(spec), executor)
    events: list[list[dict]] = []
    started = time.monotonic()
    while monitor.active:
        for event in monitor.poll():
            events.append(event.records)
        time.sleep(0.01)
    return monitor, events, time.monotonic() - started


def test_a_line_with_no_end_is_refused_once_in_bounded_memory_and_linear_time(
        tmp_path: Path) -> None:
    """160 MiB without a newline: kept whole it took seconds of copying and twice its
    size; read here it is one refused line, with at most the longest line held."""
    tracemalloc.start()
    try:
        _, events, took = watch_file(
            tmp_path, 'head -c 167772160 /dev/zero | tr "\\0" x > "$1"; echo >> "$1"')
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    records = [r for batch in events for r in batch]
    assert len(records) == 1 and isinstance(records[0], UnreadableLine), records[:3]
    assert "longer than" in records[0].why and len(records[0].line) <= 1000
    assert peak < MAX_LINE + (32 << 20), peak  # the longest line, not the whole file
    print(f"\n[hostile] 160 MiB line: {took:.1f} s, peak {peak >> 20} MiB")


def test_an_ended_jobs_rest_is_read_in_chunks_not_one_event(tmp_path: Path) -> None:
    """A job that wrote 20 MiB of records and ended before any was read: the rest comes
    as many events, each at most a read's worth, not one event of the whole file."""
    line = json.dumps({"v": 1, "type": "finish", "nodeid": "t.py::" + "a" * 1000})
    count = (20 << 20) // (len(line) + 1)
    _, events, _ = watch_file(
        tmp_path, f"yes {shlex.quote(line)} | head -n {count} > \"$1\"")
    assert sum(len(batch) for batch in events) == count
    assert max(len(batch) for batch in events) <= (1 << 20) // len(line) + 1, [
        len(batch) for batch in events]


# -------------------------------------------------------------- artefacts, heartbeats, locks


class Bench:
    """pytest-benchmark's session as the collector uses it (its results list)."""

    def __init__(self) -> None:
        self.benchmarks: list[Any] = []


def collector(request: pytest.FixtureRequest, said: list[str]) -> ArtefactCollector:
    """The collector of this pytest session, merging into a benchmark session of its own;
    what it tells the user lands in ``said``."""
    found = ArtefactCollector(request.config)
    found.cov_plugin, found.bench = None, Bench()
    found._warn = said.append  # type: ignore[method-assign]
    return found


@pytest.mark.parametrize("content", [
    b"[1]", b'{"fullname": "x"}', b'[{"name": "t", "fullname": "t", "stats": {"min": "0"}}]',
    NESTED, b"\xff", b"[" + b'{"name": 1},' * 1000 + b"{}]"],
    ids=["list-of-int", "object", "stats-of-strings", "nested", "not-json", "many-bad"])
def test_a_hostile_benchmarks_file_is_refused_with_a_warning(
        tmp_path: Path, request: pytest.FixtureRequest, content: bytes) -> None:
    (tmp_path / "benchmarks.json").write_bytes(content)
    said: list[str] = []
    merged = collector(request, said)
    merged.collect(LocalShell(), str(tmp_path), lambda path: path)
    assert merged.bench.benchmarks == []
    (message,) = said
    assert "benchmark results of a dispatched batch are refused: benchmarks.json" in message
    assert len(message) < 2000


def test_a_worker_written_benchmarks_file_is_merged(tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    stats = {k: 1.0 for k in ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3",
                              "ld15iqr", "hd15iqr", "ops", "total")}
    stats.update(rounds=5, iterations=1, iqr_outliers=0, stddev_outliers=0, outliers="0;0",
                 data=[1.0] * 5)
    (tmp_path / "benchmarks.json").write_text(json.dumps([{
        "name": "test_x", "fullname": "t.py::test_x", "group": None, "param": None,
        "params": None, "extra_info": {}, "options": {}, "stats": stats}]))
    said: list[str] = []
    merged = collector(request, said)
    merged.collect(LocalShell(), str(tmp_path), lambda path: path)
    assert said == []
    (result,) = merged.bench.benchmarks
    assert result.fullname == "t.py::test_x" and result["mean"] == 1.0


@pytest.mark.parametrize("content", [b"[]", b'{"time": "now"}', b'{"time": 1e999}', NESTED[:4000],
                                     b'{"time": 1, "running": "2"}'])
def test_a_hostile_heartbeat_is_no_heartbeat(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "heartbeat.json").write_bytes(content)
    assert heartbeat_of(content) is None
    assert agent_alive(LocalShell(), str(tmp_path)) is False


def test_a_fresh_heartbeat_is_read(tmp_path: Path) -> None:
    (tmp_path / "heartbeat.json").write_text(json.dumps({"time": time.time(), "running": 1}))
    assert agent_alive(LocalShell(), str(tmp_path)) is True


def test_a_hostile_lock_holder_file_is_no_holder(tmp_path: Path) -> None:
    (tmp_path / "lock.holder").write_bytes(NESTED[:10_000])
    assert ShellLock(LocalShell(), str(tmp_path / "lock")).holder() is None


def test_a_lock_file_planted_as_a_link_is_not_followed(tmp_path: Path) -> None:
    """A link planted where a lock file goes (the allocation's state lock in a work_dirs
    others may write) is refused, naming it; nothing is made where the link points."""
    victim = tmp_path / "victim"
    (tmp_path / "state.lock").symlink_to(victim)
    lock = ShellLock(LocalShell(), str(tmp_path / "state.lock"))
    with pytest.raises(ExecutionError, match="is a symbolic link: not followed"):
        lock.acquire(5)
    assert not victim.exists()


def test_a_relay_batch_checks_each_file_op_as_alone_and_stops_at_the_first_refusal(
        tmp_path: Path) -> None:
    """The relay's ``batch`` (a request's folders and files in one round trip): a folder
    planted as a link where the batch's inbox goes is refused as a lone mkdir refuses it,
    and the request meant for it is not written (not through the link, not anywhere)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    agent = tmp_path / "agent"
    agent.mkdir(mode=0o700)
    (agent / "inbox").symlink_to(elsewhere)
    data = base64.b64encode(b'{"name": "s1"}').decode()
    answer = relay_source._answer({"op": "batch", "ops": [
        {"op": "mkdir", "path": str(agent / "sessions" / "s1" / "inbox"), "private": True},
        {"op": "mkdir", "path": str(agent / "inbox"), "private": True},
        {"op": "write", "path": str(agent / "inbox" / "s1.json"), "mode": 0o600,
         "data": data}]})
    first, refused = answer["answers"]  # the write after the refusal is not done
    assert first == {} and "symbolic link" in refused["error"]
    assert list(elsewhere.iterdir()) == []
    assert oct((agent / "sessions" / "s1" / "inbox").stat().st_mode & 0o777) == "0o700"
    bad = relay_source._answer({"op": "batch", "ops": [{"op": "await", "path": "/x"}]})
    assert bad["answers"][0]["errno"], "only the file operations ride a batch"


# -------------------------------------------------------------- a disk that fills


def test_the_test_that_filled_the_disk_has_its_one_outcome(devcluster: dict,
                                                          tmp_path: Path) -> None:
    """Warm workers, a 1 MiB tmpfs under work_dirs, a test that prints 2 MiB: the disk
    fills under its call report, and the short lines after it still fit. That test ends
    failed, naming the full disk, and is in the junit and the summary like the others."""
    suite = make_suite(tmp_path)
    test_file = suite / "test_fault.py"
    test_file.write_text(test_file.read_text().replace('    if fault == "hang":', (
        '    if fault == "print":\n        print("x" * (2 << 20), flush=True)\n'
        '    if fault == "hang":')))
    with small_disk(suite / "work_dirs", "1m"):
        try:
            result = drill_run(suite, "warm", fault="print")
        finally:
            ids = [line.split("|", 1)[0] for line in our_jobs(suite)]
            job_id = alloc_id(suite)
            if job_id or ids:
                sh(["scancel", *([job_id] if job_id else []), *ids], check=False)
    assert result.returncode == 1, result.out
    assert sorted(result.outcomes) == sorted([
        "test_fault.py::test_1_first", "test_fault.py::test_2_fault",
        "test_fault.py::test_3_after", "test_fault.py::test_4_after"]), result.out
    assert all(len(kinds) == 1 for kinds in result.outcomes.values()), result.outcomes
    assert result.status_of("test_fault.py::test_1_first") == "passed"
    assert result.status_of("test_fault.py::test_2_fault") == "failure", result.out
    assert "FAILED test_fault.py::test_2_fault" in result.out, result.out
    assert "without writing all of its reports" in result.out, result.out


# -------------------------------------------------------------- the relay's answers and pushes


@pytest.fixture
def ssh_transport(devcluster: dict[str, Any]) -> Iterator[Any]:
    """A paramiko transport to the dev cluster's sshd (no relay of its own)."""
    ssh = devcluster["ssh"]
    cluster = ClusterConfig(name="dev", ssh_host=ssh["host"], ssh_port=ssh["port_key"],
                            user=ssh["user"], identity_file=ssh["identity_file"],
                            known_hosts=ssh["known_hosts"])
    shell = SSHShell(SSHTarget.from_cluster(cluster, ssh_config_path=os.devnull), relay=False)
    shell.connect()
    assert shell._conn is not None
    yield shell._conn.transport
    shell.close()


def hostile_relay(transport: Any, script: str) -> RelayChannel:
    """A RelayChannel whose other end is ``script`` (python on the login node) instead of
    the relay: it writes what a broken or hostile relay would."""
    chan = transport.open_session(timeout=30)
    chan.exec_command(remote_command(["python3", "-u", "-c", script]))
    return RelayChannel(chan)


def test_a_relay_line_nested_too_deep_is_skipped(ssh_transport: Any) -> None:
    relay = hostile_relay(ssh_transport, (
        "import sys, time\n"
        "sys.stdout.write('[' * 200000 + '\\n'); sys.stdout.write('{\"ready\": 1}\\n')\n"
        "sys.stdout.flush(); time.sleep(30)\n"))
    try:
        assert relay._ready.wait(20)
        assert relay.alive  # the reader thread lives on
    finally:
        relay.close()


def test_a_long_relay_line_is_read_in_linear_time(ssh_transport: Any) -> None:
    """64 MiB of one line, in 64 KiB pieces: each piece is searched for its newline once
    (re-splitting the whole buffer per piece took 30 s); the line is skipped and the next
    one read."""
    relay = hostile_relay(ssh_transport, (
        "import sys, time\n"
        "piece = 'x' * (1 << 16)\n"
        "for i in range(1024):\n"
        "    sys.stdout.write(piece)\n"
        "sys.stdout.write('\\n{\"ready\": 1}\\n'); sys.stdout.flush(); time.sleep(60)\n"))
    try:
        start = time.monotonic()
        assert relay._ready.wait(60)
        took = time.monotonic() - start
        assert relay.alive
        assert took < 15, took
        print(f"\n[hostile] 64 MiB relay line: {took:.1f} s")
    finally:
        relay.close()


def test_a_malformed_relay_answer_ends_the_channel_not_the_caller(ssh_transport: Any) -> None:
    relay = hostile_relay(ssh_transport, (
        "import sys, json\n"
        "sys.stdout.write('{\"ready\": 1}\\n'); sys.stdout.flush()\n"
        "for line in sys.stdin:\n"
        "    ident = json.loads(line)['id']\n"
        "    sys.stdout.write(json.dumps({'id': ident, 'rc': 'zero', 'out': 1}) + '\\n')\n"
        "    sys.stdout.flush()\n"))
    try:
        assert relay._ready.wait(20)
        with pytest.raises(Exception) as raised:
            relay.run(["true"], timeout=10, input=None, env=None, cwd=None)
        assert type(raised.value).__name__ == "RelayLost"  # the shell falls back to a channel
    finally:
        relay.close()


def test_a_relay_that_pushes_past_the_window_is_not_kept_in_memory(ssh_transport: Any) -> None:
    """A relay that pushes 64 MiB the reader never asked for: the client keeps at most
    twice the window and then reads the file itself."""
    window = relay_source.PUSH_WINDOW
    relay = hostile_relay(ssh_transport, (
        "import sys, base64, json, time\n"
        "sys.stdout.write('{\"ready\": 1}\\n'); sys.stdout.flush()\n"
        "sys.stdin.readline()\n"  # the watch
        "piece = base64.b64encode(b'x' * (1 << 20)).decode()\n"
        "for i in range(64):\n"
        "    sys.stdout.write(json.dumps({'push': '/f', 'offset': i << 20, 'data': piece})"
        " + '\\n')\n"
        "sys.stdout.flush(); time.sleep(30)\n"))
    try:
        assert relay._ready.wait(20)
        relay.watch("/f", 0)
        deadline = time.monotonic() + 60
        while (relay.pushes < 64 and not relay._feeds["/f"].broken
               and time.monotonic() < deadline and relay.alive):
            time.sleep(0.05)
        held = sum(len(feed.data) for feed in relay._feeds.values())
        assert held <= 2 * window, held
        assert relay.pushed("/f", 0) is None  # the reader reads the file itself
    finally:
        relay.close()


def test_the_relay_pushes_a_window_ahead_of_the_reader_and_loses_nothing(
        ssh_transport: Any, tmp_path: Path) -> None:
    """The real relay, a 40 MiB file nobody reads at first: at most the window is pushed;
    reading it through the pushes then gets every byte, in order."""
    size = 40 << 20
    path = tmp_path / "grown"
    path.write_bytes(os.urandom(1 << 20) * 40)
    relay = RelayChannel.start(ssh_transport)
    assert relay is not None
    try:
        relay.watch(str(path), 0)
        time.sleep(3)  # the relay pushes what its window allows, then waits
        assert relay.pushed_bytes <= relay_source.PUSH_WINDOW, relay.pushed_bytes
        got, offset, deadline = [], 0, time.monotonic() + 120
        while offset < size and time.monotonic() < deadline:
            data = relay.pushed(str(path), offset)
            assert data is not None
            got.append(data)
            offset += len(data)
            if not data:
                relay.wait_news(0.2)
        assert b"".join(got) == path.read_bytes()
    finally:
        relay.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_a_streamed_stdin_is_bounded_on_the_login_node(ssh_transport: Any) -> None:
    """64 MiB streamed into a command that reads nothing for 10 s: the producer waits for
    the command (a window ahead of it) instead of the login node's relay queueing the
    stream, the relay holds about a window, and every byte arrives."""
    from test_ssh_relay import relay_pids

    relay = RelayChannel.start(ssh_transport)
    assert relay is not None
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid in relay_pids():
                try:
                    peak[0] = max(peak[0], _rss_kib(pid))
                except OSError:
                    pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    piece = b"y" * (1 << 20)

    sent_at: list[float] = []

    def produce(stdin: Any) -> None:
        for _ in range(64):
            stdin.write(piece)
        sent_at.append(time.monotonic())

    started = time.monotonic()
    try:
        result, error = relay.run_stream(["sh", "-c", "sleep 10; wc -c"], produce,
                                         timeout=120, cwd=None)
    finally:
        stop.set()
        sampler.join()
        relay.close()
    assert error is None and result.returncode == 0, result
    assert result.stdout.strip() == str(64 << 20)
    assert 0 < peak[0] < 40 * 1024, f"relay peak RSS {peak[0] >> 10} MiB"
    assert sent_at[0] - started > 9, "the whole stream was sent before the command read any"


def test_relay_answers_are_base64_where_data_is_expected() -> None:
    """The answer model refuses what would raise later in the shell (data not base64)."""
    from pytest_trtllm_slurm.transport.ssh.relay_client import RelayAnswer

    assert RelayAnswer.model_validate({"id": 1, "data": base64.b64encode(b"x").decode()})
    with pytest.raises(ValueError):
        RelayAnswer.model_validate({"id": 1, "data": "not base64!"})
    with pytest.raises(ValueError):
        RelayAnswer.model_validate({"id": 1, "rc": "0"})
