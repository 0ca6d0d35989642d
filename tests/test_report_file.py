"""reports.jsonl on the node: what a killed worker wrote is all there, whole, though it is
fsynced in batches (node/report_file.py); a closed file is complete; the file is private."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_trtllm_slurm.node.report_file import ReportFile

ROOT = Path(__file__).resolve().parents[1]

# a writer that appends N lines as fast as it can, then dies by SIGKILL without closing
KILLED_WRITER = """
import json, os, signal, sys
from pathlib import Path
from pytest_trtllm_slurm.node.report_file import ReportFile

out = ReportFile(Path(sys.argv[1]))
for i in range(int(sys.argv[2])):
    out.append((json.dumps({"i": i, "pad": "x" * (i % 300)}) + "\\n").encode())
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("lines", [1, 5000])
def test_a_worker_killed_after_writing_loses_no_line(tmp_path: Path, lines: int) -> None:
    path = tmp_path / "work" / "reports.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path), str(lines)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    written = path.read_text().splitlines()
    assert [json.loads(line)["i"] for line in written] == list(range(lines))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_closed_file_has_every_line_and_a_reopened_one_starts_empty(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    out = ReportFile(first)
    out.append(b"one\n")
    out.append(b"two\n", sync=True)
    out.append(b"three\n")
    out.reopen(second)
    out.append(b"four\n")
    out.close()
    assert out.closed
    out.close()  # twice is harmless
    assert first.read_text() == "one\ntwo\nthree\n"
    assert second.read_text() == "four\n"
