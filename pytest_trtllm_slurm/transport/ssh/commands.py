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
