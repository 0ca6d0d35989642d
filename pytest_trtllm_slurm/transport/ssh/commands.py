"""What both SSH shells share: the one command string sshd hands to the remote login
shell, and the file operations of a shell with no relay."""
from __future__ import annotations

import base64
import functools
import json
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.node import relay as relay_module
from pytest_trtllm_slurm.transport.ssh.connect import SSHConnectionLost
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def remote_command(argv: Sequence[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> str:
    """The one string sshd hands to the login shell: every piece quoted, argv only."""
    if not argv:
        raise ValueError("empty argv")
    cmd = shlex.join(argv)
    if env:
        _check_names(env)
        cmd = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + cmd
    if cwd:
        cmd = f"cd {shlex.quote(cwd)} && {cmd}"
    return cmd


def piped_env_command(argv: Sequence[str], env: dict[str, str], *,
                      cwd: str | None = None) -> tuple[str, bytes]:
    """(command, what goes ahead of its input): ``argv`` run with ``env`` whose values are
    never on a command line (``ps``): the login shell reads exactly their ``export`` lines
    from stdin (dd one byte at a time) and execs ``argv``, which reads the rest."""
    _check_names(env)
    blob = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()).encode()
    cmd = remote_command(argv)
    cmd = f'eval "$(dd bs=1 count={len(blob)} 2>/dev/null)" && exec {cmd}'
    if cwd:
        cmd = f"cd {shlex.quote(cwd)} && {cmd}"
    return cmd, blob


def _check_names(env: dict[str, str]) -> None:
    bad = [k for k in env if not _ENV_NAME.match(k)]
    if bad:
        raise ValueError(f"invalid environment variable name(s): {bad}")


@functools.cache
def _relay_source() -> str:
    return Path(relay_module.__file__).read_text()  # type: ignore[arg-type]


class OneOpFiles:
    """``mkdir`` and ``write_file`` of a shell with no relay: the relay's own (node/relay.py,
    sent as ``python3 -c ... --one-op``: its verified mkdir and O_EXCL|O_NOFOLLOW write),
    one command each, so every SSH shell makes folders and files with the same code."""

    target: SSHTarget
    # the shell's: (argv, data for its stdin, argv the log shows) -> (rc, out, err, timed out)
    _exec_input: Callable[[list[str], bytes, list[str]], tuple[int, str, str, bool]]

    def _relayed_file_op(self, op: str, **fields: Any) -> dict[str, Any] | None:
        """``op`` through a live relay; None: none (SSHShell's has one)."""
        return None

    def _file_op(self, op: str, path: str, **fields: Any) -> None:
        if self._relayed_file_op(op, path=path, **fields) is not None:
            return
        request = json.dumps({"op": op, "path": path, **fields}).encode()
        rc, out, err, timed_out = self._exec_input(
            ["python3", "-c", _relay_source(), "--one-op"], request,
            ["python3", "-c", "<relay>", op, path])
        if timed_out or rc == 255:
            raise SSHConnectionLost(f"ssh to {self.target.alias} failed: "
                                    f"{err.strip() or 'timed out'}")
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = {"error": f"exit code {rc}: {err.strip()}"}
        if rc != 0 or "error" in answer:
            raise file_op_error(op, path, self.target.display,
                                answer.get("error") or err.strip())

    def mkdir(self, path: str, *, private: bool = False) -> None:
        """``mkdir -p`` whose new folders are 0700, each verified ours."""
        self._file_op("mkdir", path, private=private)

    def write_file(self, path: str, data: str | bytes, mode: int = 0o600) -> None:
        """Atomic: an exclusively created 0600 temp file next to ``path``, renamed over it."""
        blob = data.encode() if isinstance(data, str) else data
        self._file_op("write", path, mode=mode, data=base64.b64encode(blob).decode("ascii"))


def file_op_error(op: str, path: str, where: str, why: str) -> ExecutionError:
    """The one message of a failed mkdir or write on a cluster."""
    what = "create directory" if op == "mkdir" else "write"
    return ExecutionError(f"cannot {what} {path} on {where}: {why}")
