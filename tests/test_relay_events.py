"""The relay's pushes woken by file events (node/relay.py ``FolderEvents``): a watched file
written or renamed into its folder is pushed at once, not at the relay's next look (up to
``WATCH_MAX`` later); without events (NFS, not Linux) the looks alone still push it.

The relay runs in this process on two pipes, as it runs on a login node on its channel; the
looks are made rare (``WATCH_MIN``/``WATCH_MAX`` set to minutes) where a test proves that an
event, not a look, pushed the file."""

from __future__ import annotations

import base64
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.node import relay as relay_module

RARE = 600.0  # seconds between two looks: never within a test


class PipeRelay:
    """A ``Relay`` serving two pipes in a thread; its lines out are read into a queue."""

    def __init__(self) -> None:
        in_read, self._in_write = os.pipe()
        self._out_read, out_write = os.pipe()
        self._writer = os.fdopen(self._in_write, "wb")
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        relay = relay_module.Relay(os.fdopen(in_read, "rb"), os.fdopen(out_write, "wb"))
        self._serving = threading.Thread(target=relay.serve, daemon=True)
        self._serving.start()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next(lambda m: "ready" in m)

    def _read(self) -> None:
        with os.fdopen(self._out_read, "rb") as out:
            for raw in out:
                self.lines.put(json.loads(raw))

    def send(self, message: dict[str, Any]) -> None:
        self._writer.write((json.dumps(message) + "\n").encode())
        self._writer.flush()

    def next(self, wanted: Any, timeout: float = 10.0) -> dict[str, Any] | None:
        """The first line out that ``wanted`` accepts within ``timeout`` s (None: none)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if wanted(message):
                return message
        return None

    def pushed(self, path: Path, timeout: float = 10.0) -> bytes | None:
        message = self.next(lambda m: m.get("push") == str(path), timeout)
        return None if message is None else base64.b64decode(message["data"])

    def close(self) -> None:
        self._writer.close()
        self._serving.join(10)


@pytest.fixture
def rare_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "WATCH_MIN", RARE)
    monkeypatch.setattr(relay_module, "WATCH_MAX", RARE)


@pytest.fixture
def relay() -> Iterator[PipeRelay]:
    served = PipeRelay()
    yield served
    served.close()


def rename_in(path: Path, text: str) -> None:
    """As a batch's launcher writes its exit code: a temporary file renamed over the name."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux")
def test_a_renamed_or_appended_file_is_pushed_by_its_folders_event(
        relay: PipeRelay, rare_looks: None, tmp_path: Path) -> None:
    exit_code, reports = tmp_path / "exit_code", tmp_path / "reports.jsonl"
    relay.send({"op": "watch", "path": str(exit_code), "offset": 0})
    relay.send({"op": "watch", "path": str(reports), "offset": 0})
    time.sleep(0.5)  # the watches' first look is made (nothing there), then none for minutes
    with reports.open("a") as out:
        out.write('{"line": 1}\n')
    assert relay.pushed(reports) == b'{"line": 1}\n', "an appended line waited for a look"
    rename_in(exit_code, "0\n")
    assert relay.pushed(exit_code) == b"0\n", "a renamed-in exit code waited for a look"
    with reports.open("a") as out:
        out.write('{"line": 2}\n')
    assert relay.pushed(reports) == b'{"line": 2}\n'


def test_without_events_the_looks_still_push(
        relay: PipeRelay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NFS (another client's writes), systems without inotify and Pythons without ctypes
    give no event."""
    monkeypatch.setitem(sys.modules, "ctypes", None)  # ``import ctypes`` fails
    exit_code = tmp_path / "exit_code"
    relay.send({"op": "watch", "path": str(exit_code), "offset": 0})
    time.sleep(1.0)  # the looks have slowed to WATCH_MAX
    rename_in(exit_code, "3\n")
    assert relay.pushed(exit_code) == b"3\n"


def test_an_unwatched_files_folder_is_let_go(
        relay: PipeRelay, rare_looks: None, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A batch's folder is watched while one of its files is, not for the relay's life."""
    wanted: list[set[str]] = []
    real_want = relay_module.FolderEvents.want

    def want(self: Any, folders: set[str]) -> None:
        wanted.append({f for f in folders if f.startswith(str(tmp_path))})  # this relay's
        real_want(self, folders)

    monkeypatch.setattr(relay_module.FolderEvents, "want", want)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    relay.send({"op": "watch", "path": str(first / "exit_code"), "offset": 0})
    relay.send({"op": "watch", "path": str(second / "exit_code"), "offset": 0})
    relay.send({"op": "unwatch", "path": str(first / "exit_code")})
    relay.send({"op": "ack", "path": str(second / "exit_code"), "offset": 0})  # a look now
    deadline = time.monotonic() + 10
    while not (wanted and wanted[-1] == {str(second)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wanted and wanted[-1] == {str(second)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux")
def test_a_folder_made_again_is_watched_again(
        relay: PipeRelay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A batch's folder removed and made again (a retry in the same work dir): the kernel
    dropped the old folder's watch, and the relay's next look watches the new one."""
    folder = tmp_path / "batch"
    folder.mkdir()
    exit_code = folder / "exit_code"
    relay.send({"op": "watch", "path": str(exit_code), "offset": 0})
    time.sleep(0.5)  # watched
    folder.rmdir()
    folder.mkdir()
    time.sleep(0.5)  # a few looks (at most WATCH_MAX apart) meanwhile
    monkeypatch.setattr(relay_module, "WATCH_GROWTH", 1e4)  # then none for minutes
    monkeypatch.setattr(relay_module, "WATCH_MAX", RARE)
    time.sleep(0.5)
    rename_in(exit_code, "0\n")
    assert relay.pushed(exit_code) == b"0\n", "the folder made again is not watched"
