"""Checks for user values that reach an #SBATCH line, a script or an argv (a line break, a
leading ``-``); each returns the problem in words (None: fine) for the caller to name."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

#: Slurm account, QOS, reservation and partition names: letters, digits, ``_.+-``,
#: not starting with ``-`` (what sacctmgr and slurm.conf accept in practice).
_SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.:%\[\]-]*\Z")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@$-]*\Z")
_MOUNT_FLAGS = re.compile(r"[A-Za-z]+(\+[A-Za-z]+)*\Z")  # ro, rw, ro+rprivate (pyxis)

SLURM_NAME_RULE = "letters, digits and _ . + -, not starting with -"
ENV_NAME_RULE = "letters, digits and _, not starting with a digit"


def control_chars(value: str) -> list[str]:
    """The control and line-break characters of ``value``, as escapes (``['\\n', '\\x00']``):
    C0/C1, DEL, Unicode line/paragraph separators and bidi overrides (end a line, hide text)."""
    if value.isascii() and value.isprintable():  # the common case, without a look per char
        return []
    return list(dict.fromkeys(repr(ch)[1:-1] for ch in value
                              if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI))


_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F)}


def line_problem(value: str) -> str | None:
    """Problem with a value that must stay on one line (a path, a command, an image)."""
    bad = control_chars(value)
    return f"contains {', '.join(bad)} (a line break or control character)" if bad else None


def _dash_problem(value: str) -> str | None:
    return "starts with '-' (it would be read as an option)" if value.startswith("-") else None


def slurm_name_problem(value: str) -> str | None:
    """Problem with an account / partition / QOS / reservation / cluster name."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a text"
    problem = line_problem(value) or _dash_problem(value)
    if problem:
        return problem
    if not _SLURM_NAME.match(value):
        return f"is not a Slurm name ({SLURM_NAME_RULE})"
    return None


def argument_problem(value: str) -> str | None:
    """Problem with a positional value (an image, a program): one line, not empty, no option."""
    if not value:
        return "is empty"
    return line_problem(value) or _dash_problem(value)


def host_problem(value: str) -> str | None:
    """Problem with an SSH host (a name, an ssh config alias, an IP, ``[v6]``)."""
    return argument_problem(value) or (
        None if _HOST.match(value) else "is not a host name (letters, digits and . - _ : [ ] %)")


def user_problem(value: str) -> str | None:
    """Problem with a login name."""
    return argument_problem(value) or (
        None if _USER.match(value) else "is not a user name (letters, digits and _ . @ $ -)")


def env_name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        return f"is not an environment variable name ({ENV_NAME_RULE})"
    if name == "_":
        return "is set by the shell itself (bash replaces $_ before each command); use another name"
    return None


def env_value_problem(value: str) -> str | None:
    """An environment value can hold anything but NUL (execve ends the string there)."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a text"
    return "contains a NUL character (\\x00)" if "\x00" in value else None


def env_problem(env: Mapping[str, str]) -> str | None:
    """Every bad name or value of ``env`` in one text (None when all are fine)."""
    out = []
    for name, value in env.items():
        problem = env_name_problem(name)
        if problem:
            out.append(f"name {name!r} {problem}")
            continue
        problem = env_value_problem(value)
        if problem:
            out.append(f"{name}={value!r}: the value {problem}")
    return "; ".join(out) or None


def argv_problem(argv: Iterable[str]) -> str | None:
    """No argv element can hold NUL: execve would cut it there."""
    bad = [a for a in argv if "\x00" in a]
    return f"argument {bad[0]!r} contains a NUL character (\\x00)" if bad else None


def mount_problem(text: str) -> str | None:
    """Problem with a ``SRC[:DST[:FLAGS]]`` mount: absolute paths without ``,`` (pyxis's
    mount separator) or ``:`` (the parts' separator)."""
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a text"
    problem = line_problem(text)
    if problem:
        return problem
    if "," in text:
        return "contains ',' (pyxis reads it as a second mount); give each mount separately"
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        return "is not SRC[:DST[:FLAGS]]"
    for path in parts[:2]:
        if path and not path.startswith("/"):
            return f"has {path!r}, which is not an absolute path"
    if len(parts) == 3 and not _MOUNT_FLAGS.match(parts[2]):
        return f"has mount flags {parts[2]!r}; expected words such as ro or rw joined by '+'"
    return None


def mount_path_problem(path: str) -> str | None:
    """Problem with a path mounted at itself (the models root): absolute, and no ``,`` or
    ``:`` (the separators of docker -v and pyxis --container-mounts)."""
    problem = line_problem(path)
    if problem:
        return problem
    if not path.startswith("/"):
        return "is not an absolute path"
    if "," in path or ":" in path:
        return "contains ',' or ':' (the separators of docker -v and pyxis --container-mounts)"
    return None


def mounts_problem(mounts: Iterable[str]) -> str | None:
    """The first bad mount of ``mounts`` and its problem, or None."""
    for text in mounts:
        problem = mount_problem(text)
        if problem:
            return f"mount {text!r} {problem}"
    return None
