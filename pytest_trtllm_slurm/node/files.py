"""Folders and files only this user can have written (target side, stdlib only).

Whoever can write a mailbox or a GPU lock folder runs code as the user or holds their GPUs:
folders are 0700 and verified ours, requests are read only from our own regular files,
and state files are written atomically (``write_atomic``, 0600 by default)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from pytest_trtllm_slurm.node.paths import gpu_lock_dir, lock_base

LOCK_ROOT = "/tmp"  # node-local; the folder inside it is per user and verified
PRIVATE = 0o600
SHARED = None  # ``write_atomic(mode=SHARED)``: what ``open()`` would make under the umask
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPath(Exception):
    """A folder or file someone else could have written: its path and why, for the log."""


def why_untrusted(st: os.stat_result, *, directory: bool) -> str | None:
    """Why a file (or folder) with this stat may not be trusted (node/relay.py has a copy)."""
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
    """UntrustedPath unless ``folder`` is a real folder of ours nobody else may write."""
    if (why := why_untrusted(os.lstat(folder), directory=True)) is not None:
        raise UntrustedPath(f"{folder}: {why}; refusing to use it (someone else could put "
                            "files there or swap ours): remove it and run again")


def refuse_foreign_links(folders: Iterable[Path]) -> None:
    """UntrustedPath naming the first of ``folders`` that is a link planted by someone else."""
    for folder in folders:
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise UntrustedPath(f"{folder}: it is a symbolic link owned by uid {st.st_uid}; "
                                "refusing to make or use folders through it")


def make_dirs(path: str | Path, *, private: bool = False) -> Path:
    """``mkdir -p`` with 0700 folders, each made (and, ``private``, an existing ``path``)
    verified ours; folders above the first existing one are taken as they are."""
    target = Path(path)
    missing = []
    for folder in (target, *target.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    refuse_foreign_links(target.parents if missing else (target, *target.parents))
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: verified below
            folder.mkdir(mode=0o700)
        refuse_untrusted_dir(folder)
    if private and not missing:
        refuse_untrusted_dir(target)
    return target


def close_own_dirs(folders: list[Path]) -> None:
    """UntrustedPath unless each folder is ours and no link; ours opened up are made 0700."""
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
    """``root`` and its parents up to the one named ``top_name`` (only ``root`` if none)."""
    chain = [root, *root.parents]
    names = [folder.name for folder in chain]
    return chain[:names.index(top_name) + 1] if top_name in names else [root]


def open_trusted(path: Path) -> bytes:
    """The bytes of ``path`` if the open file is our own regular file (else UntrustedPath)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if (why := why_untrusted(os.fstat(fd), directory=False)) is not None:
            raise UntrustedPath(f"{path}: {why}")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def private_lock_dir(job: str, node: str, root: str = LOCK_ROOT) -> Path:
    """``<root>/trtllm-slurm-<uid>/<job>-<node>``, made and verified ours (UntrustedPath)."""
    make_dirs(root)  # usually /tmp
    base = lock_base(root)
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    try:
        close_own_dirs([base])
    except UntrustedPath as exc:
        raise UntrustedPath(
            f"the GPU lock folder {exc}. Someone may have created it to take this user's "
            "GPU locks: remove it (or have an administrator remove it) and run again") from None
    locks = gpu_lock_dir(base, job, node)
    with contextlib.suppress(FileExistsError):
        locks.mkdir(mode=0o700)
    close_own_dirs([locks])
    return locks


def temp_name(path: Path) -> Path:
    """``.NAME.<random>.tmp`` beside ``path``: never a name a reader looks for."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def announce(notice: str | Path | None) -> None:
    """Tell the controller a batch's files changed (``execution/news.py``); a hint only."""
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
    """fsync a folder (a rename in it survives a crash), where it can be."""
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
    """Atomically make the finished file ``tmp`` (beside ``path``) ``path``."""
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _settle(fd, tmp, path, mode)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = PRIVATE,
                 parents: bool = False) -> Path:
    """Write ``data`` to ``path`` so a reader sees the old or the whole new file, also after
    a crash (temporary file, fsync, rename, fsync of the folder). ``mode``: exact, set
    before the first byte; SHARED: as ``open()`` makes it. ``parents``: mkdir first.
    An empty file is a signal to a live process (a session's stop, a test's cancel, a
    gate's open): renamed into place alike, not fsynced; a crash that loses it ends its
    reader too (32 stops at a run's end: 0.3 s of fsyncs on a busy disk)."""
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
    _settle(fd, tmp, target, mode, blob, durable=bool(blob))
    return target


def _settle(fd: int, tmp: Path, target: Path, mode: int | None, blob: bytes = b"", *,
            durable: bool = True) -> None:
    """chmod to ``mode`` (exact, not masked by the umask; None: as it is), write ``blob``,
    fsync, close, rename over ``target``, fsync the folder (the fsyncs only if
    ``durable``); ``tmp`` is removed on failure."""
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)
