"""node.files.write_atomic: the one way every layer writes a file another process reads.

Real files in tmp_path; the only stand-in is a spy around ``os.fsync`` that records what
was synced and then calls the real one.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_trtllm_slurm.node.files import SHARED, publish, temp_name, write_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    """A umask that would make a plain ``open()`` file group/world readable or worse."""
    old = os.umask(0o002)
    yield
    os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_private_by_default_whatever_the_umask(tmp_path: Path, umask: None) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}' and mode_of(path) == 0o600
    path.chmod(0o644)  # an older file, more open: the new one is 0600 again
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01" and mode_of(path) == 0o600


def test_explicit_and_shared_modes(tmp_path: Path, umask: None) -> None:
    script = write_atomic(tmp_path / "run.sh", "#!/bin/sh\n", mode=0o755)
    assert mode_of(script) == 0o755
    os.umask(0o077)  # exact: not masked by the umask
    assert mode_of(write_atomic(tmp_path / "x", "", mode=0o644)) == 0o644
    os.umask(0o022)  # SHARED: what open() would make
    assert mode_of(write_atomic(tmp_path / ".gitignore", "*\n", mode=SHARED)) == 0o644
    os.umask(0o077)
    assert mode_of(write_atomic(tmp_path / "plan.json", "[]", mode=SHARED)) == 0o600


def test_fsyncs_the_file_and_then_its_folder(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[bool, int, int]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((stat.S_ISDIR(st.st_mode), st.st_ino, st.st_size))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    path = tmp_path / "spec.json"
    write_atomic(path, "x" * 1000)
    assert synced == [(False, path.stat().st_ino, 1000),  # the data, before the rename
                      (True, tmp_path.stat().st_ino, synced[1][2])]  # then the rename


def test_an_empty_signal_file_is_renamed_into_place_without_fsyncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop or cancel file tells a live process; a crash that loses it ends that process
    too. Still private, still a rename (an old file's content is replaced whole)."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    stop = tmp_path / "stop"
    stop.write_text("old")
    old_inode = stop.stat().st_ino
    write_atomic(stop, "")
    assert synced == [] and stop.read_bytes() == b"" and mode_of(stop) == 0o600
    assert stop.stat().st_ino != old_inode  # renamed over, not written in place
    write_atomic(tmp_path / "exit_code", "0\n")
    assert len(synced) == 2  # content: the file and its folder, as before


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat.json"
    size = 1 << 20
    contents = {b"a" * size, b"b" * size}
    write_atomic(path, b"a" * size)
    stop, torn, reads = threading.Event(), [], [0]

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()  # never absent either: rename replaces in one step
            reads[0] += 1
            if data not in contents:
                torn.append(len(data))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(40):
            write_atomic(path, (b"b" if i % 2 == 0 else b"a") * size)
    finally:
        stop.set()
        thread.join()
    assert reads[0] > 0
    assert not torn, f"a reader saw a partly written file ({torn[:3]})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heartbeat.json"]  # no temps


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "inside").write_text("keep")  # a non-empty folder cannot be renamed over
    with pytest.raises(OSError):
        write_atomic(busy, "new")
    assert (busy / "inside").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "no" / "such" / "dir" / "f", "x")
    made = write_atomic(tmp_path / "made" / "deep" / "f", "x", parents=True)
    assert made.read_text() == "x"


def test_temp_names_are_never_what_a_reader_looks_for(tmp_path: Path) -> None:
    names = {temp_name(tmp_path / "req.json").name for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert name.startswith(".req.json.") and name.endswith(".tmp")
    assert not temp_name(tmp_path / "ready.3").name.startswith("ready.")


def test_publish_a_file_a_library_wrote(tmp_path: Path, umask: None) -> None:
    tmp = tmp_path / ".coverage.db.tmp1"
    tmp.write_bytes(b"sqlite")
    assert mode_of(tmp) == 0o664
    publish(tmp, tmp_path / "coverage.db")
    assert (tmp_path / "coverage.db").read_bytes() == b"sqlite"
    assert mode_of(tmp_path / "coverage.db") == 0o600 and not tmp.exists()
    with pytest.raises(FileNotFoundError):
        publish(tmp, tmp_path / "coverage.db")
