"""paramiko, imported without ``invoke``: ``paramiko.config`` imports invoke (~45 ms here, on
every remote run's critical path, before its connection starts) only to run an ssh config's
``Match exec`` lines. ``with_match_exec`` imports it when a config file has one. Every
module of this package takes paramiko from here, so the first import is this one."""

from __future__ import annotations

import re
import sys
from typing import Any

_blocked = "invoke" not in sys.modules
if _blocked:
    # paramiko.config catches the ImportError and keeps ``invoke = None`` until asked
    sys.modules["invoke"] = None  # type: ignore[assignment]
try:
    import paramiko  # noqa: E402
    import paramiko.config  # noqa: E402
finally:
    if _blocked and "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]  # anyone else's ``import invoke`` works as before

_MATCH_EXEC = re.compile(r"^[ \t]*match\b[^\n]*\bexec\b", re.IGNORECASE | re.MULTILINE)


def with_match_exec(config_text: str) -> None:
    """Give paramiko.config its invoke when ``config_text`` has a ``Match exec`` line (an
    ImportError then says invoke is not installed, as paramiko's own would)."""
    config: Any = paramiko.config  # (its invoke attributes are not in its stubs)
    if config.invoke is not None or not _MATCH_EXEC.search(config_text):
        return
    import invoke

    config.invoke = invoke
    config.invoke_import_error = None


__all__ = ["paramiko", "with_match_exec"]
