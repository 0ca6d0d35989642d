"""A batch's end wakes the run loop's idle wait here (inotify on the folder of the local news
folder's end notice); the other notices (a report line, a pid) do not, and do not even wake
the wait's ``select``, so the loop does not go round (nor spend CPU) at every line."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

from pytest_trtllm_slurm.execution.folder_watch import FolderWatch, wait_for_end
from pytest_trtllm_slurm.execution.news import NewsFolder
from pytest_trtllm_slurm.node.files import announce
from pytest_trtllm_slurm.node.forkloop import write_exit
from pytest_trtllm_slurm.node.paths import ENDED, end_notice


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


def test_a_report_lines_notice_does_not_even_wake_the_wait(tmp_path: Path) -> None:
    news = NewsFolder(str(tmp_path / ".news"))
    (tmp_path / ".news").mkdir()
    watch = news.watch()  # (its end notice's folder made here, private)
    assert watch is not None
    try:
        assert (tmp_path / ".news" / ".ends").stat().st_mode & 0o777 == 0o700
        for n in range(20):
            announce(tmp_path / ".news" / f"batch_{n % 3}")
        assert select.select([watch], [], [], 0)[0] == []  # no wake-up at all
        announce(end_notice(tmp_path / ".news"))
        assert select.select([watch], [], [], 1)[0] == [watch] and watch.ended() is True
    finally:
        news.close()


def test_the_wait_ends_when_a_batch_ends_and_not_before(tmp_path: Path) -> None:
    news = NewsFolder(str(tmp_path))
    watch = news.watch()
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
        assert notice.exists() and Path(end_notice(tmp_path)).exists()
    finally:
        news.close()


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
    folder = NewsFolder(str(news))
    watch = folder.watch()
    assert watch is not None
    try:
        code = ("import sys; from pathlib import Path; from pytest_trtllm_slurm.node.gate "
                "import Gate; Gate(Path(sys.argv[1]), 10.0)")
        subprocess.run([sys.executable, "-c", code, str(work / "gate")], check=True,
                       env={**os.environ, "SLURM_PROCID": "3", "SLURM_NTASKS": "8"},
                       timeout=60)
        assert (work / "gate" / "done.3").exists()
        assert end_notice(news).exists() and watch.ended() is True
    finally:
        folder.close()


def test_a_link_planted_as_the_folder_is_not_watched(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".news").symlink_to(tmp_path / "elsewhere")
    assert FolderWatch.open(str(tmp_path / ".news")) is None
