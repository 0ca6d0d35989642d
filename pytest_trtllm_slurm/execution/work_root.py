"""The plugin's work root, created git-ignored (like ``.pytest_cache``) and 0700."""

from __future__ import annotations

from pathlib import Path

from pytest_trtllm_slurm.node.files import SHARED, make_dirs, write_atomic
from pytest_trtllm_slurm.node.paths import WorkRoot

GITIGNORE_TEXT = "# Created by pytest-trtllm-slurm automatically.\n*\n"


def ensure_work_root(path: Path) -> Path:
    """Create ``path`` if missing, with a ``.gitignore`` of ``*`` when this call made it."""
    path = Path(path)
    existed = path.is_dir()
    make_dirs(path)  # (UntrustedPath names a folder someone else made or a foreign link)
    ignore = WorkRoot(path).gitignore
    if existed or ignore.exists():  # (another run created it first)
        return path
    write_atomic(ignore, GITIGNORE_TEXT, mode=SHARED)  # git's to read, as always
    return path
