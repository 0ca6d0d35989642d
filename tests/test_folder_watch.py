"""A batch's end wakes the run loop's idle wait here (inotify on the local news folder); the
other notices (a report line, a pid) do not, so the loop does not go round at every line."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pytest_trtllm_slurm.execution.folder_watch import FolderWatch, wait_for_end
from pytest_trtllm_slurm.node.files import announce
from pytest_trtllm_slurm.node.forkloop import write_exit
from pytest_trtllm_slurm.node.paths import ENDED


def test_no_folder_no_watch(tmp_path: Path) -> None:
    assert FolderWatch.open(str(tmp_path / "not_yet")) is None


def test_only_a_batch_end_counts(tmp_path: Path) -> None:
    watch = FolderWatch.open(str(tmp_path))
    assert watch is not None
    try:
        announce(tmp_path / "batch_1")  # a report line's notice
        assert watch.ended() is False
        assert watch.ended() is False  # (drained)
        announce(tmp_path / ENDED)
        assert watch.ended() is True
        assert watch.ended() is False
    finally:
        watch.close()


def test_the_wait_ends_when_a_batch_ends_and_not_before(tmp_path: Path) -> None:
    watch = FolderWatch.open(str(tmp_path))
    assert watch is not None
    try:
        threading.Timer(0.1, announce, args=(tmp_path / "batch_1",)).start()
        start = time.monotonic()
        assert wait_for_end([watch], 0.6) is False  # a report line: slept the whole wait
        assert time.monotonic() - start >= 0.55
        notice = tmp_path / "batch_2"
        threading.Timer(0.2, write_exit, args=(
            {"exit_path": str(tmp_path / "exit_code"), "notice_path": str(notice)}, 0)).start()
        start = time.monotonic()
        assert wait_for_end([watch], 30.0) is True  # woken by the end, not the timeout
        assert time.monotonic() - start < 25
        # the exit code first, the batch's own notice, then the folder's end notice
        assert (tmp_path / "exit_code").read_text() == "0\n"
        assert notice.exists() and (tmp_path / ENDED).exists()
    finally:
        watch.close()


def test_a_closed_watch_falls_back_to_sleeping(tmp_path: Path) -> None:
    watch = FolderWatch.open(str(tmp_path))
    assert watch is not None
    os.close(watch.fileno())
    start = time.monotonic()
    assert wait_for_end([watch], 0.2) is False
    assert time.monotonic() - start >= 0.15


def test_a_gated_ranks_exit_says_done_then_wakes_the_controller(tmp_path: Path) -> None:
    """A multi-node step's ranks (node/gate.py): each exit is a batch's end to wait for."""
    import subprocess
    import sys

    work = tmp_path / "work_dirs" / "b8_20261204_000000_x"
    (work / "gate").mkdir(parents=True)
    news = tmp_path / "work_dirs" / ".news"
    news.mkdir()
    watch = FolderWatch.open(str(news))
    assert watch is not None
    try:
        code = ("import sys; from pathlib import Path; from pytest_trtllm_slurm.node.gate "
                "import Gate; Gate(Path(sys.argv[1]), 10.0)")
        subprocess.run([sys.executable, "-c", code, str(work / "gate")], check=True,
                       env={**os.environ, "SLURM_PROCID": "3", "SLURM_NTASKS": "8"},
                       timeout=60)
        assert (work / "gate" / "done.3").exists()
        assert (news / ENDED).exists() and watch.ended() is True
    finally:
        watch.close()


def test_a_link_planted_as_the_folder_is_not_watched(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".news").symlink_to(tmp_path / "elsewhere")
    assert FolderWatch.open(str(tmp_path / ".news")) is None
