"""Several file operations on a Shell's host in one round trip where the shell can carry
them together (the SSH relay's ``batch``), one by one otherwise: a served batch's folders,
files and removals on the login node cost one message, each op exactly as alone."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Sequence

from pytest_trtllm_slurm.transport.shell import READ_LIMIT, FileOp, LocalShell, Shell


def mkdir(path: str, *, private: bool = False) -> FileOp:
    return FileOp("mkdir", path, private=private)


def write(path: str, data: str, mode: int = 0o600) -> FileOp:
    return FileOp("write", path, data=data, mode=mode)


def read(path: str, limit: int = READ_LIMIT) -> FileOp:
    return FileOp("read", path, limit=limit)


def remove(path: str) -> FileOp:
    return FileOp("remove", path)


def wire(op: FileOp) -> dict[str, object]:
    """``op`` as the relay's request (``node/relay.py``; a write's bytes in base64)."""
    if op.op == "mkdir":
        return {"op": "mkdir", "path": op.path, "private": op.private}
    if op.op == "write":
        return {"op": "write", "path": op.path, "mode": op.mode,
                "data": base64.b64encode(op.data.encode()).decode("ascii")}
    if op.op == "read":
        return {"op": "read", "path": op.path, "offset": 0, "limit": op.limit}
    return {"op": "remove", "path": op.path}


def run_ops(shell: Shell, ops: Sequence[FileOp]) -> list[bytes]:
    """Do ``ops`` in order on ``shell``'s host, in one round trip where it can: each op's
    result (a read's bytes, b"" for the others). The first failure raises (ExecutionError
    or OSError, as the op alone would) and the ops after it are not done."""
    if not ops:
        return []
    done = shell.file_batch(ops)
    if done is not None:
        return done
    results: list[bytes] = []
    pending: list[str] = []  # removals in a row: one ``rm -f`` for them all
    for op in ops:
        if op.op == "remove":
            pending.append(op.path)
            results.append(b"")
            continue
        remove_files(shell, pending)
        pending = []
        if op.op == "mkdir":
            shell.mkdir(op.path, private=op.private)
        elif op.op == "write":
            shell.write_file(op.path, op.data, op.mode)
        results.append(shell.read_from(op.path, 0, op.limit) if op.op == "read" else b"")
    remove_files(shell, pending)
    return results


def remove_files(shell: Shell, paths: Sequence[str]) -> None:
    """``rm -f paths`` on the shell's host: unlinked here, one command over a remote shell."""
    if not paths:
        return
    if isinstance(shell, LocalShell):
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    else:
        shell.run(["rm", "-f", "--", *paths], timeout=30)
