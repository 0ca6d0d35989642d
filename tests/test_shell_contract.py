"""The Shell contract is total: every shell answers every member, so callers never probe
(``isinstance`` against a runtime-checkable protocol costs a look per member, per call,
on the dispatch loop's hot path)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pytest_trtllm_slurm.transport import file_ops
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell


@pytest.mark.parametrize("shell_class", [LocalShell, SSHShell, OpenSSHShell])
def test_every_shell_answers_every_member_of_the_contract(shell_class: type) -> None:
    methods = {name for name, value in vars(Shell).items()
               if callable(value) and not name.startswith("_")}
    missing = sorted(name for name in methods if not callable(getattr(shell_class, name, None)))
    assert not missing, f"{shell_class.__name__} lacks {missing}"


def test_a_local_shell_does_the_ops_one_by_one_in_order(tmp_path: Path) -> None:
    shell = LocalShell()
    box = tmp_path / "box"
    stale = tmp_path / "stale"
    stale.write_text("old")
    assert shell.file_batch([file_ops.mkdir(str(box))]) is None  # nothing to save locally
    got = file_ops.run_ops(shell, [file_ops.mkdir(str(box), private=True),
                                   file_ops.write(str(box / "a"), "hello"),
                                   file_ops.read(str(box / "a")),
                                   file_ops.remove(str(stale)),
                                   file_ops.read(str(box / "absent"))])
    assert got == [b"", b"", b"hello", b"", b""]
    assert stat.S_IMODE(box.stat().st_mode) == 0o700
    assert stat.S_IMODE((box / "a").stat().st_mode) == 0o600
    assert not stale.exists()
