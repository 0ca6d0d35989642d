"""The one command string sshd hands to the remote login shell (shared by both SSH shells)."""
from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def remote_command(argv: Sequence[str], *, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> str:
    """The one string sshd hands to the login shell: every piece quoted, argv only."""
    if not argv:
        raise ValueError("empty argv")
    cmd = shlex.join(argv)
    if env:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"invalid environment variable name(s): {bad}")
        cmd = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + cmd
    if cwd:
        cmd = f"cd {shlex.quote(cwd)} && {cmd}"
    return cmd


def piped_env_command(argv: Sequence[str], env: dict[str, str], *,
                      cwd: str | None = None) -> tuple[str, bytes]:
    """(command, what goes ahead of the command's input): ``argv`` run with ``env``, whose
    values are never on a command line (the local ``ssh``'s argv and the login node's
    ``sh -c`` are in ``ps`` for anyone): the login shell reads exactly their
    ``export`` lines from its stdin (dd one byte at a time: nothing of the command's own
    input is taken) and then execs ``argv``, which reads the rest."""
    bad = [k for k in env if not _ENV_NAME.match(k)]
    if bad:
        raise ValueError(f"invalid environment variable name(s): {bad}")
    blob = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()).encode()
    cmd = remote_command(argv)
    cmd = f'eval "$(dd bs=1 count={len(blob)} 2>/dev/null)" && exec {cmd}'
    if cwd:
        cmd = f"cd {shlex.quote(cwd)} && {cmd}"
    return cmd, blob
