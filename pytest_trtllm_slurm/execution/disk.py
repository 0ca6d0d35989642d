"""Free space where a run writes its batches (work_dirs): a full disk is named, with the
space a batch needs, instead of surfacing as an OSError deep in a write."""

from __future__ import annotations

import errno
import os

# what one batch writes at least (its spec, node ids, job log and reports): a floor
BATCH_SPACE = 256 << 10


def space_problem(path: str, need: int = BATCH_SPACE, *, failed: bool = False) -> str | None:
    """Why ``path`` (or its nearest existing parent) cannot take ``need`` more bytes
    (``failed``: a write just failed for want of space); None if it can or is unreadable."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    try:
        stat = os.statvfs(probe)
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    if free >= need and not failed:
        return None
    return (f"no space left on the file system of {path}: {_size(free)} free, a batch needs "
            f"at least {_size(need)}; free space there or point --trtllm-work-dir elsewhere")


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _size(count: int) -> str:
    if count >= 1 << 20:
        return f"{count / (1 << 20):.1f} MiB"
    return f"{count / 1024:.0f} KiB"
