"""Folders and files only this user can have written (target side, standard library only).

Why: the warm workers run whatever request is in their mailbox and take GPUs through lock
files; whoever can write there runs code as the user or holds the user's GPUs. So folders
are made 0700 and verified ours (not links, nobody else may write them), a request is read
only from a regular file of ours checked on the open file (``open_trusted``), and the GPU
lock folder's first part is verified before use (``private_lock_dir``). Every file of
state one process writes for another goes through ``write_atomic`` (temporary file, fsync,
rename, fsync of the folder; 0600 unless the caller says it is meant for others).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from pytest_trtllm_slurm.node.paths import gpu_lock_dir, lock_base

LOCK_ROOT = "/tmp"  # node-local; the folder inside it is per user and verified
PRIVATE = 0o600
SHARED = None  # ``write_atomic(mode=SHARED)``: what ``open()`` would make under the umask
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPath(Exception):
    """A folder or file someone else could have written: its path and why, for the log."""


def why_untrusted(st: os.stat_result, *, directory: bool) -> str | None:
    """Why a file (or folder) with this lstat/fstat may not be trusted; None if it may."""
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not kind_ok:
        return "it is not a " + ("folder" if directory else "regular file")
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def refuse_untrusted_dir(folder: str | Path) -> None:
    """UntrustedPath naming ``folder`` unless it is a real folder (not a link) of ours
    that neither group nor others may write."""
    why = why_untrusted(os.lstat(folder), directory=True)
    if why is not None:
        raise UntrustedPath(f"{folder}: {why}; refusing to use it (someone else could put "
                            "files there or swap ours): remove it and run again")


def refuse_foreign_links(folders: Iterable[Path]) -> None:
    """UntrustedPath naming the first of ``folders`` that is a symbolic link owned by
    someone else than this user or root (a link planted on the way to our folders)."""
    for folder in folders:
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise UntrustedPath(f"{folder}: it is a symbolic link owned by uid {st.st_uid}; "
                                "refusing to make or use folders through it")


def make_dirs(path: str | Path, *, private: bool = False) -> Path:
    """``mkdir -p`` whose new folders are 0700 (whatever the umask). Each folder it makes,
    or finds made meanwhile by someone else, is verified (``refuse_untrusted_dir``);
    ``private``: so is ``path`` when it already existed. Folders above the first existing
    one are taken as they are (a home, a project's scratch folder)."""
    target = Path(path)
    missing = []
    for folder in (target, *target.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    refuse_foreign_links(target.parents if missing else (target, *target.parents))
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile: verified as ours below, like the ones made here
        refuse_untrusted_dir(folder)
    if private and not missing:
        refuse_untrusted_dir(target)
    return target


def make_private_dirs(path: str | Path) -> Path:
    """``make_dirs(path, private=True)``: a folder only this user can have written to."""
    return make_dirs(path, private=True)


def close_own_dirs(folders: list[Path]) -> None:
    """Each folder must be ours and not a link (UntrustedPath otherwise); one of ours that
    group or others may write is made 0700."""
    for folder in folders:
        st = os.lstat(folder)
        why = why_untrusted(st, directory=True)
        if why is None:
            continue
        if (stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
                and st.st_uid == os.geteuid()):
            os.chmod(folder, 0o700)
            continue
        raise UntrustedPath(f"{folder}: {why}")


def tree_up_to(root: Path, top_name: str) -> list[Path]:
    """``root`` and its parents up to the first one named ``top_name`` (only ``root``
    when none is): the folders of a mailbox tree such as ``work_dirs/.agents/...``."""
    chain = [root]
    if root.name == top_name:
        return chain
    for parent in root.parents:
        chain.append(parent)
        if parent.name == top_name:
            return chain
    return [root]


def open_trusted(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file of ours that only we may write;
    UntrustedPath (naming the file and why) otherwise. Checked on the opened file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        why = why_untrusted(os.fstat(fd), directory=False)
        if why is not None:
            raise UntrustedPath(f"{path}: {why}")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def private_lock_dir(job: str, node: str, root: str = LOCK_ROOT) -> Path:
    """``<root>/trtllm-slurm-<uid>/<job>-<node>``: made and verified ours, 0700, not a
    link (UntrustedPath, naming the folder and its owner, when someone else made it)."""
    make_dirs(root)  # usually /tmp
    base = lock_base(root)
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    try:
        close_own_dirs([base])
    except UntrustedPath as exc:
        raise UntrustedPath(
            f"the GPU lock folder {exc}. Someone may have created it to take this user's "
            "GPU locks: remove it (or have an administrator remove it) and run again") from None
    locks = gpu_lock_dir(base, job, node)
    try:
        locks.mkdir(mode=0o700)
    except FileExistsError:
        pass
    close_own_dirs([locks])
    return locks


def temp_name(path: Path) -> Path:
    """A fresh hidden name next to ``path`` (``.NAME.<random>.tmp``): it never ends in a
    name a reader looks for (``.json``, ``.cancel``, ``ready.<rank>``)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def announce(notice: str | Path | None) -> None:
    """Tell the controller that a batch's files changed: an empty file renamed to
    ``notice`` (``paths.Batch.notice``) in the run's news folder, so that one stat of that
    folder per round says whether any batch has news, and its listing which. A hint only
    (no fsync; the controller still reads every batch now and then): a failure is ignored."""
    if not notice:
        return
    target = Path(notice)
    for _ in range(2):
        tmp = temp_name(target)
        try:
            os.close(os.open(tmp, _TEMP_FLAGS, PRIVATE))
            os.rename(tmp, target)  # a rename moves the folder's mtime, even over a notice
            return
        except FileNotFoundError:  # the first notice: its folder
            with contextlib.suppress(OSError, UntrustedPath):
                make_dirs(target.parent)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return


def fsync_dir(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a crash of the machine. Best effort
    where it cannot be done: a folder we may write but not read (it cannot be opened)
    and file systems that cannot fsync a folder (EINVAL and the like) are left as they
    are; the rename itself has happened by then."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def publish(tmp: Path, path: Path, *, mode: int | None = PRIVATE) -> None:
    """Make the finished file ``tmp`` (written by a library that wants a name of its own)
    ``path``: chmod (unless ``mode`` is SHARED), fsync, rename over ``path``, fsync the
    folder. ``tmp`` must be in ``path``'s folder; it is removed when this fails."""
    def finish(fd: int) -> None:
        if mode is not None:
            os.fchmod(fd, mode)

    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _settle(fd, tmp, path, finish)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = PRIVATE,
                 parents: bool = False) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one,
    never a part, also after a crash: a temporary file in the same folder, fsync, rename,
    fsync of the folder. ``mode``: 0600 by default, set before the first byte is written
    and whatever the umask; SHARED (None) for a file meant for others (0666 less the
    umask, as ``open()`` makes it). ``parents``: create missing folders first."""
    target = Path(path)
    if parents:
        make_dirs(target.parent)
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    while True:
        tmp = temp_name(target)
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o666 if mode is None else PRIVATE)
            break
        except FileExistsError:
            continue  # 48 random bits taken: draw again
    def fill(fd: int) -> None:
        if mode is not None:
            os.fchmod(fd, mode)  # exact, not masked by the umask
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]

    _settle(fd, tmp, target, fill)
    return target


def _settle(fd: int, tmp: Path, target: Path, prepare: Callable[[int], None]) -> None:
    """The steps every atomic write ends with: ``prepare(fd)``, fsync, close, rename over
    ``target``, fsync of the folder; ``tmp`` is removed when any of them fails."""
    try:
        try:
            prepare(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
