"""What a user sees of a dispatched run (issue 19): the live status (a terminal line
rewritten in place; plain lines without a terminal), the GPU-use summary, the timeline
files (Chrome trace JSON, SVG) and the summary JSON. Real local_direct dispatch: the
batches are real subprocess workers (no GPUs needed)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from timeline_checks import check_svg, check_trace

pytest_plugins = ["pytester"]

DISPATCH = ["-p", "no:cacheprovider", "--trtllm-remote", "--trtllm-dispatch=all",
            "--trtllm-scenario=local_direct"]
SUITE = """
import time
import pytest

@pytest.mark.trtllm_slurm(env={"GROUP": "a"})
@pytest.mark.parametrize("i", range(3))
def test_a(i):
    time.sleep(0.2)

@pytest.mark.trtllm_slurm(env={"GROUP": "b"})
def test_b_passes():
    time.sleep(0.2)

@pytest.mark.trtllm_slurm(env={"GROUP": "b"})
def test_b_fails():
    assert 0, "as planned"
"""
NODEIDS = {"test_suite.py::test_a[0]", "test_suite.py::test_a[1]", "test_suite.py::test_a[2]",
           "test_suite.py::test_b_passes", "test_suite.py::test_b_fails"}
STATUS = re.compile(r"trtllm-slurm: batches (\d+) pending(?: \([^)]*\))?, (\d+) running, "
                    r"(\d+) done \| tests (\d+) passed, (\d+) failed, (\d+) left \| "
                    r"GPUs (\d+) held, (\d+) busy(?: \| ETA (?:~\S+|\?)(?: \([^)]*\))?)?")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_"):
            monkeypatch.delenv(name)


def test_plain_status_summary_and_files(pytester: pytest.Pytester) -> None:
    """No terminal (pytester's pipe): plain status lines, the failure said as it happens,
    the GPU-use section of the terminal summary naming the files it wrote."""
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*DISPATCH, "--trtllm-timeline=out/timeline.json",
                                           "--trtllm-summary-json=out/summary.json")
    out = result.stdout.str()
    assert result.ret == 1, out
    result.assert_outcomes(passed=4, failed=1)
    first = STATUS.search(out)
    assert first is not None, out
    assert int(first[6]) == 5 and int(first[4]) == int(first[5]) == 0  # all 5 left at first
    # no earlier durations (no cache): no ETA from the packer's default guess
    assert first[0].endswith("| ETA ? (no durations yet)"), first[0]
    assert "trtllm-slurm: FAILED test_suite.py::test_b_fails (call)" in out
    assert "\x1b[" not in out  # no terminal, no escape sequences
    result.stdout.fnmatch_lines([
        "*- trtllm-slurm: GPU use -*",
        "2 batch(es), 5 dispatched test(s)",
        "GPU-seconds allocated 0, busy in tests 0 (- used)",
        "in queue * s (longest * s), in start-up * s (longest * s)",
        "makespan * s (the packer's guess * s (no earlier duration for 5 of 5 test(s)*); "
        "this run's test times alone need * s, *x that)",
        f"timeline (Perfetto / chrome://tracing): {pytester.path / 'out' / 'timeline.json'}",
        f"timeline picture: {pytester.path / 'out' / 'timeline.svg'}",
        f"summary JSON: {pytester.path / 'out' / 'summary.json'}",
    ])
    summary = json.loads((pytester.path / "out" / "summary.json").read_text())
    eff = summary["efficiency"]
    assert (eff["batches"], eff["tests"]) == (2, 5)
    assert eff["makespan_seconds"] > 0 and eff["startup_seconds_total"] > 0
    assert eff["lower_bound_seconds"] is None and eff["estimates_guessed"]
    assert 0 < eff["measured_bound_seconds"] <= eff["makespan_seconds"]
    assert {n for b in summary["batches"] for n in b["nodeids"]} == NODEIDS
    assert {b["status"] for b in summary["batches"]} == {"COMPLETED", "FAILED"}
    for name in ("timeline.json", "timeline.svg", "summary.json"):
        assert oct((pytester.path / "out" / name).stat().st_mode & 0o777) == "0o600"
    tests = check_trace(pytester.path / "out" / "timeline.json", summary)
    assert sorted(e["name"] for e in tests) == sorted(NODEIDS)
    outcomes = {e["name"]: e["args"]["outcome"] for e in tests}
    assert outcomes["test_suite.py::test_b_fails"] == "failed"
    assert outcomes["test_suite.py::test_a[0]"] == "passed"
    check_svg(pytester.path / "out" / "timeline.svg", summary)


def test_no_summary_without_dispatch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    assert "GPU use" not in result.stdout.str() and "trtllm-slurm: batches" not in \
        result.stdout.str()


# -- on a terminal ---------------------------------------------------------------------------
DRAW = re.compile(r"\r?\n\r\x1b\[2K(trtllm-slurm: [^\x1b]*)\x1b\[1A\x1b\[\d+G")
HIDE = "\x1b7\x1b[1B\r\x1b[2K\x1b8"
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def run_in_terminal(cwd: Path, *args: str, timeout: float = 120) -> str:
    """pytest with a real pseudo-terminal as its stdout (150 columns)."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "COLUMNS")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env,
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        proc.wait(timeout=30)
    return b"".join(chunks).decode(errors="replace")


def test_terminal_status_line_rewritten_in_place(pytester: pytest.Pytester) -> None:
    """The line is drawn below pytest's output and cleared before pytest writes: with the
    line's own bytes taken out, pytest's output is what it is without the plugin's line
    (the progress dots of the file on one line), and the line is gone at the end."""
    pytester.makepyfile(test_suite=SUITE)
    out = run_in_terminal(pytester.path, *DISPATCH)
    lines = DRAW.findall(out)
    assert lines, out
    assert all(STATUS.fullmatch(line) for line in lines), lines
    final = STATUS.fullmatch(lines[-1])
    assert final is not None and int(final[4]) + int(final[5]) >= 4  # it kept up
    assert "1 failed, 4 passed" in COLOUR.sub("", out)
    # every line drawn is cleared before the next bytes of pytest's own output
    assert out.rfind(HIDE) > out.rfind("\x1b[2Ktrtllm-slurm: batches"), out[-2000:]
    plain = COLOUR.sub("", DRAW.sub("", out).replace(HIDE, ""))
    assert re.search(r"test_suite\.py [.F]{5}", plain), plain
    assert "trtllm-slurm: batches" not in plain
