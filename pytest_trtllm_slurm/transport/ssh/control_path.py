"""Which ControlMaster socket may be trusted, and where a new one should live.

``ssh`` uses whatever socket sits at a ControlPath; whoever made it sees every command and
forges every answer. So a socket is used only when it is ours and every folder above it is
ours (or root's) and writable by nobody else, or a root-owned sticky folder such as /tmp."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The ControlPath an older procedure told users to start their master with (a shared
#: folder: used only after ``why_untrusted_socket`` finds it is ours).
LEGACY_CONTROL_PATH = "/tmp/ssh-trtllm-%r@%h:%p"
SOCKET_NAME = "ssh-trtllm-%r@%h:%p"


def private_folder_problem(folder: str | Path) -> str | None:
    """Why ``folder`` is not one only this user controls (None when it is)."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{folder}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder (a link or another kind of file)"
    if st.st_uid != os.geteuid():
        return f"{folder} is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write {folder} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def default_control_path() -> str:
    """A ControlPath in a folder only this user can write: ``$XDG_RUNTIME_DIR`` when it is
    such a folder, else ``~/.ssh``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and private_folder_problem(runtime) is None:
        return os.path.join(runtime, SOCKET_NAME)
    return str(Path.home() / ".ssh" / SOCKET_NAME)


def _folder_chain_problem(folder: str) -> str | None:
    """Why someone else could replace what is in ``folder`` (None when nobody can)."""
    real = Path(os.path.realpath(folder))
    for each in (real, *real.parents):
        st = os.lstat(each)
        if st.st_uid not in (os.geteuid(), 0):
            return f"the folder {each} is owned by uid {st.st_uid}"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not (st.st_mode & stat.S_ISVTX and st.st_uid == 0):
            return (f"group or others may write the folder {each} "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def why_untrusted_socket(path: str) -> str | None:
    """Why the socket at ``path`` must not be used; None when it may. A missing socket
    reads "there is no socket": nothing to connect to either way."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "there is no socket"
    except OSError as exc:
        return f"it cannot be looked at ({exc.strerror})"
    if not stat.S_ISSOCK(st.st_mode):
        return "it is not a socket" + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else "")
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    try:
        return _folder_chain_problem(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        return f"its folder cannot be looked at ({exc.strerror})"
